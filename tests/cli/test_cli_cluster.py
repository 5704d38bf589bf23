"""``dsakv simulate --instances N --router R``: the router comparison's JSON, the per-instance report, bad
input as one line, sweeps on a local Ray giving the same rows (and table) as local processes, the
KV-aware router over ZMQ printing the in-process figures, and ``--workers`` splitting one run (same output)."""

from __future__ import annotations

import json

import pytest
from cli_checks import assert_one_line_error
from rich.console import Console

from dsakv.cli import main
from dsakv.cli.simulate_render import render_sweep
from dsakv.sim.config import SimConfig
from dsakv.sim.source import Source
from dsakv.sim.sweep import run_sweep

SMALL = ["simulate", "--scenario", "chat", "--scale", "0.05", "--step-model", "constant"]
COMPARED = ("router", "hit_tokens", "ttft_p50_s", "ttft_p99_s", "load_imbalance")


def test_a_router_list_prints_one_object_per_router(capsys):
    argv = [*SMALL, "--instances", "3", "--router", "round-robin,kv-aware,oracle", "--json", "--workers", "1"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["router"] for r in rows] == ["round-robin", "kv-aware", "oracle"]
    for row in rows:
        assert list(row)[: len(COMPARED)] == list(COMPARED)
        s = row["summary"]
        assert row["hit_tokens"] == s["hit_tokens"] and row["ttft_p99_s"] == s["ttft_s"]["p99"]
        assert s["instances"] == 3 and len(s["per_instance"]) == 3 and row["load_imbalance"] >= 1.0
    assert rows[2]["hit_tokens"] >= rows[0]["hit_tokens"]


def test_one_router_reports_every_instance(capsys):
    assert main([*SMALL, "--instances", "2", "--dp-attention", "2", "--router", "least-loaded"]) == 0
    out = capsys.readouterr().out
    assert "per instance (router least-loaded)" in out and "load imbalance (max / mean routed tokens)" in out
    assert main([*SMALL, "--instances", "2", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["router"] == "round-robin" and [r["instance"] for r in s["per_instance"]] == [0, 1]


def test_out_writes_the_per_instance_plot(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*SMALL, "--instances", "2", "--out", str(out)]) == 0
    assert (out / "instances.png").read_bytes()[:4] == b"\x89PNG"


def test_kv_events_over_zmq_print_the_in_process_figures(capsys):
    argv = [*SMALL, "--instances", "3", "--router", "kv-aware", "--json"]
    assert main(argv) == 0
    in_process = json.loads(capsys.readouterr().out)
    assert (
        main([*argv, "--kv-events-endpoint", "tcp://127.0.0.1:*", "--kv-events-replay-endpoint", "tcp://127.0.0.1:*"])
        == 0
    )
    over_zmq = json.loads(capsys.readouterr().out)
    assert over_zmq["config"]["config"]["kv_events_endpoint"] == "tcp://127.0.0.1:*"
    del in_process["config"], over_zmq["config"]
    assert over_zmq == in_process and in_process["hit_tokens"] > 0


def test_a_closed_loop_over_a_cluster_runs_every_request(capsys):
    argv = [*SMALL, "--instances", "2", "--dp-attention", "2", "--max-concurrency", "3", "--json"]
    assert main([*argv, "--router", "least-loaded"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["finished"] == out["requests"] > 3 and out["config"]["config"]["max_concurrency"] == 3
    assert out["instances"] == 2 and len(out["per_instance"]) == 2


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--router", "random"], "--router = 'random': must be one of round-robin, least-loaded"),
        (["--router", "oracle,oracle"], "names a router twice"),
        (["--instances", "0"], "--instances"),
        (["--ray"], "--ray / --ray-address: run sweep points"),
        (["--router", "oracle,affinity", "--sweep", "policy=lru,lfu"], "give it without --sweep"),
        (["--router", "oracle,affinity", "--ray", "--ray-address", "x:1"], "not both"),
        (
            ["--router", "kv-aware,oracle", "--kv-events-endpoint", "tcp://127.0.0.1:*"],
            "--kv-events-endpoint: one run publishes",
        ),
        (["--router", "oracle", "--kv-events-endpoint", "tcp://127.0.0.1:*"], "--router oracle reads no events"),
        (
            ["--kv-events-replay-endpoint", "tcp://127.0.0.1:*"],
            "--kv-events-replay-endpoint: needs --kv-events-endpoint",
        ),
        (
            ["--router", "kv-aware", "--kv-events-endpoint", "localhost:1"],
            "--kv-events-endpoint = 'localhost:1': must be a ZMQ",
        ),
        (
            ["--instances", "2", "--router", "kv-aware", "--kv-events-endpoint", "tcp://127.0.0.1:7000"]
            + ["--kv-events-replay-endpoint", "tcp://127.0.0.1:7001"],
            "which --kv-events-endpoint of instance 1 binds",
        ),
    ],
)
def test_bad_cluster_flags_are_one_line_errors(capsys, flags, needle):
    code = main([*SMALL, *flags])
    assert_one_line_error(code, capsys.readouterr().err, needle)


def test_workers_split_one_run_and_print_its_figures(tmp_path, capsys):
    runs = {}
    for workers in ("1", "2"):
        out = tmp_path / workers
        argv = [*SMALL, "--instances", "3", "--dp-attention", "2", "--workers", workers, "--json"]
        assert main([*argv, "--out", str(out), "--no-plots"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary.pop("config")["config"]["workers"] == int(workers)
        runs[workers] = summary, (out / "requests.jsonl").read_text(), (out / "metrics.csv").read_text()
    assert runs["2"] == runs["1"]
    assert len(runs["1"][0]["per_instance"]) == 3


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (
            ["--instances", "4", "--workers", "2", "--router", "least-loaded"],
            "workers = 2 with router = 'least-loaded'",
        ),
        (["--instances", "2", "--workers", "3"], "workers = 3 with instances = 2"),
        (["--workers", "x"], "--workers"),
    ],
)
def test_workers_a_run_cannot_use_are_one_line_errors(capsys, flags, needle):
    assert_one_line_error(main([*SMALL, *flags]), capsys.readouterr().err, needle)


def test_sweep_on_a_local_ray_gives_the_rows_of_local_processes():
    import ray  # the 'ray' extra, installed by the 'test' extra: its absence fails the test

    assert not ray.is_initialized()  # run_sweep starts a local Ray of its own and shuts it down
    base = SimConfig(instances=2, step_model="constant")
    source = Source(scenario="chat", scale=0.05)
    points = [{"router": "round-robin"}, {"router": "kv-aware"}]
    local = run_sweep(base, points, source, workers=2)
    on_ray = run_sweep(base, points, source, workers=1, ray_address="local")
    assert [r.to_dict() for r in on_ray] == [r.to_dict() for r in local]
    assert local[0].summary["hit_tokens"] != local[1].summary["hit_tokens"]
    assert sweep_table(on_ray, source) == sweep_table(local, source)  # the table the CLI prints, too


def sweep_table(rows, source) -> str:
    console = Console(record=True, width=200)
    render_sweep(rows, source, console)
    return console.export_text()
