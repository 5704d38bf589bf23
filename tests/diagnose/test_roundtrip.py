"""The round trip: simulate with a known setting, write the run's log in an engine's format, and diagnose /
calibrate from the log alone: the indexer schedule and DCP come back exactly, the efficiencies within 5 %."""

from __future__ import annotations

import json
import random

import pytest

from dsakv.cli import main

TRUTH = {  # hbm bandwidth and the prefill compute (its three efficiencies x 0.85); the step overhead stays derived
    "bw_eff": 0.6,
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
    # a bf16 cache: SGLang prefills it in FlashMLA's prefill kernel. With the fp8 cache it prefills in the decode
    # kernel (docs/steptime.md, fact 30), and a log cannot tell the prefill compute from the decode MLA's rate: their
    # Jacobian columns are 0.97 alike once the MoE's activations ride on the bandwidth (fact 43)
    common = ["--schedule-policy", "prefill_first", "--max-batched-tokens", "8192", "--kv-dtype", "bf16"]
    assert main(["simulate", "--trace", trace, "--max-concurrency", "16", *common, "--step-settings", str(settings),
                 "--emit-log", log, "--log-interval", "1", "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["calibrate", "--log", log, "--max-batched-tokens", "8192", "--kv-dtype", "bf16", "--out", fitted,
                 "--json"]) == 0  # fmt: skip
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
    assert main(["calibrate", "--log", again, "--max-batched-tokens", "8192", "--kv-dtype", "bf16", "--json"]) == 0
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


def _waves(path, n: int, short: int, long: int, spacing: int) -> str:
    """``n`` requests of ``short`` prompts, then ``n`` of ``long`` ones, all queued at once behind a concurrency of
    ``n``: each short request's end admits a long one, so the batch stays ``n`` while its context grows from
    ``n x short`` to ``n x long`` (outputs ``spacing`` steps apart, so each long prefill ends before the next)."""
    rows, hid = [], 0
    for i in range(2 * n):
        k = i % n
        length, out = (short, 500 + spacing * k) if i < n else (long, 1000 + spacing * (n - k))
        pages = -(-length // 512)
        rows.append({"timestamp": 0, "input_length": length, "output_length": out,
                     "hash_ids": list(range(hid, hid + pages))})  # fmt: skip
        hid += pages
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return str(path)


# DeepSeek-V3.2 (the indexer on all 61 layers: 8,052 B a context token) on 16 x H200 (TP 16) with DCP 8: the main
# latent is split over 8 ranks, the indexer K is whole on each, so a rank's pool holds 6.3 M tokens and a batch of
# 32 requests at 150 k tokens reads 4.8 M x 8,052 B = 39 GB of indexer K a step: 12 ms of a 31 ms step, above the
# per-layer minimum (61 x 134 us) that hides it at smaller settings.
LINEAR = ["--model", "deepseek-v3.2", "--gpus", "16", "--dcp", "8"]


@pytest.mark.parametrize(
    ("setting", "waves", "fires"),
    [(LINEAR, (32, 20000, 150000, 70), True), ([], (16, 4000, 30000, 70), False)],
    ids=["v3.2-dcp8-long-contexts", "glm-5.3-8xh200"],
)
def test_decode_linear_in_context_round_trip(tmp_path, capsys, setting, waves, fires):
    """Simulated decode steps that really grow with context make the verdict fire, with the fitted seconds per
    context token the step-time model's own slope; on GLM-5.3 / 8 x H200 (2,772 B a context token, a 580 k-token pool) the same
    slope is a few % of the step and it does not (16 requests: at 8 the layers' minimum binds and hides the slope)."""
    trace, log = _waves(tmp_path / "t.jsonl", *waves), str(tmp_path / "sg.log")
    assert main(["simulate", "--trace", trace, *setting, "--max-concurrency", str(waves[0]), "--max-batched-tokens",
                 "16384", "--emit-log", log, "--log-interval", "1", "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["diagnose", "--log", log, *setting, "--json"]) == 0
    v = json.loads(capsys.readouterr().out)["verdicts"][3]
    assert v["name"] == "decode_linear_in_context" and v["fires"] is fires
    f = v["figures"]  # the fit finds the step-time model's slope either way; only its share of the step differs
    assert f["seconds_per_context_token"] == pytest.approx(f["expected_seconds_per_context_token"], rel=0.05)
    assert (f["context_share_of_median_step"] >= 0.25) is fires
