"""How many tokens a host-memory tier and a shared store hold (``dsakv plan --host-bytes/--store-bytes``).

A tier entry is one page of both caches as the attention group holds it: ``page_size x dcp`` tokens, the
main latent of every DCP rank and the indexer K (only on full layers, the shared-layer elision kept; the
MTP draft layers' rows when the layout has them). At ``dcp = 1`` that is the rank page:
``CacheLayout.page_bytes`` (3,452,160 B for GLM-5.3, 53,940 B/token).

Host memory is per node. Under tensor-parallel attention every rank of a group holds the *same* latent and
indexer pages (MLA's cache is replicated over TP ranks), so dsakv keeps one host copy per attention group
and node, which every rank of the group loads from: a node holding ``g`` attention groups (``gpus on the
node / attention TP``, at least 1) gives each ``host_bytes / g``. Engines that give each rank its own host
pool keep one copy per GPU: each holds ``host_bytes / gpus on the node`` of rank pages. Both are reported
(``host_tokens`` is the shared copy's, ``host_tokens_per_rank_pools`` the other). The store keeps one value
per page for the whole deployment: ``store_tokens`` is what it holds in all; under DP attention the groups
share it (the simulator gives its one group ``1 / pools`` of it).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsakv.errors import DsakvError
from dsakv.planner.budget import RankCell
from dsakv.planner.deployment import GpuSetting
from dsakv.planner.gpus import gpu_kind


@dataclass(frozen=True)
class TierCapacity:
    """Pages and tokens of the host tier (both ways) and the store; None where no size was given."""

    entry_bytes: int  # one tier entry: a group page of both caches
    group_page_tokens: int
    gpus_per_node: int
    groups_per_node: int
    host_bytes: int | None
    host_pages: int | None  # per attention group, one copy per node
    host_tokens: int | None
    host_pages_per_rank_pools: int | None  # one host pool per GPU
    host_tokens_per_rank_pools: int | None
    store_bytes: int | None
    store_pages: int | None
    store_tokens: int | None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def tier_capacity(cell: RankCell, setting: GpuSetting, host_bytes: int | None, store_bytes: int | None) -> TierCapacity:
    """The tiers' capacity for the layout ``cell`` under ``setting`` (see the module docstring)."""
    for name, value in (("host_bytes", host_bytes), ("store_bytes", store_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise DsakvError(f"{name} = {value!r}: must be an integer >= 0 or None")
    group_page_tokens = cell.group_page_tokens
    entry = cell.layout.page_bytes * cell.dcp
    on_node = min(setting.num_gpus, gpu_kind(setting.gpu).gpus_per_node)
    attention_tp = setting.tensor_parallel // setting.dp_attention
    groups = max(1, on_node // attention_tp)
    host_pages = per_rank = store_pages = None
    if host_bytes is not None:
        host_pages = host_bytes // groups // entry
        per_rank = host_bytes // on_node // cell.page_bytes
    if store_bytes is not None:
        store_pages = store_bytes // entry
    return TierCapacity(
        entry_bytes=entry,
        group_page_tokens=group_page_tokens,
        gpus_per_node=on_node,
        groups_per_node=groups,
        host_bytes=host_bytes,
        host_pages=host_pages,
        host_tokens=None if host_pages is None else host_pages * group_page_tokens,
        host_pages_per_rank_pools=per_rank,
        host_tokens_per_rank_pools=None if per_rank is None else per_rank * group_page_tokens,
        store_bytes=store_bytes,
        store_pages=store_pages,
        store_tokens=None if store_pages is None else store_pages * group_page_tokens,
    )
