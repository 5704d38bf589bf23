"""``plan(...)``: every figure ``dsakv plan`` prints, gathered in one frozen ``Plan`` (and its JSON).

Composition only: the figures come from ``budget`` (cell, pool, requests), ``workspaces``,
``weights``, ``variants`` (what-ifs), ``savings`` (prefix hits) and ``diagnose`` (explain tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from dsakv.errors import DsakvError
from dsakv.planner.budget import (
    CONTEXT_LENGTHS,
    ContextRow,
    GpuSetting,
    PoolCapacity,
    RankCell,
    RequestFit,
    context_row,
    mean_tail_waste_bytes,
    pool_capacity,
    request_fit,
    require_pool,
)
from dsakv.planner.diagnose import Explanation, explain_tokens
from dsakv.planner.savings import PrefixSavings, prefix_savings
from dsakv.planner.tiers import TierCapacity, tier_capacity
from dsakv.planner.variants import WhatIfRow, what_if_rows
from dsakv.planner.weights import WeightPlan, weights_per_rank
from dsakv.planner.workspaces import LogitsPlan, logits_budget_bytes, logits_plan, logits_row_bytes, topk_buffer_bytes
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec

MILLION_COLS = 1_048_576


@dataclass(frozen=True)
class Workspaces:
    topk_buffer_bytes: int
    logits_budget_bytes: int
    logits_row_bytes_1m: int
    logits: LogitsPlan  # max_batched_tokens query rows against the request (or max) context
    mean_tail_waste_bytes: float | int
    slot_table_bytes_1m: int
    block_table_bytes_1m: int

    def to_dict(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items() if k != "logits"}, "logits": self.logits.__dict__}


@dataclass(frozen=True)
class Plan:
    spec: ModelSpec
    layout: CacheLayout
    cell: RankCell
    setting: GpuSetting
    pool: PoolCapacity
    pool_source: str  # "gpu setting" | "available bytes"
    weights: WeightPlan | None
    contexts: tuple[RequestFit, ...]
    request: RequestFit | None
    workspaces: Workspaces
    what_if: tuple[WhatIfRow, ...]
    savings: PrefixSavings | None
    explanation: Explanation | None
    tiers: TierCapacity | None = None  # host / store capacity (``--host-bytes`` / ``--store-bytes``)

    @property
    def system_tokens(self) -> int:
        """Tokens the whole deployment holds: pool tokens x independent pools."""
        return self.pool.pool_tokens * self.setting.pools

    def to_dict(self) -> dict:
        cell = self.cell.to_dict()
        return {
            "model": self.spec.to_dict(),
            "full_indexer_layers": list(self.spec.full_indexer_layers),
            "layout": self.layout.to_dict(),
            **cell,
            "cell": cell,
            "setting": self.setting.to_dict(),
            "pool_source": self.pool_source,
            "pool_pages": self.pool.num_pages,
            "pool_tokens": self.pool.pool_tokens,
            "pools": self.setting.pools,
            "system_tokens": self.system_tokens,
            "pool": self.pool.to_dict(),
            "weights": None if self.weights is None else self.weights.to_dict(),
            "contexts": [f.to_dict() for f in self.contexts],
            "request": None if self.request is None else self.request.to_dict(),
            "workspaces": self.workspaces.to_dict(),
            "what_if": [r.to_dict() for r in self.what_if],
            "prefix_savings": None if self.savings is None else self.savings.to_dict(),
            "explain_tokens": None if self.explanation is None else self.explanation.to_dict(),
            **(
                {}
                if self.tiers is None
                else {
                    "host_tokens": self.tiers.host_tokens,
                    "store_tokens": self.tiers.store_tokens,
                    "tiers": self.tiers.to_dict(),
                }
            ),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def plan(
    spec: ModelSpec,
    layout: CacheLayout | None = None,
    setting: GpuSetting | None = None,
    *,
    available_bytes: int | None = None,
    context: int | None = None,
    cached: int | None = None,
    explain: int | None = None,
    patterns: Mapping[str, str] | None = None,
    host_bytes: int | None = None,
    store_bytes: int | None = None,
) -> Plan:
    """Compute every planner figure. ``available_bytes`` replaces the setting's memory split for the pool.

    ``host_bytes`` (per node) / ``store_bytes`` add the lower tiers' capacity (``dsakv.planner.tiers``).
    Raises ``DsakvError`` (``budget.require_pool``) when the memory leaves no pool page beyond the scratch pages."""
    layout = layout or CacheLayout(spec)
    setting = setting or GpuSetting()
    cell = RankCell(layout, setting.dcp)
    pool = pool_capacity(layout, setting, available_bytes=available_bytes)  # the one door, as dsakv simulate
    source = "gpu setting" if available_bytes is None else "available bytes"
    require_pool(pool)  # the same check (and words) as dsakv simulate
    weights = None
    if setting.weights_bytes is None and spec.arch_value("hidden_size"):
        weights = weights_per_rank(
            spec,
            tp=setting.tensor_parallel,
            dp_attention=setting.dp_attention,
            mtp_layers=layout.mtp_layers,
            dtype=setting.weight_dtype,
            moe_a2a=setting.moe_a2a,
        )
    lengths = sorted(set(CONTEXT_LENGTHS) | ({context} if context else set()))
    contexts = tuple(request_fit(cell, pool, n) for n in lengths)
    request = request_fit(cell, pool, context) if context else None
    if cached is not None and context is None:
        raise DsakvError("--cached needs --context (the request length)")
    savings = prefix_savings(layout, context, cached) if cached is not None else None
    budget = logits_budget_bytes(setting.total_bytes, setting.mem_fraction_static)
    cols = context or spec.max_position_embeddings
    million = request_fit(cell, pool, MILLION_COLS)
    workspaces = Workspaces(
        topk_buffer_bytes=topk_buffer_bytes(setting.max_batched_tokens, spec.index_topk),
        logits_budget_bytes=budget,
        logits_row_bytes_1m=logits_row_bytes(MILLION_COLS),
        logits=logits_plan(setting.max_batched_tokens, cols, budget),
        mean_tail_waste_bytes=mean_tail_waste_bytes(cell),
        slot_table_bytes_1m=million.slot_table_bytes,
        block_table_bytes_1m=million.block_table_bytes,
    )
    pool_kw = {"available_bytes": available_bytes} if available_bytes is not None else {"setting": setting}
    rows = what_if_rows(layout, setting.dcp, patterns=patterns, **pool_kw)
    explanation = explain_tokens(explain, layout, patterns=patterns, dcp=setting.dcp, **pool_kw) if explain else None
    return Plan(
        spec,
        layout,
        cell,
        setting,
        pool,
        source,
        weights,
        contexts,
        request,
        workspaces,
        tuple(rows),
        savings,
        explanation,
        None if host_bytes is None and store_bytes is None else tier_capacity(cell, setting, host_bytes, store_bytes),
    )


def context_table(cell: RankCell, lengths: tuple[int, ...] = CONTEXT_LENGTHS) -> tuple[ContextRow, ...]:
    """The context-length table (docs/planner.md §4) (bytes of each cache, pages, ratio) for ``lengths``."""
    return tuple(context_row(cell, n) for n in lengths)


__all__ = [
    "Plan",
    "Workspaces",
    "context_table",
    "plan",
]
