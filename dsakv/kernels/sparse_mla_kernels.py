"""Sparse MLA in absorbed form over selected cache rows: torch reference, Triton kernel, dispatcher.

Attention runs in the latent space: the query's no-RoPE part has been absorbed through ``W_uk`` into a
``kv_lora_rank``-dim latent query, so one cached row (latent ``c`` + RoPE key ``k_pe``) serves as both key
and value for every head::

    score[t, h, i] = (q_latent[t, h] . c[idx[t, i]] + q_rope[t, h] . k_pe[idx[t, i]]) * sm_scale
    p = softmax_i(score)            (entries with idx = -1 are skipped)
    out[t, h] = sum_i p[t, h, i] * c[idx[t, i]]           -> [T, H, kv_lora_rank]; W_uv maps it to v_head_dim

Shapes::

    q_latent [T, H, R] float   q_rope [T, H, P] float   latent [N, R] float   rope [N, P] float
    topk_idx [T, K] int64, rows of latent/rope to attend (-1 = padding)   -> out [T, H, R] fp32 (fp64 in,
    fp64 out for the reference; the Triton kernel computes in fp32)

A row with no valid index gets zeros. No validation here; ``dsakv.model.sparse_mla`` validates.
"""

from __future__ import annotations

import torch

from dsakv.kernels import use_triton


def sparse_mla_torch(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    topk_idx: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Reference: gather the selected rows per query token, masked softmax, weighted sum of latents.

    Computes in the query's dtype when it is wider than fp32 (the tiny model runs in fp64), else fp32.
    """
    score, c = _selected_scores(q_latent, q_rope, latent, rope, topk_idx, sm_scale)
    p = torch.softmax(score, dim=-1).nan_to_num(0.0)  # all-masked rows -> zeros
    return torch.einsum("thk,tkr->thr", p, c)


def _selected_scores(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    topk_idx: torch.Tensor,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selected rows' scaled scores ``[T, H, K]`` (-inf where ``topk_idx`` < 0) and their latents
    ``[T, K, R]``, in the query's dtype when it is wider than fp32, else fp32."""
    dt = torch.promote_types(q_latent.dtype, torch.float32)
    valid = topk_idx >= 0  # [T, K]
    idx = topk_idx.clamp(min=0)
    c, pe = latent[idx].to(dt), rope[idx].to(dt)  # [T, K, R], [T, K, P]
    score = torch.einsum("thr,tkr->thk", q_latent.to(dt), c) + torch.einsum("thp,tkp->thk", q_rope.to(dt), pe)
    return (score * sm_scale).masked_fill(~valid.unsqueeze(1), float("-inf")), c


def sparse_mla_partial_torch(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    topk_idx: torch.Tensor,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One DCP rank's share of :func:`sparse_mla_torch`: (out ``[T, H, R]``, lse ``[T, H]``) over the rows this
    rank holds; ``lse = log sum_i exp(score_i)`` (-inf for a row selecting nothing here, with out 0)."""
    score, c = _selected_scores(q_latent, q_rope, latent, rope, topk_idx, sm_scale)
    lse = torch.logsumexp(score, dim=-1)  # [T, H]
    p = torch.exp(score - lse.unsqueeze(-1)).nan_to_num(0.0)
    return torch.einsum("thk,tkr->thr", p, c), lse


def merge_partials(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> torch.Tensor:
    """Combine the ranks' partial attentions: ``out = sum_r exp(lse_r - lse) out_r`` with ``lse = logsumexp_r
    lse_r`` (each rank's softmax rescaled to the whole selection's denominator; the DCP all-gather + merge)."""
    lse = torch.logsumexp(torch.stack(lses), dim=0)  # [T, H]
    total = torch.zeros_like(outs[0])
    for out, part in zip(outs, lses):
        total += torch.exp(part - lse).nan_to_num(0.0).unsqueeze(-1) * out
    return total


def sparse_mla_triton(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    topk_idx: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Triton version of :func:`sparse_mla_torch`: one program per (token, head), online softmax."""
    from dsakv.kernels.sparse_mla_triton import sparse_mla_decode_kernel

    tokens, heads, rank = q_latent.shape
    rope_dim = q_rope.shape[2]
    top = topk_idx.shape[1]
    out = torch.empty(tokens, heads, rank, dtype=torch.float32, device=q_latent.device)
    if tokens == 0 or heads == 0:
        return out
    sparse_mla_decode_kernel[(tokens, heads)](
        q_latent.float().contiguous(), q_rope.float().contiguous(),
        latent.float().contiguous(), rope.float().contiguous(),
        topk_idx.to(torch.int64).contiguous(), out, float(sm_scale), top,
        HEADS=heads, RANK=rank, ROPE=rope_dim, BLOCK_K=16,
    )  # fmt: skip
    return out


def sparse_mla_kernel(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    topk_idx: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Dispatcher: Triton on CUDA (or with ``DSAKV_KERNELS=triton``), else the torch reference."""
    if use_triton(q_latent.device):
        return sparse_mla_triton(q_latent, q_rope, latent, rope, topk_idx, sm_scale)
    return sparse_mla_torch(q_latent, q_rope, latent, rope, topk_idx, sm_scale)
