"""Real log excerpts from public issues (tests/data/logs/README.md cites each): every engine line is read, the
others are counted as ignored, and the verdicts they support come out."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.diagnose import diagnose
from dsakv.telemetry.log_reader import read_log

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
# file -> (engine, prefill lines, decode lines, stats lines, ignored lines)
EXPECTED = {
    "sglang_dsr1_h20_dp_decode.log": ("sglang", 0, 4, 0, 0),
    "sglang_dsv32_prefill.log": ("sglang", 3, 0, 0, 4),
    "sglang_jax_decode_old_format.log": ("sglang", 0, 3, 0, 0),
    "vllm_dsv3_mi308_capacity.log": ("vllm", 0, 0, 0, 0),
    "vllm_mtp_stats_waiting.log": ("vllm", 0, 0, 5, 0),
    "vllm_dsv4_prefix_hit.log": ("vllm", 0, 0, 2, 1),
    "vllm_v0_stats_swapped.log": ("vllm", 0, 0, 2, 1),
}


@pytest.fixture(scope="module")
def plan():
    cfg = SimConfig(schedule_policy="prefill_first")
    return cfg, build_setup(cfg)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_excerpt_is_read_whole(name):
    f = read_log(str(LOGS / name))
    assert f.malformed_lines == 0
    assert (f.engine, f.prefill_lines, f.decode_lines, f.stats_lines, f.ignored_lines) == EXPECTED[name]


def test_real_vllm_capacity_lines_give_the_pool(plan):
    f = read_log(str(LOGS / "vllm_dsv3_mi308_capacity.log"))
    assert f.pool.tokens == 107456 and f.concurrency.context_len == 32768
    pool = {v.name: v for v in diagnose(f, None, *plan)}["pool_size"]
    assert pool.fires is True and pool.figures["logged_tokens"] == 107456  # not a GLM-5.3 on 8 x H200 pool


def test_real_logs_queued_with_room_and_queued_when_full(plan):
    room = {v.name: v for v in diagnose(read_log(str(LOGS / "sglang_dsr1_h20_dp_decode.log")), None, *plan)}
    assert room["long_request_admission"].fires is True  # 13-17 queued at 76-77 % usage
    assert room["pool_size"].fires is None
    full = {v.name: v for v in diagnose(read_log(str(LOGS / "vllm_mtp_stats_waiting.log")), None, *plan)}
    assert full["long_request_admission"].fires is False  # waiting only with the cache 88-98 % used
    assert full["long_request_admission"].figures["queued_lines"] == 5


def test_real_vllm_hit_rate_is_read(plan):
    f = read_log(str(LOGS / "vllm_dsv4_prefix_hit.log"))
    assert f.hit_rate == pytest.approx((0.198 + 0.236) / 2)
    v = {v.name: v for v in diagnose(f, None, *plan)}["hit_without_ttft_gain"]
    assert v.fires is None and "needs SGLang 'Prefill batch'" in v.advice
