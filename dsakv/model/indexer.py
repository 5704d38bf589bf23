"""Lightning indexer: score every visible context token, keep the top-k (DeepSeek-V3.2 semantics).

``I[t, s] = sum_j w[t, j] * relu(q[t, j] . k[s]) * k_scale[s]`` over indexer heads ``j`` (the stored fp8 key
dequantized by its positive scale, folded in after the head sum as the reference ``fp8_index`` does), with
columns ``s >= visible[t]`` masked (causal), then the top ``min(topk, visible[t])`` columns per row.

Selection rule (shared by the paged and dense paths of the model): a row keeps every column scoring above
its k-th largest score and, among columns scoring exactly the k-th score, the lowest positions. Indices come
back in ascending position order, padded with -1 to the common width ``min(topk, max(visible))``.

Logits budget (DESIGN.md section 3, sizes from ``dsakv.planner.workspaces``, shared with the planner): the fp32
``[rows, cols]`` logits of a prefill chunk can be huge (a 32K x 1M matrix is 128 GiB), so from 8 M elements
on, logits above the budget are scored in chunks of ``budget // (ceil(cols / 256) * 256 * 4)`` rows,
``budget = min(0.3 x total memory, 0.2 x memory outside mem_fraction_static, 0.2 x free memory)``. A row's
logits do not depend on the other rows in its chunk (the reference accumulates fp8 products exactly, the
Triton kernel scores each row in its own program), so chunking never changes the selection.

Nothing here mutates its inputs or any cache; keys are passed in already gathered (``TwinPool.read_indexer``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from dsakv.errors import DsakvError
from dsakv.kernels.indexer_kernels import indexer_logits_kernel
from dsakv.planner.workspaces import LOGITS_CHECK_MIN_ELEMENTS, logits_budget_bytes, logits_plan

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_KEY_DTYPES = (torch.float8_e4m3fn, *_FLOAT_DTYPES)


@dataclass(frozen=True)
class IndexerSelection:
    """Top-k context positions per query row.

    ``indices`` int64 ``[rows, width]``, ascending positions, -1 padded; ``counts[r] = min(topk, visible[r])``;
    ``rows_per_chunk`` and ``num_chunks`` record how the logits budget split the rows.
    """

    indices: torch.Tensor
    counts: torch.Tensor
    rows_per_chunk: int
    num_chunks: int

    @property
    def width(self) -> int:
        return self.indices.shape[1]


def device_logits_budget(device: torch.device | str, mem_fraction_static: float = 0.9) -> int:
    """The logits budget of a device (``dsakv.planner.workspaces.logits_budget_bytes``): CUDA memory from
    ``mem_get_info``, CPU from the host's physical and available memory."""
    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
    else:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        free = os.sysconf("SC_AVPHYS_PAGES") * page
    return logits_budget_bytes(total, mem_fraction_static, free)


def _check_inputs(q, weights, k, k_scale, visible) -> None:
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.dtype not in _KEY_DTYPES:
        raise DsakvError(f"indexer q: shape {_shape(q)} dtype {_dtype(q)}: must be [rows, heads, dim] fp8 or float")
    rows, heads, dim = q.shape
    if (
        not isinstance(weights, torch.Tensor)
        or tuple(weights.shape) != (rows, heads)
        or weights.dtype not in _FLOAT_DTYPES
    ):
        raise DsakvError(
            f"indexer weights: shape {_shape(weights)} dtype {_dtype(weights)}: must be [{rows}, {heads}] float"
        )
    if not isinstance(k, torch.Tensor) or k.dim() != 2 or k.shape[1] != dim or k.dtype not in _KEY_DTYPES:
        raise DsakvError(f"indexer k: shape {_shape(k)} dtype {_dtype(k)}: must be [cols, {dim}] fp8 or float")
    if not isinstance(k_scale, torch.Tensor) or tuple(k_scale.shape) != (k.shape[0],) or k_scale.dtype != torch.float32:
        raise DsakvError(
            f"indexer k_scale: shape {_shape(k_scale)} dtype {_dtype(k_scale)}: must be [{k.shape[0]}] float32"
        )
    if not isinstance(visible, torch.Tensor) or tuple(visible.shape) != (rows,) or visible.dtype.is_floating_point:
        raise DsakvError(f"indexer visible: shape {_shape(visible)} dtype {_dtype(visible)}: must be [{rows}] integer")
    if rows and (int(visible.min()) < 0 or int(visible.max()) > k.shape[0]):
        raise DsakvError(
            f"indexer visible: values {int(visible.min())}..{int(visible.max())}: must lie in 0..{k.shape[0]} (cols)"
        )


def _shape(x) -> object:
    return list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


def _dtype(x) -> object:
    return x.dtype if isinstance(x, torch.Tensor) else None


def indexer_logits(
    q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Validated fp32 logits ``[rows, cols]`` (-inf where masked); see the module docstring."""
    _check_inputs(q, weights, k, k_scale, visible)
    return indexer_logits_kernel(q, weights, k, k_scale, visible)


def select_topk(logits: torch.Tensor, counts: torch.Tensor, width: int) -> torch.Tensor:
    """Apply the selection rule to ``logits [rows, cols]``: ``counts[r]`` columns per row, -1 padded to width."""
    rows, cols = logits.shape
    out = torch.full((rows, width), -1, dtype=torch.int64, device=logits.device)
    if rows == 0 or width == 0:
        return out
    top = torch.topk(logits, width, dim=-1, sorted=True).values  # [rows, width]
    has = counts > 0
    kth = top.gather(1, (counts - 1).clamp(min=0).unsqueeze(1))  # [rows, 1]
    kth = torch.where(has.unsqueeze(1), kth, torch.full_like(kth, float("inf")))
    above = logits > kth
    tied = logits == kth
    need = counts.unsqueeze(1) - above.sum(dim=1, keepdim=True)
    keep = above | (tied & (tied.cumsum(dim=1) <= need))  # lowest positions win ties
    row, col = keep.nonzero(as_tuple=True)  # row-major: ascending column within a row
    start = torch.cumsum(counts, 0) - counts
    out[row, torch.arange(row.numel(), device=logits.device) - start[row]] = col
    return out


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    visible: torch.Tensor,
    topk: int,
    *,
    budget_bytes: int | None = None,
    mem_fraction_static: float = 0.9,
) -> IndexerSelection:
    """Score and select, in row chunks when the logits exceed the budget.

    ``topk`` larger than a row's visible context is clamped to it (not an error). ``budget_bytes``
    overrides the device budget (tests force chunking with it). Does not modify its inputs.
    """
    _check_inputs(q, weights, k, k_scale, visible)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise DsakvError(f"indexer topk = {topk!r}: must be a positive integer")
    rows, cols = q.shape[0], k.shape[0]
    visible = visible.to(device=q.device, dtype=torch.int64)
    counts = visible.clamp(max=topk)
    width = min(topk, int(visible.max())) if rows else 0
    if budget_bytes is None:
        big = rows * cols >= LOGITS_CHECK_MIN_ELEMENTS
        budget_bytes = device_logits_budget(q.device, mem_fraction_static) if big else 0
    step = max(logits_plan(rows, cols, budget_bytes).chunk_rows, 1)
    parts = []
    for r0 in range(0, rows, step):
        sl = slice(r0, r0 + step)
        logits = indexer_logits_kernel(q[sl], weights[sl], k, k_scale, visible[sl])
        parts.append(select_topk(logits, counts[sl], width))
    indices = torch.cat(parts) if parts else torch.empty(0, width, dtype=torch.int64, device=q.device)
    return IndexerSelection(indices, counts, step, len(parts))
