"""Triton kernel of the lightning-indexer logits (imported lazily: triton is an optional extra).

One program scores one query row against ``BLOCK_C`` context columns::

    k tile [BLOCK_C, DIM] (fp8 -> fp32)
    for head j:  s_j = k tile . q[row, j]      [BLOCK_C]
                 acc += w[row, j] * relu(s_j)
    acc *= k_scale[cols];  cols >= visible[row] -> -inf
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def indexer_logits_kernel(
    q_ptr,  # [rows, HEADS, DIM] fp8 or float
    w_ptr,  # [rows, HEADS] fp32
    k_ptr,  # [cols, DIM] fp8 or float
    ks_ptr,  # [cols] fp32
    vis_ptr,  # [rows] int64
    out_ptr,  # [rows, cols] fp32
    cols,
    HEADS: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # row * cols passes 2**31 for ~2K rows of a 1M context
    cb = tl.program_id(1)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_d = tl.arange(0, DIM)
    cmask = offs_c < cols
    k = tl.load(k_ptr + offs_c[:, None] * DIM + offs_d[None, :], mask=cmask[:, None], other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(HEADS):
        qj = tl.load(q_ptr + (row * HEADS + j) * DIM + offs_d).to(tl.float32)  # [DIM]
        s = tl.sum(k * qj[None, :], axis=1)  # [BLOCK_C]
        wj = tl.load(w_ptr + row * HEADS + j)
        acc += wj * tl.maximum(s, 0.0)
    acc = acc * tl.load(ks_ptr + offs_c, mask=cmask, other=1.0)
    vis = tl.load(vis_ptr + row)
    acc = tl.where(offs_c < vis, acc, float("-inf"))
    tl.store(out_ptr + row * cols + offs_c, acc, mask=cmask)
