"""What-if variants of a cache layout: the knobs that change the cell (docs/planner.md §1) and what each
does to capacity. Used by the planner's what-if table and by ``--explain-tokens`` diagnostics.

Knobs: full-indexer-layer count, MTP/draft layers, indexer kept on all layers, KV dtype, index-K
pooling (kpool), DCP size, and IndexCache F/S patterns. Capacity change is measured in the same
memory: ``base cell / variant cell - 1`` (39 full layers on GLM-5.3: 53,940 / 56,316 - 1 = -4.2%).
When a GPU setting is given, each variant also gets its pool on that setting from the one door,
``dsakv.planner.budget.pool_capacity``: the weights are the variant layout's own (its indexer schedule,
its MTP layers), so a row's pool is what ``dsakv plan`` prints for that layout; ``None`` where the
variant's DCP size cannot run on the setting's TP layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from dsakv.errors import DsakvError
from dsakv.planner.budget import GpuSetting, PoolCapacity, RankCell, pool_capacity
from dsakv.spec.layout import KV_DTYPES, CacheLayout


@dataclass(frozen=True)
class Variant:
    """One point in knob space: a layout plus a DCP size, and the knobs changed from the base."""

    label: str
    layout: CacheLayout
    dcp: int = 1
    changes: tuple[str, ...] = ()

    @property
    def cell(self) -> RankCell:
        return RankCell(self.layout, self.dcp)


def variant_pool(variant: Variant, setting: GpuSetting | None, available_bytes: int | None) -> PoolCapacity | None:
    """The door (``pool_capacity``) for a variant: its layout at its DCP size, on the setting or the bytes.
    ``None`` when neither is given or the setting's TP layout cannot run the variant's DCP size."""
    if setting is None and available_bytes is None:
        return None
    if setting is not None and variant.dcp != setting.dcp:
        try:
            setting = replace(setting, dcp=variant.dcp)
        except DsakvError:
            return None  # a DCP size this TP layout cannot run
    return pool_capacity(variant.layout, setting, available_bytes=available_bytes, dcp=variant.dcp)


@dataclass(frozen=True)
class WhatIfRow:
    label: str
    knob: str
    cell_bytes: float | int
    delta_cell_bytes: float | int
    capacity_change: float  # fraction: +0.1 = 10% more tokens in the same memory
    pool_tokens: int | None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def what_if_variants(
    layout: CacheLayout, dcp: int = 1, patterns: Mapping[str, str] | None = None
) -> list[tuple[str, Variant]]:
    """(knob, variant) pairs the planner prints; every number comes from the spec and layout."""
    spec, n = layout.spec, layout.spec.num_hidden_layers
    out: list[tuple[str, Variant]] = [("base", Variant("as configured", layout, dcp))]
    for count in sorted({spec.num_full_indexer_layers, n // 2, n}):
        if count >= 1:
            v = replace(layout, spec=spec.with_full_indexer_count(count))
            out.append(("full indexer layers", Variant(f"{count} full indexer layers", v, dcp, ("full layers",))))
    for k in sorted({0, 1, 2, spec.num_nextn_predict_layers} - {layout.mtp_layers}):
        out.append(("MTP layers", Variant(f"MTP layers = {k}", replace(layout, mtp_layers=k), dcp, ("mtp",))))
    if spec.num_shared_indexer_layers:
        all_full = replace(layout, spec=spec.with_all_indexers_full())
        out.append(("indexer on all layers", Variant(f"indexer on all {n} layers", all_full, dcp, ("all-layer",))))
    for kpool in (1, 2, 4):
        if kpool != layout.index_kpool:  # the physical indexer page kept: main page = physical page x kpool
            v = layout.with_index_kpool(kpool)
            label = f"index_kpool = {kpool} (page {v.page_size})"
            out.append(("kpool", Variant(label, v, dcp, ("kpool",))))
    for size in (1, 2, 4, 8):
        if size != dcp:
            out.append(("DCP", Variant(f"DCP = {size}", layout, size, ("dcp",))))
    for name in KV_DTYPES:
        if name == layout.kv_dtype:
            continue
        try:  # a format this spec cannot store (fp8_ds_mla needs kv_lora_rank % 128 == 0) is no what-if
            v = replace(layout, kv_dtype=name)
        except DsakvError:
            continue
        out.append(("KV dtype", Variant(f"kv_dtype = {name}", v, dcp, ("kv dtype",))))
    for name, pattern in (patterns or {}).items():
        if len(pattern) == n:
            s = spec.with_indexer_pattern(pattern, source=name)
            label = f"IndexCache {name} ({s.num_full_indexer_layers} full)"
            out.append(("IndexCache pattern", Variant(label, replace(layout, spec=s), dcp, ("pattern",))))
    return out


def what_if_rows(
    layout: CacheLayout,
    dcp: int = 1,
    *,
    setting: GpuSetting | None = None,
    available_bytes: int | None = None,
    patterns: Mapping[str, str] | None = None,
) -> list[WhatIfRow]:
    base_cell = RankCell(layout, dcp).cell_bytes
    rows = []
    for knob, v in what_if_variants(layout, dcp, patterns):
        cap = variant_pool(v, setting, available_bytes)
        cell = v.cell.cell_bytes
        rows.append(
            WhatIfRow(
                v.label, knob, cell, cell - base_cell, base_cell / cell - 1, None if cap is None else cap.pool_tokens
            )
        )
    return rows


__all__ = ["Variant", "WhatIfRow", "variant_pool", "what_if_rows", "what_if_variants"]
