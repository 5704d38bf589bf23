"""bench/calibrate.py runs on any anchors CSV (here a generated one) and exits 1 when a row leaves its band."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import re
import sys

import pytest

from dsakv.planner.deployment import rank_memory
from dsakv.sim.steptime.figures import batch1_layer_seconds
from dsakv.sim.steptime.kernels import BATCH1_LAYER_S

COLUMNS = (
    "id,model,weight_dtype,gpu,gpus,dp,mtp,accept,kv,mem,n,isl,osl,rate,fixed,conc,cap,chunk,budget,note,src,published"
)


def _write(tmp_path, published: dict, conc: str = "2") -> str:
    (tmp_path / "traces").mkdir(exist_ok=True)
    lines = [json.dumps({"timestamp": 0.0, "input_length": 100, "output_length": 5, "hash_ids": [i]}) for i in range(4)]
    (tmp_path / "traces" / "tiny-sgl-c2.jsonl").write_text("\n".join(lines) + "\n")
    row = dict.fromkeys(COLUMNS.split(","), "")
    row.update(id="tiny-sgl-c2", model="tiny", gpu="H200", gpus="1", dp="1", mtp="0", kv="fp8_ds_mla", conc=conc)
    row.update(chunk="256", published=json.dumps(published))
    path = tmp_path / "anchors.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS.split(","))
        w.writeheader()
        w.writerow(row)
    return str(path)


def test_calibrate_prints_rows_and_exits_by_band(tmp_path, calibrate, capsys):
    probe = _write(tmp_path, {"tpot_ms": [1.0, "mean"], "ttft_ms": [1.0, "p50"], "out_tok_s": 1.0})
    calibrate.main(["--anchors", probe, "--json"])
    ours = {r["metric"]: r["dsakv"] for r in json.loads(capsys.readouterr().out)["rows"]}
    inside = _write(tmp_path, {"tpot_ms": [ours["tpot_ms"] * 1.05, "mean"], "ttft_ms": [ours["ttft_ms"] * 0.92, "p50"]})
    assert calibrate.main(["--anchors", inside, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["metric"] for r in out["rows"]] == ["tpot_ms", "ttft_ms"]
    assert out["rows"][0]["ratio"] == pytest.approx(1.05) and all(r["band_ok"] for r in out["rows"])
    assert out["geomean_out"] == {}
    # Every row in its band, but a metric's geometric mean outside 0.9-1.1: exit 1, and the metric named.
    edge = _write(tmp_path, {"tpot_ms": [ours["tpot_ms"] * 1.2, "mean"], "ttft_ms": [ours["ttft_ms"] * 1.5, "p50"]})
    assert calibrate.main(["--anchors", edge, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert all(r["band_ok"] for r in out["rows"]) and set(out["geomean_out"]) == {"tpot_ms", "ttft_ms"}
    # The bands: TTFT 0.6-1.6 (1.9 is out), a rate dsakv / published within 0.8-1.25 (0.7 is out).
    assert calibrate.main(["--anchors", _write(tmp_path, {"ttft_ms": [ours["ttft_ms"] * 1.9, "p50"]})]) == 1
    outside = _write(tmp_path, {"tpot_ms": [ours["tpot_ms"], "mean"], "out_tok_s": ours["out_tok_s"] / 0.7})
    assert calibrate.main(["--anchors", outside]) == 1
    assert "OUT" in capsys.readouterr().out


def test_set_replays_at_the_given_roofline_values_and_rejects_other_names(tmp_path, calibrate, capsys):
    probe = _write(tmp_path, {"tpot_ms": [1.0, "mean"], "ttft_ms": [1.0, "mean"]})
    calibrate.main(["--anchors", probe, "--json"])
    plain = {r["metric"]: r["dsakv"] for r in json.loads(capsys.readouterr().out)["rows"]}
    calibrate.main(["--anchors", probe, "--json", "--set", "overhead_s=0.05", "--set", "frontend_s=1"])
    out = json.loads(capsys.readouterr().out)
    slower = {r["metric"]: r["dsakv"] for r in out["rows"]}
    assert out["set"] == {"overhead_s": 0.05, "frontend_s": 1.0}
    assert slower["tpot_ms"] > plain["tpot_ms"] + 40  # 50 ms a step instead of the derived microseconds
    assert slower["ttft_ms"] > plain["ttft_ms"] + 750  # the front-end's 1 s instead of 0.25 s
    assert "mla_prefill_eff" in calibrate.SETTABLE and "mtp_accept" not in calibrate.SETTABLE
    for bad in ("mtp_accept=0.5", "nope=1", "bw_eff=fast", "bw_eff=2"):
        assert calibrate.main(["--anchors", probe, "--set", bad]) == 2
    assert calibrate.main(["--anchors", probe, "--refine", "--set", "bw_eff=0.7"]) == 2
    assert "--set" in capsys.readouterr().err


@pytest.fixture
def make_traces(repo_dir):
    spec = importlib.util.spec_from_file_location("make_traces", repo_dir / "bench" / "calibration" / "make_traces.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_heldout_rows_cite_a_source_and_their_traces_are_generated(repo_dir, make_traces):
    # bench/calibration/heldout.csv: every row names its public source; its committed traces are exactly what
    # make_traces.py writes from the row (so a trace cannot drift from the settings it stands for).
    folder = repo_dir / "bench" / "calibration"
    with (folder / "heldout.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["src"].startswith("https://") and json.loads(r["published"]) for r in rows)
    for row in rows:
        committed = (folder / "traces" / f"{row['id']}.jsonl").read_text()
        assert committed == "\n".join(make_traces.trace_lines(row)) + "\n"
        first = json.loads(committed.splitlines()[0])
        assert (first["input_length"], first["output_length"]) == (int(row["isl"]), int(row["osl"]))
    assert len({r["id"] for r in rows}) == len(rows)


def test_make_traces_spaces_arrivals_by_the_rate(make_traces):
    row = {"n": "3", "isl": "1025", "osl": "2", "rate": "4", "fixed": "True"}
    lines = [json.loads(x) for x in make_traces.trace_lines(row)]
    assert [x["timestamp"] for x in lines] == [0.0, 250.0, 500.0]  # one every 1/4 s, in ms
    assert [x["hash_ids"] for x in lines] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # ceil(1025/512) fresh blocks


def test_an_empty_mem_takes_the_engines_default(calibrate):
    # SGLang TP8 + DP8 on an H200 (143,771 MiB): reserve 512 + 1.5 x 8192 + 2 x 512 + 1024 + 512 x 8 x 4.5 = 33,280
    # MiB -> (143771 - 33280) / 143771 = 0.769; without DP attention 14,848 MiB -> 0.897.
    assert calibrate.sglang_mem_fraction_static(143_771, 8, 8, 0) == 0.769
    assert calibrate.sglang_mem_fraction_static(143_771, 8, 1, 0) == 0.897
    # with an MLA model's piecewise prefill graphs (SGLang builds of a DSA model after 2026-05-22, no DP attention):
    # + 1,536 MiB -> 16,384 MiB -> 0.886
    assert calibrate.sglang_mem_fraction_static(143_771, 8, 1, 0, prefill_graph=True) == 0.886
    tp8 = {"id": "x-sgl-tp8", "engine": "sglang", "gpu": "H200", "gpus": "8", "dp": "1", "mtp": "0", "mem": ""}
    assert calibrate.engine_mem_fraction({**tp8, "version": "v0.5.14"}) == 0.886
    assert calibrate.engine_mem_fraction({**tp8, "version": "commit 947927bdb"}) == 0.897
    row = {"id": "x-sgl-dp8", "gpu": "H200", "gpus": "8", "dp": "8", "mtp": "0", "mem": ""}
    assert calibrate.engine_mem_fraction(row) == 0.769
    assert calibrate.engine_mem_fraction({**row, "id": "x-vllm-tp8", "dp": "1"}) == 0.9
    assert calibrate.engine_mem_fraction({**row, "mem": "0.85"}) == 0.85


def test_sglangs_draft_model_reserve_follows_the_rows_build(calibrate):
    # An EAGLE row with an empty mem on an H200 at TP8: 14,848 MiB reserved before the draft's share (the test above).
    row = {"id": "x-sgl-tp8-mtp3", "engine": "sglang", "gpu": "H200", "gpus": "8", "dp": "1", "mtp": "3", "mem": ""}
    # 0.5.6 (in use 2025-12-02) and a build with no version: + 2,048 MiB -> 16,896 MiB -> 0.882
    assert calibrate.sglang_eagle_reserve_mib({**row, "version": "0.5.6"}) == 2048
    assert calibrate.engine_mem_fraction({**row, "version": "0.5.6"}) == 0.882
    assert calibrate.engine_mem_fraction({**row, "version": ""}) == 0.882
    # a nightly of 2026-03-17 (after e55e65535): + 4,096 MiB -> 18,944 MiB -> 0.868
    assert calibrate.sglang_eagle_reserve_mib({**row, "version": "nightly-dev-20260317-1eea7448"}) == 4096
    assert calibrate.engine_mem_fraction({**row, "version": "nightly-dev-20260317-1eea7448"}) == 0.868
    # v0.5.12 was cut on or after 2026-05-07 and in use by 2026-05-16: between the two changes, 4 GiB
    assert calibrate.sglang_eagle_reserve_mib({**row, "version": "v0.5.12"}) == 4096
    # main @ 09ca4fc (2026-06-26, after 75998d042): the draft's pool is sized inside the fraction, nothing reserved;
    # the DSA model's piecewise prefill graphs (after 2026-05-22) keep their 1,536 MiB -> 16,384 MiB -> 0.886
    assert calibrate.sglang_eagle_reserve_mib({**row, "version": "main @ 09ca4fc"}) == 0
    assert calibrate.engine_mem_fraction({**row, "version": "main @ 09ca4fc"}) == 0.886
    # no draft, no share; a set mem wins
    assert calibrate.sglang_eagle_reserve_mib({**row, "mtp": "0", "version": "0.5.6"}) == 0
    assert calibrate.engine_mem_fraction({**row, "version": "v0.5.14", "mem": "0.8"}) == 0.8
    # 0.5.9 was in use by 2026-03-04 with no earliest cut on file: it may predate the 4 GiB change or not
    with pytest.raises(calibrate.DsakvError, match=r"version = '0\.5\.9'.*2026-02-26.*set the row's mem"):
        calibrate.engine_mem_fraction({**row, "version": "0.5.9"})
    # v0.5.14 (cut on or after 2026-05-07, in use by 2026-07-10) straddles 75998d042
    with pytest.raises(calibrate.DsakvError, match=r"2026-06-12"):
        calibrate.sglang_eagle_reserve_mib({**row, "version": "v0.5.14"})


def test_inferencex_rows_replay_its_clients_length_range(calibrate):
    from dsakv.workloads.traces import TraceRequest

    assert (
        calibrate.range_ratio_of({"id": "r1", "src": "https://github.com/SemiAnalysisAI/InferenceX/issues/870"}) == 0.8
    )
    assert calibrate.range_ratio_of({"id": "ds", "src": "https://github.com/gpustack/gpustack"}) == 1.0
    assert calibrate.range_ratio_of({"id": "x", "src": "InferenceX", "range_ratio": "0.5"}) == 0.5
    reqs = [TraceRequest(0.0, 1024, 1024, (2 * i, 2 * i + 1)) for i in range(500)]
    drawn = calibrate.client_lengths(reqs, 0.8)
    for r in drawn:  # benchmark_serving's random dataset: uniform integers in [int(0.8 x len), len]
        assert 819 <= r.input_length <= 1024 and 819 <= r.output_length <= 1024
    assert len({r.input_length for r in drawn}) > 100  # lengths vary: the closed loop's waves desynchronise
    assert calibrate.client_lengths(reqs, 0.8) == drawn  # seeded
    assert calibrate.client_lengths(reqs, 1.0) is reqs


def test_r1_rows_are_replayed_without_the_indexer(calibrate):
    # DeepSeek-R1 (dense MLA, no index_* fields) runs on the DSA preset as a proxy: its rows drop the indexer.
    assert not calibrate.has_indexer({"id": "r1-sgl-tp8-c8"})
    assert calibrate.has_indexer({"id": "ds-sgl-dp8-1k2k"})
    assert calibrate.has_indexer({"id": "r1-x", "indexer": "1"})
    assert not calibrate.has_indexer({"id": "x", "indexer": "0"})
    with pytest.raises(calibrate.DsakvError, match="indexer = maybe"):
        calibrate.has_indexer({"id": "x", "indexer": "maybe"})


def test_dp_attention_rows_take_sglangs_per_rank_chunk_and_conservativeness(calibrate, shared_dir):
    # SGLang's ServerArgs._handle_data_parallelism under --enable-dp-attention: chunked_prefill_size //= dp_size and
    # schedule_conservativeness *= 0.3; the scheduler's initial new-token ratio is 0.7 x schedule_conservativeness.
    h200 = {"id": "x-sgl-dp8", "gpu": "H200", "gpus": "8", "dp": "8", "mtp": "0", "mem": "", "chunk": ""}
    assert calibrate.sglang_chunked_prefill_size(143_771) == 8192
    assert calibrate.sglang_chunked_prefill_size(183_359) == 16384  # B200
    assert calibrate.engine_chunk_tokens(h200) == 8192 // 8
    assert calibrate.engine_chunk_tokens({**h200, "dp": "1"}) == 8192
    assert calibrate.engine_chunk_tokens({**h200, "chunk": "512"}) == 512  # a column is the per-rank value
    assert calibrate.engine_new_token_ratio(h200) == pytest.approx(0.7 * 0.3)
    assert calibrate.engine_new_token_ratio({**h200, "dp": "1"}) == pytest.approx(0.7)
    assert calibrate.engine_new_token_ratio({**h200, "id": "x-vllm-tp8"}) == 0.0  # vLLM allocates per step
    setup = calibrate.build_setup(
        calibrate.sim_config({**h200, "model": "tiny", "gpus": "1", "dp": "1", "chunk": "256"})
    )
    assert setup.scheduler.new_token_ratio == pytest.approx(0.7)
    # SGLang counts at most 4,096 tokens of a request's remaining output (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION);
    # vLLM reserves nothing ahead, so nothing to clip.
    assert setup.scheduler.new_token_clip == calibrate.SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION == 4096
    assert calibrate.engine_new_token_clip({**h200, "id": "x-vllm-tp8"}) is None
    # SGLang's tracker decays the ratio to 0.14 x its start over 600 decode steps; vLLM's ratio 0 has nothing to decay.
    assert setup.scheduler.new_token_ratio_min == pytest.approx(0.7 * 0.14)
    assert setup.scheduler.new_token_ratio_decay_steps == calibrate.SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS == 600
    assert calibrate.engine_new_token_ratio_min(h200) == pytest.approx(0.21 * 0.14)  # DP attention's start
    assert calibrate.engine_new_token_ratio_min({**h200, "id": "x-vllm-tp8"}) is None
    # SGLang retracts the fewest outputs first; vLLM preempts its newest. Both wait at the front (steptime.md).
    assert (setup.scheduler.victim_order, setup.scheduler.requeue) == calibrate.SGLANG_RETRACTION
    assert calibrate.SGLANG_RETRACTION == ("fewest_outputs", "front")
    assert calibrate.engine_preemption({**h200, "id": "x-vllm-tp8"}) == calibrate.VLLM_PREEMPTION == ("newest", "front")
    dp_setup = calibrate.build_setup(calibrate.sim_config({**h200, "model": "deepseek-v3.2", "weight_dtype": "fp8"}))
    assert dp_setup.scheduler.new_token_ratio == pytest.approx(0.21)
    assert dp_setup.scheduler.chunk_tokens == 1024
    # The gpustack DP8 anchors' chunk column (1,024, no --chunked-prefill-size in their launch command) is SGLang's
    # H200 default divided per rank, the value each DP rank's scheduler runs with.
    anchors = shared_dir / "data" / "calibration" / "anchors.csv"
    if anchors.exists():
        with anchors.open(newline="") as f:
            dp_rows = [r for r in csv.DictReader(f) if int(r["dp"] or 1) > 1]
        assert dp_rows
        for row in dp_rows:
            assert calibrate.engine_chunk_tokens(row) == calibrate.engine_chunk_tokens({**row, "chunk": ""})


def test_decode_steps_prints_the_typical_decode_steps_parts_and_median_itl(
    tmp_path, load_file_module, repo_dir, capsys, monkeypatch
):
    decode_steps = load_file_module(repo_dir / "bench" / "decode_steps.py")
    assert decode_steps.weighted_median([(3.0, 1), (1.0, 5), (2.0, 1)]) == 1.0  # 5 of 7 tokens waited 1
    assert decode_steps.weighted_median([(3.0, 4), (1.0, 1)]) == 3.0
    path = _write(tmp_path, {"tpot_ms": [1.0, "mean"]})
    assert decode_steps.main(["--anchors", path]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("tiny-sgl-c2: decode-only ") and "typical decode step (" in line
    assert " linear " in line and " overhead " in line and "median ITL " in line and line.endswith(" ms")
    # A burst whose four requests decode together (no front-end queue to stagger them): the simulator advances such
    # runs of decode steps at once, and the recorder must still see every one (4 outputs after the first: 4 steps).
    monkeypatch.setattr(decode_steps.calibrate, "FRONTEND_REQUEST_S", 0.0)
    monkeypatch.setattr(decode_steps.calibrate, "FRONTEND_TOKEN_S", 0.0)
    burst = _write(tmp_path, {"tpot_ms": [1.0, "mean"]}, conc="")
    assert decode_steps.main(["--anchors", burst]) == 0
    assert "decode-only 4 (" in capsys.readouterr().out


def test_front_end_service_is_the_least_squares_line_through_the_measurement(calibrate):
    # Closed form of the least-squares line through the measured (prompt tokens, seconds) points: slope =
    # (n Sxy - Sx Sy) / (n Sxx - Sx^2), intercept = (Sy - slope Sx) / n; every replayed row carries it.
    pts = calibrate.FRONTEND_MEASURED
    n, sx, sy = len(pts), sum(t for t, _ in pts), sum(s for _, s in pts)
    sxx, sxy = sum(t * t for t, _ in pts), sum(t * s for t, s in pts)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    assert calibrate.FRONTEND_TOKEN_S == pytest.approx(slope)
    assert calibrate.FRONTEND_REQUEST_S == pytest.approx((sy - slope * sx) / n)
    assert calibrate.frontend_service(((0, 0.002), (1000, 0.003))) == pytest.approx((0.002, 1e-6))
    row = {"id": "x-sgl-dp8", "model": "tiny", "gpu": "H200", "gpus": "1", "dp": "1", "mtp": "0", "chunk": "256"}
    cfg = calibrate.sim_config(row)
    assert (cfg.frontend_request_s, cfg.frontend_token_s) == (calibrate.FRONTEND_REQUEST_S, calibrate.FRONTEND_TOKEN_S)


def test_burst_phases_counts_every_output_token_in_vllm_benchs_one_second_buckets(
    tmp_path, load_file_module, repo_dir, capsys
):
    phases = load_file_module(repo_dir / "bench" / "burst_phases.py")
    # vllm bench serve's peak: tokens per bucket int(t - first send); the fullest bucket, scaled per DP group.
    emitted = [(0.5, 3), (0.9, 2), (1.2, 4), (2.999, 1)]
    assert phases.peak_tokens_per_second(emitted, 0.0) == 5
    assert phases.peak_tokens_per_second(emitted, 0.0, scale=8) == 40
    assert phases.peak_tokens_per_second(emitted, 0.3) == 9  # bucket [0.3, 1.3) holds 0.5, 0.9 and 1.2
    # The replay's token clock sees every output token once, analytic decode runs included.
    path = _write(tmp_path, {"tpot_ms": [1.0, "mean"], "ttft_ms": [1.0, "mean"]})
    anchor = next(csv.DictReader(open(path, newline="")))
    cfg, setup, requests, _ = phases.calibrate.replay_inputs(anchor, tmp_path / "traces")
    clock = phases.TokenClock()
    records = clock.run(cfg, setup, requests).records
    assert sum(t for _, t in clock.emitted) == sum(r.output_tokens for r in records) == 4 * 5
    peaks = tmp_path / "peaks.csv"
    peaks.write_text("id,peak_out_tok_s,median_itl_ms,src\ntiny-sgl-c2,100,10,x\n")
    assert phases.main(["--anchors", path, "--peaks", str(peaks)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("tiny-sgl-c2 ") and "(    100)" in out[1]
    assert out[-1].startswith("peak output tok/s dsakv / published: geometric mean ")
    assert phases.main(["--anchors", path, "--peaks", str(peaks), "--set", "frontend_s=2"]) == 0
    later = capsys.readouterr().out.splitlines()[1].split()
    assert float(later[3]) > float(out[1].split()[3]) + 1.5  # TTFT: the front-end's 2 s instead of 0.25 s
    assert phases.main(["--anchors", path, "--peaks", str(peaks), "--set", "nope=1"]) == 2
    assert "--set" in capsys.readouterr().err
    assert phases.main(["--anchors", path, "--peaks", str(peaks), "--detail", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("    request     0: admitted ") and out[4].startswith("    running at 0.0 s: ")


def test_an_empty_kv_takes_the_engines_default_bf16_cache(calibrate):
    # vLLM stores DeepSeek-V3.2's fp8_ds_mla format only with --kv-cache-dtype fp8 (default "auto": bf16, since
    # vllm-project/vllm#27121); SGLang on Hopper defaults to bf16. A filled cell is the row's setting.
    assert calibrate.engine_kv_dtype({"id": "x-vllm", "gpu": "H200", "kv": ""}) == "bf16"
    assert calibrate.engine_kv_dtype({"id": "x-sgl", "gpu": "H200", "version": "v0.5.14"}) == "bf16"
    assert calibrate.engine_kv_dtype({"id": "x-vllm", "gpu": "B200", "kv": ""}) == "bf16"
    assert calibrate.engine_kv_dtype({"id": "x-vllm", "kv": "fp8_ds_mla"}) == "fp8_ds_mla"
    row = {"id": "x-vllm-tp8", "model": "deepseek-v3.2", "weight_dtype": "fp8", "gpu": "H200", "gpus": "8", "kv": ""}
    setup = calibrate.build_setup(calibrate.sim_config(row))
    assert setup.layout.kv_dtype == "bf16" and setup.step_time.mla_prefill_kernel_all
    assert not setup.step_time.mla_mixed_batch


def test_gpustack_rows_leave_mem_and_kv_to_the_engines_defaults(calibrate, shared_dir):
    # gpustack's launch commands set neither the memory fraction nor the KV-cache dtype, so the corrected anchors
    # leave both cells empty: SGLang TP8 + DP8 on an H200 takes its heuristic fraction, vLLM 0.9 with a bf16 cache.
    rows = {a["id"]: a for a in csv.DictReader(open(shared_dir / "data" / "calibration" / "anchors.csv", newline=""))}
    gpustack = [a for a in rows.values() if "gpustack" in a["src"]]
    assert gpustack and all(a["mem"] == a["kv"] == "" for a in gpustack)
    sgl, vllm = rows["ds-sgl-dp8-32k100"], rows["ds-vllm-tp8-4k200"]
    assert calibrate.engine_mem_fraction(sgl) == calibrate.sglang_mem_fraction_static(143_771, 8, 8, 0) == 0.769
    assert calibrate.engine_mem_fraction(vllm) == calibrate.VLLM_GPU_MEMORY_UTILIZATION
    assert calibrate.sim_config(vllm).kv_dtype == "bf16"


def test_heldout_rows_record_only_the_settings_their_sources_name(calibrate, repo_dir):
    # The held-out rows follow the anchors' rule: gpustack's DeepSeek-V3.2 page (the anchors' source too) names no
    # memory fraction or cache format, the GLM-5 report names its image and 0.85 but no cache format; an empty cell
    # is the engine's default at the row's build, which every row names.
    with (repo_dir / "bench" / "calibration" / "heldout.csv").open(newline="") as f:
        rows = {a["id"]: a for a in csv.DictReader(f)}
    # only InferenceX's Blackwell R1 command names a cache format (--kv-cache-dtype fp8_e4m3: TensorRT-LLM MLA's rows)
    assert all(a["engine"] and a["version"] for a in rows.values())
    named = {i for i, a in rows.items() if a["kv"]}
    assert named == {i for i, a in rows.items() if "--kv-cache-dtype fp8_e4m3" in a["note"]}
    assert named and all(rows[i]["kv"] == "fp8" and rows[i]["gpu"] in ("B200", "B300") for i in named)
    assert all(a["mem"] == "" for a in rows.values() if "gpustack" in a["src"])
    assert calibrate.sim_config(rows["ds-vllm-tp8-128x4"]).kv_dtype == "bf16"  # vLLM v0.13: bf16 unless told
    assert calibrate.sim_config(rows["ds-sgl-dp8-128x4"]).kv_dtype == "bf16"  # SGLang on Hopper
    assert calibrate.sim_config(rows["glm5-sgl-tp8-b200-c1"]).kv_dtype == "fp8_ds_mla"  # SGLang on Blackwell, 2026-02
    assert calibrate.sim_config(rows["glm5-sgl-tp8-h200-mtp3-c1"]).kv_dtype == "bf16"
    assert calibrate.sim_config(rows["glm52-sgl-mi355x-tp8-8k1k-c64"]).kv_dtype == "bf16"  # gfx950 reports SM 9.5
    # the DeepSeek-V3.2 cookbook's B200 runs (SGLang 0.5.6): FlashMLA's fp8 rows, EAGLE V1 (before spec v2), eager
    # prefill (before piecewise graphs); the ShareGPT run's lengths drawn around the printed means
    mtp, dp8 = (
        calibrate.sim_config(rows["dsexp-sgl-b200-tp8-mtp3-c1"]),
        calibrate.sim_config(rows["dsexp-sgl-b200-dp8-c100"]),
    )
    assert mtp.kv_dtype == dp8.kv_dtype == "fp8_ds_mla"
    assert not mtp.spec_overlap and not mtp.prefill_graph and not dp8.prefill_graph
    assert calibrate.engine_chunk_tokens(rows["dsexp-sgl-b200-dp8-c100"]) == 16384 // 8
    assert calibrate.range_ratio_of(rows["dsexp-sgl-b200-dp8-c100"]) == 0.0
    assert calibrate.range_ratio_of(rows["dsexp-sgl-b200-tp8-mtp3-c1"]) == 1.0


def test_the_env_column_turns_vllms_deepgemm_experts_on(calibrate, repo_dir):
    # vLLM keeps its tensor-parallel fp8 experts in Triton's fused MoE on Hopper unless the source sets DeepGEMM's
    # switch to 1 (fact 36); a 0 keeps them there too (the vLLM recipe's H20 run sets VLLM_MOE_USE_DEEP_GEMM=0).
    assert calibrate.engine_env({"id": "x", "env": ""}) == {}
    assert calibrate.engine_env({"id": "x", "env": "VLLM_MOE_USE_DEEP_GEMM=0"}) == {"VLLM_MOE_USE_DEEP_GEMM": "0"}
    assert calibrate.engine_moe_deep_gemm({"id": "x"}) is False
    assert calibrate.engine_moe_deep_gemm({"id": "x", "env": "VLLM_USE_DEEP_GEMM=0"}) is False
    assert calibrate.engine_moe_deep_gemm({"id": "x", "env": "VLLM_MOE_USE_DEEP_GEMM=1"}) is True
    assert calibrate.engine_moe_deep_gemm({"id": "x", "env": "VLLM_MOE_USE_DEEP_GEMM=1 VLLM_USE_DEEP_GEMM=0"}) is False
    for bad in ("VLLM_MOE_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM=2", "CUDA_VISIBLE_DEVICES=0"):
        with pytest.raises(calibrate.DsakvError, match=rf"^anchor x: env = '{bad}': must be NAME=0 or NAME=1"):
            calibrate.engine_env({"id": "x", "env": bad})
    rows = {a["id"]: a for a in calibrate.read_anchors(repo_dir / "bench" / "calibration" / "check.csv")}
    assert [a["id"] for a in rows.values() if a.get("env")] == ["ds-vllm-tp8-h20-2k1k-r10"]
    step = lambda a: calibrate.build_setup(calibrate.sim_config(a)).step_time  # noqa: E731
    assert step(rows["ds-vllm-tp8-h20-2k1k-r10"]).moe_deep_gemm_min_tokens == 0
    assert step(rows["glm52-vllm-tp8-8k1k-c512"]).moe_deep_gemm_min_tokens == 0
    assert step(rows["glm52-sgl-h200-tp8-mtp5-8k1k-c1"]).moe_deep_gemm_min_tokens == 0


def test_blackwell_rows_take_the_batch_one_layer_their_decode_path_measured(calibrate, repo_dir):
    # Fact 14: the batch-1 layer scales with HBM, except SGLang's DSA decode on Blackwell from FlashMLA's fp8_ds_mla rows
    # or a bf16 cache (the cache format each row's build defaults to, SGLANG_BLACKWELL_DSA_KV). The held-out early-2026
    # DSA rows keep the reference layer; the GLM-5.2 cookbook's June build (TensorRT-LLM's fp8 rows) and every
    # dense-MLA row (InferenceX's DeepSeek-R1 on B200 / B300) scale.
    def layer(a):
        _, setup, _, _ = calibrate.replay_inputs(a, repo_dir / "bench" / "calibration" / "traces")
        return batch1_layer_seconds(setup.step_time)

    folder = repo_dir / "bench" / "calibration"
    held = {a["id"]: a for a in calibrate.read_anchors(folder / "heldout.csv")}
    check = {a["id"]: a for a in calibrate.read_anchors(folder / "check.csv")}
    for rid in (
        "glm5-sgl-tp8-b200-c1",
        "glm5-sgl-tp8-b200-mtp3-c1",
        "dsexp-sgl-b200-tp8-mtp3-c1",
        "ds-sgl-b200-dp8-4k512-b1",
    ):
        assert layer(held[rid]) == BATCH1_LAYER_S, rid
    for rid in ("r1-sgl0512-b200-tp8-1k1k-c1", "r1-sgl0512-b300-tp4-8k1k-c1"):
        assert layer(held[rid]) == pytest.approx(BATCH1_LAYER_S * 0.6), rid
    assert layer(check["glm52-sgl-b200-tp8-mtp5-8k1k-c1"]) == pytest.approx(BATCH1_LAYER_S * 0.6)
    assert layer(check["glm52-sgl-h200-tp8-mtp5-8k1k-c1"]) == pytest.approx(BATCH1_LAYER_S)


def test_sglang_rows_on_blackwell_run_trtllms_fused_moe_from_its_build_by_model(calibrate, repo_dir):
    # Fact 37: SGLang's automatic MoE runner on Blackwell is flashinfer_trtllm for fp8 experts without an all-to-all,
    # from 2025-10-23 for DeepSeek-V3 / R1, 2025-11-23 for DeepSeek-V3.2 (loaded as DeepseekV3ForCausalLM), 2026-02-10
    # for GLM-5.x; a row of an earlier build (or naming none) keeps the fitted rate.
    row = {"id": "x", "model": "deepseek-v3.2", "gpu": "B200", "engine": "sglang"}
    assert calibrate.engine_moe_trtllm({**row, "version": "0.5.6"}) is True  # 2025-12-02
    assert calibrate.engine_moe_trtllm({**row, "version": "lmsysorg/sglang:nightly-dev-20251120-abc"}) is False
    assert calibrate.engine_moe_trtllm({**row, "version": "lmsysorg/sglang:nightly-dev-20251120-abc", "indexer": "0"})
    assert calibrate.engine_moe_trtllm({**row, "version": ""}) is False
    glm = {**row, "model": "glm-5"}
    assert calibrate.engine_moe_trtllm({**glm, "version": "lmsysorg/sglang:nightly-dev-20260209-abc"}) is False
    assert calibrate.engine_moe_trtllm({**glm, "version": "commit 947927bdb"}) is True
    assert calibrate.engine_moe_trtllm({**row, "gpu": "H200", "version": ""}) is True  # the step time's rule says no
    step = lambda a: calibrate.build_setup(calibrate.sim_config(a)).step_time  # noqa: E731
    rows = {a["id"]: a for a in calibrate.read_anchors(repo_dir / "bench" / "calibration" / "check.csv")}
    assert step(rows["glm52-sgl-b200-tp8-mtp5-8k1k-c16"]).moe_trtllm is True
    assert step(rows["glm52-sgl-gb300-tp4-mtp5-8k1k-c16"]).moe_trtllm is True
    assert step(rows["glm52-sgl-b200-dp8-mtp1-8k1k-c64"]).moe_trtllm is False  # DeepEP: DeepGEMM's experts
    assert step(rows["glm52-sgl-h200-tp8-mtp5-8k1k-c16"]).moe_trtllm is False
    # every SGLang Blackwell row on file is dated after its model's start (the step time then keeps DeepEP rows out)
    for name in ("fit", "check", "heldout"):
        for a in calibrate.read_anchors(repo_dir / "bench" / "calibration" / f"{name}.csv"):
            if calibrate.policy_of(a) == "prefill_first" and calibrate.gpu_kind(a["gpu"]).arch == "blackwell":
                assert calibrate.engine_moe_trtllm(a) is True, a["id"]


def test_sglang_rows_on_cdna4_run_aiters_fused_moe_from_its_table(calibrate, repo_dir):
    # Fact 38: SGLang's ROCm image runs fp8 experts in AITER's fused MoE, at the rates of AITER's tuned GLM-5 table on
    # MI355X, which AITER holds from 2026-04-13 on; a build before it (or naming none) keeps the fitted rate.
    row = {"id": "x", "model": "glm-5.2", "gpu": "MI355X", "engine": "sglang"}
    assert calibrate.engine_aiter({**row, "version": "lmsysorg/sglang-rocm:v0.5.13.post1-rocm720-mi35x-20260618"})
    assert calibrate.engine_aiter({**row, "version": "lmsysorg/sglang:nightly-dev-20260412-abc"}) is False
    assert calibrate.engine_aiter({**row, "version": "lmsysorg/sglang:nightly-dev-20260413-abc"}) is True
    assert calibrate.engine_aiter({**row, "version": ""}) is False
    assert calibrate.engine_aiter({**row, "gpu": "H200", "version": ""}) is True  # the step time's rule says no
    with (repo_dir / "bench" / "calibration" / "heldout.csv").open(newline="") as f:
        amd = [a for a in csv.DictReader(f) if a["gpu"] == "MI355X"]
    assert len(amd) == 5
    for a in amd:
        assert calibrate.build_setup(calibrate.sim_config(a)).step_time.aiter is True, a["id"]


def test_sglang_on_an_amd_gpu_runs_prefill_eagerly(calibrate, repo_dir):
    # ServerArgs turns piecewise prefill graphs off on every non-CUDA GPU (HIP included), from their default
    # (c64274c74) on; the same TP8 row on an H200 of the same build replays them (no DP attention, no DeepEP).
    with (repo_dir / "bench" / "calibration" / "heldout.csv").open(newline="") as f:
        amd = [a for a in csv.DictReader(f) if a["gpu"] == "MI355X"]
    assert len(amd) == 5
    for row in amd:
        cfg = calibrate.sim_config(row)
        assert cfg.prefill_graph is False and cfg.num_speculative_tokens == 0, row["id"]
        assert calibrate.sim_config({**row, "gpu": "H200"}).prefill_graph is True, row["id"]
    chunks = {a["id"]: calibrate.engine_chunk_tokens(a) for a in amd}
    assert chunks["glm52-sgl-mi355x-tp8-8k1k-c1"] == 131072
    assert chunks["glm52-sgl-mi355x-tp8-8k1k-c1024"] == 16384  # 288 GB: SGLang's default above 160 GiB


def _write_rows(tmp_path, rows: list[dict]) -> str:
    """An anchors CSV of the tiny model's rows (``id``, ``published`` and any column overridden), each with a trace
    of four requests of 100 input and 5 output tokens."""
    (tmp_path / "traces").mkdir(exist_ok=True)
    lines = [json.dumps({"timestamp": 0.0, "input_length": 100, "output_length": 5, "hash_ids": [i]}) for i in range(4)]
    header = COLUMNS.split(",") + ["engine", "client"]
    path = tmp_path / "anchors.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        for over in rows:
            row = dict.fromkeys(header, "")
            row.update(model="tiny", gpu="H200", gpus="1", dp="1", mtp="0", kv="fp8_ds_mla", conc="2", chunk="256")
            row.update({**over, "published": json.dumps(over["published"])})
            w.writerow(row)
            (tmp_path / "traces" / f"{row['id']}.jsonl").write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_row_that_cannot_be_replayed_is_an_error_row_and_the_run_goes_on(tmp_path, calibrate, capsys):
    # DeepSeek-V3.2's ~674 GB of FP8 weights on one H200: the planner leaves no pool, so the row cannot be replayed.
    # The run still replays the other row, reports the reason, keeps the error out of the means, and exits 1.
    too_big = {"id": "ds-sgl-1gpu", "model": "deepseek-v3.2", "weight_dtype": "fp8", "conc": ""}
    path = _write_rows(
        tmp_path,
        [
            {**too_big, "published": {"tpot_ms": [10.0, "mean"], "out_tok_s": 100.0}},
            {"id": "tiny-sgl", "published": {"tpot_ms": [1.0, "mean"]}},
        ],
    )
    assert calibrate.main(["--anchors", path, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    errors = [r for r in out["rows"] if r.get("error")]
    assert [r["metric"] for r in errors] == ["tpot_ms", "out_tok_s"]
    assert all(r["id"] == "ds-sgl-1gpu" and r["dsakv"] is None and r["ratio"] is None for r in errors)
    assert "weights" in errors[0]["error"] and not any(r["band_ok"] for r in errors)
    good = [r for r in out["rows"] if not r.get("error")]
    assert [r["id"] for r in good] == ["tiny-sgl"] and good[0]["dsakv"] > 0
    assert set(out["geomean"]) == {"tpot_ms"} and out["worst"]["id"] == "tiny-sgl"
    assert out["decoders"] == []  # the error row has both figures, but nothing was replayed
    fam = {(f["family"], f["metric"]): f for f in out["families"]}
    assert fam[("sglang H200 mtp-off dp-off", "out_tok_s")] == {
        "family": "sglang H200 mtp-off dp-off", "metric": "out_tok_s", "rows": 1, "out": 0, "errors": 1,
        "geomean": None, "worst": None,
    }  # fmt: skip
    assert calibrate.main(["--anchors", path]) == 1
    text = capsys.readouterr().out
    assert "ERROR" in text and "error: ds-sgl-1gpu: the GPU setting leaves" in text
    # A malformed file is still refused before any replay (exit 2): an unknown metric or statistic, an --only id
    # that is not in the file, a missing trace.
    for i, published in enumerate(({"tput": 1.0}, {"tpot_ms": [1.0, "p42"]}, {"tpot_ms": -1})):
        (tmp_path / f"bad{i}").mkdir()
        assert (
            calibrate.main(["--anchors", _write_rows(tmp_path / f"bad{i}", [{"id": "x", "published": published}])]) == 2
        )
    assert calibrate.main(["--anchors", path, "--only", "tiny-sgl,nope"]) == 2
    (tmp_path / "traces" / "tiny-sgl.jsonl").unlink()
    assert calibrate.main(["--anchors", path]) == 2
    assert "no trace" in capsys.readouterr().err


def test_metrics_count_what_their_sources_count(tmp_path, calibrate, capsys):
    # "Total Token throughput" (vLLM), "Total TPS" (gpustack) and "Total tput/GPU" (InferenceX) count input + output
    # tokens; "Output token throughput" only the output. Four requests of 100 in / 5 out on 2 GPUs with DP 2: the
    # trace's requests are dealt over the two groups, the replay runs group 0 and counts its two once per group.
    names = ("out_tok_s", "out_tok_s_gpu", "in_tok_s", "in_tok_s_gpu", "total_tok_s", "total_tok_s_gpu", "req_s")
    published = {m: 1.0 for m in names}
    published.update(duration_s=1.0, e2e_ms=[1.0, "mean"], ttft_ms=[1.0, "mean"], tpot_ms=[1.0, "mean"])
    published.update(e2e_per_token_ms=[1.0, "mean"])
    path = _write_rows(tmp_path, [{"id": "tiny-sgl", "gpus": "2", "dp": "2", "published": published}])
    calibrate.main(["--anchors", path, "--json"])
    got = {r["metric"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    ours = {m: r["dsakv"] for m, r in got.items()}
    duration = ours["duration_s"]
    assert ours["req_s"] == pytest.approx(4 / duration)
    assert ours["out_tok_s"] == pytest.approx(4 * 5 / duration)
    assert ours["in_tok_s"] == pytest.approx(4 * 100 / duration)
    assert ours["total_tok_s"] == pytest.approx(ours["in_tok_s"] + ours["out_tok_s"])
    for m in ("out_tok_s", "in_tok_s", "total_tok_s"):
        assert ours[f"{m}_gpu"] == pytest.approx(ours[m] / 2)
        assert got[m]["ratio"] == pytest.approx(ours[m])  # a rate: dsakv / published
    assert got["duration_s"]["ratio"] == pytest.approx(1 / duration)  # a time: published / dsakv
    assert ours["e2e_ms"] == pytest.approx(ours["ttft_ms"] + 4 * ours["tpot_ms"])  # five tokens: TTFT + 4 TPOTs
    # guidellm's "time per output token" (gpustack's "Mean TPOT") is E2E / output tokens, the first token's wait
    # included: a fifth of the mean E2E here, and above the TPOT that leaves the first token out.
    assert ours["e2e_per_token_ms"] == pytest.approx(ours["e2e_ms"] / 5)
    assert ours["e2e_per_token_ms"] > ours["tpot_ms"]
    assert set(calibrate.METRICS) >= set(names) | {"ttft_ms", "tpot_ms", "e2e_ms", "duration_s"}
    assert all(calibrate.METRICS[m].rate for m in names) and not calibrate.METRICS["tpot_ms"].rate


def test_a_one_batch_run_is_read_as_bench_one_batch_server_reads_it(tmp_path, calibrate, capsys):
    # sglang.bench_one_batch_server posts one batch: its TTFT is the batch's last first token (the statistic max), its
    # ITL the time from there to the last finish over the output length, its latency the duration.
    published = {"ttft_ms": [1.0, "max"], "batch_itl_ms": 1.0, "duration_s": 1.0, "tpot_ms": [1.0, "mean"]}
    row = {"id": "tiny-sgl", "conc": "", "published": published}  # the four requests sent at once, as one batch
    calibrate.main(["--anchors", _write_rows(tmp_path, [row]), "--json"])
    ours = {r["metric"]: r["dsakv"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert ours["batch_itl_ms"] == pytest.approx((1000 * ours["duration_s"] - ours["ttft_ms"]) / 5)  # all sent at 0
    assert calibrate._stat([3.0, 9.0, 1.0], "max") == 9.0 and not calibrate.METRICS["batch_itl_ms"].rate


def test_the_receive_interval_is_the_one_the_rows_command_names(calibrate, repo_dir):
    # InferenceX's Blackwell R1 command passes --scheduler-recv-interval (10 up to 8 concurrent, 30 above); the
    # held-out rows carry it in recv_interval exactly where their note quotes it, and the replay receives as SGLang's
    # SchedulerRecvSkipper does. Empty is the engine's default, 1; another engine's row may not set it.
    rows = {a["id"]: a for a in calibrate.read_anchors(repo_dir / "bench" / "calibration" / "heldout.csv")}
    named = {i for i, a in rows.items() if a["recv_interval"]}
    assert named == {i for i, a in rows.items() if "--scheduler-recv-interval" in a["note"]} and len(named) == 22
    assert all(f"--scheduler-recv-interval {rows[i]['recv_interval']} " in rows[i]["note"] for i in named)
    assert calibrate.sim_config(rows["r1-sgl0512-b300-tp8-1k1k-c64"]).scheduler_recv_interval == 30
    assert calibrate.sim_config(rows["r1-sgl0512-b300-tp8-1k1k-c8"]).scheduler_recv_interval == 10
    assert calibrate.sim_config(rows["r1-sgl0512-h200-tp8-1k1k-c8"]).scheduler_recv_interval == 1
    sgl = {"id": "x", "engine": "sglang"}
    assert (
        calibrate.engine_recv_interval(sgl) == 1 and calibrate.engine_recv_interval({**sgl, "recv_interval": "4"}) == 4
    )
    for bad in ("0", "2.5", "x"):
        with pytest.raises(calibrate.DsakvError, match=rf"^anchor x: recv_interval = {re.escape(bad)}: must be"):
            calibrate.engine_recv_interval({**sgl, "recv_interval": bad})
    with pytest.raises(calibrate.DsakvError, match=r"^anchor x: recv_interval = 4: SGLang's"):
        calibrate.engine_recv_interval({"id": "x", "engine": "vllm", "recv_interval": "4"})


def test_the_fit_files_rows_carry_aiconfigurators_sglang_launch_rules(calibrate, repo_dir):
    # Every AIConfigurator row measured from 2026-01-19 runs mixed chunks, and every one (the earliest was measured
    # 2025-12-31) takes ISL + 1500 prompt tokens a step, SGLang's smaller limit where the chunk is smaller.
    rows = calibrate.read_anchors(repo_dir / "bench" / "calibration" / "fit.csv")
    mixed = {a["id"] for a in rows if a["mixed_chunk"] == "1"}
    assert mixed == {a["id"] for a in rows if a["note"].split("measured ")[1][:10] >= "2026-01-19"}
    assert len(rows) - len(mixed) == 1 and all(int(a["budget"]) == int(a["isl"]) + 1500 for a in rows)
    h200_8k = calibrate.sim_config(next(a for a in rows if a["id"] == "aic-v3-sgl-h200-tp8-8k1k-c16"))
    assert h200_8k.mixed_chunk and h200_8k.gpu.max_batched_tokens == 8192  # 9,692 against H200's 8,192 chunk


def test_the_mixed_chunk_column_and_sglangs_two_prompt_token_limits(calibrate):
    # mixed_chunk = 1 runs SGLang's --enable-mixed-chunk (the engine stays SGLang's, the scheduler mixes); SGLang
    # counts a batch's prompt tokens against --max-prefill-tokens and --chunked-prefill-size alike, so its step takes
    # the smaller, where vLLM's --max-num-batched-tokens is the step's budget whatever the chunk.
    sgl = {"id": "x", "engine": "sglang", "model": "deepseek-v3.2", "gpu": "H200", "gpus": "8", "conc": "4"}
    assert (
        calibrate.engine_mixed_chunk(sgl) is False
        and calibrate.engine_mixed_chunk({**sgl, "mixed_chunk": "0"}) is False
    )
    cfg = calibrate.sim_config({**sgl, "mixed_chunk": "1", "budget": "2524"})
    assert cfg.mixed_chunk and cfg.schedule_policy == "prefill_first" and cfg.gpu.max_batched_tokens == 2524
    assert calibrate.engine_step_tokens({**sgl, "budget": "9692"}, 8192) == 8192
    assert calibrate.engine_step_tokens(sgl, 8192) == 8192
    assert calibrate.engine_step_tokens({**sgl, "engine": "vllm", "budget": "9692"}, 8192) == 9692
    with pytest.raises(calibrate.DsakvError, match=r"^anchor x: mixed_chunk = yes: must be 1, 0 or empty"):
        calibrate.engine_mixed_chunk({**sgl, "mixed_chunk": "yes"})
    for row in ({**sgl, "engine": "vllm"}, {**sgl, "mtp": "3"}):
        with pytest.raises(calibrate.DsakvError, match=r"^anchor x: mixed_chunk = 1: SGLang's --enable-mixed-chunk"):
            calibrate.engine_mixed_chunk({**row, "mixed_chunk": "1"})


def test_the_one_batch_client_skips_the_tokenizers_queue_not_the_front_ends_latency(calibrate, repo_dir):
    # bench_one_batch_server sends every prompt's token ids in one /generate request: no tokenization, so no queue of
    # requests at the tokenizer (the measured service time); its batch still passes the server's path to the scheduler
    # and back, the fitted latency the serving clients' rows carry beside that queue.
    serving = (calibrate.FRONTEND_S, calibrate.FRONTEND_REQUEST_S, calibrate.FRONTEND_TOKEN_S)
    assert calibrate.engine_frontend({"id": "x"}) == serving and min(serving) > 0
    assert calibrate.engine_frontend({"id": "x", "client": "one_batch"}) == (calibrate.FRONTEND_S, 0.0, 0.0)
    with pytest.raises(calibrate.DsakvError, match=r"^anchor x: client = 'bench': must be empty or one of one_batch$"):
        calibrate.engine_frontend({"id": "x", "client": "bench"})
    rows = [a for a in calibrate.read_anchors(repo_dir / "bench" / "calibration" / "heldout.csv") if a["client"]]
    assert [a["id"] for a in rows] == [f"ds-sgl-b200-dp8-4k512-b{n}" for n in (1, 8, 16, 64)]
    for a in rows:
        cfg = calibrate.sim_config(a)
        assert (cfg.frontend_s, cfg.frontend_request_s, cfg.frontend_token_s) == (calibrate.FRONTEND_S, 0.0, 0.0)
        assert cfg.kv_dtype == "fp8_ds_mla" and not cfg.prefill_graph  # Blackwell's default, 2026-01; eager prefill
        assert calibrate.engine_chunk_tokens(a) == 16384 // 8


def test_a_one_batch_replay_waits_the_front_ends_latency_once_and_no_queue(tmp_path, calibrate, capsys):
    # The batch's four requests reach the scheduler together, FRONTEND_S after the send: with the latency set to 0
    # the engine's run is the same, shifted by it. A serving client's rows pass the tokenizer's queue as well, which
    # spreads the same four requests' arrivals, so their last first token comes later than the one batch's.
    published = {"ttft_ms": [1.0, "max"], "duration_s": 1.0}
    one = {"id": "tiny-one", "client": "one_batch", "conc": "", "published": published}
    serving = {"id": "tiny-serving", "conc": "", "published": published}
    path = _write_rows(tmp_path, [one, serving])
    runs = {}
    for name, extra in (("latency", []), ("none", ["--set", "frontend_s=0"])):
        calibrate.main(["--anchors", path, "--json", *extra])
        runs[name] = {(r["id"], r["metric"]): r["dsakv"] for r in json.loads(capsys.readouterr().out)["rows"]}
    served, bare = runs["latency"], runs["none"]
    ttft, duration = ("tiny-one", "ttft_ms"), ("tiny-one", "duration_s")
    assert served[ttft] - bare[ttft] == pytest.approx(1000 * calibrate.FRONTEND_S)
    assert served[duration] - bare[duration] == pytest.approx(calibrate.FRONTEND_S)
    assert bare[("tiny-serving", "ttft_ms")] > bare[ttft] + 1000 * 3 * calibrate.FRONTEND_REQUEST_S


def test_percentiles_interpolate_between_ranks_as_the_benchmark_clients_do(calibrate):
    np = pytest.importorskip("numpy")
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    for how in ("p50", "p90", "p95", "p99"):
        assert calibrate._stat(values, how) == pytest.approx(np.percentile(values, int(how[1:])))
    assert calibrate._stat(values, "mean") == pytest.approx(np.mean(values))
    assert calibrate._stat([7.0], "p99") == 7.0


def test_families_group_rows_by_engine_gpu_mtp_and_dp(calibrate):
    assert calibrate.family_of({"id": "x-sgl", "gpu": "B200", "mtp": "3", "dp": "8"}) == "sglang B200 mtp-on dp-on"
    assert calibrate.family_of({"id": "x-vllm", "gpu": "H200", "mtp": "0", "dp": "1"}) == "vllm H200 mtp-off dp-off"
    assert calibrate.family_of({"id": "x", "engine": "SGLang", "gpu": "H20", "mtp": "", "dp": ""}).startswith("sglang")
    row = calibrate.Row
    nan = float("nan")
    rows = [
        row("a", "tpot_ms", 1, 1, 2.0, False, "f1"),
        row("b", "tpot_ms", 1, 1, 0.5, False, "f1"),
        row("c", "tpot_ms", 1, 1, 1.1, True, "f1"),
        row("d", "tpot_ms", 1, nan, nan, False, "f1", "weights too big"),
        row("a", "ttft_ms", 1, 1, 1.0, True, "f1"),
        row("e", "tpot_ms", 1, 1, 0.9, True, "f2"),
    ]
    lines = {(f.family, f.metric): f for f in calibrate.families(rows)}
    assert list(lines) == [("f1", "tpot_ms"), ("f1", "ttft_ms"), ("f2", "tpot_ms")]
    f1 = lines[("f1", "tpot_ms")]
    assert (f1.rows, f1.out, f1.errors) == (4, 2, 1)
    assert f1.geomean == pytest.approx((2.0 * 0.5 * 1.1) ** (1 / 3))
    assert f1.worst in (2.0, 0.5)  # |log| ties: the first of the two
    assert lines[("f2", "tpot_ms")].geomean == pytest.approx(0.9)
    assert calibrate.geomeans(rows)["tpot_ms"] == pytest.approx((2.0 * 0.5 * 1.1 * 0.9) ** 0.25)
    assert calibrate.loss(rows) == pytest.approx(sum(math.log(x) ** 2 for x in (2.0, 0.5, 1.1, 1.0, 0.9)))


def test_decoders_are_littles_law_on_both_sides_and_skip_rows_without_a_mean_tpot(calibrate, capsys):
    # output tokens per second x mean TPOT = requests decoding at once; a per-GPU throughput counts the row's GPUs;
    # a row needs both figures replayed and a mean (not a percentile) TPOT; the ratio is dsakv / published.
    row, nan = calibrate.Row, float("nan")
    anchors = [
        {"id": "a", "gpus": "8", "published": json.dumps({"tpot_ms": 50.0, "out_tok_s": 600.0})},
        {"id": "b", "gpus": "8", "published": json.dumps({"tpot_ms": [20.0, "mean"], "out_tok_s_gpu": 100.0})},
        {"id": "c", "gpus": "8", "published": json.dumps({"tpot_ms": [20.0, "p50"], "out_tok_s": 100.0})},
        {"id": "d", "gpus": "8", "published": json.dumps({"tpot_ms": 20.0, "out_tok_s": 100.0})},
        {"id": "e", "gpus": "8", "published": json.dumps({"tpot_ms": 20.0})},
    ]
    rows = [
        row("a", "tpot_ms", 50.0, 40.0, 1.25, True),
        row("a", "out_tok_s", 600.0, 900.0, 1.5, False),
        row("b", "tpot_ms", 20.0, 25.0, 0.8, True),
        row("b", "out_tok_s_gpu", 100.0, 100.0, 1.0, True),
        row("c", "tpot_ms", 20.0, 20.0, 1.0, True),
        row("c", "out_tok_s", 100.0, 100.0, 1.0, True),
        row("d", "tpot_ms", 20.0, nan, nan, False, "", "no pool"),
        row("d", "out_tok_s", 100.0, nan, nan, False, "", "no pool"),
        row("e", "tpot_ms", 20.0, 20.0, 1.0, True),
    ]
    got = calibrate.decoders(rows, anchors)
    assert [d.id for d in got] == ["a", "b"]
    assert (got[0].published, got[0].dsakv) == pytest.approx((30.0, 36.0))  # 600 x 0.05; 900 x 0.04
    assert got[0].ratio == pytest.approx(1.2)
    assert (got[1].published, got[1].dsakv, got[1].ratio) == pytest.approx((16.0, 20.0, 1.25))  # 8 x 100 x 0.02
    calibrate.render(rows, {}, got)
    text = capsys.readouterr().out
    assert "decoding at once" in text and any(
        line.split() == ["a", "30.0", "36.0", "1.20"] for line in text.splitlines()
    )


def test_a_row_without_a_committed_trace_replays_the_one_make_traces_writes(tmp_path, calibrate, capsys):
    # fit.csv / check.csv commit no traces: the replay generates the row's trace from n / isl / osl / rate, the very
    # lines make_traces.py would commit, so both give the same figures.
    path = _write_rows(
        tmp_path, [{"id": "tiny-sgl", "n": "4", "isl": "100", "osl": "5", "published": {"tpot_ms": 1.0}}]
    )
    calibrate.main(["--anchors", path, "--json"])
    committed = json.loads(capsys.readouterr().out)["rows"]
    (tmp_path / "traces" / "tiny-sgl.jsonl").unlink()
    assert calibrate.main(["--anchors", path, "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["rows"] == committed
    assert not (tmp_path / "traces" / "tiny-sgl.jsonl").exists()  # generated in a scratch folder, not beside the CSV


def test_an_empty_cap_takes_the_engines_default_running_limit(calibrate):
    # vLLM's --max-num-seqs default on a >= 70 GiB GPU is 1024 (256 below); SGLang's request pool is at least 2048
    # (4096 at most), reset to 48 under speculative decoding; a filled cell is the row's setting.
    row = {"id": "x-vllm-tp8", "gpu": "H200", "gpus": "8", "dp": "1", "mtp": "0", "cap": ""}
    assert calibrate.engine_max_running(row) == 1024
    assert calibrate.engine_max_running({**row, "gpu": "H100"}) == 1024  # 81,559 MiB
    assert calibrate.engine_max_running({**row, "id": "x-sgl-tp8"}) == calibrate.SGLANG_MAX_RUNNING == 4096
    assert calibrate.engine_max_running({**row, "id": "x-sgl-tp8", "mtp": "3"}) == 48
    assert calibrate.engine_max_running({**row, "id": "x-sgl-tp8", "mtp": "3", "cap": "128"}) == 128
    # SGLang's --max-running-requests (and the speculative 48) counts the server: each DP worker takes 1/dp of it
    # (ModelRunner._resolve_max_num_reqs); its pool's own clamp is per worker already; vLLM's cap stays the cell.
    assert calibrate.engine_max_running({**row, "id": "x-sgl-dp8", "dp": "8", "cap": "256"}) == 32
    assert calibrate.engine_max_running({**row, "id": "x-sgl-dp8", "dp": "8", "mtp": "1"}) == 6
    assert calibrate.engine_max_running({**row, "id": "x-sgl-dp8", "dp": "8"}) == 4096
    assert calibrate.engine_max_running({**row, "dp": "8", "cap": "256"}) == 256
    assert calibrate.sim_config({**row, "model": "tiny", "gpus": "1", "chunk": "256"}).max_running == 1024


def test_calibration_files_cite_sources_and_are_split_by_source(repo_dir):
    # fit.csv and check.csv: every row cites its public source and replays a model the simulator prices; no source
    # page feeds both files (the check shows generalization, not interpolation), nor any id repeats.
    folder = repo_dir / "bench" / "calibration"
    files = {name: list(csv.DictReader((folder / name).open(newline=""))) for name in ("fit.csv", "check.csv")}
    from dsakv.spec import PRESETS

    for rows in files.values():
        assert rows and len({r["id"] for r in rows}) == len(rows)
        for r in rows:
            assert r["src"].startswith("https://") and r["model"] in PRESETS and r["engine"] in ("sglang", "vllm")
            assert json.loads(r["published"]) and int(r["n"]) > 0 and int(r["isl"]) > 0 and int(r["osl"]) > 0
    pages = {
        name: {r["src"].split("/blob/")[0] + r["src"].rsplit("/", 1)[-1] for r in rows} for name, rows in files.items()
    }
    assert not pages["fit.csv"] & pages["check.csv"]


def test_aiconfigurator_rows_keep_what_dsakv_prices_once_each(load_file_module, repo_dir):
    aic = load_file_module(repo_dir / "bench" / "calibration" / "from_aiconfigurator.py")
    base = dict.fromkeys(
        "id silicon_data_source backend backend_version model_path system precision mode isl osl gemm_quant_mode "
        "moe_quant_mode batch_size tp_size pp_size attention_dp_size moe_tp_size moe_ep_size silicon_ttft_ms "
        "silicon_tpot_ms".split(),
        "",
    )
    base.update(
        id="glm5_h200_c8", backend="sglang", backend_version="", model_path="zhipuai/GLM-5", system="h200_sxm",
        mode="agg", isl="1024", osl="8192", gemm_quant_mode="fp8", moe_quant_mode="fp8_block", batch_size="8",
        tp_size="8", pp_size="1", attention_dp_size="1", moe_tp_size="8", moe_ep_size="1", silicon_ttft_ms="363.686",
        silicon_tpot_ms="20.344", silicon_data_source="source_file=x.csv; silicon_concurrency=8; wip=False; "
        "image=lmsysorg/sglang:glm5-hopper",
    )  # fmt: skip
    r1 = {**base, "model_path": "deepseek-ai/DeepSeek-R1", "silicon_ttft_ms": "259.9", "silicon_tpot_ms": "10.29"}
    rows = [
        base,
        {**base, "id": "again, another dump date", "silicon_ttft_ms": "363.68600000000004"},  # the same, twice
        {**base, "silicon_tpot_ms": "21.0"},  # a second measurement of the configuration
        {**base, "moe_ep_size": "8", "moe_tp_size": "1"},  # expert parallel: not priced
        {**base, "gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4"},  # FP4 weights: not priced
        {**base, "mode": "disagg"},
        r1,
        {**r1, "model_path": "deepseek-ai/DeepSeek-V3"},  # filed under both names
    ]
    out = aic.convert(rows)
    assert [r["id"] for r in out] == [
        "aic-glm5-sgl-h200-tp8-1k8k-c8", "aic-glm5-sgl-h200-tp8-1k8k-c8-m2", "aic-r1-sgl-h200-tp8-1k8k-c8",
    ]  # fmt: skip
    first = out[0]
    assert (first["model"], first["indexer"], first["gpu"], first["gpus"], first["conc"]) == (
        "glm-5",
        "1",
        "H200",
        "8",
        "8",
    )
    assert first["n"] == str(aic.MULTI_ROUND * 8) and first["version"] == "lmsysorg/sglang:glm5-hopper"
    assert first["kv"] == first["mem"] == first["cap"] == first["chunk"] == ""  # the dump sets none of them
    assert json.loads(first["published"]) == {"ttft_ms": [363.686, "mean"], "tpot_ms": [20.344, "mean"]}
    assert out[2]["model"] == "deepseek-v3.2" and out[2]["indexer"] == "0"
    assert first["budget"] == first["mixed_chunk"] == ""  # no measured date: no generator rule read into it
    # AIConfigurator's generator launches SGLang agg with --max-prefill-tokens ISL + 1500 (from 2025-12-04) and
    # --enable-mixed-chunk (from 2026-01-19): a row measured after each rule came in carries it
    dated = {
        day: aic.anchor_row({**base, "silicon_data_source": f"model=GLM-5; measured={day}T06:26:42Z; wip=False"})
        for day in ("2025-11-30", "2025-12-31", "2026-03-19")
    }
    assert [(r["budget"], r["mixed_chunk"]) for r in dated.values()] == [("", ""), ("2524", ""), ("2524", "1")]
    assert "--enable-mixed-chunk" in dated["2026-03-19"]["note"] and "mixed-chunk" in dated["2025-11-30"]["note"]


def test_sglang_build_dates_come_from_releases_commits_and_nightly_tags(calibrate):
    date = calibrate.datetime.date
    version = lambda v: calibrate.sglang_build_date({"id": "x-sgl", "version": v})  # noqa: E731
    assert version("0.5.9") == version("lmsysorg/sglang:v0.5.9-cu130") == date(2026, 3, 4)
    assert version("v0.5.14 @ 49e384ce") == version("v0.5.14") == date(2026, 7, 10)
    assert version("lmsysorg/sglang:v0.5.6-cu129-amd64") == date(2025, 12, 2)
    assert version("lmsysorg/sglang-rocm:v0.5.13.post1-rocm720-mi35x-20260618") == date(2026, 6, 15)  # docs, 7bd1a9d16
    assert version("lmsysorg/sglang:nightly-dev-cu13-20260401-b6fe0cca") == date(2026, 4, 1)
    assert version("commit 947927bdb") == date(2026, 2, 11)
    assert version("main @ 09ca4fc") == date(2026, 6, 26)
    assert version("lmsysorg/sglang:glm5-hopper") == date(2026, 2, 11)  # the GLM-5 cookbook's images, its page's date
    assert version("lmsysorg/sglang:glm5-blackwell") == date(2026, 2, 11)
    assert version("") is None
    with pytest.raises(calibrate.DsakvError, match=r"^anchor x-sgl: version = 'v0.5.11': no build date on file"):
        version("v0.5.11")
    with pytest.raises(calibrate.DsakvError, match=r"an image of SGLANG_IMAGE_DATES \(glm5-hopper, glm5-blackwell\)"):
        version("lmsysorg/sglang:glm5-nvfp4")


def test_sglang_spec_v2_builds_replay_with_the_overlap_scheduler(calibrate):
    # spec v2 (EAGLE under the overlap scheduler) is SGLang's default since sgl-project/sglang#21062 (2026-04-29)
    row = {"id": "x-sgl-tp8", "engine": "sglang", "gpu": "H200", "gpus": "8", "dp": "1", "mtp": "3"}
    assert calibrate.engine_spec_overlap({**row, "version": "commit 947927bdb"}) is False
    assert calibrate.engine_spec_overlap({**row, "version": "v0.5.14"}) is True
    assert calibrate.engine_spec_overlap({**row, "version": "main @ 09ca4fc"}) is True
    assert calibrate.sim_config(
        {**row, "model": "glm-5.2", "weight_dtype": "fp8", "version": "v0.5.14", "mem": "0.85"}
    ).spec_overlap


def test_the_engines_overlapped_loops_receive_a_request_one_step_late(calibrate):
    # Fact 46: SGLang's overlap scheduler (off under EAGLE V1) and vLLM's async scheduling (default from v0.14.0)
    sgl = {"id": "x-sgl-tp8", "engine": "sglang", "gpu": "H200", "gpus": "8", "dp": "1"}
    assert calibrate.engine_overlap_schedule({**sgl, "mtp": "0"}) is True
    assert calibrate.engine_overlap_schedule({**sgl, "mtp": "3", "version": "commit 947927bdb"}) is False  # EAGLE V1
    assert calibrate.engine_overlap_schedule({**sgl, "mtp": "3", "version": "v0.5.14"}) is True  # spec v2
    vllm = {"id": "x-vllm-tp8", "engine": "vllm", "gpu": "H200", "gpus": "8", "dp": "1"}
    assert calibrate.vllm_release({**vllm, "version": "v0.18.0"}) == (0, 18, 0)
    assert [
        calibrate.engine_overlap_schedule({**vllm, "version": v})
        for v in ("v0.13.0", "v0.14.0", "v0.24.0", "nightly wheel (the recipe's install)", "")
    ] == [False, True, True, False, False]
    assert calibrate.sim_config({**vllm, "model": "glm-5", "version": "v0.18.0", "mtp": "3"}).overlap_schedule


def test_sglang_serves_a_dsa_model_on_blackwell_in_its_builds_default_cache(calibrate):
    # SGLang's ServerArgs picks a DSA model's cache on SM >= 10 when --kv-cache-dtype is auto: FlashMLA's fp8 rows
    # (656 B) from #11655, only under DP attention from #20086, bf16 from #21337, TensorRT-LLM's plain fp8 rows
    # (576 B) from #21914; Hopper, vLLM and models without the indexer keep bf16; a filled cell is the row's.
    kv = calibrate.engine_kv_dtype
    row = {"id": "x-sgl", "engine": "sglang", "gpu": "B200", "dp": "1", "kv": ""}
    assert kv({**row, "version": "lmsysorg/sglang:v0.5.6-cu129-amd64"}) == "fp8_ds_mla"
    assert kv({**row, "version": "lmsysorg/sglang:nightly-dev-cu13-20260317-1eea7448"}) == "bf16"
    assert kv({**row, "version": "lmsysorg/sglang:nightly-dev-cu13-20260317-1eea7448", "dp": "8"}) == "fp8_ds_mla"
    assert kv({**row, "version": "lmsysorg/sglang:nightly-dev-cu13-20260401-b6fe0cca", "dp": "8"}) == "bf16"
    assert kv({**row, "version": "commit 947927bdb", "dp": "8"}) == "fp8_ds_mla"
    assert kv({**row, "version": "commit 947927bdb"}) == "fp8_ds_mla"
    assert kv({**row, "version": "lmsysorg/sglang:glm5-blackwell"}) == "fp8_ds_mla"  # the held-out B200 rows' image
    assert kv({**row, "version": "main @ 09ca4fc"}) == kv({**row, "version": "main @ 09ca4fc", "dp": "8"}) == "fp8"
    assert kv({**row, "version": "main @ 09ca4fc", "gpu": "H200"}) == "bf16"
    assert kv({**row, "version": "main @ 09ca4fc", "indexer": "0"}) == "bf16"
    assert kv({**row, "version": ""}) == "bf16"
    assert kv({**row, "version": "main @ 09ca4fc", "kv": "bf16"}) == "bf16"
    setup = calibrate.build_setup(
        calibrate.sim_config(
            {**row, "model": "glm-5.2", "weight_dtype": "fp8", "gpus": "8", "version": "main @ 09ca4fc"}
        )
    )
    assert setup.layout.kv_dtype == "fp8" and setup.layout.main_row_bytes == 576


def test_the_accept_column_takes_one_probability_or_one_per_draft_position(calibrate):
    assert calibrate.accept_of({"id": "x", "accept": ""}) == 0.8
    assert calibrate.accept_of({"id": "x", "accept": "0.912"}) == 0.912
    # SGLANG_SIMULATE_ACC_LEN = 3.5 on 5 draft steps: half the steps accept 3 tokens, half 4
    assert calibrate.accept_of({"id": "x", "accept": "1 1 0.5 0 0"}) == (1.0, 1.0, 0.5, 0.0, 0.0)
    row = {"id": "x-sgl", "model": "glm-5.2", "weight_dtype": "fp8", "gpu": "H200", "gpus": "8", "mtp": "5"}
    cfg = calibrate.sim_config({**row, "accept": "1 1 0.5 0 0"})
    assert calibrate.build_setup(cfg).step_time.tokens_per_decode == 3.5
    with pytest.raises(calibrate.DsakvError, match=r"^anchor x: accept = 'high': must be a probability or one per"):
        calibrate.accept_of({"id": "x", "accept": "high"})


def test_the_accept_draw_column_says_whether_a_batch_shares_one_draw(calibrate, repo_dir):
    # SGLANG_SIMULATE_ACC_LEN: one accept length per verify for the whole batch (accept_draw = batch); empty or
    # "request": each request its own. Every check-file row whose engine pinned the length says so.
    assert not calibrate.accept_shared({"id": "x"}) and not calibrate.accept_shared({"id": "x", "accept_draw": ""})
    assert not calibrate.accept_shared({"id": "x", "accept_draw": "request"})
    assert calibrate.accept_shared({"id": "x", "accept_draw": "batch"})
    with pytest.raises(calibrate.DsakvError, match=r"^anchor x: accept_draw = 'step': must be one of request, batch$"):
        calibrate.accept_shared({"id": "x", "accept_draw": "step"})
    rows = calibrate.read_anchors(repo_dir / "bench" / "calibration" / "check.csv")
    pinned = {a["id"] for a in rows if "SGLANG_SIMULATE_ACC_LEN" in a["note"]}
    assert len(pinned) == 12 and pinned == {a["id"] for a in rows if calibrate.sim_config(a).mtp_accept_shared}


def test_the_glm52_cookbook_rows_replay_with_their_builds_defaults(calibrate, repo_dir):
    # The SGLang GLM-5.2 cookbook's H200 (v0.5.14), B200 and GB300 (main @ 09ca4fc) cells: spec v2, the Blackwell
    # cache, the server-wide --max-running-requests 256 per DP worker, the acceptance the cookbook pins.
    rows = [a for a in calibrate.read_anchors(repo_dir / "bench" / "calibration" / "check.csv")]
    prefixes = ("glm52-sgl-h200", "glm52-sgl-b200", "glm52-sgl-gb300")
    cells = {a["id"]: calibrate.sim_config(a) for a in rows if a["id"].startswith(prefixes)}
    assert len(cells) == 15
    for rid, cfg in cells.items():
        assert cfg.kv_dtype == ("bf16" if "-h200-" in rid else "fp8"), rid
        assert cfg.spec_overlap and cfg.schedule_policy == "prefill_first"
        assert cfg.prefill_graph is ("-tp" in rid), rid  # piecewise prefill graphs, but not under DP attention
        if rid != "glm52-sgl-gb300-dp4-8k1k-c1024":  # benchmarked without --max-running-requests
            assert cfg.max_running == (48 if "-tp" in rid else 256 // cfg.gpu.dp_attention), rid
    gb300 = {rid: cfg.gpu for rid, cfg in cells.items() if "-gb300-" in rid}
    assert {(g.gpu, g.num_gpus, g.dp_attention, g.moe_a2a) for g in gb300.values()} == {
        ("GB300", 4, 1, "none"), ("GB300", 4, 4, "deepep"),
    }  # fmt: skip
    assert cells["glm52-sgl-gb300-dp4-mtp1-8k1k-c64"].chunk_tokens == 8192  # 32,768 over 4 DP workers
    assert cells["glm52-sgl-h200-tp8-mtp5-8k1k-c1"].mtp_accept == (1.0, 1.0, 0.5, 0.0, 0.0)
    assert cells["glm52-sgl-b200-dp8-mtp1-8k1k-c64"].chunk_tokens == 4096
    assert cells["glm52-sgl-b200-dp8-8k1k-c1024"].chunk_tokens == 2048  # 16,384 / 8 above 160 GiB


def test_a_deepep_row_replays_expert_parallel_all_to_all(calibrate):
    # SGLang sets ep_size = tp_size under --moe-a2a-backend deepep (ServerArgs._handle_a2a_moe)
    row = {"id": "x-sgl-dp8", "model": "glm-5.2", "weight_dtype": "fp8", "gpu": "B200", "gpus": "8", "dp": "8"}
    assert calibrate.engine_moe_a2a(row) == ("none", 1)
    assert calibrate.engine_moe_a2a({**row, "moe_a2a": "DeepEP"}) == ("deepep", 8)
    st = calibrate.build_setup(calibrate.sim_config({**row, "moe_a2a": "deepep"})).step_time
    assert (st.moe_a2a, st.ep, st.dp_attention) == ("deepep", 8, 8)
    with pytest.raises(calibrate.DsakvError, match=r"^anchor x-sgl-dp8: moe_a2a = 'nccl': must be empty or one of"):
        calibrate.engine_moe_a2a({**row, "moe_a2a": "nccl"})


def test_vllm_rows_give_the_sparse_prefill_workspace_of_their_memory_profile(calibrate):
    # vLLM's profiling forward reserves the indexer's prefill workspace, 40 x max_model_len rows of 132 B (its own
    # comment: "40 * 163840 * 132 = 865075200 bytes" for DeepSeek-V3.2), and with an fp8 cache FlashMLA-sparse's
    # 5 x max_model_len bf16 latent rows in the same buffer; it lands outside the pool.
    row = {"id": "x-vllm", "model": "deepseek-v3.2", "weight_dtype": "fp8", "gpu": "H200", "gpus": "8", "dp": "1"}
    row.update(engine="vllm")
    assert calibrate.engine_workspace_bytes(row) == 40 * 163_840 * 132 == 865_075_200
    assert calibrate.engine_workspace_bytes({**row, "kv": "fp8_ds_mla"}) == 5 * 163_840 * 576 * 2 == 943_718_400
    glm = {**row, "model": "glm-5.2"}  # a 1,048,576-token context: 5.5 GB a rank
    assert calibrate.engine_workspace_bytes(glm) == 40 * 1_048_576 * 132 == 5_536_481_280
    assert calibrate.engine_workspace_bytes({**row, "engine": "sglang"}) == 0
    assert calibrate.engine_workspace_bytes({**row, "id": "r1-x"}) == 0  # no indexer
    cfg = calibrate.sim_config(glm)
    assert cfg.gpu.activation_bytes == calibrate.DEFAULT_ACTIVATION_BYTES + 5_536_481_280
    without = calibrate.dataclasses.replace(cfg.gpu, activation_bytes=calibrate.DEFAULT_ACTIVATION_BYTES)
    layout = calibrate.build_setup(cfg).layout
    gap = (
        calibrate.pool_capacity(layout, without).available_bytes
        - calibrate.pool_capacity(layout, cfg.gpu).available_bytes
    )
    assert gap == 5_536_481_280


def test_sglang_rows_build_the_indexer_of_every_layer_until_skip_topk_layers_went_without(calibrate):
    # Until sgl-project/sglang#30531 (2026-08-17) SGLang built an Indexer module (replicated weights) and an indexer
    # cache on every DSA layer: its DSATokenToKVPool keeps an indexer buffer on each of its layer_num layers (and its
    # pool configurator counts the indexer row num_layers times), so GLM-5.2's pool is the planner's memory less the
    # 57 skip-topk layers' indexer weights, in pages of a cell with the indexer on all 78 layers: 78 x (1,152 + 132) B
    # a token in bf16, where dsakv's IndexCache layout holds 21.
    row = {"id": "x-sgl-dp8", "model": "glm-5.2", "weight_dtype": "fp8", "gpu": "H200", "gpus": "8", "dp": "8"}
    row.update(mem="0.85", engine="sglang", version="v0.5.14")
    cfg = calibrate.sim_config(row)
    planner = calibrate.build_setup(calibrate.dataclasses.replace(cfg, pool_tokens=None))
    assert planner.layout.cell_bytes == 78 * 1_152 + 21 * 132
    indexer = {p.name: p for p in calibrate.weight_parts(planner.layout.spec, 0, "fp8")}
    per_layer = indexer["indexer wq_b/wk/weights_proj + k_norm"].bytes // 21  # replicated: whole on every rank
    assert per_layer == 2_048 * 4_096 + 16 * 32 * 4 + 6_144 * 128 + 48 * 4 + 2 * 6_144 * 32 + 2 * 2 * 128
    available = calibrate.pool_capacity(planner.layout, cfg.gpu).available_bytes - 57 * per_layer
    page = 64 * 78 * (1_152 + 132)
    assert cfg.pool_tokens == (available // page - 1) * 64 < planner.capacity.pool_tokens  # one scratch page
    assert calibrate.build_setup(cfg).num_pages == cfg.pool_tokens // 64
    assert calibrate.sim_config({**row, "version": ""}).pool_tokens == cfg.pool_tokens  # no version: the old rule
    assert calibrate.sim_config({**row, "version": "nightly-20260901"}).pool_tokens is None  # after #30531
    assert calibrate.sim_config({**row, "engine": "vllm"}).pool_tokens is None  # vLLM: the planner's pool
    assert calibrate.sim_config({**row, "model": "deepseek-v3.2"}).pool_tokens is None  # indexer on every layer


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_row_without_the_indexer_pools_the_latent_cache_alone(calibrate, engine):
    # DeepSeek-R1 on the DSA preset: no indexer K cache (61 x 1,152 B a token in bf16, not 61 x (1,152 + 132)), and
    # no indexer weights (replicated on every rank) nor top-k buffer to subtract from the rank's memory.
    row = {"id": "r1-x", "model": "deepseek-v3.2", "weight_dtype": "fp8", "gpu": "B200", "gpus": "8", "dp": "1"}
    row.update(kv="bf16", engine=engine)
    cfg = calibrate.sim_config(row)
    planner = calibrate.build_setup(calibrate.dataclasses.replace(cfg, pool_tokens=None))
    memory = rank_memory(planner.layout, cfg.gpu)
    parts = {p.name: p for p in calibrate.weight_parts(planner.layout.spec, 0, "fp8")}
    indexer_weights = parts["indexer wq_b/wk/weights_proj + k_norm"].bytes
    assert parts["indexer wq_b/wk/weights_proj + k_norm"].shard == "replicated"
    available = memory.available_bytes + indexer_weights + memory.topk_buffer_bytes
    page = 64 * 61 * 1_152
    assert cfg.pool_tokens == (available // page - 1) * 64  # one scratch page, as the planner keeps
    assert cfg.pool_tokens > planner.capacity.pool_tokens * (1_152 + 132) / 1_152  # more than the latent's share
    assert calibrate.build_setup(cfg).num_pages == cfg.pool_tokens // 64
    assert calibrate.sim_config({**row, "id": "x", "indexer": "1"}).pool_tokens is None  # DSA: the planner's pool


def test_ttft_waves_splits_a_closed_loops_first_wave_from_the_rest(tmp_path, load_file_module, repo_dir, capsys):
    waves = load_file_module(repo_dir / "bench" / "ttft_waves.py")

    class Done:  # the two fields ``waves`` reads of a finished request's record
        outcome = "finished"

        def __init__(self, arrival_s: float, ttft_s: float) -> None:
            self.arrival_s, self.ttft_s = arrival_s, ttft_s

    first, rest = waves.waves([Done(0.0, 0.5), Done(0.0, 0.3), Done(1.0, 0.1)])
    assert (first, rest) == ([500.0, 300.0], [100.0])
    # The published mean m over a first wave of share f and the rest: m = f x first + (1 - f) x rest, either way round.
    assert waves.first_wave_needed(330.0, 0.1, 100.0) == pytest.approx((330.0 - 0.9 * 100.0) / 0.1)
    assert waves.rest_needed(330.0, 0.1, 2000.0) == pytest.approx((330.0 - 0.1 * 2000.0) / 0.9)
    # The tiny closed loop (four requests, two at once): its first wave is the two sent at the client's start.
    path = _write(tmp_path, {"ttft_ms": [50.0, "mean"], "tpot_ms": [1.0, "mean"]})
    assert waves.main(["--anchors", path, "--p99", "tiny-sgl-c2=80"]) == 0
    line, summary = capsys.readouterr().out.splitlines()
    assert line.startswith("tiny-sgl-c2: 4 requests, first wave 2; replay TTFT mean ")
    assert "published mean 50.0 ms: the first wave alone would average " in line
    assert line.endswith(f"the rest would average {waves.rest_needed(50.0, 0.5, 80.0):,.1f} ms")
    assert summary == "ttft waves: 1 closed-loop rows replayed, 0 other rows left out"
    # A burst is not a closed loop: left out. A malformed --p99 is bad input: one line, exit 2.
    burst = _write(tmp_path, {"ttft_ms": [50.0, "mean"]}, conc="")
    assert waves.main(["--anchors", burst]) == 0
    assert capsys.readouterr().out.strip() == "ttft waves: 0 closed-loop rows replayed, 1 other rows left out"
    assert waves.main(["--anchors", path, "--p99", "tiny-sgl-c2"]) == 2
    assert capsys.readouterr().err.strip() == "error: --p99 'tiny-sgl-c2': ID=MS with MS a number of milliseconds"


def _pid_rows(anchor: dict, traces, step_params=None) -> list:
    """A stand-in for ``replay_or_error`` that reports the process it ran in (module level: a forked worker finds it)."""
    return [(anchor["id"], os.getpid())]


def test_replay_rows_in_forked_processes_gives_the_serial_rows(tmp_path, calibrate, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, calibrate.__name__, calibrate)  # workers find the module's functions by name
    published = {"tpot_ms": [1.0, "mean"], "ttft_ms": [1.0, "mean"]}
    path = _write_rows(
        tmp_path, [{"id": f"tiny-sgl-c2-{i}", "published": published, "conc": str(i)} for i in (1, 2, 4)]
    )
    anchors = calibrate.read_anchors(tmp_path / "anchors.csv")
    serial = calibrate.replay_rows(anchors, tmp_path / "traces")
    assert len(serial) == 6 and calibrate.replay_rows(anchors, tmp_path / "traces", jobs=2) == serial
    # The rows come back in file order from processes other than this one.
    monkeypatch.setattr(calibrate, "replay_or_error", _pid_rows)
    ran = calibrate.replay_rows(anchors, tmp_path / "traces", jobs=2)
    assert [a for a, _ in ran] == [a["id"] for a in anchors] and os.getpid() not in {pid for _, pid in ran}
    assert calibrate.main(["--anchors", path, "--jobs", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "calibrate: --jobs -1: must be 0 (one per CPU) or a count of processes"
    assert calibrate.jobs_of(0) == (os.cpu_count() or 1) and calibrate.jobs_of(3) == 3


def test_a_bench_script_ends_quietly_when_its_reader_closes_the_pipe(calibrate, monkeypatch):
    moved = []
    monkeypatch.setattr(calibrate.os, "dup2", lambda fd, to: moved.append(to))

    class Stdout:  # the script's stdout, a pipe whose reader went away
        def fileno(self) -> int:
            return 99

    monkeypatch.setattr(calibrate.sys, "stdout", Stdout())

    def closed() -> int:
        raise BrokenPipeError

    assert calibrate.run_cli(lambda: 0) == 0 and moved == []
    assert calibrate.run_cli(closed) == 1 and moved == [99]  # stdout now /dev/null: the flush at exit cannot fail
