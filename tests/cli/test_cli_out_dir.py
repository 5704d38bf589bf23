"""``--out DIR`` is written all or nothing (issue 11): a run killed while writing leaves DIR as it was, a rerun
replaces the previous run's folder whole, and JSON never carries NaN or Infinity."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_checks import REPO, files_under

from dsakv.cli import main
from dsakv.cli.output import OutputDir, dumps
from dsakv.errors import DsakvError

SMALL = ["simulate", "--scenario", "chat", "--scale", "0.05", "--step-model", "constant"]
NAMES = ("summary.json", "requests.jsonl", "plot.png")


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_nothing_reaches_the_folder_until_commit(tmp_path):
    final = tmp_path / "run"
    with OutputDir(final, NAMES) as out:
        out.write_text("summary.json", "{}")
        assert not final.exists() and out.path.parent == tmp_path and out.path.name.startswith(".run.partial-")
        out.commit()
    assert _contents(final) == {"summary.json": b"{}"}
    assert files_under(tmp_path) == ["run", "run/summary.json"]


def test_an_error_while_writing_leaves_the_previous_run_as_it_was(tmp_path):
    final = tmp_path / "run"
    final.mkdir()
    (final / "summary.json").write_text("previous")
    with pytest.raises(RuntimeError), OutputDir(final, NAMES) as out:
        out.write_text("summary.json", "new")
        raise RuntimeError("killed mid-write")
    assert files_under(tmp_path) == ["run", "run/summary.json"]
    assert (final / "summary.json").read_text() == "previous"


def test_a_rerun_replaces_the_previous_folder_whole(tmp_path):
    final = tmp_path / "run"
    final.mkdir()
    (final / "plot.png").write_text("old plot")
    (final / "summary.json").write_text("old")
    with OutputDir(final, NAMES) as out:
        out.write_text("summary.json", "new")
        out.commit()
    assert _contents(final) == {"summary.json": b"new"}  # no old plot beside the new figures
    assert files_under(tmp_path) == ["run", "run/summary.json"]


def test_missing_parents_are_created_and_removed_again_on_discard(tmp_path):
    with OutputDir(tmp_path / "a" / "b" / "run", NAMES):
        assert (tmp_path / "a" / "b").is_dir()
    assert files_under(tmp_path) == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: (d / "run").write_text("a file"), "not a folder"),
        (lambda d: (d / "run").mkdir() or (d / "run" / "notes.txt").write_text("mine"), "'notes.txt'"),
        (lambda d: (d / "run").mkdir() or (d / "run" / "summary.json").mkdir(), "'summary.json'"),
        (lambda d: (d / "run").symlink_to(d), "symbolic link"),
    ],
)
def test_a_destination_that_is_not_ours_to_replace_is_refused(tmp_path, make, message):
    make(tmp_path)
    before = files_under(tmp_path)
    with pytest.raises(DsakvError, match=message):
        OutputDir(tmp_path / "run", NAMES)
    assert files_under(tmp_path) == before


def test_the_current_folder_is_never_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for out in (".", str(tmp_path.parent)):
        with pytest.raises(DsakvError, match="current folder"):
            OutputDir(out, NAMES)
    assert files_under(tmp_path) == []


def test_a_destination_below_a_file_is_refused_even_for_root(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DsakvError, match="is not a folder"):
        OutputDir(tmp_path / "file" / "sub" / "run", NAMES)
    assert files_under(tmp_path) == ["file"]


def test_rerun_without_plots_leaves_no_plot_of_the_previous_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*SMALL, "--out", str(out)]) == 0
    assert (out / "pool_use.png").exists()
    assert main([*SMALL, "--out", str(out), "--no-plots"]) == 0
    names = ["config.json", "metrics.csv", "requests.jsonl", "summary.json"]
    assert sorted(p.name for p in out.iterdir()) == names
    assert files_under(tmp_path) == ["run", *(f"run/{n}" for n in names)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_run_killed_while_writing_leaves_the_previous_folder_intact(tmp_path, capsys, sig):
    out = tmp_path / "run"
    assert main([*SMALL, "--out", str(out), "--no-plots"]) == 0
    previous = _contents(out)
    # The child writes summary.json, then requests.jsonl and four plots (seconds of matplotlib): kill it as
    # soon as summary.json shows up, wherever the child writes it.
    argv = ["simulate", "--scenario", "chat", "--scale", "0.5", "--step-model", "constant", "--seed", "7"]
    # A runner started in the background (`pytest &` in a script) ignores SIGINT and its children inherit that:
    # a handled signal is reset to the default at exec, so the child gets Ctrl-C's KeyboardInterrupt as at a
    # terminal whatever this process was started with.
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "dsakv", *argv, "--out", str(out)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, sigint)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None and not _writing(tmp_path, out, previous):
            time.sleep(0.005)
        assert child.poll() is None, "the child finished before it could be killed"
        child.send_signal(sig)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert _contents(out) == previous  # never a new summary.json beside an old or truncated requests.jsonl
    left = [name for name in files_under(tmp_path) if not name.startswith("run")]
    if sig == signal.SIGKILL:  # no cleanup can run: the partial folder stays, hidden, and says what it is
        assert all(name.startswith(".run.partial-") for name in left)
    else:
        assert left == [] and child.returncode == (143 if sig == signal.SIGTERM else 130)


def _writing(folder: Path, out: Path, previous: dict[str, bytes]) -> bool:
    """The child has begun writing its results: a summary.json beside ``out``, or ``out`` itself changed."""
    if any(p.parent != out for p in folder.rglob("summary.json")):
        return True
    try:
        return _contents(out) != previous
    except OSError:
        return True


def test_json_output_maps_non_finite_numbers_to_null():
    text = dumps({"a": math.inf, "b": [math.nan, -math.inf, 1.5], "c": {"d": (2, math.nan)}, "e": "inf"})
    assert json.loads(text, parse_constant=_no_constant) == {
        "a": None,
        "b": [None, None, 1.5],
        "c": {"d": [2, None]},
        "e": "inf",
    }


def _no_constant(name: str):
    raise AssertionError(f"JSON carries {name}")


def test_no_partial_folder_is_left_when_the_run_fails_after_the_out_check(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{bad\n')
    assert main(["simulate", "--trace", str(trace), "--out", str(tmp_path / "run")]) == 1
    assert files_under(tmp_path) == ["t.jsonl"]
    assert os.listdir(tmp_path) == ["t.jsonl"]
