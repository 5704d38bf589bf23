"""What one simulation produced: per-request records, the pool-use timeline, and the summary figures.

Every figure is defined in ``docs/metrics.md`` (formula and unit). Bytes are per rank of the TP group
(``RankCell``: DCP splits the main latent, the indexer K is replicated); pages are the planner's rank
pages of ``page_size x dcp`` tokens (``RankCell.tokens_per_page``); pairs and FLOPs are of the lightning indexer over all indexer layers
(``dsakv.planner.savings.prefix_savings``). Records are built once, when a request leaves the simulation, and
never change afterwards; the loop's own counts (steps, evictions, preemptions, DP routing) and the trace
reader's (skipped and reordered lines) travel in ``Counters``.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dsakv.planner.budget import PoolCapacity, RankCell
from dsakv.planner.savings import prefix_savings
from dsakv.scheduler.request import Request
from dsakv.spec.layout import CacheLayout

PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class RequestRecord:
    """Accounting of one request (``docs/metrics.md``, "Per request")."""

    id: int
    line: int
    arrival_s: float
    input_tokens: int  # L, the prompt
    output_tokens: int  # tokens generated (the trace's output_length when finished)
    hit_tokens: int  # P, cached prefix at first admission (whole pages), every tier together
    hit_tokens_host: int  # the part of P loaded back from host memory
    hit_tokens_store: int  # the part of P loaded back from the store
    suffix_tokens: int  # S = L - P
    computed_tokens: int  # tokens whose KV the request wrote (recomputes and drafts included)
    pages_written: int
    pages_saved: int
    main_bytes_written: int
    indexer_bytes_written: int
    main_bytes_saved: int
    indexer_bytes_saved: int
    indexer_pairs_saved: int
    indexer_pairs_paid: int
    indexer_cross_pairs_paid: int
    indexer_flops_saved: int
    indexer_flops_paid: int
    outcome: str  # finished / rejected / unfinished
    reason: str
    preemptions: int
    tail_waste_tokens: int
    tail_waste_bytes: float
    admit_s: float | None
    first_token_s: float | None
    finish_s: float | None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ttft_s"], d["tpot_s"] = self.ttft_s, self.tpot_s
        return d


def make_record(
    req: Request,
    cell: RankCell,
    *,
    line: int,
    arrival_s: float,
    admit_s: float | None,
    first_token_s: float | None,
    finish_s: float | None,
    outcome: str,
) -> RequestRecord:
    """Build the record of a request that left the scheduler (or never entered: ``outcome`` rejected).

    ``cell`` prices the bytes per rank (its layout, the pairs and FLOPs); the times are those the loop saw
    (None where the request never got that far)."""
    st = req.stats
    prompt_tokens, hit_tokens = req.prompt_len, st.hit_tokens
    sav = prefix_savings(cell.layout, prompt_tokens, hit_tokens)
    total = prompt_tokens + len(req.outputs)
    tail = (-total) % cell.tokens_per_page if outcome == "finished" else 0
    admitted = st.admit_step is not None
    return RequestRecord(
        id=req.id,
        line=line,
        arrival_s=arrival_s,
        input_tokens=prompt_tokens,
        output_tokens=len(req.outputs),
        hit_tokens=sav.cached_tokens,
        hit_tokens_host=st.hit_tokens_host,
        hit_tokens_store=st.hit_tokens_store,
        suffix_tokens=sav.computed_tokens,
        computed_tokens=st.computed_tokens,
        pages_written=st.pages_written,
        pages_saved=sav.cached_tokens // cell.tokens_per_page,
        main_bytes_written=cell.main_bytes(st.computed_tokens) if st.computed_tokens else 0,
        indexer_bytes_written=cell.indexer_bytes(st.computed_tokens) if st.computed_tokens else 0,
        main_bytes_saved=cell.main_bytes(sav.cached_tokens) if hit_tokens else 0,
        indexer_bytes_saved=cell.indexer_bytes(sav.cached_tokens) if hit_tokens else 0,
        indexer_pairs_saved=sav.pairs_saved if admitted else 0,
        indexer_pairs_paid=sav.pairs_paid if admitted else 0,
        indexer_cross_pairs_paid=sav.cross_pairs_paid if admitted else 0,
        indexer_flops_saved=sav.flops_saved if admitted else 0,
        indexer_flops_paid=sav.flops_paid if admitted else 0,
        outcome=outcome,
        reason=st.reason,
        preemptions=st.preemptions,
        tail_waste_tokens=tail,
        tail_waste_bytes=tail * cell.cell_bytes,
        admit_s=admit_s,
        first_token_s=first_token_s,
        finish_s=finish_s,
    )


@dataclass
class Counters:
    """Counts the records cannot give: the loop's (steps, evictions, preemptions, offloads, DP routing) and
    the trace reader's (``skipped_lines``, ``reordered_lines``). ``docs/metrics.md`` defines each one."""

    steps: int = 0
    evicted_tokens: int = 0
    eviction_steps: int = 0  # steps that evicted (the summary's ``evictions``)
    preemptions: int = 0
    offloaded_pages: int = 0
    skipped_lines: int = 0
    reordered_lines: int = 0
    dp_attention: int = 1  # attention-DP groups; the loop simulates group 0
    other_group_requests: int = 0  # requests routed to the other groups


@dataclass
class Timeline:
    """One sample per scheduler step (at the step's end): pool pages in use, pages held only by the cache."""

    time_s: array = field(default_factory=lambda: array("d"))
    used_pages: array = field(default_factory=lambda: array("q"))
    cache_only_pages: array = field(default_factory=lambda: array("q"))
    running: array = field(default_factory=lambda: array("q"))
    preempt_time_s: array = field(default_factory=lambda: array("d"))


@dataclass
class SimResult:
    """Everything one run produced; ``summary`` is filled by ``summarize``."""

    config: dict
    layout: CacheLayout
    cell: RankCell
    capacity: PoolCapacity
    capacity_pages: int
    records: list[RequestRecord]
    timeline: Timeline
    counters: Counters
    summary: dict = field(default_factory=dict)
    tiers: tuple[Any, Any] | None = None  # (sim.transfers.TierSetup, TierCounters) when the run had lower tiers

    @property
    def page_main_bytes(self) -> int:
        """Main-KV bytes of one pool page on one rank (``page_size`` rows; DCP spreads the group's tokens)."""
        return self.cell.main_page_bytes

    @property
    def page_indexer_bytes(self) -> int:
        """Indexer-K bytes of one pool page on one rank (all ``page_size x dcp`` tokens: replicated)."""
        return self.cell.indexer_page_bytes


def _pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None}
    arr = np.asarray(values, dtype=np.float64)
    out = {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out["mean"] = float(arr.mean())
    return out


def _time_weighted(t: np.ndarray, v: np.ndarray) -> float:
    """Mean of a step function sampled at step ends: value v[i] holds over (t[i-1], t[i]]."""
    if t.size == 0 or t[-1] <= 0:
        return float(v.mean()) if v.size else 0.0
    dt = np.diff(np.concatenate(([0.0], t)))
    return float((v * dt).sum() / t[-1])


def summarize(result: SimResult) -> dict:
    """Summary figures (``docs/metrics.md``) from the records, the timeline and the loop's counters."""
    recs, timeline, counts = result.records, result.timeline, result.counters
    admitted = [r for r in recs if r.admit_s is not None]
    finished = [r for r in recs if r.outcome == "finished"]
    rejected = [r for r in recs if r.outcome == "rejected"]
    input_adm = sum(r.input_tokens for r in admitted)
    hit = sum(r.hit_tokens for r in admitted)
    hit_host = sum(r.hit_tokens_host for r in admitted)
    hit_store = sum(r.hit_tokens_store for r in admitted)
    t, used = np.asarray(timeline.time_s), np.asarray(timeline.used_pages, dtype=np.float64)
    makespan = float(t[-1]) if t.size else 0.0
    page_main, page_idx = result.page_main_bytes, result.page_indexer_bytes
    out_tokens = sum(r.output_tokens for r in recs)
    s = {
        "requests": len(recs),
        "admitted": len(admitted),
        "finished": len(finished),
        "rejected": len(rejected),
        "rejected_reasons": dict(Counter(_reason_kind(r.reason) for r in rejected)),
        "unfinished": len(recs) - len(finished) - len(rejected),
        "skipped_lines": counts.skipped_lines,
        "reordered_lines": counts.reordered_lines,
        "dp_attention": counts.dp_attention,
        "other_group_requests": counts.other_group_requests,
        "input_tokens": sum(r.input_tokens for r in recs),
        "admitted_input_tokens": input_adm,
        "rejected_input_tokens": sum(r.input_tokens for r in rejected),
        "output_tokens": out_tokens,
        "hit_tokens": hit,
        "hit_tokens_device": hit - hit_host - hit_store,
        "hit_tokens_host": hit_host,
        "hit_tokens_store": hit_store,
        "hit_rate_tokens": hit / input_adm if input_adm else 0.0,
        "hit_rate_requests": sum(1 for r in admitted if r.hit_tokens) / len(admitted) if admitted else 0.0,
        "computed_tokens": sum(r.computed_tokens for r in recs),
        "pages_written": sum(r.pages_written for r in recs),
        "pages_saved": sum(r.pages_saved for r in recs),
        "main_bytes_written": sum(r.main_bytes_written for r in recs),
        "indexer_bytes_written": sum(r.indexer_bytes_written for r in recs),
        "main_bytes_saved": sum(r.main_bytes_saved for r in recs),
        "indexer_bytes_saved": sum(r.indexer_bytes_saved for r in recs),
        "indexer_pairs_saved": sum(r.indexer_pairs_saved for r in recs),
        "indexer_pairs_paid": sum(r.indexer_pairs_paid for r in recs),
        "indexer_cross_pairs_paid": sum(r.indexer_cross_pairs_paid for r in recs),
        "indexer_flops_saved": sum(r.indexer_flops_saved for r in recs),
        "indexer_flops_paid": sum(r.indexer_flops_paid for r in recs),
        "evicted_tokens": counts.evicted_tokens,
        "evictions": counts.eviction_steps,
        "preemptions": counts.preemptions,
        "offloaded_pages": counts.offloaded_pages,
        "tail_waste_tokens_mean": float(np.mean([r.tail_waste_tokens for r in finished])) if finished else 0.0,
        "tail_waste_bytes_mean": float(np.mean([r.tail_waste_bytes for r in finished])) if finished else 0.0,
        "pool_pages": result.capacity_pages,
        "pool_tokens": result.capacity_pages * result.cell.tokens_per_page,
        "pool_main_bytes": result.capacity_pages * page_main,
        "pool_indexer_bytes": result.capacity_pages * page_idx,
        "peak_used_pages": int(used.max()) if used.size else 0,
        "peak_main_bytes": int(used.max()) * page_main if used.size else 0,
        "peak_indexer_bytes": int(used.max()) * page_idx if used.size else 0,
        "mean_used_pages": _time_weighted(t, used),
        "mean_main_bytes": _time_weighted(t, used) * page_main,
        "mean_indexer_bytes": _time_weighted(t, used) * page_idx,
        "peak_pool_use": float(used.max()) / result.capacity_pages if used.size and result.capacity_pages else 0.0,
        "mean_pool_use": _time_weighted(t, used) / result.capacity_pages if result.capacity_pages else 0.0,
        "steps": counts.steps,
        "makespan_s": makespan,
        "ttft_s": _pct([r.ttft_s for r in finished if r.ttft_s is not None]),
        "tpot_s": _pct([r.tpot_s for r in finished if r.tpot_s is not None]),
        "e2e_s": _pct([r.finish_s - r.arrival_s for r in finished]),
        "output_tokens_per_s": out_tokens / makespan if makespan else 0.0,
        "input_tokens_per_s": input_adm / makespan if makespan else 0.0,
        "computed_tokens_per_s": sum(r.computed_tokens for r in recs) / makespan if makespan else 0.0,
    }
    s.update(tier_summary(result))
    result.summary = s
    return s


def tier_summary(result: SimResult) -> dict:
    """Bytes the lower tiers moved, per tier and per cache (zero without tiers): ``store_bytes_read`` /
    ``store_bytes_written`` in total, and ``tier_bytes`` split into main KV and indexer K (indexer on full
    layers only, in every tier, as on the device)."""
    zero = {"host_bytes_read": 0, "host_bytes_written": 0, "store_bytes_read": 0, "store_bytes_written": 0}
    if result.tiers is None:
        return {**zero, "tier_bytes": None, "load_backs": 0, "write_back_stall_s": 0.0}
    setup, c = result.tiers
    main, idx = setup.entry_main_bytes, setup.entry_indexer_bytes
    pages = {
        "host_bytes_read": c.host_pages_read,
        "host_bytes_written": c.host_pages_written,
        "store_bytes_read": c.store_pages_read,
        "store_bytes_written": c.store_pages_written,
    }
    split = {
        tier: {
            way: {"main": pages[f"{tier}_bytes_{way}"] * main, "indexer": pages[f"{tier}_bytes_{way}"] * idx}
            for way in ("read", "written")
        }
        for tier in ("host", "store")
    }
    return {
        **{k: n * (main + idx) for k, n in pages.items()},
        "tier_bytes": split,
        "load_backs": c.load_backs,
        "write_back_stall_s": c.write_back_stall_s,
    }


def _reason_kind(reason: str) -> str:
    """Group rejection reasons by cause (the full text stays in the per-request record)."""
    if "context limit" in reason:
        return "exceeds context limit"
    if "whole pool" in reason:
        return "larger than the pool"
    if "empty" in reason:
        return "empty prompt"
    return reason or "unknown"
