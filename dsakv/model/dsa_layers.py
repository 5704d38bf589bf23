"""Layers of the real architectures (GLM-MoE-DSA, DeepSeek-V3.2) with checkpoint weights, written to follow
transformers 5.24's op order so the exact cache mode reproduces its greedy tokens.

Weights are ``[out, in]`` as stored (``F.linear``). Per token::

    MLA      x -> q_a_proj -> RMSNorm -> qr -> q_b_proj -> per head [q_nope | q_rot] -> RoPE(interleaved)
             x -> kv_a_proj_with_mqa -> [latent -> RMSNorm | k_rot -> RoPE(interleaved)]   <- main cache row
             absorbed: q_latent[h] = W_uk[h]^T q_nope[h];  score = (q_latent . latent + q_rot . k_rot) * scale
             scale = qk_head_dim^-0.5 x YaRN mscale(all_dim)^2; out = W_uv[h] (softmax @ latent) -> o_proj
    indexer  qr -> wq_b -> q [heads, dim]; x -> wk -> LayerNorm(+bias, eps 1e-6) -> k   <- indexer cache row
             RoPE on the first qk_rope_head_dim dims (GLM interleaved, DeepSeek-V3.2 half-split)
             head weights w = weights_proj(x) * heads^-0.5 * dim^-0.5;  I[t, s] = sum_h w[t,h] relu(q[t,h] . k[s])
             production mode: q and k Hadamard-rotated, q fp8 per (token, head) with its scale folded into w,
             k stored fp8 + scale by the pool (DeepSeek's kernels); exact mode: fp32, no rotation
    MoE      sigmoid router (+ e_score_correction_bias for the choice only), group-limited top-k, normalised
             weights x routed_scaling_factor, SwiGLU experts + shared experts; dense SwiGLU on dense layers

Nothing here mutates its inputs or weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dsakv.errors import DsakvError
from dsakv.kernels.cache_ops import quantize_tiles
from dsakv.model.dsa_config import INDEXER_NORM_EPS, DsaConfig
from dsakv.model.mla import MlaProjection
from dsakv.model.nn import hadamard_matrix
from dsakv.model.rope import RopeTables

Weights = Mapping[str, torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: fp32 variance, ``weight * normed``."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _take(w: Weights, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if name not in w:
        raise DsakvError(f"checkpoint: tensor {name!r} is missing")
    t = w[name]
    if shape is not None and tuple(t.shape) != shape:
        raise DsakvError(f"checkpoint: tensor {name!r} has shape {list(t.shape)}: the config implies {list(shape)}")
    return t


class Mla:
    def __init__(self, cfg: DsaConfig, w: Weights, prefix: str) -> None:
        s = cfg.spec
        h, hid = cfg.num_attention_heads, cfg.hidden_size
        self.cfg, self.heads, self.nope, self.rope, self.rank = (
            cfg,
            h,
            cfg.qk_nope_head_dim,
            s.qk_rope_head_dim,
            s.kv_lora_rank,
        )
        self.v_dim = cfg.v_head_dim
        self.q_a = _take(w, prefix + "q_a_proj.weight", (cfg.q_lora_rank, hid))
        self.q_a_norm = _take(w, prefix + "q_a_layernorm.weight", (cfg.q_lora_rank,))
        self.q_b = _take(w, prefix + "q_b_proj.weight", (h * (self.nope + self.rope), cfg.q_lora_rank))
        self.kv_a = _take(w, prefix + "kv_a_proj_with_mqa.weight", (self.rank + self.rope, hid))
        self.kv_a_norm = _take(w, prefix + "kv_a_layernorm.weight", (self.rank,))
        kv_b = _take(w, prefix + "kv_b_proj.weight", (h * (self.nope + self.v_dim), self.rank)).view(h, -1, self.rank)
        self.w_uk = kv_b[:, : self.nope].contiguous()  # [heads, nope, rank]
        self.w_uv = kv_b[:, self.nope :].contiguous()  # [heads, v, rank]
        self.o = _take(w, prefix + "o_proj.weight", (hid, h * self.v_dim))
        bias = cfg.attention_bias
        self.q_a_bias = _take(w, prefix + "q_a_proj.bias") if bias else None
        self.kv_a_bias = _take(w, prefix + "kv_a_proj_with_mqa.bias") if bias else None
        self.o_bias = _take(w, prefix + "o_proj.bias") if bias else None
        self.sm_scale = (self.nope + self.rope) ** -0.5 * cfg.rope.softmax_scale_factor()

    def project(self, x: torch.Tensor, rope: RopeTables) -> MlaProjection:
        t, eps = x.shape[0], self.cfg.rms_norm_eps
        qr = rms_norm(F.linear(x, self.q_a, self.q_a_bias), self.q_a_norm, eps)
        q = F.linear(qr, self.q_b).view(t, self.heads, self.nope + self.rope)
        q_nope, q_rot = q[..., : self.nope], q[..., self.nope :]
        kv = F.linear(x, self.kv_a, self.kv_a_bias)
        latent = rms_norm(kv[:, : self.rank], self.kv_a_norm, eps)
        q_latent = torch.einsum("thn,hnr->thr", q_nope, self.w_uk)
        return MlaProjection(qr, q_latent, rope.interleaved(q_rot), latent, rope.interleaved(kv[:, self.rank :]))

    def output(self, out_latent: torch.Tensor) -> torch.Tensor:
        """Latent-space attention output ``[T, heads, rank]`` -> hidden ``[T, hidden]``."""
        v = torch.einsum("thr,hvr->thv", out_latent.to(self.w_uv.dtype), self.w_uv)
        return F.linear(v.reshape(v.shape[0], -1), self.o, self.o_bias)


@dataclass(frozen=True)
class IndexerRounding:
    """What the indexer rounds besides the pool's key storage: the Hadamard rotation of q and k, and the
    query's fp8 cast (scale per token and head, folded into the head weights). The production mode sets both;
    ``bench/dsa_agreement.py`` switches them one at a time."""

    hadamard: bool
    fp8_query: bool

    @classmethod
    def for_production(cls, production: bool) -> IndexerRounding:
        return cls(hadamard=production, fp8_query=production)


@dataclass(frozen=True)
class IndexerQuery:
    q: torch.Tensor  # [T, heads, dim] fp32 (exact) or float8_e4m3fn (production)
    weights: torch.Tensor  # [T, heads] fp32: head weight x heads^-0.5 x dim^-0.5 (x q's fp8 scale)


class Indexer:
    def __init__(self, cfg: DsaConfig, w: Weights, prefix: str) -> None:
        s = cfg.spec
        self.cfg, self.heads, self.dim, self.rope = cfg, s.index_n_heads, s.index_head_dim, s.qk_rope_head_dim
        self.wq_b = _take(w, prefix + "wq_b.weight", (self.heads * self.dim, cfg.q_lora_rank))
        self.wk = _take(w, prefix + "wk.weight", (self.dim, cfg.hidden_size))
        self.k_norm_w = _take(w, prefix + "k_norm.weight", (self.dim,))
        self.k_norm_b = w.get(prefix + "k_norm.bias")
        self.weights_proj = _take(w, prefix + "weights_proj.weight", (self.heads, cfg.hidden_size)).float()
        self._hadamard: torch.Tensor | None = None

    def hadamard(self) -> torch.Tensor:
        if self._hadamard is None:
            if self.dim & (self.dim - 1):
                raise DsakvError(f"index_head_dim = {self.dim}: the production mode's Hadamard needs a power of two")
            self._hadamard = hadamard_matrix(self.dim)
        return self._hadamard

    def _rope(self, x: torch.Tensor, rope: RopeTables) -> torch.Tensor:
        rot, rest = x[..., : self.rope], x[..., self.rope :]
        rot = rope.interleaved(rot) if self.cfg.indexer_rope_interleaved else rope.half_split(rot)
        return torch.cat([rot, rest], dim=-1)

    def key(self, x: torch.Tensor, rope: RopeTables, rounding: IndexerRounding) -> torch.Tensor:
        """Indexer keys ``[T, dim]`` fp32 (the pool quantizes them when its indexer dtype is fp8)."""
        k = F.layer_norm(F.linear(x, self.wk), (self.dim,), self.k_norm_w, self.k_norm_b, INDEXER_NORM_EPS)
        k = self._rope(k, rope).float()
        return k @ self.hadamard() if rounding.hadamard else k

    def query(self, x: torch.Tensor, qr: torch.Tensor, rope: RopeTables, rounding: IndexerRounding) -> IndexerQuery:
        t = x.shape[0]
        q = self._rope(F.linear(qr, self.wq_b).view(t, self.heads, self.dim), rope).float()
        weights = F.linear(x.float(), self.weights_proj) * (self.heads**-0.5) * (self.dim**-0.5)
        if rounding.hadamard:
            q = q @ self.hadamard()
        if not rounding.fp8_query:
            return IndexerQuery(q, weights)
        q8, q_scale = quantize_tiles(q.reshape(t * self.heads, self.dim), self.dim)
        return IndexerQuery(q8.view(t, self.heads, self.dim), weights * q_scale.view(t, self.heads))


class DenseMlp:
    def __init__(self, w: Weights, prefix: str, hidden: int, inter: int) -> None:
        self.gate = _take(w, prefix + "gate_proj.weight", (inter, hidden))
        self.up = _take(w, prefix + "up_proj.weight", (inter, hidden))
        self.down = _take(w, prefix + "down_proj.weight", (hidden, inter))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.gate)) * F.linear(x, self.up), self.down)


class Moe:
    """Routed experts (fused gate/up per expert, as transformers holds them) plus shared experts."""

    def __init__(self, cfg: DsaConfig, w: Weights, prefix: str) -> None:
        self.cfg = cfg
        e, hid, inter = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.router = _take(w, prefix + "gate.weight", (e, hid)).float()
        bias = w.get(prefix + "gate.e_score_correction_bias")
        self.bias = torch.zeros(e) if bias is None else bias.float()
        if prefix + "experts.gate_up_proj" in w:  # fused 3-D layout
            self.gate_up = list(_take(w, prefix + "experts.gate_up_proj", (e, 2 * inter, hid)).unbind(0))
            self.down = list(_take(w, prefix + "experts.down_proj", (e, hid, inter)).unbind(0))
        else:
            self.gate_up = [
                torch.cat([
                    _take(w, f"{prefix}experts.{i}.gate_proj.weight", (inter, hid)),
                    _take(w, f"{prefix}experts.{i}.up_proj.weight", (inter, hid)),
                ])
                for i in range(e)
            ]  # fmt: skip
            self.down = [_take(w, f"{prefix}experts.{i}.down_proj.weight", (hid, inter)) for i in range(e)]
        self.shared = DenseMlp(w, prefix + "shared_experts.", hid, inter * cfg.n_shared_experts)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights ``[T, k]``, expert ids ``[T, k]``): transformers' noaux_tc router."""
        cfg, e = self.cfg, self.cfg.n_routed_experts
        scores = F.linear(x.float(), self.router).sigmoid()
        choice = scores + self.bias
        groups = choice.view(-1, cfg.n_group, e // cfg.n_group).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(groups, k=cfg.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(groups).scatter_(1, group_idx, 1)
        mask = group_mask.unsqueeze(-1).expand(-1, cfg.n_group, e // cfg.n_group).reshape(-1, e)
        choice = choice.masked_fill(~mask.bool(), float("-inf"))
        idx = torch.topk(choice, k=cfg.num_experts_per_tok, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * cfg.routed_scaling_factor, idx

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, idx = self.route(x)
        out = torch.zeros_like(x)
        for expert in torch.unique(idx).tolist():
            slot, token = torch.where((idx == expert).T)  # transformers' order: by slot, then token
            gate, up = F.linear(x[token], self.gate_up[expert]).chunk(2, dim=-1)
            h = F.linear(F.silu(gate) * up, self.down[expert]) * weights[token, slot, None]
            out.index_add_(0, token, h.to(out.dtype))
        return out + self.shared(x)


__all__ = ["DenseMlp", "Indexer", "IndexerQuery", "IndexerRounding", "Mla", "MlaProjection", "Moe", "rms_norm"]
