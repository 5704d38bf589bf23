"""Prefill/decode disaggregation in the simulator: ``xPyD``, x prefill and y decode instances of the GPU setting.

    run_pd(cfg, pd, requests) -> PdSimResult           (dsakv simulate --pd xPyD)

Two clusters of the one driver (``dsakv.sim.cluster.Cluster``), in causal order (nothing flows back from the
decode side to the prefill side):

1. **Prefill side** (x instances, ``cfg.router``: KV-aware routing of prefills works as for any run): every
   request with one output token. Its step samples the first token and the prompt's pages leave; the
   prefill instance goes on with its next batch at once (the transfer runs beside it: SGLang's Mooncake
   path sends a chunk's pages while the next chunk computes), so the prefill side pays no transfer time.
2. **Decode side** (y instances, the same router): each request arrives when its prefill finished, with its
   whole trace output. Its own prefix cache is matched at admission (within the request's namespace); the
   prompt pages it lacks are the hand-off. ``PdDecodeGroup`` prices those pages' tokens not as compute but
   as the link time of their bytes (main KV + indexer K of every layer that owns one, MTP layer included:
   the layout's per-page bytes) on one GPU's link, in the step that admits them: the request's first token
   reaches the client when its pages have arrived (TTFT = prefill TTFT + queueing + hand-off), and a decode
   instance's step that receives pages waits for them (not overlapped with that instance's decode: the
   conservative side; an engine that writes by RDMA into a decode instance beside its decode batch would hide
   it, which a hand-off shorter than a decode step nearly does).

The run's records are the decode side's, with each request's arrival, admission and prefill figures (hits,
computed tokens, bytes written) from the prefill side; its timeline and pool are both sides' summed.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from dsakv.errors import DsakvError
from dsakv.planner.pd import IB_NDR_BYTES_PER_S, pd_links
from dsakv.scheduler import BatchPlan
from dsakv.sim.cluster import Cluster
from dsakv.sim.config import SimConfig, SimSetup, build_setup
from dsakv.sim.gc_threshold import rare_collections
from dsakv.sim.group import Group
from dsakv.sim.merge import ClusterParts, cluster_figures, instance_figures, merge_groups, sum_timelines
from dsakv.sim.report import Counters, RecordTable, RequestRecord, SimResult
from dsakv.spec.layout import ceil_div
from dsakv.workloads.traces import TraceRequest

_PD = re.compile(r"(\d+)P(\d+)D", re.IGNORECASE)
# the prefill side's figures a PD record keeps (what was computed where the prompt was computed)
_PREFILL_FIELDS = (
    "arrival_s", "admit_s", "hit_tokens", "hit_tokens_host", "hit_tokens_store", "suffix_tokens", "computed_tokens",
    "pages_written", "pages_saved", "main_bytes_written", "indexer_bytes_written", "main_bytes_saved",
    "indexer_bytes_saved", "indexer_pairs_saved", "indexer_pairs_paid", "indexer_cross_pairs_paid",
    "indexer_flops_saved", "indexer_flops_paid",
)  # fmt: skip


@dataclass(frozen=True)
class PdConfig:
    """``prefill`` and ``decode`` instances, each of the run's GPU setting; the hand-off's link (``link``: its
    name, ``link_bytes_per_s``: one GPU's one-direction bandwidth)."""

    prefill: int
    decode: int
    link: str = "ib_400g"
    link_bytes_per_s: float = IB_NDR_BYTES_PER_S

    def __post_init__(self) -> None:
        for name in ("prefill", "decode"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DsakvError(f"pd {name} = {value!r}: must be a positive number of instances")
        if not self.link_bytes_per_s > 0:
            raise DsakvError(f"pd link_bytes_per_s = {self.link_bytes_per_s!r}: must be positive")

    def to_dict(self) -> dict:
        return {
            "prefill": self.prefill,
            "decode": self.decode,
            "link": self.link,
            "link_bytes_per_s": self.link_bytes_per_s,
        }


def parse_pd(text: str, gpu: str, link_gbps: float | None = None) -> PdConfig:
    """``--pd xPyD`` (x, y >= 1) and the link: ``--link-gbps`` when given, else 400 Gb/s InfiniBand NDR per GPU
    (``dsakv.planner.pd.pd_links``, the planner's PD link figures)."""
    m = _PD.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise DsakvError(
            f"--pd = {text!r}: must be xPyD, x prefill and y decode instances, each at least 1 (e.g. 1P1D)"
        )
    links = pd_links(gpu, link_gbps)
    link = "link" if link_gbps is not None else "ib_400g"
    return PdConfig(int(m.group(1)), int(m.group(2)), link, links[link])


def check_pd_config(cfg: SimConfig, setup: SimSetup) -> None:
    """What a PD run does not model (one-line errors naming the field)."""
    if cfg.instances != 1:
        raise DsakvError(f"instances = {cfg.instances} with --pd: give the instances in xPyD, not --instances")
    if cfg.max_concurrency is not None:
        raise DsakvError(
            "max_concurrency with --pd: the closed loop is modelled for one cluster; use the trace's times"
        )
    if cfg.workers != 1:
        raise DsakvError(f"workers = {cfg.workers} with --pd: a PD run uses one process")
    if setup.tiers is not None:
        raise DsakvError("host / store tiers with --pd: lower tiers are not modelled in a PD run")
    if setup.setting.dcp != 1:
        raise DsakvError(
            f"dcp = {setup.setting.dcp} with --pd: the hand-off is modelled without decode context parallelism"
        )


@dataclass(frozen=True)
class HandOff:
    """Per page of ``group_page_tokens`` tokens, the bytes a hand-off moves by cache, and the link's rate."""

    group_page_tokens: int
    main_page_bytes: int
    indexer_page_bytes: int
    link_bytes_per_s: float

    @classmethod
    def of(cls, setup: SimSetup, pd: PdConfig) -> HandOff:
        lay = setup.layout  # every attention layer's main KV, every full layer's index-K, the MTP layer included
        return cls(lay.page_size, lay.main_page_bytes, lay.indexer_page_bytes, pd.link_bytes_per_s)

    def pages(self, start: int, end: int) -> int:
        """Pages of tokens ``[start, end)`` the hand-off moves (the hand-off's one page-count function: over
        a request its chunks' pages add up to ``ceil(L / page) - hit pages``)."""
        return ceil_div(end, self.group_page_tokens) - ceil_div(start, self.group_page_tokens)

    def seconds(self, pages: int) -> float:
        return pages * (self.main_page_bytes + self.indexer_page_bytes) / self.link_bytes_per_s


class PdDecodeGroup(Group):
    """A decode instance's DP group: the prompt tokens it admits (those its prefix cache lacks) arrive over the
    link instead of being computed; the rest of its step is priced as any group's."""

    hand_off: HandOff  # set by PdDecodeCluster

    def shape(self, plan: BatchPlan) -> tuple[list[tuple[int, int]], list[int]]:  # type: ignore[override]
        """``Group.shape`` of the items that compute (the hand-off's prompt tokens aside: under DP attention the
        MoE's token sum, ``Cluster._step``'s, carries no import either)."""
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        for item in plan.items:
            if item.start < item.request.prompt_len:
                continue
            if item.end - item.start > 1:
                prefill.append((item.end - item.start, item.start))
            else:
                decode.append(item.end)
        return prefill, decode

    def hand_off_pages(self, plan: BatchPlan) -> int:
        """Pages of the prompt the plan's items receive over the link (pages ``[start, end)`` of each)."""
        pages = 0
        for item in plan.items:
            prompt = item.request.prompt_len
            if item.start < prompt:
                pages += self.hand_off.pages(item.start, min(item.end, prompt))
        return pages

    def price(self, plan: BatchPlan, dp_tokens: int | None = None, dp_decodes: int | None = None) -> float:
        """The link seconds of the pages the step receives, plus the step-time model over what it computes."""
        seconds = self.hand_off.seconds(self.hand_off_pages(plan))
        prefill, decode = self.shape(plan)
        if prefill or decode:
            seconds += self.setup.step_time.step_seconds(prefill, decode, dp_tokens, dp_decodes)
        return seconds


class PdDecodeCluster(Cluster):
    """The decode side: ``Cluster`` of ``PdDecodeGroup``s priced with ``hand_off``; runs carry no import chunk."""

    def __init__(self, *args: Any, hand_off: HandOff, **kwargs: Any) -> None:
        self.group_class = functools.partial(_decode_group, hand_off)
        super().__init__(*args, **kwargs)
        for _, group in self.targets:
            group.chunks_in_runs = False  # a run prices chunks as compute: import chunks step one by one


def _decode_group(hand_off: HandOff, *args: Any, **kwargs: Any) -> PdDecodeGroup:
    group = PdDecodeGroup(*args, **kwargs)
    group.hand_off = hand_off
    return group


@dataclass(frozen=True)
class PdFigures:
    """The hand-off's figures of a PD run (``--json``: ``pd_*``)."""

    pd: PdConfig
    pages: int  # pages moved (the decode side's hits excluded)
    bytes_main: int
    bytes_indexer: int
    transfer_s: float  # link seconds of every hand-off, summed
    decode_hit_tokens: int  # prompt tokens the decode side's prefix caches already held
    prefill_ttft_s: float  # mean over finished requests: arrival to the prefill side's first token

    def to_dict(self) -> dict:
        return {
            "pd": f"{self.pd.prefill}P{self.pd.decode}D",
            "pd_link": self.pd.link,
            "pd_link_bytes_per_s": self.pd.link_bytes_per_s,
            "pd_transfer_pages": self.pages,
            "pd_transfer_bytes_main": self.bytes_main,
            "pd_transfer_bytes_indexer": self.bytes_indexer,
            "pd_transfer_bytes_total": self.bytes_main + self.bytes_indexer,
            "pd_transfer_s": self.transfer_s,
            "pd_decode_hit_tokens": self.decode_hit_tokens,
            "pd_prefill_ttft_s": self.prefill_ttft_s,
        }


@dataclass
class PdSimResult(SimResult):
    """A PD run's ``SimResult``: the usual figures of the whole run plus the hand-off's (``pd``)."""

    pd: PdFigures | None = None

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        return {**self.figures.to_dict(), **(self.pd.to_dict() if self.pd else {})}


def run_pd(
    cfg: SimConfig, pd: PdConfig, requests, *, setup: SimSetup | None = None, counters: Counters | None = None,
    check_every: int = 0, analytic_decode: bool = True,
) -> PdSimResult:  # fmt: skip
    """Run ``requests`` (TraceRequests in arrival order) on ``pd.prefill`` prefill and ``pd.decode`` decode
    instances of ``cfg``'s GPU setting (``cfg.instances`` must be 1); ``check_every`` as ``dsakv.sim.run``'s,
    on both sides."""
    setup = setup or build_setup(cfg)
    check_pd_config(cfg, setup)
    requests = list(requests)
    with rare_collections():
        p_cfg = replace(cfg, instances=pd.prefill)
        prefill = Cluster(
            p_cfg, setup, [replace(r, output_length=1) for r in requests], analytic_decode=analytic_decode
        )
        try:
            p_parts = prefill.run(None, check_every)
        finally:
            prefill.close()
        p_recs = {rec.id: rec for part in p_parts.records for rec in part}
        handed = _decode_requests(requests, p_recs)
        d_cfg = replace(
            cfg, instances=pd.decode, time_scale=1.0, frontend_s=0.0, frontend_request_s=0.0, frontend_token_s=0.0
        )
        hand_off = HandOff.of(setup, pd)
        decode = PdDecodeCluster(
            d_cfg, setup, [r for r, _ in handed], analytic_decode=analytic_decode, hand_off=hand_off
        )
        try:
            d_parts = decode.run(None, check_every)
        finally:
            decode.close()
        return _merge(cfg, pd, setup, counters or Counters(), requests, p_recs, handed, p_parts, d_parts, hand_off)


def _decode_requests(requests: list[TraceRequest], p_recs: dict[int, RequestRecord]) -> list[tuple[TraceRequest, int]]:
    """The decode side's stream: each request whose prefill finished, arriving then with its whole output, in
    hand-off order (ties in id order); with its prefill-side id."""
    done = sorted((rec.finish_s, rid) for rid, rec in p_recs.items() if rec.outcome == "finished")
    return [(replace(requests[rid], timestamp_ms=finish_s * 1000.0), rid) for finish_s, rid in done]


def _merge(
    cfg: SimConfig, pd: PdConfig, setup: SimSetup, base: Counters, requests: list[TraceRequest],
    p_recs: dict[int, RequestRecord], handed: list[tuple[TraceRequest, int]], p_parts: ClusterParts,
    d_parts: ClusterParts, hand_off: HandOff,
) -> PdSimResult:  # fmt: skip
    """One result of both sides: per request the decode side's record with the prefill side's arrival and
    prefill figures (a request whose prefill did not finish keeps its prefill record); both sides' groups."""
    d_recs = {rec.id: rec for part in d_parts.records for rec in part}
    records, pages, hits = dict(p_recs), 0, 0
    keep = [f.name for f in fields(RequestRecord) if f.name in _PREFILL_FIELDS]
    for d_id, (req, rid) in enumerate(handed):
        d = d_recs[d_id]
        p = p_recs[rid]
        records[rid] = replace(d, id=rid, line=p.line, preemptions=p.preemptions + d.preemptions,
                               **{name: getattr(p, name) for name in keep})  # fmt: skip
        if d.admit_s is not None:
            pages += hand_off.pages(d.hit_tokens, req.input_length)
            hits += d.hit_tokens
    table = RecordTable(records[rid] for rid in sorted(records))
    total_cfg = replace(cfg, instances=pd.prefill + pd.decode)
    timeline = sum_timelines(p_parts.timelines + d_parts.timelines)
    result = merge_groups(
        total_cfg, setup, base, p_parts.counts + d_parts.counts, [table], None, timeline, p_parts.steps + d_parts.steps
    )
    rows = []
    for part in (p_parts, d_parts):
        for tally, row in zip(part.tallies, part.rows):
            row = row or instance_figures(tally, _side_figures(total_cfg, setup, part))
            rows.append(replace(row, instance=len(rows)))
    figures = result.figures.with_cluster(cluster_figures(total_cfg, cfg.router, rows))
    finished = [p_recs[rid] for _, rid in handed]
    ttft = sum(p.first_token_s - p.arrival_s for p in finished) / len(finished) if finished else 0.0
    pd_figs = PdFigures(pd, pages, pages * hand_off.main_page_bytes, pages * hand_off.indexer_page_bytes,
                        hand_off.seconds(pages), hits, ttft)  # fmt: skip
    kw = {f.name: getattr(result, f.name) for f in fields(SimResult)}
    return PdSimResult(**{**kw, "figures": figures, "config": {**total_cfg.to_dict(), "pd": pd.to_dict()}}, pd=pd_figs)


def _side_figures(cfg: SimConfig, setup: SimSetup, part: ClusterParts):
    """The figures of one side of one instance (its row of ``per_instance``)."""
    return merge_groups(cfg, setup, Counters(), part.counts, part.records, None, part.timelines[0], part.steps).figures


__all__ = ["HandOff", "PdConfig", "PdDecodeGroup", "PdFigures", "PdSimResult", "check_pd_config", "parse_pd", "run_pd"]
