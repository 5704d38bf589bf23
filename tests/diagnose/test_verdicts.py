"""Each of the four verdicts: a log where it must fire and one where it must not (plus: not enough data)."""

from __future__ import annotations

import json

import pytest

from dsakv.cli import main
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.diagnose import VERDICTS, diagnose
from dsakv.telemetry.log_reader import read_log


@pytest.fixture(scope="module")
def plan():
    cfg = SimConfig(schedule_policy="prefill_first")
    return cfg, build_setup(cfg)


def verdicts(path, plan) -> dict:
    cfg, setup = plan
    return {v.name: v for v in diagnose(read_log(path), None, cfg, setup)}


def test_pool_size_fires_and_names_the_indexer_schedule(write_log, sglang, plan):
    cfg, setup = plan
    planned = setup.num_pages * setup.group_page_tokens
    v = verdicts(write_log(sglang.pool(planned, planned * 53940 / 2**30)), plan)["pool_size"]
    assert v.fires is False and v.figures["gap_tokens"] == 0
    from dsakv.planner.budget import pool_capacity
    from dsakv.spec.layout import CacheLayout

    var = CacheLayout(setup.spec.with_full_indexer_count(39))
    logged = pool_capacity(var, setup.setting).pool_tokens
    v = verdicts(write_log(sglang.pool(logged, logged * var.cell_bytes / 2**30), "b.log"), plan)["pool_size"]
    assert (
        v.fires is True
        and "39 full indexer layers" in v.advice
        and v.figures["explained_by"][0] == ("39 full indexer layers")
    )
    assert v.figures["gap_share"] < 0


def test_long_request_admission_fires_when_requests_wait_with_the_pool_free(write_log, sglang, plan):
    lines = sglang.pool(580096, 29.14) + [sglang.decode(2, 300000, 60.0, usage=0.52, queue=3)] * 5
    assert verdicts(write_log(lines), plan)["long_request_admission"].fires is True
    full = sglang.pool(580096, 29.14) + [sglang.decode(40, 570000, 600.0, usage=0.98, queue=3)] * 5
    full += [sglang.prefill(1, 2048, 0, usage=0.1, queue=9)] * 5  # a prefill's queue is its token budget's
    assert verdicts(write_log(full, "b.log"), plan)["long_request_admission"].fires is False


def test_hit_without_ttft_gain_fires_for_short_hits_before_long_suffixes(write_log, sglang, plan):
    # A bf16 pool: SGLang's sparse prefill kernel reads each selected row once a chunk, so the suffix's cost is its
    # attention to the hit (an fp8 pool on Hopper prefills in the decode kernel, each token's top-k rows read: a cost
    # linear in the suffix, and a hit saves about its share).
    bf16 = SimConfig(schedule_policy="prefill_first", kv_dtype="bf16")
    bf16_plan = (bf16, build_setup(bf16))
    short_hits = [sglang.prefill(1, 2048, 200000)] + [sglang.prefill(0, 2048, 0)] * 292  # 200K hit, 600K suffix
    v = verdicts(write_log(short_hits), bf16_plan)["hit_without_ttft_gain"]
    assert v.fires is True and v.figures["expected_prefill_saving"] < 0.7 * v.figures["hit_rate"]
    long_hits = [sglang.prefill(1, 512, 16384)] * 20
    v = verdicts(write_log(long_hits, "b.log"), plan)["hit_without_ttft_gain"]
    assert v.fires is False and v.figures["expected_prefill_saving"] > 0.8
    v = verdicts(write_log([sglang.prefill(1, 2048, 0)] * 3, "c.log"), plan)["hit_without_ttft_gain"]
    assert v.fires is None and v.advice.startswith("not enough data: needs")


def _decode_log(sglang, slope_s: float) -> list[str]:
    lines = [sglang.interval(1)]
    for ctx in range(20000, 420000, 20000):
        for n in (1, 2):
            step = 0.015 + 0.001 * n + slope_s * n * ctx
            lines.append(sglang.decode(n, n * ctx, n / step))
    return lines


def test_decode_linear_in_context_fires_when_steps_grow_with_context(write_log, sglang, plan):
    v = verdicts(write_log(_decode_log(sglang, 4e-8)), plan)["decode_linear_in_context"]
    assert v.fires is True and v.figures["seconds_per_context_token"] == pytest.approx(4e-8, rel=1e-3)
    v = verdicts(write_log(_decode_log(sglang, 0.0), "b.log"), plan)["decode_linear_in_context"]
    assert v.fires is False
    v = verdicts(write_log([sglang.decode(4, 9000, 300.0)] * 3, "c.log"), plan)["decode_linear_in_context"]
    assert v.fires is None


def test_diagnose_json_lists_every_verdict(write_log, sglang, capsys):
    path = write_log(sglang.pool(580096, 29.14) + _decode_log(sglang, 4e-8))
    assert main(["diagnose", "--log", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in out["verdicts"]] == list(VERDICTS)
    assert {v["fires"] for v in out["verdicts"]} <= {True, False, None}
    assert all(isinstance(v["figures"], dict) and v["advice"] for v in out["verdicts"])


def test_a_queue_behind_a_full_batch_is_not_a_page_reservation(write_log, sglang, plan):
    capped = sglang.pool(580096, 29.14) + [sglang.decode(256, 300000, 6000.0, usage=0.52, queue=30)] * 5
    v = verdicts(write_log(capped), plan)["long_request_admission"]  # max_running_requests=256: the cap queues them
    assert v.fires is False and v.figures["queued_lines"] == 5


def test_the_pool_comes_from_the_metrics_scrape_when_the_log_has_none(write_log, sglang, tmp_path, capsys, plan):
    from dsakv.planner.budget import pool_capacity
    from dsakv.spec.layout import CacheLayout

    logged = pool_capacity(CacheLayout(plan[1].spec.with_full_indexer_count(39)), plan[1].setting).pool_tokens
    log = write_log([sglang.decode(4, 9000, 300.0)] * 3)
    scrape = tmp_path / "metrics.txt"
    scrape.write_text(f"# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens {logged}\n")
    assert main(["diagnose", "--log", log, "--metrics", str(scrape), "--json"]) == 0
    pool = json.loads(capsys.readouterr().out)["verdicts"][0]
    assert pool["fires"] is True and pool["figures"]["explained_by"][0] == "39 full indexer layers"
