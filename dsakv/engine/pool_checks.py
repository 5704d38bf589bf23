"""Input validation for the twin pool: every check runs before any byte is written.

A slot is usable when its page is allocated or is a scratch page (ids below ``allocator.first_page``,
kept for padded writes); page-level operations (offload, restore) accept allocated pages only.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import numpy as np
import torch

from dsakv.cache.allocator import PageAllocator
from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class SlotChecker:
    """Turns caller input into validated long tensors on the pool device; reads the allocator only."""

    def __init__(self, layout: CacheLayout, allocator: PageAllocator, device: torch.device) -> None:
        self.layout = layout
        self.allocator = allocator
        self.device = device

    def layer(self, layer: int) -> int:
        n = self.layout.num_attention_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n:
            raise DsakvError(f"layer = {layer!r}: must be an attention layer id in 0..{n - 1}")
        return layer

    def indexer_layer(self, layer: int) -> int:
        self.layer(layer)
        if not self.layout.layer_has_indexer(layer):
            full = ", ".join(map(str, self.layout.indexer_layers)) or "none (the spec has no full indexer layer)"
            raise DsakvError(f"layer = {layer}: a shared indexer layer holds no indexer K; full layers: {full}")
        return layer

    def _ids(self, values: Sequence[int] | torch.Tensor, name: str) -> torch.Tensor:
        """``values`` as a 1-D int64 tensor, refusing anything that would be converted by truncation or
        wrap-around: floats, bools, None, ids outside int64 (each a ``DsakvError`` naming ``name``)."""
        if isinstance(values, torch.Tensor):
            t = values
        elif isinstance(values, np.ndarray):
            if values.dtype.kind not in "iu" or values.ndim != 1:
                raise DsakvError(
                    f"{name}: array of dtype {values.dtype} shape {values.shape}; must be a 1-D integer array"
                )
            if values.dtype.kind == "u" and values.size and int(values.max()) > INT64_MAX:
                raise DsakvError(f"{name}: id {int(values.max())} out of range; ids are at most {INT64_MAX}")
            t = torch.from_numpy(values.astype(np.int64))
        else:
            if isinstance(values, str | bytes) or not isinstance(values, Sequence):
                raise DsakvError(f"{name}: got {type(values).__name__}; must be a 1-D integer tensor or list of ids")
            for i, v in enumerate(values):
                if type(v) is not int and (isinstance(v, bool) or not isinstance(v, Integral)):
                    raise DsakvError(f"{name}[{i}] = {v!r}: must be an integer id, not {type(v).__name__}")
                if not INT64_MIN <= v <= INT64_MAX:
                    raise DsakvError(f"{name}[{i}] = {v}: out of range; ids lie in {INT64_MIN}..{INT64_MAX}")
            t = torch.tensor([int(v) for v in values], dtype=torch.long)
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool or t.dim() != 1:
            raise DsakvError(f"{name}: dtype {t.dtype} shape {tuple(t.shape)}; must be a 1-D integer tensor or list")
        if t.dtype == torch.uint64 and t.numel() and int(t.max()) > INT64_MAX:
            raise DsakvError(f"{name}: id {int(t.max())} out of range; ids are at most {INT64_MAX}")
        return t.to(torch.long)

    def page_is_writable(self, page: int) -> bool:
        """A page takes token writes when it is allocated or is a scratch page (below ``first_page``)."""
        if type(page) is not int and (isinstance(page, bool) or not isinstance(page, Integral)):
            raise DsakvError(f"page = {page!r}: must be an integer page id")
        return 0 <= page < self.allocator.first_page or self.allocator.is_allocated(page)

    def slots(self, values: Sequence[int] | torch.Tensor, name: str, distinct: bool = False) -> torch.Tensor:
        """Validated int64 slots on the pool device: in range, in writable pages, distinct if asked."""
        s = self._ids(values, name)
        if s.numel() == 0:
            return s.to(self.device)
        ps, end = self.layout.page_size, self.allocator.end_page
        lo, hi = int(s.min()), int(s.max())
        if lo < 0 or hi >= end * ps:
            bad = lo if lo < 0 else hi
            raise DsakvError(f"{name}: slot {bad} out of range; valid slots 0..{end * ps - 1}")
        for page in torch.unique(torch.div(s, ps, rounding_mode="floor")).tolist():
            if not self.page_is_writable(page):
                raise DsakvError(f"{name}: slot in page {page}, which is not allocated")
        if distinct and torch.unique(s).numel() != s.numel():
            raise DsakvError(f"{name}: a slot appears twice; each slot may be written once per call")
        return s.to(self.device)

    def pages(self, values: Sequence[int] | torch.Tensor, name: str) -> torch.Tensor:
        """Validated int64 page ids on the pool device: allocated (never scratch), distinct."""
        p = self._ids(values, name)
        for page in p.tolist():
            if not self.allocator.is_allocated(page):
                raise DsakvError(
                    f"{name}: page {page} is not allocated (allocated ids lie in "
                    f"{self.allocator.first_page}..{self.allocator.end_page - 1})"
                )
        if torch.unique(p).numel() != p.numel():
            raise DsakvError(f"{name}: a page id appears twice")
        return p.to(self.device)


def check_rows(x: torch.Tensor, name: str, n: int, dim: int, device: torch.device) -> torch.Tensor:
    """``x`` must be a floating tensor ``[n, dim]``; returned on ``device``."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dtype in _FP8_DTYPES:
        kind = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise DsakvError(f"{name}: {kind}; must be a float32, bfloat16 or float16 tensor")
    if tuple(x.shape) != (n, dim):
        raise DsakvError(f"{name}: shape {tuple(x.shape)}; must be ({n}, {dim}) (one row per slot)")
    return x.to(device)


_FP8_DTYPES = {torch.float8_e4m3fn, torch.float8_e5m2}
