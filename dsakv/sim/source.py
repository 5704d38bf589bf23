"""Where the requests of a run come from: a Mooncake trace file or a named synthetic scenario.

A ``Source`` is a small frozen description (picklable, so sweep workers re-open it themselves instead of
receiving every request); ``open_source`` turns it into an ``OpenedSource``: an iterable of ``TraceRequest``
in arrival order plus the reader's counts (skipped and reordered lines). Opening a trace validates it first.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from dsakv.errors import DsakvError, check_choice
from dsakv.sim.report import Counters
from dsakv.workloads.scenarios import DEFAULT_SCENARIO, SCENARIOS, generate_scenario
from dsakv.workloads.traces import MooncakeTrace, TraceOrderWarning, TraceRequest, is_regular_file


@dataclass(frozen=True)
class Source:
    """``trace`` (a path) or ``scenario`` (a name; default the embedded ``mixed``), never both."""

    trace: str | None = None
    scenario: str | None = None
    scale: float = 1.0
    seed: int = 0
    skip_bad: bool = False

    def __post_init__(self) -> None:
        if self.trace is not None and self.scenario is not None:
            raise DsakvError("give either --trace or --scenario, not both")
        if self.scenario is not None:
            check_choice("scenario", self.scenario, SCENARIOS)

    @property
    def name(self) -> str:
        if self.trace is not None:
            return f"trace {self.trace}"
        return f"scenario {self.scenario or DEFAULT_SCENARIO} (seed {self.seed}, scale {self.scale:g})"

    def to_dict(self) -> dict:
        return {
            "trace": self.trace,
            "scenario": None if self.trace else (self.scenario or DEFAULT_SCENARIO),
            "scale": self.scale,
            "seed": self.seed,
            "skip_bad": self.skip_bad,
        }


@dataclass(frozen=True)
class OpenedSource:
    """The requests of a source, ready to replay: how many, the reader's counts (seed of the loop's
    ``Counters``) and the notes to show the user (out-of-order or skipped lines, an empty trace)."""

    requests: Iterable[TraceRequest]
    num_requests: int
    counters: Counters
    warnings: tuple[str, ...] = ()
    last_timestamp_ms: float = 0  # the latest arrival's timestamp (0 when empty) ...
    last_line: int = 0  # ... and its trace line (0 for a scenario); ``check_arrival`` vets it before a run


def check_rereadable(source: Source) -> None:
    """``DsakvError`` unless ``source`` can be opened more than once (each sweep point, and each worker of a
    sharded run, opens it again): a trace must then be a regular file, not a pipe or FIFO, whose lines the
    first reader would take."""
    if source.trace is not None and not is_regular_file(source.trace):
        raise DsakvError(
            f"trace {source.trace!r}: a pipe or FIFO can be read only once and every sweep point (or worker) "
            "reads the trace again: save it to a file first"
        )


def open_source(source: Source) -> OpenedSource:
    """Validate and open the source; a trace's out-of-order warning is returned, not printed."""
    if source.trace is None:
        reqs = generate_scenario(source.scenario or DEFAULT_SCENARIO, seed=source.seed, scale=source.scale)
        last = reqs[-1].timestamp_ms if reqs else 0
        return OpenedSource(reqs, len(reqs), Counters(), last_timestamp_ms=last)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceOrderWarning)
        trace = MooncakeTrace(source.trace, skip_bad=source.skip_bad)
    notes = tuple(str(w.message) for w in caught if issubclass(w.category, TraceOrderWarning))
    if trace.skipped:
        notes += (f"skipped {trace.skipped} bad lines (first: {trace.first_error})",)
    if len(trace) == 0:
        notes += (f"trace {source.trace!r} holds no request: nothing to simulate",)
    counters = Counters(skipped_lines=trace.skipped, reordered_lines=trace.out_of_order)
    return OpenedSource(trace, len(trace), counters, notes, trace.last_timestamp_ms, trace.last_line)


def source_requests(source: Source) -> Iterable[TraceRequest]:
    """The requests of ``source`` (opened again: a sharded run's worker calls it through a
    ``functools.partial``, a picklable request factory; ``dsakv.sim.shards``)."""
    return open_source(source).requests
