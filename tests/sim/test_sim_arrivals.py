"""Arrivals (issue 11): a waiting request costs its hash ids, not its token ids (memory follows the running
set, not the backlog), and an arrival time the float clock cannot hold is an error naming the line."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from dsakv.cache.key import RadixKey
from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.scheduler.request import Request, check_prompt
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.group import MAX_ARRIVAL_S, Group, arrival_seconds
from dsakv.workloads.traces import MooncakePrompt, TraceRequest, mooncake_tokens

BACKLOG, PROMPT = 1000, 8192  # 1,000 requests of 8,192 tokens, all arriving at once


def test_a_waiting_backlog_holds_no_token_ids():
    reqs = [TraceRequest(0.0, PROMPT, 8, tuple(range(16 * i, 16 * i + 16)), i + 1) for i in range(BACKLOG)]
    cfg = SimConfig(step_model="constant", pool_tokens=64 * 400, max_running=4)
    sim = Group(cfg, build_setup(cfg))
    tracemalloc.start()
    try:
        for rid, req in enumerate(reqs):
            sim.add(req, 0.0, rid)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(sim.scheduler.waiting) == BACKLOG
    # As int64 token ids the backlog would hold 1,000 x 8,192 x 8 B = 65.5 MB; as hash ids it is what the
    # Request objects and their trackers cost (about 1 KB each), plus one prompt expanded while checked.
    assert current < 4e6 and peak < 8e6, (current, peak)
    assert all(r.key is None for r in sim.scheduler.waiting)  # no radix key before the first admission


def test_compact_prompts_give_the_figures_of_expanded_ones():
    # The same requests as token-id arrays through the scheduler directly: identical keys, identical hits.
    reqs = [TraceRequest(float(i), 1000 + 37 * i, 5, (0, 1, 2 + i % 3), i + 1) for i in range(12)]
    cfg = SimConfig(step_model="constant", pool_tokens=64 * 64)
    result = simulate(cfg, reqs, check_every=1)
    assert sum(r.hit_tokens for r in result.records) > 0 and result.summary["finished"] == 12
    for r in reqs:
        compact = MooncakePrompt(r.hash_ids, r.input_length)
        expanded = mooncake_tokens(r.hash_ids, r.input_length)
        a = Request(0, compact, 1, None, 0)
        b = Request(0, expanded, 1, None, 0)
        check_prompt(compact)
        assert a.radix_key(a.num_tokens).data == b.radix_key(b.num_tokens).data


@pytest.mark.parametrize("length", [1, 511, 512, 513, 1500])
def test_a_compact_prompt_reads_as_its_token_ids(length):
    ids = (7, 3, 9)
    prompt, tokens = MooncakePrompt(ids, length), mooncake_tokens(ids, length)
    assert len(prompt) == length and np.asarray(prompt).dtype == np.uint32
    assert np.array_equal(np.asarray(prompt), tokens) and np.array_equal(prompt[2:-1], tokens[2:-1])
    assert prompt[0] == tokens[0] and prompt[-1] == tokens[-1] and prompt[length // 2] == tokens[length // 2]
    with pytest.raises(IndexError):
        prompt[length]
    assert RadixKey(np.asarray(prompt)).data == RadixKey(tokens).data


def test_a_compact_prompt_of_wide_hash_ids_reads_as_its_token_ids():
    ids = (5, 2**22, 2**40 + 3)  # a direct id, then wide ones: still uint32, the same ids as expanded
    prompt, tokens = MooncakePrompt(ids, 1500), mooncake_tokens(ids, 1500)
    assert np.asarray(prompt).dtype == np.uint32 and np.array_equal(np.asarray(prompt), tokens)
    assert [prompt[i] for i in (0, 511, 512, 1024, 1499)] == [int(tokens[i]) for i in (0, 511, 512, 1024, 1499)]
    check_prompt(prompt)


@pytest.mark.parametrize(
    ("timestamp_ms", "time_scale"), [(1e308, 1.0), (1e308, 1e300), (1.0, 1e300), (2e13, 1.0), (float("nan"), 1.0)]
)
def test_an_arrival_beyond_the_clock_is_an_error_naming_the_line(timestamp_ms, time_scale):
    with pytest.raises(DsakvError, match="trace line 42: timestamp .* arrivals must lie within 1e\\+10 s"):
        arrival_seconds(timestamp_ms, time_scale, 42)
    assert arrival_seconds(MAX_ARRIVAL_S * 1000, 1.0, 1) == MAX_ARRIVAL_S


def test_the_loop_refuses_a_late_arrival_before_it_enters_the_clock():
    reqs = [TraceRequest(0.0, 10, 2, (1,), 1), TraceRequest(1e308, 10, 2, (2,), 2)]
    with pytest.raises(DsakvError, match="trace line 2"):
        simulate(SimConfig(step_model="constant", pool_tokens=6400), reqs)


@pytest.mark.parametrize("analytic", [True, False])
def test_the_overlap_scheduler_receives_a_request_at_the_second_step_start_after_it(analytic):
    # SGLang's event_loop_overlap plans each step while the one before runs: a request that reaches a busy engine
    # during a step is received when that step's successor starts, and joins the step after. Constant 20 ms steps:
    # request 1 decodes from 0; request 2 arrives at 30 ms, during the step [20, 40) ms.
    reqs = [TraceRequest(0.0, 64, 40, (1,), 1), TraceRequest(30.0, 64, 4, (2,), 2)]
    admitted = {}
    for overlap in (False, True):
        cfg = SimConfig(step_model="constant", schedule_policy="prefill_first", overlap_schedule=overlap)
        result = simulate(cfg, reqs, analytic_decode=analytic, check_every=1)
        admitted[overlap] = {r.line: r.admit_s for r in result.records}
        assert result.summary["finished"] == 2
    assert admitted[False] == pytest.approx({1: 0.0, 2: 0.04})  # the next step start
    assert admitted[True] == pytest.approx({1: 0.0, 2: 0.06})  # the second: [40, 60) ms was planned without it


def test_an_idle_overlap_scheduler_receives_at_once():
    # No step in flight: the loop has nothing to launch and receives the request as it comes.
    reqs = [TraceRequest(0.0, 64, 2, (1,), 1), TraceRequest(500.0, 64, 2, (2,), 2)]
    cfg = SimConfig(step_model="constant", schedule_policy="prefill_first", overlap_schedule=True)
    result = simulate(cfg, reqs, check_every=1)
    assert {r.line: r.admit_s for r in result.records} == pytest.approx({1: 0.0, 2: 0.5})


@pytest.mark.parametrize("analytic", [True, False])
@pytest.mark.parametrize(("overlap", "interval", "admit_s"), [(False, 1, 0.04), (False, 3, 0.08), (True, 3, 0.08)])
def test_the_receive_interval_holds_a_request_until_the_nth_decode_turn(analytic, overlap, interval, admit_s):
    # SGLang's SchedulerRecvSkipper (--scheduler-recv-interval n): a loop turn adds 1,000 after a prefill step and 1
    # after a decode step, and receives when that brings its count to n. Constant 20 ms steps: request 1 prefills in
    # [0, 20) ms, so the turn at 20 ms receives (and starts the count again); request 2 reaches the scheduler at 30 ms,
    # and at n = 3 the turns at 40 and 60 ms count 1 and 2 and the turn at 80 ms receives it (under the overlap
    # scheduler, the turn at 80 ms began as the step at 60 ms started: it reached the scheduler by then).
    reqs = [TraceRequest(0.0, 64, 40, (1,), 1), TraceRequest(30.0, 64, 4, (2,), 2)]
    cfg = SimConfig(
        step_model="constant",
        schedule_policy="prefill_first",
        overlap_schedule=overlap,
        scheduler_recv_interval=interval,
    )
    result = simulate(cfg, reqs, analytic_decode=analytic, check_every=1)
    assert result.summary["finished"] == 2
    assert {r.line: r.admit_s for r in result.records} == pytest.approx({1: 0.0, 2: admit_s})


def test_the_turn_after_a_prefill_step_receives():
    # Request 2 reaches the scheduler at 10 ms, during request 1's prefill step [0, 20): that step weighs 1,000, so
    # the next turn receives whatever the interval.
    reqs = [TraceRequest(0.0, 64, 40, (1,), 1), TraceRequest(10.0, 64, 4, (2,), 2)]
    cfg = SimConfig(step_model="constant", schedule_policy="prefill_first", scheduler_recv_interval=30)
    result = simulate(cfg, reqs, check_every=1)
    assert {r.line: r.admit_s for r in result.records} == pytest.approx({1: 0.0, 2: 0.02})


def test_an_idle_loop_receives_at_once_whatever_the_interval():
    # A request reaching an engine with nothing to run (here: after request 1 has left) is received as it comes: an
    # idle loop turns in microseconds, so its count reaches the interval at once.
    reqs = [TraceRequest(0.0, 64, 2, (1,), 1), TraceRequest(500.0, 64, 2, (2,), 2)]
    cfg = SimConfig(step_model="constant", schedule_policy="prefill_first", scheduler_recv_interval=30)
    result = simulate(cfg, reqs, check_every=1)
    assert {r.line: r.admit_s for r in result.records} == pytest.approx({1: 0.0, 2: 0.5})


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_a_receive_interval_other_than_a_positive_integer_is_refused(bad):
    with pytest.raises(DsakvError, match=r"^scheduler_recv_interval = .*: must be a positive integer"):
        SimConfig(scheduler_recv_interval=bad, schedule_policy="prefill_first")


def test_a_receive_interval_is_sglangs_and_needs_its_policy():
    with pytest.raises(DsakvError, match=r"^scheduler_recv_interval = 5: SGLang's --scheduler-recv-interval needs "):
        SimConfig(scheduler_recv_interval=5)  # the mixed policy: vLLM's engine receives every step
    assert SimConfig(scheduler_recv_interval=1).scheduler_recv_interval == 1  # the default passes either policy


def test_mixed_chunks_decode_the_running_requests_in_every_prefill_step():
    # SGLang's --enable-mixed-chunk mixes the running decodes into its prefill batch. Constant 20 ms steps, 256 prompt
    # tokens a step: request 2's 1,024-token prompt takes four chunk steps while request 1 decodes. Prefill-first
    # holds request 1 for those four steps; with mixed chunks it decodes in each of them and finishes 80 ms sooner.
    reqs = [TraceRequest(0.0, 64, 40, (1,), 1), TraceRequest(30.0, 1024, 4, (2, 3), 2)]
    finish = {}
    for mixed in (False, True):
        cfg = SimConfig(
            step_model="constant",
            schedule_policy="prefill_first",
            mixed_chunk=mixed,
            chunk_tokens=256,
            gpu=GpuSetting(max_batched_tokens=256),
        )
        result = simulate(cfg, reqs, check_every=1)
        assert result.summary["finished"] == 2
        finish[mixed] = {r.line: r.finish_s for r in result.records}
    assert finish[True][1] == pytest.approx(finish[False][1] - 0.08)
    # the engine stays SGLang's: the step time is the one prefill-first prices; the scheduler plans mixed steps
    on = SimConfig(schedule_policy="prefill_first", mixed_chunk=True)
    off = SimConfig(schedule_policy="prefill_first")
    assert build_setup(on).step_time == build_setup(off).step_time
    assert build_setup(on).scheduler.schedule_policy == "mixed"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"mixed_chunk": True},
            r"^mixed_chunk = True: SGLang's --enable-mixed-chunk needs schedule_policy prefill_first",
        ),
        (
            {"mixed_chunk": True, "schedule_policy": "prefill_first", "num_speculative_tokens": 2},
            r"^mixed_chunk = True: SGLang turns mixed chunks off under speculative decoding",
        ),
        ({"mixed_chunk": 1, "schedule_policy": "prefill_first"}, r"^mixed_chunk = 1: must be True or False"),
    ],
)
def test_mixed_chunks_outside_sglangs_rules_are_refused(kwargs, match):
    with pytest.raises(DsakvError, match=match):
        SimConfig(**kwargs)
