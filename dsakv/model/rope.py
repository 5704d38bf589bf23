"""RoPE of the real architectures, computed as transformers 5.24 computes it (so the exact mode matches it
bit for bit where it can): fp32 inverse frequencies (default or YaRN), ``cos``/``sin`` of
``position * inv_freq`` times YaRN's attention factor, and the two layouts::

    interleaved (MLA; GLM's indexer)   pairs (x0, x1), (x2, x3), ...; the output is *de-interleaved*:
                                       [x_even * cos - x_odd * sin | x_odd * cos + x_even * sin]
    half-split (DeepSeek-V3.2 indexer) pairs (x_i, x_{i + d/2}):  x * [cos|cos] + rotate_half(x) * [sin|sin]

Queries and keys go through the same layout, so dot products do not see the output permutation. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dsakv.model.dsa_config import RopeConfig


def inv_frequencies(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq fp32 ``[dim / 2]``, attention factor on cos/sin) as transformers' rope init functions."""
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim)
    if rope.rope_type == "default":
        return 1.0 / pos_freqs, 1.0
    factor = rope.factor
    attention = rope.attention_factor
    if attention is None:
        if rope.mscale and rope.mscale_all_dim:
            attention = rope.yarn_mscale(factor, rope.mscale) / rope.yarn_mscale(factor, rope.mscale_all_dim)
        else:
            attention = rope.yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta)
        )

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention)


@dataclass(frozen=True)
class RopeTables:
    """``cos``/``sin`` ``[T, dim / 2]`` fp32 of a batch's positions."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def at(cls, rope: RopeConfig, dim: int, positions: torch.Tensor) -> RopeTables:
        inv, attention = inv_frequencies(rope, dim)
        freqs = positions.to(torch.int64).float().unsqueeze(-1) * inv  # [T, dim / 2]
        return cls(freqs.cos() * attention, freqs.sin() * attention)

    def _expand(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], *([1] * (x.dim() - 2)), t.shape[1]).to(x.dtype)

    def interleaved(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, ..., dim]`` rotated in (even, odd) pairs; output de-interleaved (transformers' form)."""
        cos, sin = self._expand(self.cos, x), self._expand(self.sin, x)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def half_split(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, ..., dim]`` rotated in (i, i + dim/2) pairs (``rotate_half``)."""
        cos = torch.cat([self.cos, self.cos], -1)
        sin = torch.cat([self.sin, self.sin], -1)
        cos, sin = self._expand(cos, x), self._expand(sin, x)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


__all__ = ["RopeTables", "inv_frequencies"]
