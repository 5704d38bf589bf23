"""``dsakv simulate`` with a trace on a pipe, and sweeps whose points fail (issue 11): a piped trace is
simulated whole; an impossible point is a row with its error; a sweep whose every point fails exits 1; the
JSON never carries NaN or Infinity."""

from __future__ import annotations

import json

from cli_checks import assert_one_line_error, dsakv_child

from dsakv.cli import main

TRACE = "".join(
    f'{{"timestamp": {t}, "input_length": {n}, "output_length": 4, "hash_ids": {ids}}}\n'
    for t, n, ids in [(0, 600, [0, 1]), (5, 700, [0, 2]), (9, 100, [3]), (12, 1100, [0, 1, 4])]
)
SIM = ["simulate", "--step-model", "constant"]


def _strict(text: str):
    """JSON that must not carry NaN or Infinity."""

    def refuse(name: str):
        raise AssertionError(f"JSON carries {name}")

    return json.loads(text, parse_constant=refuse)


def test_a_piped_trace_is_simulated_whole():
    done = dsakv_child(*SIM, "--trace", "/dev/stdin", "--json", stdin=TRACE)
    assert done.returncode == 0, done.stderr
    d = _strict(done.stdout)
    assert d["requests"] == d["finished"] == 4 and d["input_tokens"] == 2500


def test_a_sweep_refuses_a_piped_trace_it_would_read_again():
    done = dsakv_child(*SIM, "--trace", "/dev/stdin", "--sweep", "policy=lru,lfu", "--workers", "2", stdin=TRACE)
    assert_one_line_error(done.returncode, done.stderr, "pipe or FIFO")


def test_workers_refuse_a_piped_trace_each_would_read_again():
    argv = [*SIM, "--trace", "/dev/stdin", "--instances", "2", "--workers", "2"]
    done = dsakv_child(*argv, stdin=TRACE)
    assert_one_line_error(done.returncode, done.stderr, "pipe or FIFO", "(or worker)")


def test_an_impossible_point_is_a_row_with_its_error():
    # 10^11 tokens of pool: once a MemoryError that took the whole sweep down; now the simulator's limit.
    argv = [*SIM, "--scenario", "chat", "--scale", "0.05", "--sweep", "pool=100000000000,20000", "--workers", "1"]
    done = dsakv_child(*argv, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _strict(done.stdout)["rows"]
    assert rows[0]["summary"] is None and "at most 8,388,608 pages" in rows[0]["error"]
    assert rows[1]["error"] is None and rows[1]["summary"]["finished"] > 0


def test_a_sweep_whose_every_point_fails_exits_1(capsys, tmp_path):
    out = tmp_path / "run"
    argv = [*SIM, "--scenario", "chat", "--scale", "0.05", "--sweep", "pool=32,10", "--workers", "1", "--json"]
    code = main([*argv, "--out", str(out)])
    captured = capsys.readouterr()
    assert_one_line_error(code, captured.err, "every sweep point failed", "pool_tokens=32")
    assert [r["error"] is not None for r in _strict(captured.out)["rows"]] == [True, True]
    assert list(tmp_path.iterdir()) == []  # nothing written for a sweep that produced nothing


def test_sweep_json_is_strict_when_a_point_overflows_the_clock(tmp_path):
    # 1e308 ms x 1e300 / 1000 is infinite: once Infinity and NaN in the JSON, now that point's error row.
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE + '{"timestamp": 1e308, "input_length": 10, "output_length": 2, "hash_ids": [5]}\n')
    argv = [*SIM, "--trace", str(path), "--sweep", "time_scale=1e300,1e-300", "--workers", "1", "--json"]
    done = dsakv_child(*argv, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _strict(done.stdout)["rows"]
    assert "trace line 5" in rows[0]["error"] and rows[1]["summary"]["finished"] == 5
