"""Building blocks of the tiny DSA model: seeded linear weights, RMSNorm, RoPE, Hadamard rotation.

Every function is elementwise per token (or a fixed-shape matmul), so a token's result does not depend on
which other tokens share the batch apart from matmul rounding. Nothing here holds state.
"""

from __future__ import annotations

import math

import torch

ROPE_THETA = 10000.0  # the tiny model's RoPE base (the tiny preset carries no rope_theta)
NORM_EPS = 1e-6


def init_linear(gen: torch.Generator, fan_in: int, fan_out: int, dtype: torch.dtype) -> torch.Tensor:
    """A ``[fan_in, fan_out]`` weight with N(0, 1/fan_in) entries (used as ``x @ w``).

    Drawn in fp32 and then cast, so a seed gives the same values whatever the compute dtype.
    """
    return (torch.randn(fan_in, fan_out, generator=gen) / math.sqrt(fan_in)).to(dtype)


def init_norm(gen: torch.Generator, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """A norm gain near 1 (random, so a wrong norm is not hidden by all-ones weights)."""
    return (1.0 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * weight


def layer_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, None, NORM_EPS)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, *, interleaved: bool) -> torch.Tensor:
    """Rotate ``x [T, ..., dim]`` by its token's position ``positions [T]``.

    ``interleaved`` pairs (x0, x1), (x2, x3), ... (MLA); otherwise (x_i, x_{i + dim/2}) (the indexer,
    as in the DeepSeek-V3.2 reference).
    """
    dim = x.shape[-1]
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # [T, dim/2]
    cos, sin = angle.cos().float(), angle.sin().float()
    for _ in range(x.dim() - 2):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    a, b = x[..., : dim // 2], x[..., dim // 2 :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def hadamard_matrix(dim: int) -> torch.Tensor:
    """Orthonormal Sylvester-Hadamard matrix ``[dim, dim]`` (dim a power of two): spreads outliers
    across dimensions before fp8 quantization, as the reference indexer's ``rotate_activation``."""
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"hadamard dim = {dim}: must be a power of two")
    h = torch.ones(1, 1)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(dim)
