"""Lightning-indexer projections of the tiny DSA model (a full indexer layer's weights).

Per token, following the DeepSeek-V3.2 reference ``Indexer``::

    qr [q_lora_rank] -> wq -> q [index_heads, index_dim] -> RoPE on the first rope dims (not interleaved)
    x  [hidden]      -> wk -> LayerNorm -> k [index_dim]  -> RoPE likewise             <- the indexer cache
    q, k -> Hadamard rotation;  q -> fp8 per (token, head) with scale sq
    head weights w = (x @ w_proj) * index_heads^-0.5 * index_dim^-0.5 * sq

The key is returned unquantized: the pool quantizes it on store (fp8 + one scale), and the dense path
emulates that with the pool's own quantizer. Weights are fixed at construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsakv.kernels.cache_ops import quantize_tiles
from dsakv.model.nn import apply_rope, hadamard_matrix, init_linear, init_norm, layer_norm
from dsakv.spec.model_spec import ModelSpec


@dataclass(frozen=True)
class IndexerQuery:
    q: torch.Tensor  # [T, index_heads, index_dim] float8_e4m3fn
    weights: torch.Tensor  # [T, index_heads] fp32, q scale and softmax scale folded in


class IndexerLayer:
    """Seeded random weights of one full indexer layer."""

    def __init__(self, spec: ModelSpec, gen: torch.Generator, dtype: torch.dtype) -> None:
        hidden = spec.arch_value("hidden_size")
        self.heads = spec.index_n_heads
        self.dim = spec.index_head_dim
        self.rope = min(spec.qk_rope_head_dim, spec.index_head_dim)
        self.wq = init_linear(gen, spec.arch_value("q_lora_rank"), self.heads * self.dim, dtype)
        self.wk = init_linear(gen, hidden, self.dim, dtype)
        self.k_norm = init_norm(gen, self.dim, dtype)
        self.w_proj = init_linear(gen, hidden, self.heads, dtype)
        self.rotation = hadamard_matrix(self.dim).to(dtype)
        self.weight_scale = self.heads**-0.5 * self.dim**-0.5

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        pe = apply_rope(x[..., : self.rope], positions, interleaved=False)
        return torch.cat([pe, x[..., self.rope :]], dim=-1) @ self.rotation

    def key(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Indexer keys ``[T, index_dim]`` fp32 of normed hidden states ``x [T, hidden]``."""
        return self._rope(layer_norm(x @ self.wk, self.k_norm), positions)

    def query(self, x: torch.Tensor, qr: torch.Tensor, positions: torch.Tensor) -> IndexerQuery:
        """fp8 queries and head weights for ``x [T, hidden]`` and the MLA's ``qr [T, q_lora_rank]``."""
        t = x.shape[0]
        q = self._rope((qr @ self.wq).view(t, self.heads, self.dim), positions)
        q8, q_scale = quantize_tiles(q.reshape(t * self.heads, self.dim), self.dim)
        weights = (x @ self.w_proj) * self.weight_scale * q_scale.view(t, self.heads)
        return IndexerQuery(q8.view(t, self.heads, self.dim), weights)
