"""``dsakv simulate``'s engine flags (issue 15): ``--ep``, ``--moe-a2a``, ``--schedule-policy``, ``--num-speculative-tokens`` and
``--weight-dtype`` reach the step time and the scheduler; bad values are one-line errors naming the flag and
what is allowed; ``--sweep`` takes ``ep``, ``moe_a2a`` and ``schedule_policy``."""

from __future__ import annotations

import json

import pytest
from cli_checks import assert_one_line_error

from dsakv.cli import main

# Eight requests of 1,000 + 12 tokens at t = 0: enough for prefill and decode steps, small enough to be quick.
TRACE = "".join(
    f'{{"timestamp": 0, "input_length": 1000, "output_length": 12, "hash_ids": [{2 * k}, {2 * k + 1}]}}\n'
    for k in range(8)
)
BASE = ["simulate", "--model", "deepseek-v3.2", "--pool-tokens", "200000", "--json"]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE)
    return str(path)


def _run(capsys, trace: str, *flags: str) -> dict:
    assert main([*BASE, "--trace", trace, *flags]) == 0
    return json.loads(capsys.readouterr().out)


def _step_time(summary: dict) -> dict:
    return summary["config"]["setup"]["step_time"]


def test_engine_flags_reach_the_step_time_and_the_scheduler(capsys, trace):
    base = _run(capsys, trace)
    ep = _run(capsys, trace, "--ep", "8", "--moe-a2a", "deepep")
    assert (_step_time(ep)["ep"], _step_time(ep)["moe_a2a"]) == (8, "deepep")
    assert ep["makespan_s"] != base["makespan_s"]  # all-to-all instead of the MoE all-reduce
    ep_only = _run(capsys, trace, "--ep", "8")  # whole experts: a rank's weight bytes do not move (docs/steptime.md);
    # its (token, expert) pairs, 1 / 8 of TP's, move fewer hidden-sized rows (fact 43)
    assert ep_only["makespan_s"] < base["makespan_s"]
    sgl = _run(capsys, trace, "--schedule-policy", "prefill_first")
    assert sgl["config"]["setup"]["scheduler"]["schedule_policy"] == "prefill_first"
    assert _step_time(base)["mla_mixed_batch"] is True  # vLLM's fp8 mixed batch (fewer than 32 heads a rank)
    # SGLang prefills FlashMLA's fp8 rows on Hopper in the decode kernel too (flashmla_kv), a bf16 pool in the prefill one
    assert _step_time(sgl)["mla_mixed_batch"] is True and _step_time(sgl)["mla_dense_short_prefill"] is True
    sgl_bf16 = _run(capsys, trace, "--schedule-policy", "prefill_first", "--kv-dtype", "bf16")
    assert _step_time(sgl_bf16)["mla_mixed_batch"] is False
    sparse = _run(capsys, trace, "--schedule-policy", "prefill_first", "--no-dense-short-prefill")
    assert _step_time(sparse)["mla_dense_short_prefill"] is False
    mtp = _run(capsys, trace, "--num-speculative-tokens", "2")
    assert _step_time(mtp)["num_speculative_tokens"] == 2 and mtp["steps"] < base["steps"]
    # vLLM on Hopper keeps its tensor-parallel fp8 experts in Triton's fused MoE unless DeepGEMM's switch is set
    # (fact 36); SGLang runs DeepGEMM only under an all-to-all
    assert _step_time(base)["moe_deep_gemm_min_tokens"] == 0 and _step_time(sgl)["moe_deep_gemm_min_tokens"] == 0
    deep_gemm = _run(capsys, trace, "--moe-deep-gemm")
    assert _step_time(deep_gemm)["moe_deep_gemm_min_tokens"] == 1
    old_spelling = _run(capsys, trace, "--no-moe-deep-gemm")  # a hidden alias of the default
    assert _step_time(old_spelling)["moe_deep_gemm_min_tokens"] == 0
    # SGLang on Blackwell runs fp8 experts in TensorRT-LLM's fused MoE (fact 37) unless told otherwise
    b200 = ["--schedule-policy", "prefill_first", "--gpu", "B200", "--weight-dtype", "fp8"]
    assert _step_time(sgl)["moe_trtllm"] is False and _step_time(_run(capsys, trace, *b200))["moe_trtllm"] is True
    assert _step_time(_run(capsys, trace, *b200, "--no-moe-trtllm"))["moe_trtllm"] is False
    # SGLang on CDNA 4 runs fp8 experts in AITER's fused MoE (fact 38) unless told otherwise
    mi355x = ["--schedule-policy", "prefill_first", "--gpu", "MI355X", "--weight-dtype", "fp8"]
    assert _step_time(sgl)["aiter"] is False and _step_time(_run(capsys, trace, *mi355x))["aiter"] is True
    assert _step_time(_run(capsys, trace, *mi355x, "--no-aiter"))["aiter"] is False


def test_weight_dtype_reaches_the_step_time(capsys, trace):
    # glm-5.2 is a bf16 checkpoint: an fp8 deployment of it reads half the weight bytes per decode step.
    glm = ["--model", "glm-5.2"]
    bf16 = _run(capsys, trace, *glm)
    fp8 = _run(capsys, trace, *glm, "--weight-dtype", "fp8")
    assert _step_time(fp8)["weight_dtype"] == "fp8" and _step_time(bf16)["weight_dtype"] is None
    assert fp8["makespan_s"] < bf16["makespan_s"]


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--ep", "3"], ["ep = 3", "must divide tp = 8"]),
        (["--ep", "0"], ["--ep", "integer >= 1"]),
        (["--ep", "two"], ["--ep", "integer"]),
        (["--moe-a2a", "nccl"], ["moe_a2a = 'nccl'", "none, deepep"]),
        (["--moe-a2a", "deepep"], ["moe_a2a = 'deepep'", "ep >= 2"]),
        (["--schedule-policy", "fifo"], ["schedule_policy = 'fifo'", "mixed, prefill_first"]),
        (["--num-speculative-tokens", "-1"], ["--num-speculative-tokens", "integer >= 0"]),
        (["--num-speculative-tokens", "2", "--mtp-accept", "0.9,x"], ["--mtp-accept position 2 = 'x'", "(0, 1]"]),
        (
            ["--num-speculative-tokens", "2", "--mtp-accept", "0.9,0.8,0.7"],
            ["mtp_accept = (0.9, 0.8, 0.7)", "for 2 draft tokens"],
        ),
        (["--num-speculative-tokens", "2", "--mtp-accept", "1.5"], ["--mtp-accept", "(0, 1]"]),
        (["--weight-dtype", "int3"], ["weight dtype 'int3'", "fp8"]),
        (["--sweep", "moe_a2a=none,nccl"], ["moe_a2a = 'nccl'", "none, deepep"]),
        (["--sweep", "schedule_policy=fifo"], ["schedule_policy = 'fifo'", "mixed, prefill_first"]),
        (["--sweep", "ep=1,x"], ["--sweep ep", "integer"]),
    ],
)
def test_bad_engine_flags_are_one_line_errors(capsys, trace, flags, needles):
    code = main([*BASE, "--trace", trace, "--workers", "1", *flags])
    assert_one_line_error(code, capsys.readouterr().err, *needles)


def test_sweep_over_ep_moe_a2a_and_schedule_policy(capsys, trace):
    sweep = ["--sweep", "ep=1,8", "--sweep", "moe_a2a=none,deepep", "--workers", "1"]
    assert main([*BASE, "--trace", trace, *sweep, "--sweep", "schedule_policy=mixed,prefill_first"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    points = [(r["config"]["ep"], r["config"]["gpu"]["moe_a2a"], r["config"]["schedule_policy"]) for r in rows]
    assert len(points) == 8 and len(set(points)) == 8
    failed = {p for p, r in zip(points, rows) if r["error"]}
    assert failed == {(1, "deepep", "mixed"), (1, "deepep", "prefill_first")}  # DeepEP needs ep >= 2
    assert all(r["summary"]["finished"] == 8 for r in rows if not r["error"])


def test_mtp_accept_takes_one_probability_per_draft_position(capsys, trace):
    # A chain that accepts more drafts yields more tokens per decode step: fewer steps for the same output.
    chain = _run(capsys, trace, "--num-speculative-tokens", "3", "--mtp-accept", "0.9,0.6,0.3")
    low = _run(capsys, trace, "--num-speculative-tokens", "3", "--mtp-accept", "0.3")
    assert chain["finished"] == low["finished"] == 8 and chain["steps"] < low["steps"]


def _staggered(tmp_path, every_ms: int, output_length: int) -> str:
    """A trace of eight 1,000-token requests, one every ``every_ms``; returns its path."""
    path = tmp_path / "staggered.jsonl"
    path.write_text(
        "".join(
            f'{{"timestamp": {every_ms * k}, "input_length": 1000, "output_length": {output_length}, '
            f'"hash_ids": [{2 * k}, {2 * k + 1}]}}\n'
            for k in range(8)
        )
    )
    return str(path)


def test_overlap_schedule_flag_delays_a_request_reaching_a_busy_engine(capsys, tmp_path):
    # Requests every 40 ms into a busy engine: SGLang's overlap scheduler receives each one step late (fact 46), so
    # the mean TTFT grows; the config reports the flag.
    path = _staggered(tmp_path, 40, 64)
    sync = _run(capsys, path, "--schedule-policy", "prefill_first")
    overlap = _run(capsys, path, "--schedule-policy", "prefill_first", "--overlap-schedule")
    assert (
        sync["config"]["config"]["overlap_schedule"] is False
        and overlap["config"]["config"]["overlap_schedule"] is True
    )
    assert overlap["ttft_s"]["mean"] > sync["ttft_s"]["mean"]


def test_scheduler_recv_interval_flag_holds_arrivals_for_decode_turns(capsys, tmp_path):
    # Requests every 150 ms into a decoding engine: with SGLang's --scheduler-recv-interval 8 a loop turn receives only
    # every eighth decode step, so the mean TTFT grows; the config reports the interval; 0 is a one-line error.
    path = _staggered(tmp_path, 150, 256)
    every = _run(capsys, path, "--schedule-policy", "prefill_first")
    eighth = _run(capsys, path, "--schedule-policy", "prefill_first", "--scheduler-recv-interval", "8")
    assert every["config"]["config"]["scheduler_recv_interval"] == 1
    assert eighth["config"]["config"]["scheduler_recv_interval"] == 8
    assert eighth["ttft_s"]["mean"] > every["ttft_s"]["mean"]
    code = main([*BASE, "--trace", path, "--scheduler-recv-interval", "0"])
    assert_one_line_error(code, capsys.readouterr().err, "--scheduler-recv-interval")


def test_mixed_chunk_flag_decodes_the_running_requests_in_prefill_steps(capsys, tmp_path):
    # SGLang's --enable-mixed-chunk: each arriving prompt's prefill step carries the running decodes, so the requests
    # already decoding are not held behind it and their TPOT falls; the config reports the flag; without
    # prefill_first it is a one-line error naming the field.
    path = _staggered(tmp_path, 150, 256)
    first = _run(capsys, path, "--schedule-policy", "prefill_first")
    mixed = _run(capsys, path, "--schedule-policy", "prefill_first", "--mixed-chunk")
    assert first["config"]["config"]["mixed_chunk"] is False and mixed["config"]["config"]["mixed_chunk"] is True
    assert mixed["tpot_s"]["mean"] < first["tpot_s"]["mean"]
    code = main([*BASE, "--trace", path, "--mixed-chunk"])
    assert_one_line_error(code, capsys.readouterr().err, "mixed_chunk", "prefill_first")
