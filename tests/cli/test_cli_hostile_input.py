"""Hostile input to every command (issue 11): each is exit status 1, one line on stderr naming the problem (and
the limit, for numbers too large), no traceback, and nothing left behind on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_checks import assert_one_line_error, dsakv_child, files_under

import dsakv.cli.simulate as simulate_cli
from dsakv.cli import main
from dsakv.spec.model_spec import MAX_LAYERS

GOOD = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
BIG = "1" + "0" * 400  # a 401-digit number
SIM = ["simulate", "--step-model", "constant"]
SMALL = [*SIM, "--scenario", "chat", "--scale", "0.05"]
PRESET = Path(__file__).resolve().parents[2] / "dsakv" / "spec" / "presets" / "glm-5.3.json"


def _config(**fields) -> str:
    cfg = json.loads(PRESET.read_text())
    cfg.pop("indexer_types", None)
    cfg.pop("index_topk_freq", None)
    cfg.pop("index_skip_topk_offset", None)
    return json.dumps({**cfg, **fields})


# name -> (input files, argv ("{in}" is the input folder), words the error line must hold)
CASES: dict[str, tuple[dict[str, bytes | str], list[str], tuple[str, ...]]] = {
    "config not UTF-8": (
        {"c.json": b'{"num_hidden_layers": 4, "x": "\xff"}'},
        ["plan", "--config", "{in}/c.json"],
        ("not UTF-8",),
    ),
    "config nested 100,000 deep": (
        {"c.json": "[" * 100_000 + "]" * 100_000},
        ["plan", "--config", "{in}/c.json"],
        ("nested too deeply",),
    ),
    "config 5,000-digit integer": (
        {"c.json": '{"kv_lora_rank": ' + "9" * 5000 + "}"},
        ["plan", "--config", "{in}/c.json"],
        ("digits",),
    ),
    "config 401-digit layer count": (
        {"c.json": _config(num_hidden_layers=int(BIG))},
        ["plan", "--config", "{in}/c.json"],
        ("num_hidden_layers",),
    ),
    "config 401-digit kv_lora_rank": (
        {"c.json": _config(kv_lora_rank=int(BIG))},
        ["plan", "--config", "{in}/c.json"],
        ("kv_lora_rank", "2**63-1"),
    ),
    "simulate config not UTF-8": ({"c.json": b"\xfe\xff{}"}, [*SIM, "--config", "{in}/c.json"], ("not UTF-8",)),
    "trace line not UTF-8": (
        {"t.jsonl": GOOD.encode() + b'{"timestamp": 1\xff}\n'},
        [*SIM, "--trace", "{in}/t.jsonl"],
        ("trace line 2", "not UTF-8"),
    ),
    "trace line nested": (
        {"t.jsonl": GOOD + "[" * 100_000 + "]" * 100_000 + "\n"},
        [*SIM, "--trace", "{in}/t.jsonl"],
        ("trace line 2", "nested too deeply"),
    ),
    "trace 5,000-digit integer": (
        {"t.jsonl": GOOD + '{"timestamp": 1, "input_length": ' + "9" * 5000 + "}\n"},
        [*SIM, "--trace", "{in}/t.jsonl"],
        ("trace line 2", "digits"),
    ),
    "trace 4,000-digit timestamp": (
        {
            "t.jsonl": GOOD
            + '{"timestamp": '
            + "9" * 4000
            + ', "input_length": 10, "output_length": 2, "hash_ids": [2]}\n'
        },
        [*SIM, "--trace", "{in}/t.jsonl"],
        ("trace line 2", "timestamp"),
    ),
    "trace timestamp 1e308": (
        {"t.jsonl": GOOD + '{"timestamp": 1e308, "input_length": 10, "output_length": 2, "hash_ids": [2]}\n'},
        [*SIM, "--trace", "{in}/t.jsonl", "--json"],
        ("trace line 2", "arrivals must lie within"),
    ),
    "time scale 1e300": (
        {"t.jsonl": GOOD + GOOD.replace('"timestamp": 0', '"timestamp": 5')},
        [*SIM, "--trace", "{in}/t.jsonl", "--time-scale", "1e300"],
        ("trace line 2", "time_scale 1e+300"),
    ),
    "scenario time scale 1e300": ({}, [*SMALL, "--time-scale", "1e300", "--json"], ("arrivals must lie within",)),
    "--out under a regular file": (
        {"t.jsonl": GOOD},
        [*SIM, "--trace", "{in}/t.jsonl", "--out", "{in}/t.jsonl/run"],
        ("is not a folder",),
    ),
    "--out is an existing file": (
        {"t.jsonl": GOOD},
        [*SIM, "--trace", "{in}/t.jsonl", "--out", "{in}/t.jsonl"],
        ("not a folder",),
    ),
    "--sweep --out is an existing file": (
        {"t.jsonl": GOOD},
        [*SIM, "--trace", "{in}/t.jsonl", "--sweep", "policy=lru,lfu", "--workers", "1", "--out", "{in}/t.jsonl"],
        ("not a folder",),
    ),
    "--out holds a folder named like an output": (
        {"run/summary.json/x": ""},
        [*SMALL, "--out", "{in}/run"],
        ("summary.json",),
    ),
    "--out holds a file dsakv does not write": (
        {"run/notes.txt": "mine"},
        [*SMALL, "--out", "{in}/run"],
        ("notes.txt",),
    ),
    "--pool-tokens 401 digits": ({}, [*SMALL, "--pool-tokens", BIG], ("--pool-tokens", "9,223,372,036,854,775,807")),
    "--gpus 401 digits": ({}, ["plan", "--gpus", BIG], ("--gpus", "9,223,372,036,854,775,807")),
    "--context 401 digits": ({}, ["plan", "--context", BIG], ("--context",)),
    "--available-bytes 401 digits": ({}, ["plan", "--available-bytes", BIG], ("--available-bytes", "2**63 - 1")),
    "--gpu-memory 1e999999999": ({}, ["plan", "--gpu-memory", "1e999999999"], ("--gpu-memory", "2**63 - 1")),
    "--mtp-layers 401 digits": ({}, ["plan", "--mtp-layers", BIG], ("--mtp-layers",)),
    "--seed 401 digits": ({}, [*SMALL, "--seed", BIG], ("--seed",)),
    "--scale 401 digits": ({}, [*SMALL, "--scale", BIG], ("--scale",)),
    "demo --pages 401 digits": ({}, ["demo", "--pages", BIG], ("--pages",)),
    "plan --available-bytes 1": (
        {},
        ["plan", "--available-bytes", "1"],
        ("available bytes = 1 B", "less than one page"),
    ),
    "plan --weights-bytes 1e15": (
        {},
        ["plan", "--weights-bytes", "1e15"],
        ("weights 1,000,000,000,000,000 B", "less than one page"),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_is_one_line_and_leaves_nothing_behind(name, tmp_path, capsys, monkeypatch):
    files, argv, words = CASES[name]
    folder = tmp_path / "in"
    folder.mkdir()
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    before = files_under(tmp_path)
    monkeypatch.setattr(simulate_cli, "run_sweep", _never)  # output problems are found before any point runs
    code = main([a.replace("{in}", str(folder)) for a in argv])
    assert_one_line_error(code, capsys.readouterr().err, *words)
    assert files_under(tmp_path) == before


def _never(*args, **kwargs):
    raise AssertionError("the sweep ran although its --out cannot be written")


def test_an_out_problem_is_reported_before_the_simulation_runs(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(simulate_cli, "sim_run", _never)
    assert_one_line_error(main([*SMALL, "--out", str(tmp_path / "file" / "run")]), capsys.readouterr().err)


def test_plan_refuses_what_simulate_refuses_in_the_same_words(capsys):
    # One validation (planner.budget.require_pool) for both commands: same exit status, same line.
    for flags in (["--available-bytes", "1"], ["--weights-bytes", "1e15"], ["--gpu-memory", "1GB"]):
        plan_line = assert_one_line_error(main(["plan", *flags]), capsys.readouterr().err)
        sim_line = assert_one_line_error(main([*SMALL, *flags]), capsys.readouterr().err)
        assert plan_line == sim_line


def test_skip_bad_skips_lines_that_are_not_utf8_and_hash_ids_out_of_range(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    bad_hash = '{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [9223372036854775808]}\n'
    path.write_bytes(GOOD.encode() + b'{"timestamp": 1\xff}\n' + bad_hash.encode() + GOOD.encode())
    assert main([*SIM, "--trace", str(path), "--skip-bad", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["skipped_lines"] == 2 and d["requests"] == d["finished"] == 2
    assert "(first: trace line 2: not UTF-8" in d["notes"][0]


# Inputs that, with the bug back, take tens of GB or crash the interpreter: run in a capped child process.
CHILD_CASES = {
    "simulate --pool-tokens 10^11": ([*SMALL, "--pool-tokens", "100000000000"], ("8,388,608 pages",)),
    "plan --mtp-layers 10^9": (["plan", "--mtp-layers", "1000000000"], ("mtp_layers", str(MAX_LAYERS))),
    "demo --pages 10^9": (["demo", "--pages", "1000000000"], ("--pages", "1 GiB")),
    "demo --threads 10^6": (["demo", "--threads", "1000000"], ("--threads", "CPUs")),
    "demo --system-tokens 10^9": (["demo", "--system-tokens", "1000000000"], ("--system-tokens", "4,096")),
    "demo --conversations 10^9": (["demo", "--conversations", "1000000000"], ("--conversations", "1,000")),
}


@pytest.mark.parametrize("name", list(CHILD_CASES))
def test_numbers_too_large_are_one_line_naming_the_limit(name, tmp_path):
    argv, words = CHILD_CASES[name]
    done = dsakv_child(*argv)
    assert_one_line_error(done.returncode, done.stderr, *words)


def test_a_config_with_a_billion_layers_is_refused_before_building_them(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(_config(num_hidden_layers=10**9))
    done = dsakv_child("plan", "--config", str(path))
    assert_one_line_error(done.returncode, done.stderr, "num_hidden_layers", f"1..{MAX_LAYERS}")
