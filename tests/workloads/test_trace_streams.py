"""Traces from pipes and FIFOs, and bytes that are not UTF-8 (issue 11): a stream is read once, into a private
copy; a bad line is named (or skipped) whatever its bytes; a sweep refuses a stream it would read again."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import dsakv.workloads.traces as traces
from dsakv.errors import DsakvError
from dsakv.sim.config import SimConfig
from dsakv.sim.source import Source
from dsakv.sim.sweep import run_sweep
from dsakv.workloads.traces import MooncakeTrace

LINES = [
    '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n',
    '{"timestamp": 9, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n',
    '{"timestamp": 4, "input_length": 20, "output_length": 1, "hash_ids": [3]}\n',
]


class Blocked(Exception):
    """Not an OSError, so no ``except OSError`` on the way turns it into a "cannot read" and carries on."""


@pytest.fixture
def deadline() -> Iterator[None]:
    """Turn a hang (a FIFO opened a second time, with no writer left) into a failure after 30 s."""

    def expire(signum, frame):
        raise Blocked("the trace was opened again after its writer had gone")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _fifo(tmp_path: Path, data: bytes) -> Path:
    """A FIFO whose writer (a thread) sends ``data`` once, then closes."""
    path = tmp_path / "trace.fifo"
    os.mkfifo(path)
    threading.Thread(target=path.write_bytes, args=(data,), daemon=True).start()
    return path


def _summary(trace: MooncakeTrace) -> list[tuple]:
    return [(r.line, r.timestamp_ms, r.input_length, r.hash_ids) for r in trace]


@pytest.mark.filterwarnings("ignore::dsakv.workloads.traces.TraceOrderWarning")
def test_a_fifo_is_read_once_and_replayed_as_often_as_asked(tmp_path, deadline):
    regular = tmp_path / "t.jsonl"
    regular.write_text("".join(LINES))
    trace = MooncakeTrace(_fifo(tmp_path, "".join(LINES).encode()))
    assert trace.spooled and len(trace) == 3 and trace.out_of_order == 1  # sorted from the private copy
    assert _summary(trace) == _summary(trace) == _summary(MooncakeTrace(regular))
    assert [r.line for r in trace] == [1, 3, 2]


def test_an_ordered_fifo_is_replayed_from_its_copy(tmp_path, deadline):
    data = (LINES[0] + LINES[2] + LINES[1]).encode()
    trace = MooncakeTrace(_fifo(tmp_path, data))
    assert trace.out_of_order == 0 and trace.last_timestamp_ms == 9 and trace.last_line == 3
    assert [r.line for r in trace] == [r.line for r in trace] == [1, 2, 3]


def test_a_sweep_refuses_a_fifo_instead_of_opening_it_again(tmp_path, deadline):
    path = tmp_path / "trace.fifo"
    os.mkfifo(path)  # no writer: opening it would block
    with pytest.raises(DsakvError, match="pipe or FIFO"):
        run_sweep(SimConfig(step_model="constant"), [{}, {"eviction_policy": "lfu"}], Source(trace=str(path)), 1)


def test_a_line_that_is_not_utf8_is_named_or_skipped(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(LINES[0].encode() + b'{"timestamp": 1, "x": "\xff\xfe"}\n' + LINES[1].encode())
    with pytest.raises(DsakvError, match=r"trace line 2: not UTF-8 text \(byte 0xff"):
        MooncakeTrace(path)
    trace = MooncakeTrace(path, skip_bad=True)
    assert trace.skipped == 1 and len(trace) == 2 and "not UTF-8" in trace.first_error


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
        ('{"timestamp": 0, "input_length": ' + "7" * 5000 + "}", "digits"),
        ('{"timestamp": ' + "9" * 4000 + ', "input_length": 1, "output_length": 1, "hash_ids": [1]}', "'timestamp'"),
        ('{"timestamp": 0, "input_length": ' + "9" * 30 + ', "output_length": 1, "hash_ids": [1]}', r"2\*\*63-1"),
    ],
)
def test_a_hostile_line_is_a_bad_line_like_any_other(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text(LINES[0] + line + "\n")
    with pytest.raises(DsakvError, match=message) as exc:
        MooncakeTrace(path)
    assert str(exc.value).startswith("trace line 2: ") and len(str(exc.value)) < 300
    assert MooncakeTrace(path, skip_bad=True).skipped == 1


def test_a_line_longer_than_the_limit_stops_the_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(traces, "MAX_LINE_BYTES", 200)
    path = tmp_path / "t.jsonl"
    path.write_text(LINES[0] + '{"pad": "' + "x" * 300 + '"}\n')
    with pytest.raises(DsakvError, match="trace line 2: longer than 200 bytes"):
        MooncakeTrace(path, skip_bad=True)


def test_a_folder_is_not_a_trace(tmp_path):
    with pytest.raises(DsakvError, match="it is a folder"):
        MooncakeTrace(tmp_path)
