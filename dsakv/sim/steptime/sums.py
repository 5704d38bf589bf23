"""One step's batch reduced to the integer aggregates the roofline prices (``StepSums``), and the exact integer
sums behind them: the sparse-MLA pairs of a prefill chunk, the decode contexts clipped at top-k, and the same
sums over a run of steps (every context one longer per step) as int64 arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class StepSums(NamedTuple):
    """One step's batch as the integer aggregates the roofline prices (``batch_sums``)."""

    pf_chunks: int  # prefill chunks (each sends one row to the lm_head)
    pf_tokens: int  # new prefill tokens
    pf_keys: int  # keys the chunks' indexer reads (context + new tokens, per chunk)
    pf_idx_pairs: int  # causal (query, key) indexer pairs of the chunks
    pf_pairs: int  # sparse-MLA (query, key) pairs of the chunks: min(position, top-k) per query
    pf_chunk_rows: int  # latent rows a chunk reads once: min(context + new, new x top-k) per chunk
    n_dec: int  # decodes
    dec_sum: int  # their context lengths summed
    dec_topk: int  # ... each clipped at top-k
    dec_rows: int  # ... each clipped at (1 + drafts) x top-k (dec_topk without drafts)


def batch_sums(prefill: Sequence[tuple[int, int]], decode: Sequence[int], topk: int, q: int) -> StepSums:
    """The batch reduced to the integer aggregates ``RooflineStepTime.price`` needs (``q``: query rows per decode,
    the token and its drafts)."""
    n_dec = len(decode)
    # Decode sums: the plain sum is C-level; the clipped ones need a pass only past top-k (equal when q = 1).
    dec_sum = sum(decode)
    longest = max(decode) if n_dec else 0
    dec_topk = clipped_sum(decode, dec_sum, longest, topk)
    dec_rows = dec_topk if q == 1 else clipped_sum(decode, dec_sum, longest, q * topk)
    pf_tokens = pf_keys = pf_idx_pairs = pf_pairs = pf_chunk_rows = 0
    for n, ctx in prefill:
        pf_tokens += n
        pf_keys += n + ctx
        pf_idx_pairs += n * ctx + n * (n + 1) // 2
        pf_pairs += sparse_pairs(n, ctx, topk)
        pf_chunk_rows += min(n + ctx, n * topk)
    return StepSums(
        len(prefill), pf_tokens, pf_keys, pf_idx_pairs, pf_pairs, pf_chunk_rows, n_dec, dec_sum, dec_topk, dec_rows
    )


def clipped_run(values: Sequence[int], first: int, cap: int, steps: np.ndarray) -> np.ndarray | int:
    """``sum(min(v + j, cap) for v in values)`` for each ``j`` in ``steps``, given its value ``first`` at j = 0:
    only the values below ``cap`` still grow (each by ``min(j, cap - v)``); exact int64. ``first`` itself when
    none is below ``cap`` (the same every step: ``price`` computes what depends on it once)."""
    gaps = [cap - v for v in values if v < cap]
    if not gaps:
        return first
    return first + np.minimum(steps[:, None], np.array(gaps, dtype=np.int64)[None, :]).sum(axis=1)


def clipped_sum(values: Sequence[int], total: int, largest: int, cap: int) -> int:
    """``sum(min(v, cap) for v in values)`` given their sum and maximum: only the values above ``cap`` are
    visited, without a ``min`` call each (the step time runs once per simulated step)."""
    if largest <= cap:
        return total
    over = [v for v in values if v > cap]
    return total - sum(over) + cap * len(over)


def sparse_pairs(n: int, ctx: int, topk: int) -> int:
    """Sum over the chunk's queries at positions ctx..ctx+n-1 of min(position + 1, topk)."""
    lo, hi = ctx + 1, ctx + n  # keys visible to the first and last query
    if lo >= topk:
        return n * topk
    below = min(hi, topk - 1)  # queries seeing fewer than topk keys: lo..below
    ramp = (lo + below) * (below - lo + 1) // 2
    return ramp + (hi - below) * topk
