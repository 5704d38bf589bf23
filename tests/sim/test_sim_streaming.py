"""Streaming at both ends of a run: per-request rows are written as requests leave, byte for byte the rows of
the sorted records at the end, and the trace is pulled only as far as the simulated time has reached."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import pytest

from dsakv.cli.output import dumps
from dsakv.errors import DsakvError
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig
from dsakv.sim.rowstream import RowStream
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import MooncakeTrace, TraceRequest

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def _row(record) -> str:
    return dumps(record.to_dict()) + "\n"


def _streamed(cfg: SimConfig, requests) -> tuple[str, str, list[int]]:
    """(rows streamed during the run, rows of the run's sorted records, ids in the order requests left)."""
    file, left = io.StringIO(), []
    stream = RowStream(file, _row, "requests.jsonl")

    def sink(record) -> None:
        left.append(record.id)
        stream.add(record)

    result = simulate(cfg, requests, record_sink=sink)
    stream.close()
    return file.getvalue(), "".join(map(_row, result.records)), left


@pytest.mark.parametrize(
    "cfg",
    [SimConfig(pool_tokens=40_000), SimConfig(pool_tokens=40_000, instances=3, router="least-loaded")],
    ids=["single-loop", "cluster"],
)
def test_streamed_rows_equal_the_rows_of_the_sorted_records(cfg):
    chat = generate_scenario("chat", seed=0, scale=0.1)
    streamed, at_end, left = _streamed(cfg, chat)
    assert left != sorted(left)  # requests left out of id order: the stream had to hold rows back
    assert streamed == at_end and streamed.count("\n") == len(chat)


@pytest.mark.parametrize("source", ["generated", "shared"])
def test_streamed_rows_of_the_trace_head_equal_the_rows_at_the_end(source):
    if source == "shared" and not DATA.exists():
        pytest.skip(f"Mooncake trace not present at {DATA} (shared data absent; the generated case ran)")
    head = (
        list(itertools.islice(MooncakeTrace(DATA), 300))
        if source == "shared"
        else generate_scenario("agent", seed=2, scale=0.2)
    )
    streamed, at_end, left = _streamed(SimConfig(instances=2), head)
    assert left != sorted(left)
    assert streamed == at_end


def test_rows_of_ids_that_never_left_are_written_in_id_order_at_close():
    file = io.StringIO()
    stream = RowStream(file, lambda r: f"{r.id}\n", "rows")
    for rid in (2, 0, 5, 1):
        stream.add(_Record(rid))
    assert file.getvalue() == "0\n1\n2\n"  # 5 waits for 3 and 4
    stream.close()
    assert file.getvalue() == "0\n1\n2\n5\n" and stream.rows_written == 4


def test_a_failed_write_names_the_file():
    stream = RowStream(_FullDisk(), lambda r: "row\n", "--out 'run': requests.jsonl")
    with pytest.raises(DsakvError, match="--out 'run': requests.jsonl: cannot write"):
        stream.add(_Record(0))


class _Record:
    def __init__(self, rid: int) -> None:
        self.id = rid


class _FullDisk(io.StringIO):
    """A file on a full disk: every write fails as the OS reports it."""

    def writelines(self, lines) -> None:
        raise OSError(28, "No space left on device")


def _spaced(n: int, gap_ms: float) -> list[TraceRequest]:
    """``n`` short requests ``gap_ms`` apart (distinct users): each has left before the next arrives."""
    return [TraceRequest(i * gap_ms, 600, 4, (10 * i, 10 * i + 1)) for i in range(n)]


@pytest.mark.parametrize("instances", [1, 2])
def test_the_trace_is_pulled_only_up_to_the_next_arrival(instances):
    requests, pulled = _spaced(40, 60_000.0), []

    def lazily():
        for r in requests:
            pulled.append(r)
            yield r

    seen = []  # when request k leaves: how many requests had been pulled
    simulate(SimConfig(instances=instances), lazily(), record_sink=lambda record: seen.append((record.id, len(pulled))))
    assert [rid for rid, _ in seen] == list(range(len(requests)))
    # request k leaves before request k + 1 arrives: the reader has taken k + 1 requests and the one pending
    assert all(n <= rid + 2 for rid, n in seen)
