"""DcpPool: the twin cache of one decode-context-parallel (DCP) group of ``dcp`` ranks, emulated in one process
(each rank its own tensors), behind the same interface as ``TwinPool``.

One page id space (SGLang: ``PagedTokenToKVPoolAllocator(size x dcp, page_size x dcp)``): a page id names
``V = page_size x dcp`` tokens of a sequence, and a slot ``v = page x V + o`` is a token of the group::

    main KV (sharded)      token o of a page lives on rank  o % dcp,  row  o // dcp  of that rank's page
                           rank r: main[l] uint8 [P, page_size, row]              (SGLang: loc % dcp == rank)
    indexer K (replicated) every rank holds every token's key, indexed by the group slot v with 64-token
                           physical pages: index[l] uint8 [P x dcp, S x 132]   (page v // page_size)
    MTP / draft layers     replicated whole (the draft worker's pools are not DCP-sharded): main[l] uint8
                           [P, V, row] on every rank

so the indexer buffer of a rank spans ``P x dcp`` physical pages: ``index_buf_size = (size + page_size) x dcp
- page_size`` token slots for ``size = (P - 1) x page_size`` main slots (``dsakv.planner.budget.index_buf_size``).

Layouts. ``slot`` (SGLang): one buffer per layer and rank, as above. ``packed`` (vLLM): DCP makes the main KV
``dcp_sharded`` and the indexer not, so they are two KV-cache groups, each with its own blocks and block
table: group ``main`` one block per page id (every attention layer's ``page_size`` rank rows), group
``indexer`` one block per 64-token physical page (every full layer's indexer page), ``dcp`` blocks per page
id (``block_tables``). A prefix hit is the minimum over the groups (``hit_tokens``); both are addressed by
the one page id, so allocation, eviction, offload and tiers keep them in step.

A host copy of a page (offload, host tier, store) is one block in the packed byte order of ``layout`` (the
*group* layout: ``page_size x dcp`` tokens a page), gathered from every rank's share: main rows in token
order, then each full layer's indexer page with all keys before all scales. It is byte for byte the block a
DCP-1 pool of page size ``V`` holds for the same tokens, so copies move between the two.

Mutation and checking contract: as ``TwinPool`` (every call checks its input before writing; ``CheckedSlots``
are trusted). Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from dsakv.cache.allocator import PageAllocator
from dsakv.engine.config import POOL_KINDS
from dsakv.engine.pool import TwinPool, move_indexer_states
from dsakv.engine.pool_checks import SlotChecker, check_rows
from dsakv.engine.pool_dcp_copies import DcpPageCopies
from dsakv.errors import DsakvError, check_choice
from dsakv.kernels import cache_ops
from dsakv.model.inputs import CheckedSlots, Slots
from dsakv.planner.budget import CUDA_GRAPH_PADDING_SLOTS, RankCell, index_buf_pages, scratch_pages
from dsakv.planner.deployment import check_int
from dsakv.spec.layout import CacheLayout

__all__ = ["DcpPool", "KVCacheGroup", "group_layout", "pool_for_pages"]


def pool_for_pages(
    layout: CacheLayout,
    num_pages: int,
    *,
    dcp: int = 1,
    padding_slots: int = CUDA_GRAPH_PADDING_SLOTS,
    kind: str = "slot",
    device: str | torch.device = "cpu",
    dcp_replicated: bool = False,
) -> TwinPool | DcpPool:
    """The pool of one rank (``dcp = 1``: a ``TwinPool``) or of a DCP group, with ``num_pages`` page ids to hand
    out: for ``pool_capacity(layout, ..., dcp=dcp, dcp_replicated=...).num_pages`` it holds exactly the planner's
    ``pool_bytes`` on each rank."""
    check_int("dcp", dcp, 1)
    if dcp == 1:
        if dcp_replicated is not False:
            raise DsakvError(f"dcp_replicated = {dcp_replicated!r}: only meaningful with dcp > 1")
        return TwinPool.for_pages(layout, num_pages, padding_slots=padding_slots, kind=kind, device=device)
    return DcpPool.for_pages(
        layout, num_pages, dcp, padding_slots=padding_slots, kind=kind, device=device, replicated=dcp_replicated
    )


def group_layout(rank_layout: CacheLayout, dcp: int) -> CacheLayout:
    """The layout of the group's pages as the allocator, radix tree and host copies see them: ``page_size x dcp``
    tokens a page, every other field the rank layout's."""
    check_int("dcp", dcp, 1)
    if dcp == 1:
        return rank_layout
    return replace(rank_layout, page_size=rank_layout.page_size * dcp, allow_any_page_size=True)


@dataclass(frozen=True)
class KVCacheGroup:
    """One KV-cache group of the packed layout: its name, tokens a block spans, bytes of one block on one
    rank, blocks per page id, and whether its tokens are split over the DCP ranks."""

    name: str
    block_tokens: int
    block_bytes: int
    blocks_per_page: int
    dcp_sharded: bool


class DcpPool(DcpPageCopies):
    """Both caches of a DCP group: ``dcp`` ranks' tensors for ``allocator.end_page`` page ids."""

    def __init__(
        self,
        rank_layout: CacheLayout,
        allocator: PageAllocator,
        dcp: int,
        kind: str = "slot",
        device: str | torch.device = "cpu",
        replicated: bool = False,
    ) -> None:
        check_choice("pool kind", kind, POOL_KINDS)
        check_int("dcp", dcp, 2)
        if not isinstance(replicated, bool):
            raise DsakvError(f"dcp_replicated = {replicated!r}: must be True or False")
        self.replicated = replicated
        if not isinstance(rank_layout, CacheLayout):
            raise DsakvError(f"layout = {rank_layout!r}: must be a CacheLayout")
        self.layout = group_layout(rank_layout, dcp)
        if allocator.page_size != self.layout.page_size:
            raise DsakvError(
                f"allocator.page_size = {allocator.page_size}: a DCP {dcp} page holds page_size x dcp = "
                f"{self.layout.page_size} tokens"
            )
        self.rank_layout, self.dcp, self.kind, self.allocator = rank_layout, dcp, kind, allocator
        self.device = torch.device(device)
        self.fp8_scales = (1.0,) * rank_layout.num_attention_layers
        self._key_dtype = torch.float32 if rank_layout.indexer_dtype == "fp32" else cache_ops.FP8
        self.num_physical_pages = allocator.end_page
        self._checker = SlotChecker(self.layout, allocator, self.device)
        self._blocks: list[tuple[torch.Tensor, torch.Tensor]] = []  # packed: per rank (main group, indexer group)
        self._main: list[list[torch.Tensor]] = []  # [rank][layer]
        self._index: list[list[torch.Tensor]] = []
        for _ in range(dcp):
            main, index = self._rank_buffers()
            self._main.append(main)
            self._index.append(index)

    @classmethod
    def for_pages(
        cls,
        rank_layout: CacheLayout,
        num_pages: int,
        dcp: int,
        *,
        padding_slots: int = CUDA_GRAPH_PADDING_SLOTS,
        kind: str = "slot",
        device: str | torch.device = "cpu",
        replicated: bool = False,
    ) -> DcpPool:
        """A DCP pool and its allocator: ``num_pages`` page ids to hand out after the scratch pages."""
        tokens = rank_layout.page_size * dcp
        alloc = PageAllocator(num_pages, tokens, first_page=scratch_pages(tokens, padding_slots))
        return cls(rank_layout, alloc, dcp, kind, device, replicated)

    # ----- buffers -------------------------------------------------------------------------------
    def main_shards(self, layer: int) -> int:
        """Ranks a layer's main KV is split over: ``dcp`` for the model's layers, 1 for MTP (draft) layers and
        for every layer of a ``replicated`` pool."""
        model_layer = self._checker.layer(layer) < self.layout.spec.num_hidden_layers
        return self.dcp if model_layer and not self.replicated else 1

    @property
    def index_buf_pages(self) -> int:
        """Physical (``page_size``-token) indexer pages of one rank and layer, by SGLang's ``index_buf_size``:
        for ``size = (P - 1) x page_size`` rank slots when the main KV is sharded, for ``size = (P - 1) x V``
        group slots in pages of ``V`` tokens (``dcp`` physical pages each) when the pool is replicated; both
        come to ``P x dcp``."""
        P, ps, d = self.num_physical_pages, self.rank_layout.page_size, self.dcp
        if self.replicated:
            return index_buf_pages((P - 1) * ps * d, ps * d, d, dcp_replicated=True) * d
        return index_buf_pages((P - 1) * ps, ps, d)

    def _main_rows(self, layer: int) -> int:
        return self.rank_layout.page_size * (self.dcp // self.main_shards(layer))

    def _rank_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        lay, P, ix = self.rank_layout, self.num_physical_pages, self.index_buf_pages
        u8 = dict(dtype=torch.uint8, device=self.device)
        row, ipb = lay.main_row_bytes, lay.indexer_page_bytes_per_layer
        layers = range(lay.num_attention_layers)
        if self.kind == "slot":
            main = [torch.zeros((P, self._main_rows(la), row), **u8) for la in layers]
            index = [torch.zeros((ix if lay.layer_has_indexer(la) else 0, ipb), **u8) for la in layers]
            return main, index
        widths = [self._main_rows(la) * row for la in layers]
        main_blocks = torch.zeros((P, sum(widths)), **u8)  # group "main": one block per page id
        index_blocks = torch.zeros((ix, ipb * lay.num_indexer_layers), **u8)  # group "indexer": per 64 tokens
        self._blocks.append((main_blocks, index_blocks))
        offsets = [sum(widths[:la]) for la in layers]
        main = [main_blocks[:, o : o + w].view(P, w // row, row) for o, w in zip(offsets, widths)]
        index = [torch.zeros((0, ipb), **u8) for _ in layers]  # shared layers: a 0-row placeholder
        for j, la in enumerate(lay.indexer_layers):
            index[la] = index_blocks[:, j * ipb : (j + 1) * ipb]
        return main, index

    @property
    def groups(self) -> tuple[KVCacheGroup, ...]:
        """The packed layout's KV-cache groups (the slot layout stores the same bytes per layer)."""
        cell = RankCell(self.rank_layout, self.dcp, self.replicated)
        ps = self.rank_layout.page_size
        return (
            KVCacheGroup("main", ps * self.dcp, cell.main_page_bytes, 1, not self.replicated),
            KVCacheGroup("indexer", ps, self.rank_layout.indexer_page_bytes, self.dcp, False),
        )

    def block_tables(self, pages: Sequence[int]) -> tuple[list[int], list[int]]:
        """Each group's block table of a page table: the main group's blocks are the page ids, the indexer
        group's the ``dcp`` physical pages ``p x dcp + j`` of each."""
        pages = [int(p) for p in pages]
        return pages, [p * self.dcp + j for p in pages for j in range(self.dcp)]

    def hit_tokens(self, cached_pages: Sequence[int]) -> int:
        """Tokens a prefix of cached pages serves: the minimum over the groups of blocks x block tokens."""
        tables = self.block_tables(cached_pages)
        return min(len(t) * g.block_tokens for t, g in zip(tables, self.groups))

    @property
    def nbytes(self) -> int:
        """Device bytes of every rank (``dcp x rank_nbytes``)."""
        return self.dcp * self.rank_nbytes

    @property
    def rank_nbytes(self) -> int:
        """Device bytes of one rank's share (== ``num_physical_pages x RankCell(rank_layout, dcp).page_bytes``
        without MTP layers)."""
        return sum(t.numel() for t in self._main[0]) + sum(t.numel() for t in self._index[0])

    def page_is_writable(self, page: int) -> bool:
        return self._checker.page_is_writable(page)

    def rank_main_view(self, rank: int, layer: int) -> torch.Tensor:
        """uint8 ``[P, rows, main_row_bytes]`` of one rank and layer (rows = page_size, or V when replicated)."""
        return self._main[self._rank(rank)][self._checker.layer(layer)]

    def rank_indexer_view(self, rank: int, layer: int) -> torch.Tensor:
        """uint8 ``[P x dcp, indexer_page_bytes_per_layer]`` of one rank (0 rows for a shared layer)."""
        return self._index[self._rank(rank)][self._checker.layer(layer)]

    def _rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.dcp:
            raise DsakvError(f"rank = {rank!r}: must be a DCP rank in 0..{self.dcp - 1}")
        return rank

    # ----- store / read --------------------------------------------------------------------------
    def _slots(self, slots: Slots, name: str, distinct: bool = False) -> torch.Tensor:
        if isinstance(slots, CheckedSlots):
            return slots.tensor
        return self._checker.slots(slots, name, distinct=distinct)

    def _split(self, layer: int, s: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """(rank, positions into ``s``, rank-local slots) for every rank holding some of ``s`` in ``layer``."""
        V = self.layout.page_size
        if self.main_shards(layer) == 1:
            return [(r, torch.arange(len(s), device=s.device), s) for r in range(self.dcp)]
        page, off = torch.div(s, V, rounding_mode="floor"), s % V
        rank = off % self.dcp
        local = page * self.rank_layout.page_size + torch.div(off, self.dcp, rounding_mode="floor")
        out = []
        for r in range(self.dcp):
            idx = (rank == r).nonzero().flatten()
            out.append((r, idx, local[idx]))
        return out

    def store_main(self, layer: int, slots: Slots, latent: torch.Tensor, rope: torch.Tensor) -> None:
        """Write each token's main row on the rank that owns it (every rank for a replicated layer)."""
        layer = self._checker.layer(layer)
        s = self._slots(slots, "slots", distinct=True)
        spec = self.rank_layout.spec
        latent = check_rows(latent, "latent", len(s), spec.kv_lora_rank, self.device)
        rope = check_rows(rope, "rope", len(s), spec.qk_rope_head_dim, self.device)
        for r, idx, local in self._split(layer, s):
            if len(idx):
                cache_ops.store_main(self._main[r][layer], local, latent[idx], rope[idx], self.layout.kv_dtype)

    def read_main(self, layer: int, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized rows of ``slots``, each read from the rank that owns it. Does not modify the pool."""
        layer = self._checker.layer(layer)
        s = self._slots(slots, "slots")
        spec = self.rank_layout.spec
        latent = torch.empty((len(s), spec.kv_lora_rank), dtype=torch.float32, device=self.device)
        rope = torch.empty((len(s), spec.qk_rope_head_dim), dtype=torch.float32, device=self.device)
        parts = self._split(layer, s)[: self.main_shards(layer)]  # a replicated layer: rank 0 serves it
        for r, idx, local in parts:
            latent[idx], rope[idx] = self._gather(r, layer, local)
        return latent, rope

    def read_main_rank(self, layer: int, rank: int, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of ``slots`` that rank ``rank`` holds, in order (the rank's partial attention reads these);
        a slot another rank owns is refused."""
        layer, rank = self._checker.layer(layer), self._rank(rank)
        s = self._slots(slots, "slots")
        r, idx, local = self._split(layer, s)[rank]
        if len(idx) != len(s):
            raise DsakvError(f"slots: {len(s) - len(idx)} of them live on another DCP rank than {rank}")
        return self._gather(rank, layer, local)

    def _gather(self, rank: int, layer: int, local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spec = self.rank_layout.spec
        return cache_ops.gather_main(
            self._main[rank][layer], local, self.layout.kv_dtype, spec.kv_lora_rank, spec.qk_rope_head_dim
        )

    def store_indexer(self, layer: int, slots: Slots, key: torch.Tensor) -> None:
        """Write each key on every rank (the indexer K is replicated over the DCP group)."""
        layer = self._checker.indexer_layer(layer)
        s = self._slots(slots, "slots", distinct=True)
        key = check_rows(key, "key", len(s), self.rank_layout.spec.index_head_dim, self.device)
        lay = self.rank_layout
        if len(s):
            for r in range(self.dcp):
                cache_ops.store_indexer(self._index[r][layer], s, key, lay.page_size, lay.index_kpool, self._key_dtype)

    def read_indexer(self, layer: int, slots: Slots, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw (key, scale) of each slot from ``rank``'s replica. Does not modify the pool."""
        layer, rank = self._checker.indexer_layer(layer), self._rank(rank)
        s = self._slots(slots, "slots")
        lay = self.rank_layout
        return cache_ops.gather_indexer(
            self._index[rank][layer], s, lay.page_size, lay.spec.index_head_dim, lay.index_kpool, self._key_dtype
        )

    def read_indexer_dequant(self, layer: int, slots: Slots) -> torch.Tensor:
        key, scale = self.read_indexer(layer, slots)
        return key.float() * scale.unsqueeze(1)

    # ----- lockstep moves ------------------------------------------------------------------------
    def move_slots(self, src_slots: Sequence[int] | torch.Tensor, dst_slots: Sequence[int] | torch.Tensor) -> None:
        """Copy token ``src[i]`` to ``dst[i]`` in every layer of both caches on every rank (``TwinPool.move_slots``:
        sources read before any write; a main row moves from the rank owning the source to the one owning the
        destination, the indexer entry on every replica)."""
        src = self._checker.slots(src_slots, "src_slots")
        dst = self._checker.slots(dst_slots, "dst_slots", distinct=True)
        if len(src) != len(dst):
            raise DsakvError(f"dst_slots: {len(dst)} slots; must match the {len(src)} src_slots")
        if not len(src):
            return
        layers = range(self.layout.num_attention_layers)
        rows = [self._raw_rows(la, src) for la in layers]  # gather every layer before writing any
        for la, r in zip(layers, rows):
            for rank, idx, local in self._split(la, dst):
                view = self._main[rank][la]
                view[local // view.shape[1], local % view.shape[1]] = r[idx]
        for rank in range(self.dcp):
            move_indexer_states(self._index[rank], self.rank_layout, src, dst)

    def _raw_rows(self, layer: int, s: torch.Tensor) -> torch.Tensor:
        out = torch.empty((len(s), self.rank_layout.main_row_bytes), dtype=torch.uint8, device=self.device)
        for rank, idx, local in self._split(layer, s)[: self.main_shards(layer)]:
            view = self._main[rank][layer]
            out[idx] = view[local // view.shape[1], local % view.shape[1]]
        return out

    # ----- invariants ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Allocator consistent; every rank's buffers shaped as the layout and DCP size imply; the replicas
        (indexer K, MTP layers) identical on every rank."""
        self.allocator.check_integrity()
        lay, P = self.rank_layout, self.num_physical_pages
        for layer in range(lay.num_attention_layers):
            rows = self._main_rows(layer)
            for r in range(self.dcp):
                m, ix = self._main[r][layer], self._index[r][layer]
                if tuple(m.shape) != (P, rows, lay.main_row_bytes):
                    raise AssertionError(f"dcp pool: rank {r} main layer {layer} has shape {tuple(m.shape)}")
                want = (P * self.dcp if lay.layer_has_indexer(layer) else 0, lay.indexer_page_bytes_per_layer)
                if tuple(ix.shape) != want:
                    raise AssertionError(f"dcp pool: rank {r} indexer layer {layer} has shape {tuple(ix.shape)}")
                if not torch.equal(ix, self._index[0][layer]):
                    raise AssertionError(f"dcp pool: rank {r}'s indexer K of layer {layer} differs from rank 0's")
                if self.main_shards(layer) == 1 and not torch.equal(m, self._main[0][layer]):
                    raise AssertionError(f"dcp pool: rank {r}'s replicated main KV of layer {layer} differs")
        if self.rank_nbytes != P * RankCell(lay, self.dcp, self.replicated).page_bytes:
            raise AssertionError(f"dcp pool: {self.rank_nbytes} bytes a rank; the planner says {P} pages")
