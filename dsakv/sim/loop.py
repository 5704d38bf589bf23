"""The discrete-event loop: trace requests arrive over simulated time and the real ``Scheduler`` (with the
real ``PageAllocator`` and ``RadixCache``, no pool) serves them; a step-time model stands in for the GPU.

One iteration::

    add every request whose arrival time <= now        (token ids created here, dropped at finish)
    idle?  -> jump the clock to the next arrival
    plan = scheduler.step()                             (admission, chunked prefill, decode, eviction, preemption)
    dt   = step_time(prefill chunks, decode contexts) + host copies of offload/restore
    report one dummy token per sampled item (drafts accepted with probability mtp_accept, seeded)
    now += dt; finished requests become ``RequestRecord``s

Under DP attention (``d`` groups, each with its own pool and prefix cache) requests are routed round-robin,
request ``i`` to group ``i mod d`` (SGLang's default load balancing); the groups do not share pages, so the
loop simulates group 0 with every ``d``-th request and every figure is that group's (``dp_attention`` and
``other_group_requests`` in the summary say so).

Each request generates exactly its trace ``output_length`` tokens (EOS is ignored). Output token ids are
one id per request, counted down from ``2**32 - 1``, so no output page ever matches another request's
prompt. Deterministic: the same config, trace and seed give the same records.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.scheduler.request import Status
from dsakv.scheduler.scheduler import Scheduler
from dsakv.sim.config import Setup, SimConfig, build_setup
from dsakv.sim.report import RequestRecord, SimResult, Timeline, make_record, summarize
from dsakv.workloads.traces import MOONCAKE_BLOCK, TraceRequest, mooncake_tokens

HOST_COPY_BYTES_PER_S = 55e9  # PCIe Gen5 x16, effective (docs/steptime.md, assumption 9)
OUTPUT_TOKEN_TOP = 2**32 - 1  # radix keys are uint32 token ids
MAX_PROMPT_TOKEN = 2**31  # prompt ids stay below the output ids
MAX_HASH_ID = MAX_PROMPT_TOKEN // MOONCAKE_BLOCK


def simulate(
    cfg: SimConfig,
    requests: Iterable[TraceRequest],
    *,
    setup: Setup | None = None,
    counters: dict | None = None,
    progress: Callable[[int], None] | None = None,
    check_every: int = 0,
) -> SimResult:
    """Run ``requests`` (in arrival order) through one scheduler; returns records, timeline and summary.

    ``counters`` seeds the loop's counters (e.g. ``skipped_lines`` from the trace reader). ``progress``
    is called with the number of requests that left the simulation so far, every few hundred steps.
    ``check_every = n > 0`` runs ``Scheduler.check_integrity`` (allocator and radix too) every n steps.
    """
    setup = setup or build_setup(cfg)
    layout, cell, ps = setup.layout, setup.cell, setup.page_tokens
    alloc = PageAllocator(setup.pages, ps, first_page=1)
    radix = None
    if cfg.prefix_cache:
        # With MTP drafts the tree keys pages on bigrams (EAGLE/MTP engines do: the draft head needs the
        # hidden state of the token before a match break), so a hit drops its last matched page.
        radix = RadixCache(
            alloc, eviction_policy=cfg.eviction_policy, insert_mode=cfg.insert_mode, speculative=cfg.mtp > 0
        )
    sched = Scheduler(alloc, radix, setup.scheduler)
    step_seconds = setup.step_time.step_seconds
    rng = random.Random(cfg.seed)
    accept, drafts_on = cfg.mtp_accept, cfg.mtp > 0
    scale = cfg.time_scale / 1000.0
    page_bytes = setup.cell.page_bytes  # one rank page, both caches
    info: dict[int, list] = {}  # live request id -> [line, arrival_s, admit_s, first_token_s, token]
    records: list[RequestRecord] = []
    tl = Timeline()
    c = {"steps": 0, "evicted_tokens": 0, "eviction_steps": 0, "preemptions": 0, "offloaded_pages": 0}
    c.update(counters or {})
    dp = setup.setting.dp_attention
    c["dp_attention"], c["other_group_requests"] = dp, 0

    def leave(req, now: float, outcome: str) -> None:
        line, arrival, admit, first, _ = info.pop(req.id)
        records.append(make_record(req, layout, cell, line, arrival, (admit, first, now), outcome))

    def group_zero(reqs: Iterable[TraceRequest]) -> Iterable[TraceRequest]:
        for i, r in enumerate(reqs):
            if i % dp == 0:
                yield r
            else:
                c["other_group_requests"] += 1

    arrivals = iter(requests) if dp == 1 else group_zero(requests)
    pending = next(arrivals, None)
    serial, now = 0, 0.0
    while True:
        while pending is not None and pending.timestamp_ms * scale <= now:
            arrival = pending.timestamp_ms * scale
            if pending.hash_ids and max(pending.hash_ids) >= MAX_HASH_ID:
                raise DsakvError(f"trace line {pending.line}: hash id {max(pending.hash_ids)} >= {MAX_HASH_ID}")
            prompt = mooncake_tokens(pending.hash_ids, pending.input_length)
            req = sched.add_request(prompt, pending.output_length, request_id=serial)
            info[serial] = [pending.line, arrival, None, None, (OUTPUT_TOKEN_TOP - serial,)]
            serial += 1
            if req.status is Status.REJECTED:
                leave(req, None, "rejected")
            elif req.status is Status.FINISHED:
                info[req.id][2] = info[req.id][3] = arrival
                leave(req, arrival, "finished")
            pending = next(arrivals, None)
        if sched.is_idle:
            if pending is None:
                break
            now = max(now, pending.timestamp_ms * scale)
            continue
        plan = sched.step()
        if not plan.items:
            sched.update(plan, [])
            if pending is None:
                break  # cannot make progress and nothing will arrive: remaining requests are unfinished
            now = max(now, pending.timestamp_ms * scale)
            continue
        prefill, decode, sampled = [], [], []
        for item in plan.items:
            if item.end - item.start > 1:
                prefill.append((item.end - item.start, item.start))
            else:
                decode.append(item.end)
            if not item.sample:
                sampled.append(())
                continue
            tok = info[item.request.id][4]
            if drafts_on and item.num_draft:
                n = 0
                while n < item.num_draft and rng.random() < accept:
                    n += 1
                sampled.append(tok * (n + 1))
            else:
                sampled.append(tok)
        dt = step_seconds(prefill, decode)
        host = sum(len(h.pages) for h in plan.offloads) + sum(len(h.pages) for h in plan.restores)
        if host:
            dt += host * page_bytes / HOST_COPY_BYTES_PER_S
        for req in plan.admitted:
            entry = info[req.id]
            if entry[2] is None:
                entry[2] = now
        if plan.preempted:
            c["preemptions"] += len(plan.preempted)
            tl.preempt_time_s.extend([now] * len(plan.preempted))
        c["offloaded_pages"] += sum(len(h.pages) for h in plan.offloads)
        if plan.evicted_tokens:
            c["evicted_tokens"] += plan.evicted_tokens
            c["eviction_steps"] += 1
        now += dt
        for item in plan.items:
            if item.sample:
                entry = info[item.request.id]
                if entry[3] is None:
                    entry[3] = now
        for req in sched.update(plan, sampled):
            leave(req, now, "finished")
        c["steps"] += 1
        tl.time_s.append(now)
        tl.used_pages.append(alloc.num_allocated)
        tl.cache_only_pages.append(radix.evictable_tokens // ps if radix is not None else 0)
        tl.running.append(len(sched.running))
        if check_every and c["steps"] % check_every == 0:
            sched.check_integrity()
        if progress is not None and c["steps"] % 256 == 0:
            progress(len(records))
    for req in list(sched.running) + list(sched.waiting):
        req.stats.reason = req.stats.reason or "simulation stalled: no step could make progress"
        leave(req, None, "unfinished")
    if check_every:
        sched.check_integrity()
    if progress is not None:
        progress(len(records))
    records.sort(key=lambda r: r.id)
    result = SimResult(
        config=cfg.to_dict(),
        layout=layout,
        cell=cell,
        capacity=setup.capacity,
        capacity_pages=setup.pages,
        records=records,
        timeline=tl,
        counters=c,
    )
    summarize(result)
    return result
