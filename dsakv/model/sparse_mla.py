"""Sparse MLA over the indexer's selection, in absorbed form (attention in the latent space).

The paged path reads only the main-KV rows the selection names: :func:`compact_selection` turns the
per-row selected positions into the set of distinct positions to read (one ``TwinPool.read_main`` of
exactly those slots) and row-local indices into that set; :func:`sparse_mla` then attends each query row
to its selected rows (math in ``dsakv.kernels.sparse_mla_kernels``). A decode row selecting
``min(topk, visible)`` positions therefore reads exactly that many main rows per layer.

Neither function modifies its inputs or any cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsakv.errors import DsakvError
from dsakv.kernels.sparse_mla_kernels import sparse_mla_kernel

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class CompactSelection:
    """``positions``: distinct selected context positions, ascending ``[N]``; ``local``: ``[T, K]``
    indices into ``positions`` (-1 kept as padding)."""

    positions: torch.Tensor
    local: torch.Tensor


def compact_selection(indices: torch.Tensor) -> CompactSelection:
    """Deduplicate the positions selected by any row (what must be read from the main cache)."""
    valid = indices >= 0
    positions = torch.unique(indices[valid])  # sorted
    local = torch.searchsorted(positions, indices.clamp(min=0))
    return CompactSelection(positions, torch.where(valid, local, torch.full_like(local, -1)))


def _fail(name: str, x, want: str) -> DsakvError:
    got = f"shape {list(x.shape)} dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
    return DsakvError(f"sparse_mla {name}: {got}: must be {want}")


def sparse_mla(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    topk_idx: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Attend ``q [T, H, R] / [T, H, P]`` to rows ``topk_idx [T, K]`` of ``latent [N, R]`` / ``rope [N, P]``.

    Returns the latent-space output ``[T, H, R]`` (fp32, or fp64 from the torch reference on fp64 queries;
    apply ``W_uv`` for the value heads).
    """
    if not isinstance(q_latent, torch.Tensor) or q_latent.dim() != 3 or q_latent.dtype not in _FLOATS:
        raise _fail("q_latent", q_latent, "[tokens, heads, kv_lora_rank] float")
    t, h, r = q_latent.shape
    if (
        not isinstance(q_rope, torch.Tensor)
        or q_rope.dim() != 3
        or q_rope.shape[:2] != (t, h)
        or q_rope.dtype not in _FLOATS
    ):
        raise _fail("q_rope", q_rope, f"[{t}, {h}, rope_dim] float")
    p = q_rope.shape[2]
    if not isinstance(latent, torch.Tensor) or latent.dim() != 2 or latent.shape[1] != r or latent.dtype not in _FLOATS:
        raise _fail("latent", latent, f"[rows, {r}] float")
    n = latent.shape[0]
    if not isinstance(rope, torch.Tensor) or tuple(rope.shape) != (n, p) or rope.dtype not in _FLOATS:
        raise _fail("rope", rope, f"[{n}, {p}] float")
    if (
        not isinstance(topk_idx, torch.Tensor)
        or topk_idx.dim() != 2
        or topk_idx.shape[0] != t
        or topk_idx.dtype.is_floating_point
    ):
        raise _fail("topk_idx", topk_idx, f"[{t}, k] integer")
    if topk_idx.numel() and (int(topk_idx.min()) < -1 or int(topk_idx.max()) >= n):
        raise DsakvError(
            f"sparse_mla topk_idx: values {int(topk_idx.min())}..{int(topk_idx.max())}: must lie in -1..{n - 1}"
        )
    return sparse_mla_kernel(q_latent, q_rope, latent, rope, topk_idx.to(torch.int64), sm_scale)
