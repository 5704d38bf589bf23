"""Triton kernel of sparse MLA decode (imported lazily: triton is an optional extra).

One program per (query token t, head h), streaming the selected rows in blocks of ``BLOCK_K``::

    idx block [BLOCK_K] -> gather c [BLOCK_K, RANK], k_pe [BLOCK_K, ROPE]
    s = (c . q_latent + k_pe . q_rope) * sm_scale          [BLOCK_K], idx < 0 -> -inf
    online softmax: m' = max(m, max s); acc = acc * e^(m - m') + sum_i e^(s_i - m') c_i
    out = acc / denom
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sparse_mla_decode_kernel(
    ql_ptr,  # [T, HEADS, RANK] fp32
    qr_ptr,  # [T, HEADS, ROPE] fp32
    lat_ptr,  # [N, RANK] fp32
    rope_ptr,  # [N, ROPE] fp32
    idx_ptr,  # [T, top] int64
    out_ptr,  # [T, HEADS, RANK] fp32
    sm_scale,
    top,
    HEADS: tl.constexpr,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)  # (t * HEADS + h) * RANK can pass 2**31 for a long prefill chunk
    h = tl.program_id(1)
    offs_r = tl.arange(0, RANK)
    offs_p = tl.arange(0, ROPE)
    ql = tl.load(ql_ptr + (t * HEADS + h) * RANK + offs_r)
    qr = tl.load(qr_ptr + (t * HEADS + h) * ROPE + offs_p)
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([RANK], dtype=tl.float32)
    for k0 in range(0, top, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        idx = tl.load(idx_ptr + t * top + offs_k, mask=offs_k < top, other=-1)
        valid = idx >= 0
        row = tl.where(valid, idx, 0)
        c = tl.load(lat_ptr + row[:, None] * RANK + offs_r[None, :], mask=valid[:, None], other=0.0)
        pe = tl.load(rope_ptr + row[:, None] * ROPE + offs_p[None, :], mask=valid[:, None], other=0.0)
        s = (tl.sum(c * ql[None, :], axis=1) + tl.sum(pe * qr[None, :], axis=1)) * sm_scale  # [BLOCK_K]
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        # A block with nothing valid so far keeps m_new = -inf; guard the exponentials against -inf - -inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe)  # [BLOCK_K]
        denom = denom * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * c, axis=0)
        m = m_new
    out = tl.where(denom > 0, acc / tl.where(denom > 0, denom, 1.0), 0.0)
    tl.store(out_ptr + (t * HEADS + h) * RANK + offs_r, out)
