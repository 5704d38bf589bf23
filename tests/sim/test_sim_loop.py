"""The simulation loop over the real scheduler: accounting, determinism, bad settings, pressure."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.planner.savings import prefix_savings
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.group import Group
from dsakv.sim.report import Counters
from dsakv.sim.source import Source, open_source
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import MooncakeTrace, TraceRequest

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"
CONST = {"step_model": "constant"}


def _req(ts_ms, ids, n, out=4):
    return TraceRequest(ts_ms, n, out, tuple(ids))


@pytest.fixture(scope="module")
def chat():
    return generate_scenario("chat", seed=0, scale=0.1)


def test_every_request_generates_exactly_its_output_length(chat):
    res = simulate(SimConfig(), chat, check_every=50)
    assert res.summary["finished"] == len(chat) == res.summary["requests"]
    assert [r.output_tokens for r in res.records] == [q.output_length for q in chat]
    assert res.summary["output_tokens"] == sum(q.output_length for q in chat)


def test_same_seed_gives_identical_records(chat):
    a = simulate(SimConfig(num_speculative_tokens=1, seed=3), chat)
    b = simulate(SimConfig(num_speculative_tokens=1, seed=3), chat)
    assert [r.to_dict() for r in a.records] == [r.to_dict() for r in b.records]
    assert a.summary == b.summary


def test_resent_prompt_hits_its_whole_pages_minus_one_token():
    reqs = [_req(0, [1, 2, 3], 1300), _req(60_000, [1, 2, 3], 1300)]
    res = simulate(SimConfig(**CONST), reqs)
    first, second = res.records
    assert first.hit_tokens == 0
    assert second.hit_tokens == (1300 - 1) // 64 * 64
    assert second.suffix_tokens == 1300 - second.hit_tokens


def test_record_savings_match_the_planner(chat):
    res = simulate(SimConfig(), chat)
    lay = CacheLayout(ModelSpec.preset("glm-5.3"))
    hit = [r for r in res.records if r.hit_tokens][0]
    sav = prefix_savings(lay, hit.input_tokens, hit.hit_tokens)
    assert (hit.indexer_pairs_saved, hit.indexer_pairs_paid) == (sav.pairs_saved, sav.pairs_paid)
    assert hit.indexer_cross_pairs_paid == hit.hit_tokens * hit.suffix_tokens
    assert hit.indexer_flops_saved == sav.flops_saved and hit.pages_saved == sav.cached_pages
    assert hit.main_bytes_saved + hit.indexer_bytes_saved == sav.bytes_saved


def test_constant_step_time_gives_exact_latencies():
    res = simulate(SimConfig(step_model="constant"), [_req(1000, [0, 1], 1000, out=5)])
    rec = res.records[0]
    assert rec.arrival_s == 1.0
    assert rec.ttft_s == pytest.approx(0.02)  # one prefill step of the default 0.02 s
    assert rec.tpot_s == pytest.approx(0.02)


def test_time_scale_stretches_arrivals():
    reqs = [_req(0, [0], 100), _req(2000, [1], 100)]
    res = simulate(SimConfig(time_scale=2.5, **CONST), reqs)
    assert [r.arrival_s for r in res.records] == [0.0, 5.0]


def test_request_longer_than_context_limit_is_rejected_with_reason():
    ids = range(2100)  # 2100 x 512 tokens > GLM-5.3's 1,048,576 context
    res = simulate(SimConfig(**CONST), [_req(0, ids, 2100 * 512), _req(10, [9000], 50)])
    assert res.summary["rejected"] == 1 and res.summary["finished"] == 1
    assert res.records[0].outcome == "rejected" and "context limit" in res.records[0].reason
    assert res.summary["rejected_reasons"] == {"exceeds context limit": 1}


def test_request_larger_than_pool_is_rejected_not_crashed():
    res = simulate(SimConfig(pool_tokens=1024, **CONST), [_req(0, range(4), 2000), _req(1, [7], 100)])
    assert [r.outcome for r in res.records] == ["rejected", "finished"]
    assert "whole pool" in res.records[0].reason


def test_wide_hash_ids_simulate_exactly_like_the_same_trace_in_direct_ids(chat):
    """No ceiling on hash ids: mapping every id to one from 2**22 up (injectively) changes no figure. Ids from
    the top of the range down, so the largest id a trace can hold (2**63 - 1, hash id 0's image) is in it."""
    wide = [replace(r, hash_ids=tuple(2**63 - 1 - 977 * h for h in r.hash_ids)) for r in chat]
    assert min(min(r.hash_ids) for r in wide) >= 2**22 and max(max(r.hash_ids) for r in wide) == 2**63 - 1
    direct, widened = simulate(SimConfig(), chat, check_every=97), simulate(SimConfig(), wide, check_every=97)
    assert widened.summary == direct.summary
    assert widened.summary["hit_tokens"] > 0


def test_hash_id_beyond_2_to_the_63_names_the_line(tmp_path):
    # The trace reader is the edge that range-checks ids: the simulator's source refuses line 7 before any run.
    lines = [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [h]} for h in [2**40] * 6 + [2**63]]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))
    with pytest.raises(
        DsakvError, match=r"trace line 7: field 'hash_ids' contains 9223372036854775808: .*0..2\*\*63-1"
    ):
        open_source(Source(trace=str(path)))


def test_pool_smaller_than_one_page_is_reported():
    with pytest.raises(DsakvError, match="at least one page"):
        build_setup(SimConfig(pool_tokens=10))


def test_gpu_memory_too_small_for_weights_is_reported():
    with pytest.raises(DsakvError, match="less than one page"):
        build_setup(SimConfig(gpu=GpuSetting(gpu_memory_bytes=10**9)))


@pytest.mark.parametrize("preemption", ["recompute", "offload"])
def test_small_pool_preempts_and_still_finishes_everything(preemption):
    # admission reserves prompt + 70% of the output, so long outputs outgrow their reservation
    reqs = [_req(0, [i], 200, out=2000) for i in range(12)]
    cfg = SimConfig(pool_tokens=8192, preemption=preemption, **CONST)
    res = simulate(cfg, reqs, check_every=5)
    s = res.summary
    assert s["finished"] == 12 and s["preemptions"] > 0
    assert s["peak_used_pages"] <= s["pool_pages"]
    if preemption == "offload":
        assert s["offloaded_pages"] > 0


def test_small_pool_evicts_cached_prefixes(chat):
    res = simulate(SimConfig(pool_tokens=20_000), chat, check_every=20)
    assert res.summary["evicted_tokens"] > 0 and res.summary["finished"] == len(chat)


def test_insert_at_allocation_finishes_everything_with_prefix_hits(chat):
    alloc = simulate(SimConfig(insert_mode="allocate"), chat, check_every=50).summary
    assert alloc["finished"] == len(chat) and alloc["hit_tokens"] > 0


def test_without_a_prefix_cache_everything_finishes_and_nothing_hits(chat):
    off = simulate(SimConfig(prefix_cache=False), chat).summary
    assert off["finished"] == len(chat) and off["hit_tokens"] == 0
    assert off["evicted_tokens"] == 0 and off["hit_rate_requests"] == 0


def _pool_tokens(cfg: SimConfig) -> int:
    setup = build_setup(cfg)
    return setup.num_pages * setup.group_page_tokens


def test_what_if_layouts_change_pool_capacity():
    base = _pool_tokens(SimConfig())
    assert _pool_tokens(SimConfig(indexer_pattern="78")) < base
    assert _pool_tokens(SimConfig(kv_dtype="bf16")) < base
    assert _pool_tokens(SimConfig(num_speculative_tokens=1)) < base
    assert _pool_tokens(SimConfig(gpu=GpuSetting(dcp=2))) > base


@pytest.mark.parametrize("source", ["generated", "shared"])
def test_mooncake_trace_head_runs_with_prefix_hits(source, tmp_path):
    if source == "shared" and not DATA.exists():
        pytest.skip(f"Mooncake trace not present at {DATA} (shared data absent; the generated case ran)")
    path = DATA if source == "shared" else _write_trace(tmp_path, generate_scenario("chat", seed=3, scale=0.5))
    res = simulate(SimConfig(), itertools.islice(MooncakeTrace(path), 200))
    assert res.summary["finished"] == min(200, res.summary["requests"]) > 0 and res.summary["hit_tokens"] > 0


def _write_trace(tmp_path, requests) -> str:
    """``requests`` as a Mooncake JSON-lines file (a generated stand-in for the shared trace)."""
    path = tmp_path / "generated.jsonl"
    rows = (
        {"timestamp": r.timestamp_ms, "input_length": r.input_length, "output_length": r.output_length,
         "hash_ids": list(r.hash_ids)}
        for r in requests
    )  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize("mode", ["finish", "allocate"])
def test_mtp_drafts_leak_no_page_at_finish(mode):
    reqs = [_req(0, [1], 100, out=2), _req(10, [1, 2], 700, out=30), _req(20, [1, 2], 700, out=9)]
    res = simulate(
        SimConfig(num_speculative_tokens=2, insert_mode=mode, pool_tokens=64 * 40, **CONST), reqs, check_every=1
    )
    assert res.summary["finished"] == 3


def test_allocator_keeps_the_planner_scratch_pages_out_of_the_pool():
    cfg = SimConfig(**CONST)
    setup = build_setup(cfg)
    sim = Group(cfg, setup)
    assert sim.allocator.first_page == setup.capacity.scratch_pages == 1
    assert sim.allocator.num_pages == setup.num_pages == setup.capacity.num_pages


def test_seeded_counters_are_copied_and_reach_the_summary():
    seed = Counters(skipped_lines=3, reordered_lines=2)
    res = simulate(SimConfig(**CONST), [_req(0, [1], 100, out=4)], counters=seed)
    # one prefill step samples the first token, three decode steps the rest
    assert (res.summary["skipped_lines"], res.summary["reordered_lines"], res.summary["steps"]) == (3, 2, 4)
    assert seed == Counters(skipped_lines=3, reordered_lines=2)  # the caller's object is left alone


def test_trace_tenants_and_salts_isolate_prefix_hits(tmp_path):
    # The same prompt four times, a minute apart: only a request of the same (tenant, cache_salt) hits.
    rows = [
        {"timestamp": 0, "input_length": 1300, "output_length": 4, "hash_ids": [1, 2, 3], "tenant": "a"},
        {"timestamp": 60_000, "input_length": 1300, "output_length": 4, "hash_ids": [1, 2, 3], "tenant": "b"},
        {"timestamp": 120_000, "input_length": 1300, "output_length": 4, "hash_ids": [1, 2, 3], "cache_salt": "x"},
        {"timestamp": 180_000, "input_length": 1300, "output_length": 4, "hash_ids": [1, 2, 3], "tenant": "b"},
        {"timestamp": 240_000, "input_length": 1300, "output_length": 4, "hash_ids": [1, 2, 3]},
    ]
    path = tmp_path / "tenants.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    opened = open_source(Source(trace=str(path)))
    res = simulate(SimConfig(**CONST), opened.requests, check_every=1)
    hit = (1300 - 1) // 64 * 64
    assert [r.hit_tokens for r in res.records] == [0, 0, 0, hit, 0]


def test_scenario_tenants_only_lower_the_hits():
    # A fixed step time: which shared prefixes are still cached when a request comes is a matter of timing, and the
    # roofline's calibration is not what this test is about.
    cfg = SimConfig(step_model="constant")
    plain = simulate(cfg, generate_scenario("chat", seed=0, scale=0.1))
    dealt = simulate(cfg, generate_scenario("chat", seed=0, scale=0.1, tenants=4), check_every=25)
    assert dealt.summary["finished"] == plain.summary["finished"]
    assert 0 < dealt.summary["hit_tokens"] < plain.summary["hit_tokens"]
