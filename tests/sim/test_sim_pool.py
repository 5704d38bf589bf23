"""The simulator's pool is the planner's: same GPU setting (DP attention, DCP, weights, activation reserve,
batched tokens) -> same pages per DP group; DCP pages are the planner's rank pages; DP attention routes round-robin."""

from __future__ import annotations

import json

import pytest

from dsakv.cli import main
from dsakv.planner.deployment import GpuSetting
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig, build_setup
from dsakv.workloads.traces import TraceRequest

GPU_FLAGS = [
    [],
    ["--dp-attention", "8"],
    ["--dcp", "4"],
    ["--gpus", "16", "--dp-attention", "4", "--dcp", "2"],
    ["--weights-bytes", "80GB", "--activation-bytes", "1GiB", "--max-batched-tokens", "8192"],
    ["--gpu-memory", "141GB", "--mem-fraction-static", "0.9"],
    ["--gpu", "B200"],
    ["--available-bytes", "20GB", "--dcp", "2"],
]


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("flags", GPU_FLAGS, ids=lambda f: " ".join(f) or "default")
def test_simulate_pool_equals_plan_pool_for_the_same_gpu_flags(capsys, flags):
    plan = _json(capsys, ["plan", "--json", *flags])
    sim = _json(
        capsys, ["simulate", "--scenario", "chat", "--scale", "0.01", "--step-model", "constant", "--json"] + flags
    )
    groups = sim["instances"] * sim["dp_attention"]  # every DP group simulated, each with the planner's pool
    assert sim["pool_pages"] == groups * plan["pool_pages"] and sim["pool_tokens"] == groups * plan["pool_tokens"]
    assert sim["pool_main_bytes"] + sim["pool_indexer_bytes"] == groups * plan["pool_pages"] * plan["page_bytes"]


def test_gpu_flags_are_validated_alike(capsys):
    for cmd in ("plan", "simulate"):
        assert main([cmd, "--dp-attention", "3"]) == 1
        assert "dp_attention = 3: must divide tp = 8" in capsys.readouterr().err


def _req(ts_ms, ids, n, out=4):
    return TraceRequest(ts_ms, n, out, tuple(ids))


def test_dcp_pages_hold_page_size_times_dcp_tokens_and_hits_follow_them():
    cfg = SimConfig(gpu=GpuSetting(dcp=2), step_model="constant", pool_tokens=100_000)
    setup = build_setup(cfg)
    assert setup.group_page_tokens == 128 and setup.num_pages == 100_000 // 128
    res = simulate(cfg, [_req(0, [1, 2, 3], 1300), _req(60_000, [1, 2, 3], 1300)])
    second = res.records[1]
    assert second.hit_tokens == (1300 - 1) // 128 * 128 and second.pages_saved == second.hit_tokens // 128
    # bytes of one rank: main rows of half the tokens (interleaved over 2 ranks), indexer K of all of them
    assert second.main_bytes_saved == second.hit_tokens // 2 * setup.layout.main_bytes_per_token
    assert second.indexer_bytes_saved == second.hit_tokens * setup.layout.indexer_bytes_per_token
    s = res.summary
    assert s["peak_main_bytes"] == s["peak_used_pages"] * setup.layout.main_page_bytes
    assert s["peak_indexer_bytes"] == s["peak_used_pages"] * 2 * setup.layout.indexer_page_bytes
    assert res.records[0].tail_waste_tokens == (-(1300 + 4)) % 128


def test_dp_attention_simulates_every_group():
    reqs = [_req(i * 1000, [i], 100) for i in range(10)]
    res = simulate(SimConfig(gpu=GpuSetting(tp=8, dp_attention=4), step_model="constant"), reqs)
    assert res.summary["requests"] == res.summary["finished"] == 10
    assert [r.arrival_s for r in res.records] == [float(i) for i in range(10)]
    assert res.summary["dp_attention"] == 4 and "other_group_requests" not in res.summary
    assert res.summary["pool_pages"] == 4 * build_setup(SimConfig(gpu=GpuSetting(tp=8, dp_attention=4))).num_pages


def test_rejected_input_tokens_are_reported_beside_the_hit_rate():
    too_long = 2 * 4096
    cfg = SimConfig(
        model="tiny", gpu=GpuSetting(num_gpus=4, tp=4), step_model="constant", pool_tokens=64 * 400
    )  # 4 heads
    res = simulate(cfg, [_req(0, range(16), too_long), _req(1, [99], 100)])
    s = res.summary
    assert s["rejected"] == 1 and s["rejected_input_tokens"] == too_long
    assert s["input_tokens"] == too_long + 100 and s["admitted_input_tokens"] == 100
    assert s["rejected_reasons"] == {"exceeds context limit": 1}
