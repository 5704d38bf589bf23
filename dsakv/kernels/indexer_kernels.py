"""Lightning-indexer logits: plain-torch reference, Triton kernel with the same signature, dispatcher.

Dataflow (DeepSeek-V3.2 ``fp8_index``), for query row ``t`` and context column ``s``::

    fp8 q[t, j] . fp8 k[s]  -> fp32 per-head logit      (j = indexer head, dot over index_head_dim)
    relu                     -> x head weight w[t, j]    (w already carries q's fp8 scale and softmax scale)
    sum over heads           -> x k_scale[s]             (one fp32 scale per stored key; > 0)
    s >= visible[t]          -> -inf                     (causal: row t sees context columns 0..visible[t]-1)

Folding ``k_scale`` after the head sum equals scoring against the dequantized key because the scale is
positive (``relu(a * c) = c * relu(a)`` for ``c > 0``). Shapes::

    q       [rows, H, D]  float8_e4m3fn or float      weights [rows, H] fp32
    k       [cols, D]     float8_e4m3fn or float      k_scale [cols]    fp32
    visible [rows]        int64                        -> logits [rows, cols] fp32

These functions do not validate; ``dsakv.model.indexer`` does. Context column ``s`` is context position ``s``
(the caller gathers keys in position order).
"""

from __future__ import annotations

import torch

from dsakv.kernels import use_triton

REFERENCE_TEMP_ELEMENTS = 32 * 1024 * 1024  # cap of the reference's fp64 per-head scratch (256 MiB)


def indexer_logits_torch(
    q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Reference: fp32 logits ``[rows, cols]``, -inf where the column is not visible to the row.

    Accumulates in fp64: fp8 x fp8 products over 128 dims sum exactly there, so a row's logits are
    bit-identical however the rows are batched or chunked (the selection never depends on chunking).
    """
    rows, heads, _ = q.shape
    cols = k.shape[0]
    q64, k64t, w64 = q.double(), k.double().T, weights.double()
    acc = torch.zeros(rows, cols, dtype=torch.float64, device=q.device)
    group = max(1, min(heads, REFERENCE_TEMP_ELEMENTS // max(rows * cols, 1)))  # heads per GEMM
    for h0 in range(0, heads, group):
        per_head = torch.matmul(q64[:, h0 : h0 + group], k64t)  # [rows, group, cols], exact for fp8 inputs
        for j in range(per_head.shape[1]):  # fixed head order: the fp64 sum is reproducible
            acc += per_head[:, j].relu() * w64[:, h0 + j : h0 + j + 1]
    logits = (acc * k_scale.double().unsqueeze(0)).float()
    hidden = torch.arange(cols, device=q.device).unsqueeze(0) >= visible.to(q.device).unsqueeze(1)
    return logits.masked_fill_(hidden, float("-inf"))


def indexer_logits_triton(
    q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Triton version of :func:`indexer_logits_torch` (one program per row x block of columns)."""
    import triton

    from dsakv.kernels.indexer_triton import indexer_logits_kernel

    rows, heads, dim = q.shape
    cols = k.shape[0]
    out = torch.empty(rows, cols, dtype=torch.float32, device=q.device)
    if rows == 0 or cols == 0:
        return out
    q, k = q.contiguous(), k.contiguous()
    weights = weights.float().contiguous()
    k_scale = k_scale.float().contiguous()
    visible = visible.to(torch.int64).contiguous()
    block_c = 32
    grid = (rows, triton.cdiv(cols, block_c))
    indexer_logits_kernel[grid](
        q, weights, k, k_scale, visible, out, cols,
        HEADS=heads, DIM=dim, BLOCK_C=block_c,
    )  # fmt: skip
    return out


def indexer_logits_kernel(
    q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Dispatcher: Triton on CUDA (or with ``DSAKV_KERNELS=triton``), else the torch reference."""
    if use_triton(q.device):
        return indexer_logits_triton(q, weights, k, k_scale, visible)
    return indexer_logits_torch(q, weights, k, k_scale, visible)
