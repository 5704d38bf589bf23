"""TwinPool: the physical storage of both caches of a DSA model under one page id.

Two layouts, same per-layer views (kernels see strides, never the layout)::

    slot   (SGLang)  main[l]    uint8 [P * page_size, row]  viewed [P, page_size, row]   every attention layer
                     indexer[l] uint8 [P, S * 132]          keys then scales             full layers only;
                                uint8 [0, S * 132]          placeholder                  shared layers
    packed (vLLM)    blocks     uint8 [P, page_bytes]       one block per page id:
                     | main l=0 | main l=1 | ... | main l=L-1 | indexer f0 | ... | indexer fF-1 |
                     0          ^ packed_main_offset(l)        ^ main_page_bytes = packed_indexer_offset(f0)

P = ``allocator.end_page`` physical pages, S = ``layout.indexer_states_per_page``. Page ids below
``allocator.first_page`` exist physically but are never handed out: they are scratch pages that accept
padded writes. ``TwinPool.for_pages`` builds the pool and its allocator with the one scratch-page rule,
``dsakv.planner.budget.scratch_pages`` (the planner's ``pool_capacity`` counts the same pages).

Mutation contract: ``store_*``, ``move_slots`` and ``restore_pages`` write only the addressed token rows /
pages of the listed layers; ``read_*`` and ``offload_pages`` do not modify the pool. Every method checks all
of its input (slots in range and in allocated or scratch pages, shapes, dtypes, layers) before writing and
raises ``DsakvError`` with the pool unchanged -- except ``CheckedSlots``, which ``validate_batch`` checked
once for a whole forward and which the pool trusts (the model's per-layer path). The pool never allocates or
frees pages: the caller holds the allocator. Moves and offloads act on every layer of both caches at once;
there is no per-cache variant. Not thread-safe: the caller serialises access (one engine step at a time).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsakv.cache.allocator import PageAllocator
from dsakv.engine.config import POOL_KINDS
from dsakv.engine.offload import HostPages, block_spans, host_buffer
from dsakv.engine.pool_checks import SlotChecker, check_rows
from dsakv.errors import DsakvError, check_choice
from dsakv.kernels import cache_ops
from dsakv.kernels.common import last_per_key
from dsakv.model.inputs import CheckedSlots, Slots
from dsakv.planner.budget import CUDA_GRAPH_PADDING_SLOTS, scratch_pages
from dsakv.spec.layout import CacheLayout

__all__ = ["POOL_KINDS", "TwinPool", "move_indexer_states"]


def move_indexer_states(
    index: Sequence[torch.Tensor], layout: CacheLayout, src: torch.Tensor, dst: torch.Tensor
) -> None:
    """Copy the indexer state of slot ``src[i]`` to ``dst[i]`` in every full layer of ``index`` (one uint8
    ``[pages, indexer_page_bytes_per_layer]`` buffer per attention layer, ``layout.page_size``-token pages): key
    bytes and scale bytes separately, sources read before any write; with ``index_kpool`` N > 1 a destination
    state receives the state of the last source mapped to it."""
    ps, kpool, states = layout.page_size, layout.index_kpool, layout.indexer_states_per_page
    sp, sst = src // ps, (src % ps) // kpool
    dp, dst_state = dst // ps, (dst % ps) // kpool
    if kpool > 1:
        keep = last_per_key(dp * states + dst_state)
        sp, sst, dp, dst_state = sp[keep], sst[keep], dp[keep], dst_state[keep]
    key_dim = layout.indexer_key_bytes
    src_cols = torch.cat(cache_ops.indexer_columns(sst, states, key_dim), dim=1)
    dst_cols = torch.cat(cache_ops.indexer_columns(dst_state, states, key_dim), dim=1)
    full = [index[f] for f in layout.indexer_layers]
    entries = [ix[sp.unsqueeze(1), src_cols] for ix in full]
    for ix, e in zip(full, entries):
        ix[dp.unsqueeze(1), dst_cols] = e


class TwinPool:
    """Main-KV and indexer-K storage for ``allocator.end_page`` pages, allocated once at construction."""

    def __init__(
        self,
        layout: CacheLayout,
        allocator: PageAllocator,
        kind: str = "slot",
        device: str | torch.device = "cpu",
        fp8_scale: float | Sequence[float] = 1.0,
    ) -> None:
        check_choice("pool kind", kind, POOL_KINDS)
        if not isinstance(layout, CacheLayout):
            raise DsakvError(f"layout = {layout!r}: must be a CacheLayout")
        if not isinstance(allocator, PageAllocator):
            raise DsakvError(f"allocator = {allocator!r}: must be a PageAllocator")
        if allocator.page_size != layout.page_size:
            raise DsakvError(
                f"allocator.page_size = {allocator.page_size}: the layout serves page_size = {layout.page_size}"
            )
        scales = [float(fp8_scale)] * layout.num_attention_layers if isinstance(fp8_scale, int | float) else fp8_scale
        scales = [float(s) for s in scales]
        if len(scales) != layout.num_attention_layers or not all(s > 0 for s in scales):
            raise DsakvError(
                f"fp8_scale = {fp8_scale!r}: one positive float, or one per attention layer "
                f"({layout.num_attention_layers})"
            )
        self.layout = layout
        self.rank_layout = layout
        self.dcp = 1  # one rank holds every token (``DcpPool``: a DCP group)
        self.allocator = allocator
        self.kind = kind
        self.device = torch.device(device)
        self.fp8_scales = tuple(scales)
        self._key_dtype = torch.float32 if layout.indexer_dtype == "fp32" else cache_ops.FP8
        self.num_physical_pages = allocator.end_page
        self._checker = SlotChecker(layout, allocator, self.device)
        P, ps, ipb = self.num_physical_pages, layout.page_size, layout.indexer_page_bytes_per_layer
        u8 = dict(dtype=torch.uint8, device=self.device)
        self._blocks: torch.Tensor | None = None
        if kind == "packed":
            self._blocks = torch.zeros((P, layout.page_bytes), **u8)
            mpb = layout.main_page_bytes_per_layer
            self._main = [
                self._blocks[:, o : o + mpb].view(P, ps, layout.main_row_bytes)
                for o in map(layout.packed_main_offset, range(layout.num_attention_layers))
            ]
            self._index = [
                self._blocks[:, layout.packed_indexer_offset(lay) : layout.packed_indexer_offset(lay) + ipb]
                if layout.layer_has_indexer(lay)
                else torch.zeros((0, ipb), **u8)
                for lay in range(layout.num_attention_layers)
            ]
        else:
            self._main = [
                torch.zeros((P * ps, layout.main_row_bytes), **u8).view(P, ps, layout.main_row_bytes)
                for _ in range(layout.num_attention_layers)
            ]
            self._index = [
                torch.zeros((P if layout.layer_has_indexer(lay) else 0, ipb), **u8)
                for lay in range(layout.num_attention_layers)
            ]

    @classmethod
    def for_pages(
        cls,
        layout: CacheLayout,
        num_pages: int,
        *,
        padding_slots: int = CUDA_GRAPH_PADDING_SLOTS,
        kind: str = "slot",
        device: str | torch.device = "cpu",
        fp8_scale: float | Sequence[float] = 1.0,
    ) -> TwinPool:
        """A pool and its allocator: ``num_pages`` pages to hand out after ``scratch_pages(page_size,
        padding_slots)`` scratch pages (ids ``0 .. first_page - 1``).

        The default padding is a CUDA serving engine's, so ``for_pages(layout, pool_capacity(layout, ...).num_pages)``
        holds exactly the planner's ``physical_pages`` and ``pool_bytes``; the engine passes its own padding.
        """
        first = scratch_pages(layout.page_size, padding_slots)
        return cls(layout, PageAllocator(num_pages, layout.page_size, first_page=first), kind, device, fp8_scale)

    def page_is_writable(self, page: int) -> bool:
        """True for allocated pages and scratch pages; the one rule every slot check of the pool uses."""
        return self._checker.page_is_writable(page)

    def _slots(self, slots: Slots, name: str, distinct: bool = False) -> torch.Tensor:
        """Checked int64 slots on the pool device; ``CheckedSlots`` (``validate_batch``'s) pass as they are."""
        if isinstance(slots, CheckedSlots):
            return slots.tensor
        return self._checker.slots(slots, name, distinct=distinct)

    @property
    def nbytes(self) -> int:
        """Device bytes of both caches (== num_physical_pages * layout.page_bytes)."""
        return sum(t.numel() for t in self._main) + sum(t.numel() for t in self._index)

    # ----- views ---------------------------------------------------------------------------------
    def main_view(self, layer: int) -> torch.Tensor:
        """uint8 ``[num_physical_pages, page_size, main_row_bytes]`` view of one layer (writes go to the pool).

        For kernels and inspection: copying tokens or pages through the views would move one cache without
        the other; ``move_slots`` / ``offload_pages`` / ``restore_pages`` are the lockstep operations.
        """
        return self._main[self._checker.layer(layer)]

    def indexer_view(self, layer: int) -> torch.Tensor:
        """uint8 ``[num_physical_pages, indexer_page_bytes_per_layer]``; 0 rows for a shared layer."""
        return self._index[self._checker.layer(layer)]

    # ----- store / read --------------------------------------------------------------------------
    def store_main(self, layer: int, slots: Slots, latent: torch.Tensor, rope: torch.Tensor) -> None:
        """Quantize and write the main-KV row of each slot in ``layer``. Slots must be distinct."""
        layer = self._checker.layer(layer)
        s = self._slots(slots, "slots", distinct=True)
        spec = self.layout.spec
        latent = check_rows(latent, "latent", len(s), spec.kv_lora_rank, self.device)
        rope = check_rows(rope, "rope", len(s), spec.qk_rope_head_dim, self.device)
        if len(s):
            cache_ops.store_main(self._main[layer], s, latent, rope, self.layout.kv_dtype, self.fp8_scales[layer])

    def read_main(self, layer: int, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized (latent fp32 ``[n, kv_lora_rank]``, rope fp32 ``[n, rope_dim]``). Does not modify the pool."""
        layer = self._checker.layer(layer)
        s = self._slots(slots, "slots")
        spec = self.layout.spec
        return cache_ops.gather_main(
            self._main[layer], s, self.layout.kv_dtype, spec.kv_lora_rank, spec.qk_rope_head_dim, self.fp8_scales[layer]
        )

    def main_shards(self, layer: int) -> int:
        """Ranks a layer's main KV is split over: one (``DcpPool`` splits the model's layers over DCP ranks)."""
        self._checker.layer(layer)
        return 1

    def read_main_rank(self, layer: int, rank: int, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """``read_main`` of rank 0, the only rank."""
        if rank != 0:
            raise DsakvError(f"rank = {rank!r}: a TwinPool is one rank (0)")
        return self.read_main(layer, slots)

    def store_indexer(self, layer: int, slots: Slots, key: torch.Tensor) -> None:
        """Quantize each key to fp8 + one fp32 scale into its page's key and scale areas (full layers only).

        With ``index_kpool`` N > 1 the state of a group of N tokens holds the last stored token's key.
        """
        layer = self._checker.indexer_layer(layer)
        s = self._slots(slots, "slots", distinct=True)
        key = check_rows(key, "key", len(s), self.layout.spec.index_head_dim, self.device)
        if len(s):
            cache_ops.store_indexer(
                self._index[layer], s, key, self.layout.page_size, self.layout.index_kpool, self._key_dtype
            )

    def read_indexer(self, layer: int, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw (fp8 key ``[n, index_head_dim]``, fp32 scale ``[n]``) of each slot. Does not modify the pool."""
        layer = self._checker.indexer_layer(layer)
        s = self._slots(slots, "slots")
        lay = self.layout
        return cache_ops.gather_indexer(
            self._index[layer], s, lay.page_size, lay.spec.index_head_dim, lay.index_kpool, self._key_dtype
        )

    def read_indexer_dequant(self, layer: int, slots: Slots) -> torch.Tensor:
        """fp32 keys ``[n, index_head_dim]`` (fp8 key x scale). Does not modify the pool."""
        key, scale = self.read_indexer(layer, slots)
        return key.float() * scale.unsqueeze(1)

    # ----- lockstep moves ------------------------------------------------------------------------
    def move_slots(self, src_slots: Sequence[int] | torch.Tensor, dst_slots: Sequence[int] | torch.Tensor) -> None:
        """Copy token ``src[i]`` to ``dst[i]`` in every layer of both caches (main row, indexer key, scale).

        All sources are read before any destination is written, so overlapping ranges shift correctly.
        Destinations must be distinct; other tokens of the touched pages are left untouched. With
        ``index_kpool`` N > 1 a destination state receives the state of the last source mapped to it.
        """
        src = self._checker.slots(src_slots, "src_slots")
        dst = self._checker.slots(dst_slots, "dst_slots", distinct=True)
        if len(src) != len(dst):
            raise DsakvError(f"dst_slots: {len(dst)} slots; must match the {len(src)} src_slots")
        if not len(src):
            return
        ps = self.layout.page_size
        sp, so = src // ps, src % ps
        dp, do = dst // ps, dst % ps
        rows = [m[sp, so] for m in self._main]  # gather every layer before writing any
        for m, r in zip(self._main, rows):
            m[dp, do] = r
        move_indexer_states(self._index, self.layout, src, dst)

    def offload_pages(self, pages: Sequence[int]) -> HostPages:
        """Copy both caches of ``pages`` to host. Does not modify the pool or the allocator."""
        idx = self._checker.pages(pages, "pages")
        host = host_buffer(len(idx), self.layout.page_bytes, self.device)
        self._copy_out(idx, host, torch.arange(len(idx)))
        return HostPages(self.layout, tuple(int(p) for p in idx.tolist()), host, self.fp8_scales)

    def restore_pages(self, host: HostPages, pages: Sequence[int]) -> None:
        """Write both caches of ``host`` into ``pages`` (allocated, distinct), bit-exact."""
        if not isinstance(host, HostPages):
            raise DsakvError(f"host: got {type(host).__name__}; must be the HostPages that offload_pages returned")
        if host.layout != self.layout:
            raise DsakvError("host: HostPages were taken with a different layout; restore needs the same layout")
        if host.fp8_scales is not None and host.fp8_scales != self.fp8_scales:
            raise DsakvError(
                f"host: HostPages were taken with fp8_scale {host.fp8_scales}; this pool reads {self.fp8_scales}"
            )
        host.check()
        idx = self._checker.pages(pages, "pages")
        if len(idx) != host.num_pages:
            raise DsakvError(f"pages: {len(idx)} page ids; host holds {host.num_pages} pages")
        self._copy_in(host.blocks, torch.arange(len(idx)), idx)

    def copy_pages_to_host(self, pages: Sequence[int], dest: torch.Tensor, rows: Sequence[int]) -> None:
        """Both caches of ``pages[i]`` into row ``rows[i]`` of ``dest`` (a host uint8 ``[n, page_bytes]`` buffer of
        packed blocks, e.g. the host tier's), without a temporary copy. Does not modify the pool."""
        idx = self._checker.pages(pages, "pages")
        self._copy_out(idx, dest, self._host_rows(dest, rows, len(idx)))

    def copy_pages_from_host(self, src: torch.Tensor, rows: Sequence[int], pages: Sequence[int]) -> None:
        """Row ``rows[i]`` of the host buffer ``src`` (packed blocks of this pool's layout) into ``pages[i]``
        (allocated, distinct), both caches, bit-exact."""
        idx = self._checker.pages(pages, "pages")
        self._copy_in(src, self._host_rows(src, rows, len(idx)), idx)

    def _host_rows(self, buf: torch.Tensor, rows: Sequence[int], n: int) -> torch.Tensor:
        width = self.layout.page_bytes
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 2 or buf.shape[1] != width:
            raise DsakvError(f"host buffer: must be a host uint8 tensor [n, {width}] (packed blocks of both caches)")
        if buf.device.type != "cpu":
            raise DsakvError(f"host buffer: on {buf.device}; must be on the host")
        r = torch.as_tensor(list(rows), dtype=torch.long)
        if len(r) != n or (n and (int(r.min()) < 0 or int(r.max()) >= buf.shape[0])):
            raise DsakvError(f"rows: {list(rows)} must be {n} row indices in 0..{buf.shape[0] - 1}")
        return r

    def _copy_out(self, idx: torch.Tensor, dest: torch.Tensor, rows: torch.Tensor) -> None:
        if self.device.type == "cpu":
            for row, page in zip(rows.tolist(), idx.tolist()):
                for src, off, length in self._page_spans(page):
                    dest[row, off : off + length].copy_(src)
            return
        if self._blocks is not None:
            dest[rows] = self._blocks[idx].cpu()
            return
        for cache, layer, off, length in block_spans(self.layout):
            view = self._main[layer] if cache == "main" else self._index[layer]
            dest[rows, off : off + length] = view[idx].reshape(len(idx), length).cpu()

    def _copy_in(self, src: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor) -> None:
        if self.device.type == "cpu":
            for row, page in zip(rows.tolist(), idx.tolist()):
                for dst, off, length in self._page_spans(page):
                    dst.copy_(src[row, off : off + length])
            return
        blocks = src[rows].to(self.device, non_blocking=True)
        if self._blocks is not None:
            self._blocks[idx] = blocks
        else:
            for cache, layer, off, length in block_spans(self.layout):
                view = self._main[layer] if cache == "main" else self._index[layer]
                view[idx] = blocks[:, off : off + length].reshape((len(idx),) + tuple(view.shape[1:]))
        torch.cuda.synchronize(self.device)  # the caller's next forward reads these pages

    def _page_spans(self, page: int) -> list[tuple[torch.Tensor, int, int]]:
        """(flat uint8 view of one page of one layer and cache, offset, length in the packed block) of ``page``.

        On the CPU a page copy is one contiguous copy per span (memcpy speed); torch's indexed gather /
        scatter of whole rows runs at a fraction of that there (bench/store.py measures both)."""
        if self._blocks is not None:
            return [(self._blocks[page], 0, self.layout.page_bytes)]
        return [
            ((self._main[layer] if cache == "main" else self._index[layer])[page].view(-1), off, length)
            for cache, layer, off, length in block_spans(self.layout)
        ]

    # ----- invariants ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Allocator consistent; every buffer has the shape, dtype and device the layout implies."""
        self.allocator.check_integrity()
        lay, P = self.layout, self.num_physical_pages
        if P != self.allocator.end_page:
            raise AssertionError(f"pool: {P} physical pages but allocator ends at {self.allocator.end_page}")
        for layer in range(lay.num_attention_layers):
            m, ix = self._main[layer], self._index[layer]
            if tuple(m.shape) != (P, lay.page_size, lay.main_row_bytes) or m.dtype != torch.uint8:
                raise AssertionError(f"pool: main view of layer {layer} has shape {tuple(m.shape)}")
            rows = P if lay.layer_has_indexer(layer) else 0
            if tuple(ix.shape) != (rows, lay.indexer_page_bytes_per_layer) or ix.dtype != torch.uint8:
                raise AssertionError(f"pool: indexer view of layer {layer} has shape {tuple(ix.shape)}")
            if m.device != self.device or ix.device != self.device:
                raise AssertionError(f"pool: layer {layer} buffers are not on {self.device}")
        if self.nbytes != P * lay.page_bytes:
            raise AssertionError(f"pool: {self.nbytes} bytes; layout says {P} x {lay.page_bytes}")
