"""What a PD hand-off moves per request, by cache, and how long it takes over a link.

Per context length L: ``pages = ceil(L / page_size)`` (the hand-off's one page-count function); the main
KV of every attention layer, the index-K of every layer that owns an indexer, and of those the MTP (draft)
layers' share (main + full indexer each). Seconds are bytes / one GPU's one-direction link: 400 Gb/s
InfiniBand NDR per GPU (the usual one NIC per GPU in a PD deployment), the GPU kind's NVLink / Infinity
Fabric, its PCIe host link, or ``--link-gbps``. A request moves from one prefill rank to one decode rank, so
one GPU's link carries it.

What skipping the indexer would cost: index-K is ``k_norm(wk · hidden)`` and cannot be rebuilt from the
latent, so a decode side without it prefills the whole prompt again: ``L`` tokens, among them the indexer's
``L(L+1)/2`` causal (query, key) pairs per full layer at ``2 × index_n_heads × index_head_dim`` FLOPs each —
against the link seconds the indexer bytes take.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsakv.errors import DsakvError
from dsakv.planner.budget import CONTEXT_LENGTHS
from dsakv.planner.gpus import gpu_kind
from dsakv.spec.layout import CacheLayout, ceil_div

IB_NDR_BYTES_PER_S = 400e9 / 8  # 400 Gb/s InfiniBand NDR, one NIC per GPU, one direction


@dataclass(frozen=True)
class PdRow:
    context: int
    pages: int
    pd_bytes_main: int  # every attention layer's main KV (MTP layers included)
    pd_bytes_indexer: int  # every full layer's index-K (MTP layers included)
    pd_bytes_mtp: int  # of the two above, the MTP layers' main + index-K
    pd_bytes_total: int
    transfer_s: dict[str, float]  # seconds over each link
    skip_indexer_saves_s: dict[str, float]  # link seconds the indexer bytes take
    skip_indexer_recompute_tokens: int  # the prefill a decode side without index-K computes again
    skip_indexer_recompute_indexer_flops: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PdPlan:
    links: dict[str, float]  # bytes per second, one direction
    rows: tuple[PdRow, ...]

    def to_dict(self) -> dict:
        return {"links_bytes_per_s": dict(self.links), "rows": [r.to_dict() for r in self.rows]}


def pd_links(gpu: str, link_gbps: float | None = None) -> dict[str, float]:
    """Link name -> bytes per second: IB NDR per GPU, the GPU kind's interconnect and host link, ``--link-gbps``."""
    kind = gpu_kind(gpu)
    links = {
        "ib_400g": IB_NDR_BYTES_PER_S,
        kind.interconnect.lower().replace(" ", "_"): kind.link_bytes_per_s,
        kind.host_link.lower().replace(" ", "_"): kind.host_link_bytes_per_s,
    }
    if link_gbps is not None:
        if isinstance(link_gbps, bool) or not isinstance(link_gbps, int | float) or not link_gbps > 0:
            raise DsakvError(f"--link-gbps = {link_gbps!r}: must be a positive number of Gb/s")
        links["link"] = link_gbps * 1e9 / 8
    return links


def pd_row(layout: CacheLayout, context: int, links: dict[str, float]) -> PdRow:
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise DsakvError(f"context = {context!r}: a hand-off covers a positive number of tokens")
    pages = ceil_div(context, layout.page_size)
    main, index = pages * layout.main_page_bytes, pages * layout.indexer_page_bytes
    mtp = pages * layout.mtp_layers * (layout.main_page_bytes_per_layer + layout.indexer_page_bytes_per_layer)
    pairs = context * (context + 1) // 2
    return PdRow(
        context=context,
        pages=pages,
        pd_bytes_main=main,
        pd_bytes_indexer=index,
        pd_bytes_mtp=mtp,
        pd_bytes_total=main + index,
        transfer_s={k: (main + index) / v for k, v in links.items()},
        skip_indexer_saves_s={k: index / v for k, v in links.items()},
        skip_indexer_recompute_tokens=context,
        skip_indexer_recompute_indexer_flops=pairs * layout.spec.indexer_flops_per_pair * layout.num_indexer_layers,
    )


def pd_plan(layout: CacheLayout, gpu: str, *, link_gbps: float | None = None, context: int | None = None) -> PdPlan:
    """The context table's hand-offs (plus ``context`` when given)."""
    links = pd_links(gpu, link_gbps)
    lengths = sorted(set(CONTEXT_LENGTHS) | ({context} if context else set()))
    return PdPlan(links, tuple(pd_row(layout, n, links) for n in lengths))


__all__ = ["IB_NDR_BYTES_PER_S", "PdPlan", "PdRow", "pd_links", "pd_plan", "pd_row"]
