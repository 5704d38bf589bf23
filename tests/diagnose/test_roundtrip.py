"""The round trip: simulate with a known setting, write the run's log in an engine's format, and diagnose /
calibrate from the log alone: the indexer schedule and DCP come back exactly, the efficiencies within 5 %."""

from __future__ import annotations

import json
import random

import pytest

from dsakv.cli import main

TRUTH = {  # hbm bandwidth, the step overhead and the prefill compute (its three efficiencies x 0.85)
    "bw_eff": 0.6,
    "overhead_s": 0.002,
    "gemm_eff": 0.515 * 0.85,
    "moe_eff": 0.44 * 0.85,
    "mla_prefill_eff": 0.6469 * 0.85,
}


def _trace(path, n: int, seed: int = 1, outputs: tuple[int, int] = (60, 200)) -> str:
    r, hid, rows = random.Random(seed), 0, []
    for _ in range(n):
        length = r.randint(2500, 6000)
        pages = -(-length // 512)
        rows.append({"timestamp": 0, "input_length": length, "output_length": r.randint(*outputs),
                     "hash_ids": list(range(hid, hid + pages))})  # fmt: skip
        hid += pages
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return str(path)


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_diagnose_recovers_indexer_schedule_and_dcp_exactly(tmp_path, capsys, fmt):
    trace, log = _trace(tmp_path / "t.jsonl", 6), str(tmp_path / "server.log")
    args = ["simulate", "--trace", trace, "--indexer", "39", "--dcp", "2", "--emit-log", log, "--log-format", fmt]
    assert main([*args, "--json"]) == 0
    capsys.readouterr()
    assert main(["diagnose", "--log", log, "--json"]) == 0
    pool = json.loads(capsys.readouterr().out)["verdicts"][0]
    assert pool["fires"] is True
    assert pool["figures"]["explained_by"][0] == "39 full indexer layers + DCP = 2"


def test_calibrate_recovers_the_efficiencies_within_5_percent(tmp_path, capsys):
    settings = tmp_path / "truth.json"
    settings.write_text(json.dumps({"format": "dsakv-step-settings", "version": 1, "settings": TRUTH}))
    trace, log, fitted = _trace(tmp_path / "t.jsonl", 60), str(tmp_path / "sg.log"), str(tmp_path / "fit.json")
    common = ["--schedule-policy", "prefill_first", "--max-batched-tokens", "8192"]
    assert main(["simulate", "--trace", trace, "--max-concurrency", "16", *common, "--step-settings", str(settings),
                 "--emit-log", log, "--log-interval", "1", "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["calibrate", "--log", log, "--max-batched-tokens", "8192", "--out", fitted, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    got = {f["name"]: f for f in out["fields"]}
    for name, value in TRUTH.items():
        assert got[name]["determined"], name
        assert got[name]["value"] == pytest.approx(value, rel=0.05), name
    assert {e["kind"] for e in out["errors"]} == {"decode", "prefill"}
    assert all(e["median_abs_error"] < 0.02 for e in out["errors"])
    # the settings file is what simulate --step-settings reads: the same run again gives the measured log's steps
    again = str(tmp_path / "again.log")
    assert main(["simulate", "--trace", trace, "--max-concurrency", "16", *common, "--step-settings", fitted,
                 "--emit-log", again, "--log-interval", "1", "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["calibrate", "--log", again, "--max-batched-tokens", "8192", "--json"]) == 0
    refit = {f["name"]: f["value"] for f in json.loads(capsys.readouterr().out)["fields"]}
    assert refit["bw_eff"] == pytest.approx(TRUTH["bw_eff"], rel=0.05)


def test_calibrate_refuses_a_vllm_log_and_bad_settings_files(tmp_path, capsys):
    log = tmp_path / "v.log"
    log.write_text("INFO 01-01 00:00:00 [x.py:1] GPU KV cache size: 569,600 tokens\n")
    assert main(["calibrate", "--log", str(log)]) == 1
    assert "vLLM" in capsys.readouterr().err
    bad = tmp_path / "s.json"
    bad.write_text(json.dumps({"format": "dsakv-step-settings", "version": 1, "settings": {"warp_speed": 2}}))
    assert main(["simulate", "--scenario", "chat", "--step-settings", str(bad)]) == 1
    assert "settings.warp_speed: must be one of" in capsys.readouterr().err


def test_emit_log_is_one_runs_and_its_flags_need_it(tmp_path, capsys):
    log = str(tmp_path / "x.log")
    assert main(["simulate", "--scenario", "chat", "--emit-log", log, "--sweep", "chunk_tokens=2048,4096"]) == 1
    assert "one run's log" in capsys.readouterr().err
    assert main(["simulate", "--scenario", "chat", "--log-format", "vllm"]) == 1
    assert "give --emit-log" in capsys.readouterr().err
    assert main(["simulate", "--scenario", "chat", "--emit-log", log, "--log-format", "trt"]) == 1
    assert "--log-format = 'trt': must be one of sglang, vllm" in capsys.readouterr().err
    assert main(["simulate", "--scenario", "chat", "--emit-log", log, "--instances", "2"]) == 1
    assert "one instance" in capsys.readouterr().err


def test_calibrate_from_sglangs_default_interval_still_finds_the_bandwidth(tmp_path, capsys):
    """Decode lines every 40 steps (SGLang's default): each gap's steps approximated by the batch it printed; the
    dominant unit still comes back within 5 %, and the report says how to get a step-exact fit."""
    settings = tmp_path / "truth.json"
    settings.write_text(json.dumps({"format": "dsakv-step-settings", "version": 1, "settings": TRUTH}))
    trace, log = _trace(tmp_path / "t.jsonl", 60, outputs=(400, 800)), str(tmp_path / "sg.log")
    assert main(["simulate", "--trace", trace, "--max-concurrency", "16", "--schedule-policy", "prefill_first",
                 "--max-batched-tokens", "8192", "--step-settings", str(settings), "--emit-log", log, "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["calibrate", "--log", log, "--max-batched-tokens", "8192", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    bw = next(f for f in out["fields"] if f["name"] == "bw_eff")
    assert bw["determined"] and bw["value"] == pytest.approx(TRUTH["bw_eff"], rel=0.05)
    assert "--decode-log-interval 1" in out["notes"][0]
