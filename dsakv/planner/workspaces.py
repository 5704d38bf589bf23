"""Process-wide workspaces outside the pages (docs/planner.md §5): the top-k index buffer and the indexer
logits budget with the row-chunk size it implies. Pure functions of sizes; nothing is allocated.

* top-k indices: ``max_num_batched_tokens x index_topk x 4`` B (int32), allocated once;
* indexer logits: fp32 ``[rows, cols]`` (rows = query tokens, cols = context length). Budget =
  ``min(0.3 x total, 0.2 x (memory outside mem_fraction_static), 0.2 x free)``; a logits tensor
  below ``LOGITS_CHECK_MIN_ELEMENTS`` is never checked; above the budget, query rows run in chunks
  of ``budget // (ceil(cols / 256) x 256 x 4)`` rows (the column count is padded to 256).

At planning time the free memory is not known; the planner takes it as the memory outside the
static fraction (weights and the pool fill the static part), unless the caller passes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dsakv.spec.layout import ceil_div

INDEX_BYTES = 4  # int32 top-k index
LOGIT_BYTES = 4  # fp32 logit
LOGITS_COL_ALIGN = 256
# SGLang's ``_MQA_LOGITS_STATIC_SKIP_ELEMS = 8_000_000`` (dsa_indexer.py): rows x cols below it are never chunked
LOGITS_CHECK_MIN_ELEMENTS = 8_000_000


def topk_buffer_bytes(max_batched_tokens: int, index_topk: int) -> int:
    """int32 top-k indices for every batched query token (16 MiB at 2,048 tokens x 2,048)."""
    return max_batched_tokens * index_topk * INDEX_BYTES


def logits_row_bytes(cols: int) -> int:
    """One fp32 logits row over ``cols`` keys (4 MiB at 1,048,576 columns)."""
    return cols * LOGIT_BYTES


def logits_budget_bytes(total_bytes: int, mem_fraction_static: float, free_bytes: int | None = None) -> int:
    """``min(0.3 x total, 0.2 x total x (1 - f), 0.2 x free)``, floored to whole bytes."""
    outside = total_bytes - total_bytes * Fraction(str(mem_fraction_static))
    free = outside if free_bytes is None else Fraction(free_bytes)
    return int(min(Fraction(3, 10) * total_bytes, Fraction(1, 5) * outside, Fraction(1, 5) * free))


def chunk_rows(budget_bytes: int, cols: int) -> int:
    """Query rows per chunk: ``budget // (ceil(cols / 256) x 256 x 4)`` (0 means not even one row fits)."""
    padded = ceil_div(cols, LOGITS_COL_ALIGN) * LOGITS_COL_ALIGN
    return budget_bytes // (padded * LOGIT_BYTES)


@dataclass(frozen=True)
class LogitsPlan:
    """How a ``[rows, cols]`` logits tensor is processed under a budget."""

    rows: int
    cols: int
    elements: int
    bytes: int
    budget_bytes: int
    checked: bool  # False below LOGITS_CHECK_MIN_ELEMENTS
    chunk_rows: int  # rows per chunk (== rows when no chunking is needed)
    chunks: int


def logits_plan(rows: int, cols: int, budget_bytes: int) -> LogitsPlan:
    """Chunking of ``rows`` query tokens scored against ``cols`` keys."""
    elements = rows * cols
    checked = elements >= LOGITS_CHECK_MIN_ELEMENTS
    per_chunk = (
        rows if not checked or elements * LOGIT_BYTES <= budget_bytes else max(chunk_rows(budget_bytes, cols), 1)
    )
    per_chunk = min(per_chunk, rows) if rows else 0
    chunks = ceil_div(rows, per_chunk) if per_chunk else 0
    return LogitsPlan(rows, cols, elements, elements * LOGIT_BYTES, budget_bytes, checked, per_chunk, chunks)


__all__ = [
    "LOGITS_CHECK_MIN_ELEMENTS",
    "LogitsPlan",
    "chunk_rows",
    "logits_budget_bytes",
    "logits_plan",
    "logits_row_bytes",
    "topk_buffer_bytes",
]
