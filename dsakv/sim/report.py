"""What one simulation produced: per-request records, the pool-use timeline, and the summary figures.

Every figure is defined in ``docs/metrics.md`` (formula and unit). Bytes are per rank of the TP group
(``RankCell``: DCP splits the main latent, the indexer K is replicated); pages are the planner's rank
pages of ``page_size x dcp`` tokens (``RankCell.group_page_tokens``); pairs and FLOPs are of the lightning indexer over all indexer layers
(``dsakv.planner.savings.prefix_savings``). Records are built once, when a request leaves the simulation, and
never change afterwards; the driver's counts (steps, evictions, preemptions) and the trace reader's (skipped
and reordered lines) travel in ``Counters``.

A run keeps its records in a ``RecordTable``: one typed array per field (8 bytes a figure, about 220 bytes a
request, instead of a ``RequestRecord`` object and its boxed numbers, about 1 KB), read back as
``RequestRecord`` objects one at a time; ``dsakv.sim.summary.summarize`` sums the columns (exact integers, in
record order).
"""

from __future__ import annotations

import functools
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from dsakv.planner.budget import PoolCapacity, RankCell
from dsakv.planner.savings import prefix_savings
from dsakv.scheduler.request import Request
from dsakv.sim.transfers import TierCounters, TierSetup
from dsakv.spec.layout import CacheLayout

if TYPE_CHECKING:
    from dsakv.sim.summary import Summary


@dataclass(slots=True)
class RequestRecord:
    """Accounting of one request (``docs/metrics.md``, "Per request")."""

    id: int
    line: int
    arrival_s: float
    input_tokens: int  # L, the prompt
    output_tokens: int  # tokens generated (the trace's output_length when finished)
    hit_tokens: int  # P, cached prefix at first admission (whole pages), every tier together
    hit_tokens_host: int  # the part of P loaded back from host memory
    hit_tokens_store: int  # the part of P loaded back from the store
    suffix_tokens: int  # S = L - P
    computed_tokens: int  # tokens whose KV the request wrote (recomputes and drafts included)
    pages_written: int
    pages_saved: int
    main_bytes_written: int
    indexer_bytes_written: int
    main_bytes_saved: int
    indexer_bytes_saved: int
    indexer_pairs_saved: int
    indexer_pairs_paid: int
    indexer_cross_pairs_paid: int
    indexer_flops_saved: int
    indexer_flops_paid: int
    outcome: str  # finished / rejected / unfinished
    reason: str
    preemptions: int
    tail_waste_tokens: int
    tail_waste_bytes: float
    admit_s: float | None
    first_token_s: float | None
    finish_s: float | None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ttft_s"], d["tpot_s"] = self.ttft_s, self.tpot_s
        return d


def make_record(
    req: Request,
    cell: RankCell,
    *,
    line: int,
    arrival_s: float,
    admit_s: float | None,
    first_token_s: float | None,
    finish_s: float | None,
    outcome: str,
) -> RequestRecord:
    """Build the record of a request that left the scheduler (or never entered: ``outcome`` rejected).

    ``cell`` prices the bytes per rank (its layout, the pairs and FLOPs); the times are those the loop saw
    (None where the request never got that far)."""
    st = req.stats
    prompt_tokens, hit_tokens = req.prompt_len, st.hit_tokens
    sav = prefix_savings(cell.layout, prompt_tokens, hit_tokens)
    total = prompt_tokens + len(req.outputs)
    tail = (-total) % cell.group_page_tokens if outcome == "finished" else 0
    admitted = st.admit_step is not None
    return RequestRecord(
        id=req.id,
        line=line,
        arrival_s=arrival_s,
        input_tokens=prompt_tokens,
        output_tokens=len(req.outputs),
        hit_tokens=sav.cached_tokens,
        hit_tokens_host=st.hit_tokens_host,
        hit_tokens_store=st.hit_tokens_store,
        suffix_tokens=sav.computed_tokens,
        computed_tokens=st.computed_tokens,
        pages_written=st.pages_written,
        pages_saved=sav.cached_tokens // cell.group_page_tokens,
        main_bytes_written=cell.main_bytes(st.computed_tokens) if st.computed_tokens else 0,
        indexer_bytes_written=cell.indexer_bytes(st.computed_tokens) if st.computed_tokens else 0,
        main_bytes_saved=cell.main_bytes(sav.cached_tokens) if hit_tokens else 0,
        indexer_bytes_saved=cell.indexer_bytes(sav.cached_tokens) if hit_tokens else 0,
        indexer_pairs_saved=sav.pairs_saved if admitted else 0,
        indexer_pairs_paid=sav.pairs_paid if admitted else 0,
        indexer_cross_pairs_paid=sav.cross_pairs_paid if admitted else 0,
        indexer_flops_saved=sav.flops_saved if admitted else 0,
        indexer_flops_paid=sav.flops_paid if admitted else 0,
        outcome=outcome,
        reason=st.reason,
        preemptions=st.preemptions,
        tail_waste_tokens=tail,
        tail_waste_bytes=tail * cell.cell_bytes,
        admit_s=admit_s,
        first_token_s=first_token_s,
        finish_s=finish_s,
    )


_OPTIONAL_TIMES = ("admit_s", "first_token_s", "finish_s")  # None is stored as NaN (a time is never NaN)
_TEXT = ("outcome", "reason")


class RecordTable(Sequence):
    """The records of a run as columns: ``append`` a ``RequestRecord``, read ``table[i]`` (a new
    ``RequestRecord`` equal to the one appended), iterate, or take a whole ``column(name)``.

    A numeric column is an ``array`` typed by its first value (``q`` for ints, ``d`` for floats); a value that
    does not fit (an int beyond 64 bits, a float among ints) turns that column into a plain list, so a figure
    is never rounded. The times that may be None are NaN in a ``d`` array; ``outcome`` is a byte code into the
    distinct outcomes; ``reason`` is kept only where it is not empty.
    """

    NAMES = tuple(f.name for f in fields(RequestRecord))
    _NUMERIC = tuple(name for name in NAMES if name not in _TEXT)  # the columns of ``_columns``

    def __init__(self, records: Iterable[RequestRecord] = ()) -> None:
        self._columns: dict[str, array | list] = {}
        self._outcome_names: list[str] = []
        self._outcomes = array("B")
        self._reasons: dict[int, str] = {}
        self._size = 0
        for record in records:
            self.append(record)

    def append(self, record: RequestRecord) -> None:
        row, columns = self._size, self._columns
        for name in self._NUMERIC:
            value = getattr(record, name)
            if value is None and name in _OPTIONAL_TIMES:
                value = math.nan
            column = columns.get(name)
            if column is None:
                column = columns[name] = array("d" if name in _OPTIONAL_TIMES or type(value) is float else "q")
            try:
                column.append(value)
            except (TypeError, OverflowError):  # does not fit the array's type: keep the exact value
                column = columns[name] = list(column)
                column.append(value)
        try:
            code = self._outcome_names.index(record.outcome)
        except ValueError:
            code = len(self._outcome_names)
            self._outcome_names.append(record.outcome)
        self._outcomes.append(code)
        if record.reason:
            self._reasons[row] = record.reason
        self._size = row + 1

    def __len__(self) -> int:
        return self._size

    def _record(self, row: int) -> RequestRecord:
        values = {name: column[row] for name, column in self._columns.items()}
        for name in _OPTIONAL_TIMES:
            if math.isnan(values[name]):
                values[name] = None
        values["outcome"] = self._outcome_names[self._outcomes[row]]
        values["reason"] = self._reasons.get(row, "")
        return RequestRecord(**values)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self._record(row) for row in range(*index.indices(self._size))]
        row = index + self._size if index < 0 else index
        if not 0 <= row < self._size:
            raise IndexError(f"record {index} out of range for {self._size} records")
        return self._record(row)

    def __iter__(self) -> Iterator[RequestRecord]:
        return map(self._record, range(self._size))

    def column(self, name: str) -> array | list:
        """The values of one field in record order (``outcome`` and ``reason`` as lists of strings; the
        optional times with NaN for None). The table's own storage for numeric fields: do not modify."""
        if name == "outcome":
            return [self._outcome_names[code] for code in self._outcomes]
        if name == "reason":
            return [self._reasons.get(row, "") for row in range(self._size)]
        if self._size == 0:
            return array("d" if name in _OPTIONAL_TIMES else "q")
        return self._columns[name]

    def outcome_mask(self, outcome: str) -> list[bool]:
        """Per record: does its outcome equal ``outcome``."""
        if outcome not in self._outcome_names:
            return [False] * self._size
        code = self._outcome_names.index(outcome)
        return [c == code for c in self._outcomes]

    @classmethod
    def concatenated(cls, tables: Sequence[RecordTable]) -> RecordTable:
        """The rows of ``tables`` one after the other, column by column (no record object is made)."""
        out = cls()
        for table in tables:
            if not table._size:
                continue
            if not out._size:
                out._outcome_names = list(table._outcome_names)
                for name, column in table._columns.items():
                    out._columns[name] = array(column.typecode, column) if isinstance(column, array) else list(column)
                out._outcomes = array("B", table._outcomes)
                out._reasons = dict(table._reasons)
                out._size = table._size
                continue
            for name, column in table._columns.items():
                mine = out._columns[name]
                if isinstance(mine, array) and isinstance(column, array) and mine.typecode == column.typecode:
                    mine.extend(column)
                else:  # a column that did not fit its array in one of them: plain values
                    out._columns[name] = list(mine) + list(column)
            codes = []
            for name in table._outcome_names:
                if name not in out._outcome_names:
                    out._outcome_names.append(name)
                codes.append(out._outcome_names.index(name))
            out._outcomes.extend(codes[c] for c in table._outcomes)
            out._reasons.update((row + out._size, reason) for row, reason in table._reasons.items())
            out._size += table._size
        return out

    def sort_by_id(self) -> None:
        """Reorder every column by the records' ids (stable)."""
        if self._size < 2:
            return
        ids = self._columns["id"]
        if isinstance(ids, array):  # one stable argsort; then each typed column is gathered in C
            order = np.argsort(np.frombuffer(ids, ids.typecode), kind="stable")
        else:
            order = np.array(sorted(range(self._size), key=ids.__getitem__), dtype=np.intp)
        for name, column in self._columns.items():
            if isinstance(column, array):
                self._columns[name] = array(column.typecode, np.frombuffer(column, column.typecode)[order].tobytes())
            else:
                self._columns[name] = [column[row] for row in order.tolist()]
        self._outcomes = array("B", np.frombuffer(self._outcomes, np.uint8)[order].tobytes())
        position = {row: new for new, row in enumerate(order.tolist())}
        self._reasons = {position[row]: reason for row, reason in self._reasons.items()}


@dataclass(frozen=True, slots=True)
class GroupCounts:
    """One DP group's counts the records cannot give: the steps that evicted (the group's own count) and the
    scheduler's totals (``SchedulerStats``: evicted tokens, preemptions, offloaded pages)."""

    eviction_steps: int = 0
    evicted_tokens: int = 0
    preemptions: int = 0
    offloaded_pages: int = 0

    @staticmethod
    def total(counts: Iterable[GroupCounts]) -> GroupCounts:
        counts = list(counts)
        return GroupCounts(*(sum(getattr(c, f.name) for c in counts) for f in fields(GroupCounts)))


@dataclass
class Counters:
    """The run's counts the records cannot give: the driver's (steps, the groups' evictions, preemptions,
    offloads: ``GroupCounts``) and the trace reader's (``skipped_lines``, ``reordered_lines``; a source seeds
    them). ``docs/metrics.md`` defines each one."""

    steps: int = 0
    evicted_tokens: int = 0
    eviction_steps: int = 0  # steps that evicted (the summary's ``evictions``)
    preemptions: int = 0
    offloaded_pages: int = 0
    skipped_lines: int = 0
    reordered_lines: int = 0
    dp_attention: int = 1  # attention-DP groups of each instance (every group simulated)


@dataclass
class Timeline:
    """Samples at step ends: pool pages in use, pages held only by the cache, running requests. A sample's
    values hold over ``(previous sample's time, its time]``.

    One sample per scheduler step, or, with ``merge_equal`` (a cluster of several groups: its timelines must
    not grow with the steps), one per stretch of steps with equal values, at the stretch's last step end:
    the same step function, sampled where it changes (peaks and the makespan equal, time-weighted means
    equal up to the rounding of a sum)."""

    time_s: array = field(default_factory=lambda: array("d"))
    used_pages: array = field(default_factory=lambda: array("q"))
    cache_only_pages: array = field(default_factory=lambda: array("q"))
    running: array = field(default_factory=lambda: array("q"))
    preempt_time_s: array = field(default_factory=lambda: array("d"))
    merge_equal: bool = False

    def sample(self, time_s: float, used: int, cached: int, running: int) -> None:
        """The sample at a step's end."""
        if (
            self.merge_equal
            and self.time_s
            and used == self.used_pages[-1]
            and cached == self.cache_only_pages[-1]
            and running == self.running[-1]
        ):
            self.time_s[-1] = time_s
            return
        self.time_s.append(time_s)
        self.used_pages.append(used)
        self.cache_only_pages.append(cached)
        self.running.append(running)

    def sample_run(self, times: Sequence[float], used: np.ndarray, cached: np.ndarray, running: int) -> None:
        """The samples at the ends of a run of steps (``used`` / ``cached``: int64, one per step): what
        ``sample`` at each step end makes, in one pass, on a timeline of one sample per step (a ``merge_equal``
        one is given a ``sample`` at the end of each stretch of equal values instead: ``Group.observe_run``)."""
        self.time_s.extend(times)
        self.used_pages.extend(used.tolist())
        self.cache_only_pages.extend(cached.tolist())
        self.running.extend([running] * len(times))


@dataclass(frozen=True, slots=True)
class TierUse:
    """The lower tiers of a run: their setup (``sim.transfers.TierSetup``: sizes, bytes per entry) and what
    they moved (``TierCounters``, every group's together)."""

    setup: TierSetup
    counters: TierCounters


@dataclass
class SimResult:
    """Everything one run produced; ``figures`` is its typed summary (``dsakv.sim.summary``), ``summary`` the
    same rendered to the JSON object of ``--json`` (made once, on first use)."""

    config: dict
    layout: CacheLayout
    cell: RankCell
    capacity: PoolCapacity
    num_pages: int
    records: RecordTable  # or any sequence of ``RequestRecord`` (``summarize`` tables it)
    timeline: Timeline
    counters: Counters
    figures: Summary
    tiers: TierUse | None = None  # when the run had lower tiers
    # a run split among worker processes: each worker's peak resident set (bytes) and CPU seconds (user + system)
    worker_peak_rss_bytes: tuple[int, ...] = ()
    worker_cpu_s: tuple[float, ...] = ()

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        return self.figures.to_dict()

    @property
    def page_main_bytes(self) -> int:
        """Main-KV bytes of one pool page on one rank (``page_size`` rows; DCP spreads the group's tokens)."""
        return self.cell.main_page_bytes

    @property
    def page_indexer_bytes(self) -> int:
        """Indexer-K bytes of one pool page on one rank (all ``page_size x dcp`` tokens: replicated)."""
        return self.cell.indexer_page_bytes
