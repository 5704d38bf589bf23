"""The simulator's compact bookkeeping (issue 14, scale): records as typed columns, the same figures as the
plain objects gave, and a summary whose figures follow from its records and timeline."""

from __future__ import annotations

import math
import tracemalloc
from array import array
from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsakv.scheduler.request import check_prompt
from dsakv.sim import run as simulate
from dsakv.sim.cluster import Cluster
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.group import Group
from dsakv.sim.report import RecordTable, RequestRecord
from dsakv.sim.summary import summarize
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import MooncakePrompt, TraceRequest


@pytest.fixture(scope="module")
def result():
    return simulate(SimConfig(pool_tokens=40_000), generate_scenario("mixed", seed=1, scale=0.1))


def test_summary_figures_follow_from_the_records_and_the_timeline(result):
    """Every figure derived here from the records, the timeline and the cell, not pinned: a change of the
    bookkeeping (or of the step time, which moves the interleaving) must keep these relations."""
    s, recs, cell = result.summary, list(result.records), result.cell
    assert s["requests"] == len(recs) == 80 and s["finished"] + s["rejected"] + s["unfinished"] == 80
    assert s["finished"] > 0 and s["evicted_tokens"] > 0 and s["evicted_tokens"] % cell.group_page_tokens == 0
    admitted = [r for r in recs if r.admit_s is not None]
    finished = [r for r in recs if r.outcome == "finished"]
    assert s["hit_tokens"] == sum(r.hit_tokens for r in admitted) > 0
    assert s["pages_written"] == sum(r.pages_written for r in recs)
    assert s["main_bytes_written"] == sum(r.main_bytes_written for r in recs) > 0
    assert s["indexer_flops_paid"] == sum(r.indexer_flops_paid for r in recs)
    times = list(result.timeline.time_s)
    assert s["makespan_s"] == times[-1] >= max(r.finish_s for r in finished)
    assert s["steps"] >= len(times) > 0  # one sample per step of the one group
    ttft = np.array([r.first_token_s - r.arrival_s for r in finished])
    assert s["ttft_s"]["p50"] == float(np.percentile(ttft, 50)) and s["ttft_s"]["mean"] == float(ttft.mean())
    assert s["ttft_s"]["p50"] <= s["ttft_s"]["p90"] <= s["ttft_s"]["p99"]
    assert s["tail_waste_bytes_mean"] == float(np.mean([r.tail_waste_bytes for r in finished]))
    used, t = np.asarray(result.timeline.used_pages, dtype=np.float64), np.asarray(times)
    mean_used = float((used * np.diff(np.concatenate(([0.0], t)))).sum() / t[-1])
    assert s["mean_pool_use"] == mean_used / s["pool_pages"] and 0 < s["mean_pool_use"] <= s["peak_pool_use"] <= 1


def test_a_list_of_records_and_its_table_give_the_same_summary(result):
    table = result.records
    assert isinstance(table, RecordTable)
    as_list = list(table)
    assert {r.outcome for r in as_list} == {"finished", "rejected"}  # None times and reasons are in there
    assert [r.id for r in as_list] == sorted(r.id for r in as_list)
    figures = summarize(as_list, result.timeline, result.counters, result.cell, result.num_pages, result.tiers)
    assert figures.with_cluster(result.figures.cluster) == result.figures


times = st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False))
record_strategy = st.builds(
    RequestRecord,
    **{
        f.name: (
            times
            if f.name in ("admit_s", "first_token_s", "finish_s")
            else st.floats(0, 1e9, allow_nan=False)
            if f.name in ("arrival_s", "tail_waste_bytes")
            else st.sampled_from(["finished", "rejected", "unfinished"])
            if f.name == "outcome"
            else st.sampled_from(["", "prompt is empty", "exceeds the context limit 10"])
            if f.name == "reason"
            else st.integers(0, 2**70)  # beyond 64 bits: that column falls back to exact Python ints
            if f.name == "indexer_flops_paid"
            else st.integers(0, 2**40)
        )
        for f in fields(RequestRecord)
    },
)


@settings(max_examples=150, deadline=None)
@given(records=st.lists(record_strategy, max_size=12))
def test_a_table_reads_back_every_record_it_was_given_also_sorted_by_id(records):
    table = RecordTable(records)
    assert len(table) == len(records)
    assert [r.to_dict() for r in table] == [r.to_dict() for r in records]
    if records:
        assert table[-1] == records[-1] and table[1:3] == records[1:3]
        assert list(table.column("indexer_flops_paid")) == [r.indexer_flops_paid for r in records]
        assert [math.isnan(t) for t in table.column("admit_s")] == [r.admit_s is None for r in records]
    with pytest.raises(IndexError):
        table[len(records)]
    table.sort_by_id()
    expected = sorted(records, key=lambda r: r.id)
    assert [r.to_dict() for r in table] == [r.to_dict() for r in expected]


@settings(max_examples=40, deadline=None)
@given(records=st.lists(record_strategy, min_size=2, max_size=8), big=st.integers(2**63, 2**70))
def test_a_table_whose_ids_outgrow_64_bits_still_sorts_by_id(records, big):
    records = [replace(r, id=big + 5 - i if i % 2 else i) for i, r in enumerate(records)]  # the id column: a list
    table = RecordTable(records)
    table.sort_by_id()
    assert [r.to_dict() for r in table] == [r.to_dict() for r in sorted(records, key=lambda r: r.id)]


def test_records_cost_a_few_hundred_bytes_each():
    """The columns of 1,000 records: 27 numeric fields of 8 bytes, an outcome byte, no per-record object."""
    record = RequestRecord(**{f.name: 10**12 + i for i, f in enumerate(fields(RequestRecord))} | {
        "outcome": "finished", "reason": "", "arrival_s": 1.5, "admit_s": None, "first_token_s": 2.0,
        "finish_s": 3.0, "tail_waste_bytes": 7.0,
    })  # fmt: skip
    table = RecordTable([record] * 1000)
    stored = sum(column.itemsize * len(column) for column in table._columns.values())
    assert stored == 8 * 27 * 1000 and len(table._outcomes) == 1000 and not table._reasons
    assert table[999] == record


def test_a_waiting_request_costs_about_a_kilobyte_not_its_boxed_hash_ids():
    """Waiting requests keep their hash ids as 8-byte array items (a trace reader's tuple of ints, ~36 bytes
    an id, is dropped at arrival) and no token ids: 2,000 waiting prompts of 24 blocks each."""
    blocks, count = 24, 2000

    def arrivals():  # fresh tuples of large ids, as the trace reader makes them
        for i in range(count):
            yield TraceRequest(0.0, blocks * 512, 10, tuple(range(10**6 + i * blocks, 10**6 + (i + 1) * blocks)))

    cfg = SimConfig(step_model="constant")
    sim = Group(cfg, build_setup(cfg))
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for rid, req in enumerate(arrivals()):
            sim.add(req, 0.0, rid)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    waiting = sim.scheduler.waiting
    assert len(waiting) == count and all(type(r.prompt.hash_ids) is array for r in waiting)
    assert (after - before) / count < 1300  # a tuple of 24 boxed ids alone would add ~1,100


def test_concatenated_tables_hold_every_row_in_order(result):
    records = list(result.records)
    assert {r.outcome for r in records} == {"finished", "rejected"} and any(r.reason for r in records)
    rejected = [r for r in records if r.outcome == "rejected"]  # a part whose first outcome is the other one
    parts = [RecordTable(records[:7]), RecordTable(), RecordTable(rejected), RecordTable(records[7:])]
    assert list(RecordTable.concatenated(parts)) == records[:7] + rejected + records[7:]


class _Unexpandable(MooncakePrompt):
    __slots__ = ()

    def __array__(self, dtype=None, copy=None):
        raise AssertionError("expanded")


def test_a_trace_prompt_is_checked_on_arrival_without_expanding_it():
    check_prompt(_Unexpandable((3, 2**40), 700))  # its bounds vouch for its token ids
    assert MooncakePrompt((3, -1), 700).token_id_bounds is None  # not a hash id: checked token by token
    with pytest.raises(AssertionError, match="expanded"):
        check_prompt(_Unexpandable((3, -1), 700))


def test_the_scheduler_forgets_the_requests_that_left_the_simulation():
    cfg = SimConfig(step_model="constant")
    cluster = Cluster(cfg, build_setup(cfg), generate_scenario("chat", seed=0, scale=0.05))
    parts = cluster.run()
    (_, group), finished = cluster.targets[0], len(parts.records[0])
    assert finished > 0 and all(r.outcome == "finished" for r in parts.records[0])
    assert group.scheduler.done == {} and group.scheduler.stats.finished == finished


def test_cluster_bench_copies_shift_hash_ids_by_the_top_id_and_keep_every_other_field(load_file_module, repo_dir):
    bench = load_file_module(repo_dir / "bench" / "cluster.py")
    base = [
        TraceRequest(0.0, 700, 5, (0, 3), line=1),
        TraceRequest(2.5, 10, 1, (3,), line=2, tenant="t", cache_salt=7),
        TraceRequest(4.0, 1, 2, (), line=3),
    ]
    copies = list(bench.scaled(base, 3))
    assert [c.line for c in copies] == [1, 1, 1, 2, 2, 2, 3, 3, 3] and copies[::3] == base
    assert [c.hash_ids for c in copies[:6]] == [(0, 3), (4, 7), (8, 11), (3,), (7,), (11,)]
    assert all(replace(c, hash_ids=r.hash_ids) == r for c, r in zip(copies, [r for r in base for _ in range(3)]))
