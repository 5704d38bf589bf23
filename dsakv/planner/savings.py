"""What a prefix-cache hit saves (docs/planner.md §6). Pure function; ``dsakv plan --cached`` and the simulator's
records (``dsakv.sim.report``) use it.

For a request of ``L`` tokens of which ``cached_tokens`` hit the prefix cache, only whole cached
pages count (the radix tree holds whole pages): ``P = (cached_tokens // page_size) x page_size`` and
``S = L - P`` tokens are computed. Indexer scoring is causal over (query, key) token pairs:

* saved: the prefix-internal pairs, ``P (P + 1) / 2`` (queries and keys both in the prefix);
* still paid: the cross term ``P x S`` (suffix queries score the whole prefix) plus the
  suffix-internal ``S (S + 1) / 2``; saved + paid = ``L (L + 1) / 2``.

FLOPs are ``pairs x 2 x index_n_heads x index_head_dim`` per indexer layer; the totals multiply by
the layout's indexer layers (full layers + MTP layers). Pair counts are per token, so ``index_kpool``
is not applied to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout


@dataclass(frozen=True)
class PrefixSavings:
    """Savings of one prefix hit; ``*_per_layer`` FLOPs are for one indexer layer."""

    total_tokens: int
    cached_tokens: int  # whole cached pages x page_size (what is actually reused)
    computed_tokens: int
    cached_pages: int
    main_bytes_saved: int
    indexer_bytes_saved: int
    bytes_saved: int
    pairs_saved: int
    pairs_paid: int
    cross_pairs_paid: int
    suffix_pairs_paid: int
    flops_saved_per_layer: int
    flops_paid_per_layer: int
    flops_saved: int
    flops_paid: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def prefix_savings(layout: CacheLayout, total_tokens: int, cached_tokens: int) -> PrefixSavings:
    """Pages and bytes of both caches not written, and indexer pairs/FLOPs saved and still paid."""
    for name, value in (("total tokens", total_tokens), ("cached tokens", cached_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DsakvError(f"{name} = {value!r}: must be an integer >= 0")
    if cached_tokens > total_tokens:
        raise DsakvError(f"cached tokens = {cached_tokens}: must be <= total tokens = {total_tokens}")
    pages = cached_tokens // layout.page_size
    p = pages * layout.page_size
    s = total_tokens - p
    saved = p * (p + 1) // 2
    cross, suffix = p * s, s * (s + 1) // 2
    per_pair = layout.spec.indexer_flops_per_pair
    layers = layout.num_indexer_layers
    main, indexer = pages * layout.main_page_bytes, pages * layout.indexer_page_bytes
    return PrefixSavings(
        total_tokens=total_tokens,
        cached_tokens=p,
        computed_tokens=s,
        cached_pages=pages,
        main_bytes_saved=main,
        indexer_bytes_saved=indexer,
        bytes_saved=main + indexer,
        pairs_saved=saved,
        pairs_paid=cross + suffix,
        cross_pairs_paid=cross,
        suffix_pairs_paid=suffix,
        flops_saved_per_layer=saved * per_pair,
        flops_paid_per_layer=(cross + suffix) * per_pair,
        flops_saved=saved * per_pair * layers,
        flops_paid=(cross + suffix) * per_pair * layers,
    )


__all__ = ["PrefixSavings", "prefix_savings"]
