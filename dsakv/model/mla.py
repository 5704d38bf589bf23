"""Multi-head latent attention (MLA) of the tiny DSA model, in absorbed form.

Per token (shapes for the ``tiny`` preset in brackets)::

    x [hidden] -> wq_a -> RMSNorm -> qr [q_lora_rank]           (also feeds the lightning indexer)
    qr -> wq_b -> per head: q_nope [qk_nope], q_pe [rope] -> RoPE(position, interleaved)
    x -> wkv_a -> latent [kv_lora_rank] -> RMSNorm   |   k_pe [rope] -> RoPE     <- what the main cache stores
    absorbed query: q_latent[h] = W_uk[h] q_nope[h]  [kv_lora_rank]
    score(t, s) = (q_latent . latent_s + q_pe . k_pe_s) / sqrt(qk_nope + rope)
    out_latent [heads, kv_lora_rank] -> W_uv -> [heads, v_head] -> wo -> [hidden]

The attention itself lives in ``dsakv.model.sparse_mla`` (paged) and :func:`MlaLayer.masked_attention`
(dense reference). Weights are fixed at construction; methods do not modify them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsakv.model.nn import apply_rope, init_linear, init_norm, rms_norm
from dsakv.spec.model_spec import ModelSpec


@dataclass(frozen=True)
class MlaProjection:
    """One layer's projections for a batch of tokens ``[T, ...]``."""

    qr: torch.Tensor  # [T, q_lora_rank]
    q_latent: torch.Tensor  # [T, heads, kv_lora_rank]
    q_rope: torch.Tensor  # [T, heads, rope]
    latent: torch.Tensor  # [T, kv_lora_rank]
    k_rope: torch.Tensor  # [T, rope]


class MlaLayer:
    """Seeded random MLA weights of one layer and the projections around the attention."""

    def __init__(self, spec: ModelSpec, gen: torch.Generator, dtype: torch.dtype) -> None:
        hidden = spec.arch_value("hidden_size")
        self.heads = spec.arch_value("num_attention_heads")
        self.nope = spec.arch_value("qk_nope_head_dim")
        self.v_dim = spec.arch_value("v_head_dim")
        self.rank = spec.kv_lora_rank
        self.rope = spec.qk_rope_head_dim
        q_lora = spec.arch_value("q_lora_rank")
        self.wq_a = init_linear(gen, hidden, q_lora, dtype)
        self.q_norm = init_norm(gen, q_lora, dtype)
        self.wq_b = init_linear(gen, q_lora, self.heads * (self.nope + self.rope), dtype)
        self.wkv_a = init_linear(gen, hidden, self.rank + self.rope, dtype)
        self.kv_norm = init_norm(gen, self.rank, dtype)
        wkv_b = init_linear(gen, self.rank, self.heads * (self.nope + self.v_dim), dtype).view(
            self.rank, self.heads, -1
        )
        self.w_uk = wkv_b[:, :, : self.nope].contiguous()  # [rank, heads, nope]
        self.w_uv = wkv_b[:, :, self.nope :].contiguous()  # [rank, heads, v]
        self.wo = init_linear(gen, self.heads * self.v_dim, hidden, dtype)
        self.sm_scale = (self.nope + self.rope) ** -0.5

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> MlaProjection:
        """Queries (absorbed) and the latent/RoPE row to cache, for normed hidden states ``x [T, hidden]``."""
        t = x.shape[0]
        qr = rms_norm(x @ self.wq_a, self.q_norm)
        q = (qr @ self.wq_b).view(t, self.heads, self.nope + self.rope)
        q_nope, q_pe = q[..., : self.nope], q[..., self.nope :]
        q_latent = torch.einsum("thn,rhn->thr", q_nope, self.w_uk)
        kv = x @ self.wkv_a
        latent = rms_norm(kv[:, : self.rank], self.kv_norm)
        k_rope = apply_rope(kv[:, self.rank :], positions, interleaved=True)
        q_rope = apply_rope(q_pe, positions, interleaved=True)
        return MlaProjection(qr, q_latent, q_rope, latent, k_rope)

    def output(self, out_latent: torch.Tensor) -> torch.Tensor:
        """Latent-space attention output ``[T, heads, rank]`` -> hidden ``[T, hidden]``."""
        v = torch.einsum("thr,rhv->thv", out_latent, self.w_uv)
        return v.reshape(v.shape[0], -1) @ self.wo

    def masked_attention(
        self, proj: MlaProjection, latent: torch.Tensor, rope: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        """Dense reference: full scores against every cached row, then the index mask ``allowed [T, S]``."""
        score = torch.einsum("thr,sr->ths", proj.q_latent, latent) + torch.einsum("thp,sp->ths", proj.q_rope, rope)
        score = (score * self.sm_scale).masked_fill(~allowed.unsqueeze(1), float("-inf"))
        return torch.einsum("ths,sr->thr", torch.softmax(score, dim=-1), latent)
