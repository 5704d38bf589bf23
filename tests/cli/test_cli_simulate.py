"""``dsakv simulate``: JSON figures, --out files, bad traces and impossible settings as one-line errors."""

from __future__ import annotations

import json

import pytest

from dsakv.cli import build_parser, main
from dsakv.cli.gpu_args import gpu_setting, parse_float, parse_fraction
from dsakv.cli.output import dumps
from dsakv.cli.simulate import build_config
from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig
from dsakv.sim.source import Source, open_source
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import write_mooncake

SMALL = ["simulate", "--scenario", "chat", "--scale", "0.05", "--step-model", "constant"]


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_json_carries_every_required_summary_figure(capsys):
    d = _json(capsys, SMALL + ["--json"])
    for key in ("requests", "input_tokens", "hit_tokens", "evicted_tokens", "preemptions", "rejected"):
        assert isinstance(d[key], int)
    assert d["config"]["source"]["scenario"] == "chat"
    assert d["config"]["setup"]["pool"]["source"] == "planner (GPU setting)"


def test_stepping_every_decode_step_gives_the_same_figures(capsys):
    argv = ["simulate", "--scenario", "chat", "--scale", "0.05", "--instances", "2", "--json"]
    assert _json(capsys, argv + ["--no-analytic-decode"]) == _json(capsys, argv)
    assert main(argv + ["--no-analytic-decode", "--router", "round-robin,oracle"]) == 1
    assert "--no-analytic-decode applies to one run" in capsys.readouterr().err


def test_exact_token_keys_give_the_digest_keys_figures(capsys):
    argv = SMALL + ["--pool-tokens", "12000", "--json"]  # a small pool: evictions happen
    digest, tokens = _json(capsys, argv), _json(capsys, argv + ["--page-keys", "tokens"])
    assert (digest["config"]["config"]["page_keys"], tokens["config"]["config"]["page_keys"]) == ("digest", "tokens")
    assert digest["evicted_tokens"] > 0 and digest["hit_tokens"] > 0
    digest.pop("config"), tokens.pop("config")
    assert digest == tokens


def test_frontend_latency_shifts_every_ttft(capsys):
    # Every request reaches the scheduler 0.5 s after its send: the engine runs the same steps 0.5 s later.
    a = _json(capsys, SMALL + ["--json"])
    b = _json(capsys, SMALL + ["--json", "--frontend-s", "0.5"])
    assert b["config"]["config"]["frontend_s"] == 0.5 and a["config"]["config"]["frontend_s"] == 0.0
    for q in ("p50", "p99", "mean"):
        assert b["ttft_s"][q] == pytest.approx(a["ttft_s"][q] + 0.5)
    assert b["tpot_s"]["p50"] == pytest.approx(a["tpot_s"]["p50"])


def test_new_token_ratio_reaches_the_schedulers_admission(capsys):
    # SGLang under DP attention starts its ratio at 0.7 x 0.3: the flag is the scheduler's reserve, not a label.
    d = _json(capsys, SMALL + ["--json", "--new-token-ratio", "0.21"])
    assert d["config"]["config"]["new_token_ratio"] == 0.21
    assert d["config"]["setup"]["scheduler"]["new_token_ratio"] == 0.21
    assert _json(capsys, SMALL + ["--json"])["config"]["setup"]["scheduler"]["new_token_ratio"] == 0.7
    assert (
        _json(capsys, SMALL + ["--json", "--new-token-ratio", "0"])["config"]["setup"]["scheduler"]["new_token_ratio"]
        == 0
    )

    # SGLang's clip of the remaining output the reserve counts (4,096): the scheduler's, none by default.
    clipped = _json(capsys, SMALL + ["--json", "--new-token-clip", "4096"])["config"]["setup"]["scheduler"]
    assert clipped["new_token_clip"] == 4096
    assert _json(capsys, SMALL + ["--json"])["config"]["setup"]["scheduler"]["new_token_clip"] is None
    # Who is preempted and where it waits again: vLLM's newest / front by default, SGLang's order on request.
    sglang = SMALL + ["--json", "--victim-order", "fewest_outputs", "--requeue", "back"]
    sched = _json(capsys, sglang)["config"]["setup"]["scheduler"]
    assert (sched["victim_order"], sched["requeue"]) == ("fewest_outputs", "back")
    sched = _json(capsys, SMALL + ["--json"])["config"]["setup"]["scheduler"]
    assert (sched["victim_order"], sched["requeue"]) == ("newest", "front")
    assert (sched["new_token_ratio_min"], sched["new_token_ratio_decay_steps"]) == (None, 600)
    tracked = SMALL + ["--json", "--new-token-ratio-min", "0.098", "--new-token-ratio-decay-steps", "50"]
    sched = _json(capsys, tracked)["config"]["setup"]["scheduler"]
    assert (sched["new_token_ratio_min"], sched["new_token_ratio_decay_steps"]) == (0.098, 50)


def test_mtp_index_share_reaches_the_step_time_and_shortens_mtp_steps(capsys):
    # index_share_for_mtp_iteration: draft passes 2 .. 3 skip the MTP layer's indexer (docs/steptime.md).
    argv = ["simulate", "--scenario", "chat", "--scale", "0.02", "--num-speculative-tokens", "3", "--json"]
    plain, shared = _json(capsys, argv), _json(capsys, argv + ["--mtp-index-share"])
    assert not plain["config"]["config"]["mtp_index_share"] and shared["config"]["config"]["mtp_index_share"]
    assert shared["config"]["setup"]["step_time"]["mtp_index_share"] is True
    assert shared["tpot_s"]["mean"] < plain["tpot_s"]["mean"]


def test_default_run_needs_no_file(capsys):
    assert main(["simulate", "--scale", "0.05", "--step-model", "constant"]) == 0
    assert "hit rate" in capsys.readouterr().out


def test_out_writes_config_records_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    d = _json(capsys, SMALL + ["--json", "--out", str(out)])
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "summary.json", "requests.jsonl", "pool_use.png", "timeline.png"} <= names
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == d["requests"]
    assert json.loads((out / "config.json").read_text())["config"]["eviction_policy"] == "lru"


def test_out_requests_jsonl_is_written_during_the_run_as_the_sorted_records_give_it(tmp_path, capsys):
    argv = [*SMALL, "--instances", "2", "--pool-tokens", "40000", "--no-plots"]
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out)]) == 0
    cfg, source = build_config(build_parser().parse_args(argv))
    opened = open_source(source)
    records = simulate(cfg, opened.requests, counters=opened.counters).records
    assert (out / "requests.jsonl").read_text() == "".join(dumps(r.to_dict()) + "\n" for r in records)


def test_trace_file_and_pool_override(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_mooncake(path, generate_scenario("chat", seed=4, scale=0.05))
    d = _json(capsys, ["simulate", "--trace", str(path), "--pool-tokens", "20000", "--json", "--time-scale", "2"])
    assert d["pool_tokens"] == 20000 // 64 * 64
    assert d["config"]["config"]["time_scale"] == 2.0


def test_malformed_trace_line_is_one_line_error_with_line_number(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{bad\n')
    assert main(["simulate", "--trace", str(path)]) == 1
    err = capsys.readouterr().err
    assert "line 2" in err and err.count("\n") == 1


def test_frontend_service_queues_a_burst_in_send_order(tmp_path, capsys):
    # 20 requests sent at once through a 50 ms front-end: the last reaches the engine after 20 x 50 ms = 1 s.
    path = tmp_path / "burst.jsonl"
    path.write_text(
        "".join(f'{{"timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [{i}]}}\n' for i in range(20))
    )
    argv = ["simulate", "--trace", str(path), "--step-model", "constant", "--json"]
    plain = _json(capsys, argv)
    queued = _json(capsys, argv + ["--frontend-request-s", "0.05"])
    assert queued["config"]["config"]["frontend_request_s"] == 0.05
    assert queued["makespan_s"] >= 20 * 0.05 > plain["makespan_s"]
    # request k waits (k + 1) x 50 ms for the front-end: the mean TTFT gains at least the mean wait, 0.525 s
    assert queued["ttft_s"]["mean"] >= plain["ttft_s"]["mean"] + 0.525 - 0.02


def test_skip_bad_counts_lines_in_summary(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{bad\n')
    d = _json(capsys, ["simulate", "--trace", str(path), "--skip-bad", "--json"])
    assert d["skipped_lines"] == 1 and d["requests"] == 1


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--pool-tokens", "10"], "one page"),
        (["--gpu-memory", "1GB"], "less than one page"),
        (["--policy", "random"], "policy"),
        (["--time-scale", "0"], "time-scale"),
        (["--frontend-s", "-1"], "--frontend-s"),
        (["--frontend-request-s", "-0.01"], "--frontend-request-s"),
        (["--frontend-token-s", "x"], "--frontend-token-s"),
        (["--frontend-request-s", "0.01", "--instances", "2"], "one instance"),
        (["--new-token-ratio", "1.5"], "--new-token-ratio = '1.5': must be a number in [0, 1]"),
        (["--new-token-ratio", "x"], "--new-token-ratio"),
        (["--new-token-clip", "0"], "--new-token-clip"),
        (["--new-token-ratio-min", "0.9"], "new_token_ratio_min = 0.9: must be None (a constant ratio) or a number in"),
        (["--new-token-ratio-min", "0.1", "--new-token-ratio-decay-steps", "0"], "--new-token-ratio-decay-steps"),
        (["--requeue", "middle"], "requeue = 'middle': must be one of front, back"),
        (["--victim-order", "oldest"], "victim_order = 'oldest': must be one of newest, fewest_outputs, most_pages"),
        (["--new-token-clip", "4k"], "--new-token-clip"),
        (["--scenario", "nope"], "scenario"),
        (["--trace", "x.jsonl", "--scenario", "chat"], "not both"),
    ],
)
def test_impossible_settings_are_reported_not_crashed(capsys, extra, message):
    assert main(["simulate", *extra]) == 1
    assert message in capsys.readouterr().err


def test_sweep_prints_one_comparison_table(capsys):
    d = _json(capsys, SMALL + ["--sweep", "policy=lru,fifo", "--sweep", "pool=5000,64", "--json", "--workers", "1"])
    assert [r["label"] for r in d["rows"]] == [
        "eviction_policy=lru, pool_tokens=5000",
        "eviction_policy=lru, pool_tokens=64",
        "eviction_policy=fifo, pool_tokens=5000",
        "eviction_policy=fifo, pool_tokens=64",
    ]
    assert main(SMALL + ["--sweep", "policy=lru,fifo", "--workers", "1"]) == 0
    assert "sweep over scenario chat" in capsys.readouterr().out


def test_out_of_order_trace_is_sorted_with_a_warning(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    rows = [(5000, [1]), (0, [2]), (3000, [3])]
    path.write_text(
        "".join(f'{{"timestamp": {t}, "input_length": 10, "output_length": 2, "hash_ids": {h}}}\n' for t, h in rows)
    )
    assert main(["simulate", "--trace", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    assert "out of order" in captured.err and d["reordered_lines"] == 2  # two lines lie below an earlier timestamp
    assert d["finished"] == 3


def test_flag_defaults_are_the_config_defaults():
    # One home for every default: no flag repeats a number of SimConfig, GpuSetting or Source.
    for argv in (["simulate"], ["simulate", "--policy", "lru", "--mode", "finish"]):
        cfg, source = build_config(build_parser().parse_args(argv))
        assert cfg == SimConfig() and source == Source()
    assert gpu_setting(build_parser().parse_args(["plan"])) == GpuSetting()


@pytest.mark.parametrize(
    ("parse", "text", "allowed"),
    [
        (parse_float, "0", "a positive number"),
        (parse_float, "-1", "a positive number"),
        (parse_float, "inf", "a positive number"),
        (parse_float, "nan", "a positive number"),
        (parse_float, "x", "a positive number"),
        (parse_fraction, "1.5", "a number in (0, 1]"),
        (parse_fraction, "0", "a number in (0, 1]"),
        (parse_fraction, "half", "a number in (0, 1]"),
    ],
)
def test_number_flags_name_the_flag_the_text_and_the_range(parse, text, allowed):
    with pytest.raises(DsakvError) as exc:
        parse("--knob", text)
    assert str(exc.value) == f"--knob = {text!r}: must be {allowed}"
    assert parse("--knob", "0.5") == 0.5


def test_mtp_accept_shared_reaches_the_config(capsys):
    argv = ["simulate", "--scenario", "chat", "--scale", "0.005", "--num-speculative-tokens", "2", "--json"]
    plain, shared = _json(capsys, argv), _json(capsys, argv + ["--mtp-accept-shared"])
    assert plain["config"]["config"]["mtp_accept_shared"] is False
    assert shared["config"]["config"]["mtp_accept_shared"] is True
