"""``dsakv plan --explain-tokens N``: which knob explains the pool size an engine logged.

The engine's log states its pool in tokens. The planner recomputes the pool on the same setting for
the layout as configured and for every variant one or two knobs away (full-indexer-layer count,
MTP layers, DCP, indexer on all layers, KV dtype, kpool, IndexCache patterns). A variant whose pool
equals the logged figure exactly explains the gap; otherwise the nearest variants are listed with
their differences. Fewer changed knobs rank first among exact matches. Pure; nothing is mutated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import combinations

from dsakv.errors import DsakvError
from dsakv.planner.budget import GpuSetting, RankCell
from dsakv.planner.variants import Variant, variant_pool
from dsakv.spec.layout import KV_DTYPES, CacheLayout


@dataclass(frozen=True)
class Candidate:
    label: str
    changes: tuple[str, ...]
    cell_bytes: float | int
    pool_tokens: int
    diff_tokens: int  # candidate - logged

    @property
    def exact(self) -> bool:
        return self.diff_tokens == 0

    def to_dict(self) -> dict:
        return {**self.__dict__, "exact": self.exact}


@dataclass(frozen=True)
class Explanation:
    logged_tokens: int
    planned_tokens: int
    gap_tokens: int  # logged - planned
    explained: bool
    verdict: str
    candidates: tuple[Candidate, ...]  # best first

    def to_dict(self) -> dict:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "candidates"},
            "candidates": [c.to_dict() for c in self.candidates],
        }


def _knob_options(layout: CacheLayout, dcp: int, patterns: Mapping[str, str]) -> dict[str, list[tuple[str, dict]]]:
    """Per knob: (label, change) options, a change being layout/spec/dcp overrides."""
    spec, n = layout.spec, layout.spec.num_hidden_layers
    schedule = [
        (f"{c} full indexer layers", {"spec": spec.with_full_indexer_count(c)})
        for c in range(1, n)  # n full layers is the all-layer option below
        if c != spec.num_full_indexer_layers
    ]
    if spec.num_shared_indexer_layers:
        schedule.append((f"indexer on all {n} layers", {"spec": spec.with_all_indexers_full()}))
    for name, pattern in patterns.items():
        if len(pattern) == n and pattern != spec.indexer_pattern:
            schedule.append((f"IndexCache {name}", {"spec": spec.with_indexer_pattern(pattern, source=name)}))
    return {
        "indexer schedule": schedule,
        "mtp": [(f"MTP layers = {k}", {"mtp_layers": k}) for k in range(0, 5) if k != layout.mtp_layers],
        "dcp": [(f"DCP = {d}", {"dcp": d}) for d in (1, 2, 4, 8, 16) if d != dcp],
        "kv dtype": [(f"kv_dtype = {d}", {"kv_dtype": d}) for d in KV_DTYPES if d != layout.kv_dtype],
        "kpool": [
            (
                f"index_kpool = {k} (page {layout.indexer_physical_page * k})",
                {"index_kpool": k, "page_size": layout.indexer_physical_page * k},
            )
            for k in (1, 2, 4, 8, 16)
            if k != layout.index_kpool
        ],
    }


def explain_tokens(
    logged_tokens: int,
    layout: CacheLayout,
    *,
    setting: GpuSetting | None = None,
    available_bytes: int | None = None,
    dcp: int = 1,
    patterns: Mapping[str, str] | None = None,
    top: int = 5,
) -> Explanation:
    """Compare a logged pool size with the plan and with every variant one or two knobs away."""
    if isinstance(logged_tokens, bool) or not isinstance(logged_tokens, int) or logged_tokens <= 0:
        raise DsakvError(f"explain-tokens = {logged_tokens!r}: must be a positive integer (the engine's logged pool)")
    if setting is not None:
        dcp = setting.dcp
    base = Variant("as configured", layout, dcp)
    planned = variant_pool(base, setting, available_bytes)
    if planned is None:
        raise DsakvError("explain-tokens needs a GPU setting or --available-bytes")
    options = _knob_options(layout, dcp, patterns or {})
    candidates = [
        Candidate(base.label, (), base.cell.cell_bytes, planned.pool_tokens, planned.pool_tokens - logged_tokens)
    ]
    seen_cells: dict[tuple, int] = {}
    combos = [((k,), (o,)) for k, opts in options.items() for o in opts]
    for k1, k2 in combinations(options, 2):
        combos += [((k1, k2), (o1, o2)) for o1 in options[k1] for o2 in options[k2]]
    for knobs, picked in combos:
        overrides: dict = {}
        for _, change in picked:
            overrides.update(change)
        var_dcp = overrides.pop("dcp", dcp)
        try:
            var_layout = replace(layout, **overrides)
        except DsakvError:
            continue
        key = (var_layout.page_bytes, var_layout.index_kpool, var_layout.mtp_layers, var_dcp)
        if key not in seen_cells:
            cap = variant_pool(Variant("", var_layout, var_dcp), setting, available_bytes)
            seen_cells[key] = -1 if cap is None else cap.pool_tokens
        tokens = seen_cells[key]
        if tokens < 0:
            continue
        label = " + ".join(lbl for lbl, _ in picked)
        candidates.append(
            Candidate(label, knobs, RankCell(var_layout, var_dcp).cell_bytes, tokens, tokens - logged_tokens)
        )
    candidates.sort(key=lambda c: (abs(c.diff_tokens), len(c.changes), c.label))
    best = tuple(candidates[:top])
    exact = [c for c in best if c.exact]
    gap = logged_tokens - planned.pool_tokens
    if planned.pool_tokens == logged_tokens:
        verdict = f"engine logged {logged_tokens:,} tokens; the plan as configured gives exactly that"
    elif exact:
        c = exact[0]
        verdict = (
            f"engine logged {logged_tokens:,} tokens; our plan says {planned.pool_tokens:,} (gap {gap:+,}); "
            f"with {c.label} we get {c.pool_tokens:,} exactly -> explained"
        )
    else:
        c = best[0]
        verdict = (
            f"engine logged {logged_tokens:,} tokens; our plan says {planned.pool_tokens:,} (gap {gap:+,}); "
            f"no knob matches exactly; nearest: {c.label} -> {c.pool_tokens:,} ({c.diff_tokens:+,}): "
            "check the memory figures (mem_fraction_static, weights, --available-bytes)"
        )
    return Explanation(logged_tokens, planned.pool_tokens, gap, bool(exact), verdict, best)


__all__ = ["Candidate", "Explanation", "explain_tokens"]
