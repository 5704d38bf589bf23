"""The budget: what one token, one page and one request cost per rank, and how many pages a rank's
memory holds. Pure functions over a ``CacheLayout``; nothing here allocates or mutates anything.

API (used by ``dsakv plan``, the simulator, the diagnostics and the engine's ``TwinPool``)::

    cell = RankCell(layout, dcp=1)                 # bytes per token / per page on one rank
    cap = pool_capacity(layout, GpuSetting(...))   # -> PoolCapacity: .num_pages, .pool_tokens, .page_bytes, .memory
    cap = pool_capacity(layout, available_bytes=N) # same, from bytes already set aside for the pool
    cap = pool_capacity(layout, setting, available_bytes=N, dcp=d)  # both: the bytes, the setting's DCP (or d)
    row = context_row(cell, tokens)                # bytes of each cache, pages, ratio for one request
    fit = request_fit(cell, cap, tokens)           # fits? how many concurrently? page-table bytes

Pool size (docs/planner.md §2): ``physical_pages = available // page_bytes`` (whole pages only) and
``num_pages = physical_pages - scratch_pages``: the pool keeps its first pages as scratch pages for padded
writes (``PageAllocator(first_page=scratch_pages)``), so they cost memory but are never handed out; a CUDA
serving engine needs one (``scratch_pages(page_size, CUDA_GRAPH_PADDING_SLOTS) == 1``). ``pool_tokens = num_pages x
group_page_tokens``. Available bytes on one rank = ``floor(total x mem_fraction_static) - weights per
rank - activation reserve - top-k index buffer`` (docs/planner.md).

DCP (decode context parallelism, size d): the main latent of the group's tokens is split over the d
ranks while the indexer K is replicated, so one rank page holds ``page_size`` main slots but
``page_size x d`` indexer slots and stands for ``page_size x d`` tokens of the group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsakv.errors import DsakvError
from dsakv.planner.deployment import (
    DEFAULT_ACTIVATION_BYTES,
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_MEM_FRACTION,
    GpuSetting,
    RankMemory,
    check_int,
    rank_memory,
)
from dsakv.spec.layout import CacheLayout, ceil_div, exact_div

CONTEXT_LENGTHS = (8_192, 131_072, 524_288, 1_048_576)

# A CUDA serving engine points every padded row of a captured CUDA-graph batch at one dummy slot (SGLang:
# slot 0, in page 0; vLLM skips padded writes), so one scratch page holds its padding whatever the batch.
CUDA_GRAPH_PADDING_SLOTS = 1


def scratch_pages(page_size: int, padding_slots: int) -> int:
    """Pages kept below ``PageAllocator.first_page`` for throw-away padded writes: the fewest whole pages that
    hold ``padding_slots`` distinct slots at once (at least one page). The one rule for the planner
    (``CUDA_GRAPH_PADDING_SLOTS``: 1 page), the twin pool and the engine (which pads up to ``SCRATCH_SEQS``
    sequences to ``min_rows`` rows each in one forward, each padding row in its own slot).
    """
    check_int("page_size", page_size, 1)
    check_int("padding_slots", padding_slots, 1)
    return ceil_div(padding_slots, page_size)


@dataclass(frozen=True)
class RankCell:
    """The layout's bytes as one rank of a DCP group of size ``dcp`` holds them. Built from the
    ``CacheLayout``, which stays the one home of the per-token figures: a rank page stands for
    ``page_size x dcp`` tokens, holds ``page_size`` main rows (the group's main latent is split over the
    ranks) and the indexer K of all its tokens (replicated). At ``dcp = 1`` every figure is the layout's."""

    layout: CacheLayout
    dcp: int = 1
    dcp_replicated: bool = False  # the whole pool replicated on every rank (index_buf_size's dcp_replicated)

    def __post_init__(self) -> None:
        check_int("dcp", self.dcp, 1)
        if not isinstance(self.dcp_replicated, bool):
            raise DsakvError(f"dcp_replicated = {self.dcp_replicated!r}: must be True or False")

    @property
    def group_page_tokens(self) -> int:
        return self.layout.page_size * self.dcp

    @property
    def replicated_main_layers(self) -> int:
        """MTP / draft layers: the draft worker's pools are replicated, not DCP-sharded (SGLang's
        ``loc_space_scale``), so each rank holds their main rows of every token of the page; every layer when
        the pool is ``dcp_replicated``."""
        return self.layout.num_attention_layers if self.dcp_replicated else self.layout.mtp_layers

    @property
    def main_page_bytes(self) -> int:
        """Main rows one rank holds per page: ``page_size`` rows of each model layer (the group's tokens split
        over the ranks) and ``page_size x dcp`` rows of each draft layer (replicated)."""
        lay = self.layout
        sharded = lay.num_attention_layers - self.replicated_main_layers
        return lay.main_page_bytes_per_layer * (sharded + self.dcp * self.replicated_main_layers)

    @property
    def indexer_page_bytes(self) -> int:
        """Indexer K one rank holds per page: every token's (replicated), ``dcp`` physical pages a layer. SGLang
        counts it as ``indexer_cell_size x dcp`` per rank token of the target, and not multiplied on the draft
        worker, whose pool already spans the group's tokens: either way ``page_size x dcp`` states' bytes."""
        return self.layout.indexer_page_bytes * self.dcp

    @property
    def page_bytes(self) -> int:
        """Bytes of one rank page in both caches (3,452,160 for GLM-5.3 at dcp 1)."""
        return self.main_page_bytes + self.indexer_page_bytes

    @property
    def main_bytes_per_token(self) -> float | int:
        """Main bytes one rank holds per token of the group: the model layers' split over the DCP ranks, the
        draft layers' whole."""
        return exact_div(self.main_page_bytes, self.group_page_tokens)

    @property
    def indexer_bytes_per_token(self) -> float | int:
        """The layout's indexer bytes per token: every DCP rank holds the indexer K of every token."""
        return self.layout.indexer_bytes_per_token

    @property
    def cell_bytes(self) -> float | int:
        return exact_div(self.page_bytes, self.group_page_tokens)

    def main_bytes(self, tokens: int) -> int:
        """Main-KV bytes the busiest rank writes for ``tokens`` tokens."""
        row, draft = self.layout.main_row_bytes, self.replicated_main_layers
        sharded = self.layout.num_attention_layers - draft
        return ceil_div(tokens, self.dcp) * row * sharded + tokens * row * draft

    def indexer_bytes(self, tokens: int) -> int:
        """Indexer-K bytes one rank writes for ``tokens`` tokens (one state per kpool tokens)."""
        states = ceil_div(tokens, self.layout.index_kpool)
        return states * self.layout.indexer_row_bytes * self.layout.num_indexer_layers

    def pages_for_tokens(self, tokens: int) -> int:
        """Rank pages that hold ``tokens`` tokens of the group (``layout.pages_for_tokens`` at dcp 1)."""
        return ceil_div(tokens, self.group_page_tokens)

    def to_dict(self) -> dict:
        return {
            "dcp": self.dcp,
            "group_page_tokens": self.group_page_tokens,
            "main_bytes_per_token": self.main_bytes_per_token,
            "indexer_bytes_per_token": self.indexer_bytes_per_token,
            "cell_bytes": self.cell_bytes,
            "main_page_bytes": self.main_page_bytes,
            "indexer_page_bytes": self.indexer_page_bytes,
            "page_bytes": self.page_bytes,
        }


def index_buf_size(size: int, page_size: int, dcp: int, dcp_replicated: bool = False) -> int:
    """Token slots of one rank's indexer buffer (SGLang's ``index_buf_size``): ``(size + page_size) x dcp -
    page_size`` for a pool of ``size`` rank tokens (plus its padding page) whose indexer K is replicated over
    ``dcp`` ranks, ``size`` when the pool itself is replicated (``dcp_replicated``: its ``size`` already counts
    the group's tokens). The buffer then has ``(index_buf_size + page_size + 1) // page_size`` pages:
    ``(size / page_size + 1) x dcp``, i.e. ``dcp`` physical pages per page id, padding page included."""
    for name, value, low in (("size", size, 0), ("page_size", page_size, 1), ("dcp", dcp, 1)):
        check_int(name, value, low)
    return size if dcp_replicated else (size + page_size) * dcp - page_size


def index_buf_pages(size: int, page_size: int, dcp: int, dcp_replicated: bool = False) -> int:
    """Physical pages of that indexer buffer (SGLang ``IndexKeyCache``: ``(index_buf_size + page_size + 1) //
    page_size``)."""
    return (index_buf_size(size, page_size, dcp, dcp_replicated) + page_size + 1) // page_size


@dataclass(frozen=True)
class PoolCapacity:
    """Pages and tokens of one rank's pool. ``num_pages`` (handed out) excludes the ``scratch_pages`` kept for
    padded writes; ``physical_pages = scratch_pages + num_pages`` whenever memory holds more than the scratch;
    ``pool_tokens = num_pages x group_page_tokens``."""

    available_bytes: int
    page_bytes: int
    group_page_tokens: int
    physical_pages: int
    num_pages: int
    pool_tokens: int
    pool_bytes: int
    scratch_pages: int
    memory: RankMemory | None = None

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "memory"}
        if self.memory is not None:
            out["memory"] = self.memory.to_dict()
        return out


def pool_capacity(
    layout: CacheLayout,
    setting: GpuSetting | None = None,
    *,
    available_bytes: int | None = None,
    dcp: int | None = None,
    dcp_replicated: bool = False,
) -> PoolCapacity:
    """The pool of ``layout`` on one rank: the one door for this number (``dsakv plan``, ``dsakv simulate``, the
    what-if table and ``--explain-tokens`` / ``dsakv diagnose`` all call it).

    Memory: the setting's split (``rank_memory``: the weights are those of ``layout`` itself, its indexer
    schedule and its ``mtp_layers``, unless the setting names ``weights_bytes``), or ``available_bytes``, which
    replaces that split (the setting, when given too, still names the DCP size). At least one is needed.
    ``dcp``: a variant's DCP size, defaulting to the setting's (1 without one); with a setting it must be a size
    the setting's TP layout runs (``DsakvError`` otherwise). ``dcp_replicated``: every rank holds the whole pool
    (``RankCell.dcp_replicated``). Zero pages when memory is short (``require_pool`` refuses that).
    """
    if setting is None and available_bytes is None:
        raise DsakvError("pool_capacity: give a GPU setting or available_bytes")
    if setting is not None and dcp is not None and dcp != setting.dcp:
        setting = replace(setting, dcp=dcp)  # GpuSetting checks that the TP layout runs this DCP size
    if setting is not None:
        dcp = setting.dcp
    memory = None
    if available_bytes is None:
        memory = rank_memory(layout, setting)
        available_bytes = memory.available_bytes
    elif isinstance(available_bytes, bool) or not isinstance(available_bytes, int) or available_bytes <= 0:
        raise DsakvError(f"available bytes = {available_bytes!r}: must be a positive integer")
    cell = RankCell(layout, dcp or 1, dcp_replicated)
    physical = max(available_bytes // cell.page_bytes, 0)
    scratch = scratch_pages(layout.page_size, CUDA_GRAPH_PADDING_SLOTS)
    pages = max(physical - scratch, 0)
    return PoolCapacity(
        available_bytes=available_bytes,
        page_bytes=cell.page_bytes,
        group_page_tokens=cell.group_page_tokens,
        physical_pages=physical,
        num_pages=pages,
        pool_tokens=pages * cell.group_page_tokens,
        pool_bytes=physical * cell.page_bytes,
        scratch_pages=scratch,
        memory=memory,
    )


def require_pool(capacity: PoolCapacity) -> None:
    """Raise ``DsakvError`` with the reason unless the pool holds at least one page beyond the scratch pages.

    The one check of a usable pool, shared by ``dsakv plan`` (``dsakv.planner.plan.plan``) and ``dsakv
    simulate`` (``dsakv.sim.config.build_setup``), so both refuse the same settings with the same words.
    """
    if capacity.num_pages >= 1:
        return
    mem = capacity.memory
    if mem is None:
        head = f"available bytes = {capacity.available_bytes:,} B"
    else:
        head = (
            f"the GPU setting leaves {capacity.available_bytes:,} B per rank for the pool "
            f"(static {mem.static_bytes:,} B - weights {mem.weights_bytes:,} B - activations "
            f"{mem.activation_bytes:,} B - top-k buffer {mem.topk_buffer_bytes:,} B)"
        )
    n = capacity.scratch_pages
    raise DsakvError(
        f"{head}: less than one page ({capacity.page_bytes:,} B) beyond the {n} scratch page{'s' if n > 1 else ''}"
    )


@dataclass(frozen=True)
class ContextRow:
    """One request of ``tokens`` tokens on one rank: written bytes of each cache and reserved pages."""

    tokens: int
    pages: int
    main_bytes: int
    indexer_bytes: int
    total_bytes: int
    reserved_bytes: int
    tail_waste_bytes: int
    indexer_main_ratio: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def context_row(cell: RankCell, tokens: int) -> ContextRow:
    """Bytes and pages of one request; ``reserved`` counts whole pages, ``tail waste`` the difference."""
    check_int("context tokens", tokens, 1)
    main, indexer = cell.main_bytes(tokens), cell.indexer_bytes(tokens)
    pages = cell.pages_for_tokens(tokens)
    reserved = pages * cell.page_bytes
    return ContextRow(tokens, pages, main, indexer, main + indexer, reserved, reserved - main - indexer, indexer / main)


@dataclass(frozen=True)
class RequestFit:
    """Whether a request fits the pool, how many fit at once, and what its page tables cost."""

    row: ContextRow
    fits: bool
    concurrent: int
    slot_table_bytes: int  # int32 per token (SGLang req_to_token)
    block_table_bytes: int  # int32 per page (vLLM block table)

    def to_dict(self) -> dict:
        return {**self.row.to_dict(), **{k: v for k, v in self.__dict__.items() if k != "row"}}


def request_fit(cell: RankCell, capacity: PoolCapacity, tokens: int) -> RequestFit:
    """A request reserves ``ceil(tokens / group_page_tokens)`` pages up front (docs/planner.md §4)."""
    row = context_row(cell, tokens)
    return RequestFit(row, row.pages <= capacity.num_pages, capacity.num_pages // row.pages, 4 * tokens, 4 * row.pages)


def mean_tail_waste_bytes(cell: RankCell) -> float | int:
    """The last page of a request is on average half empty: ``group_page_tokens / 2 x cell``."""
    return exact_div(cell.page_bytes, 2)


__all__ = [
    "CONTEXT_LENGTHS",
    "CUDA_GRAPH_PADDING_SLOTS",
    "DEFAULT_ACTIVATION_BYTES",
    "DEFAULT_MAX_BATCHED_TOKENS",
    "DEFAULT_MEM_FRACTION",
    "ContextRow",
    "GpuSetting",
    "PoolCapacity",
    "RankCell",
    "RankMemory",
    "RequestFit",
    "context_row",
    "index_buf_pages",
    "index_buf_size",
    "mean_tail_waste_bytes",
    "pool_capacity",
    "rank_memory",
    "request_fit",
    "require_pool",
    "scratch_pages",
]
