"""Reading an engine's log as a stream: one pass, memory bounded whatever the log's size.

``read_log(path)`` reads the file in binary lines (``log_lines.parse_line`` each; the bulk, decode lines, through a
faster equivalent in ``_read``), keeps the pool figures, counts
and sums, and a bounded, evenly spaced sample of the batch lines (``BoundedSample``): a 1 GB log costs the same
memory as a 1 MB one. It also builds the *gaps* a step-time fit needs (``Gap``): SGLang prints each batch line
after the batch ran, with a throughput over the time since the previous line of its kind, so a decode line's
``K x running / throughput`` seconds (``K`` = ``decode_log_interval``, read from the server-args line, default
40) are the prefill batches printed since the previous decode line plus ``K`` decode steps, and (with ``K`` = 1,
where every decode step is printed) a prefill line's ``new tokens / throughput`` seconds are the decode steps
since the previous prefill line plus its own batch.

Bad input never raises a traceback: a binary file (NUL bytes) or a missing file is one ``DsakvError``; a line
that is none of the engines' is counted in ``ignored_lines``, one that starts like them but is not (truncated,
numbers past 2**63 - 1) in ``malformed_lines`` (its number in ``malformed_at``, the first few).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import BinaryIO, Generic, TypeVar

from dsakv.errors import DsakvError
from dsakv.telemetry.log_lines import (
    MALFORMED,
    AvailableLine,
    ConcurrencyLine,
    DecodeLine,
    PoolLine,
    PrefillLine,
    StatsLine,
    parse_line,
)

T = TypeVar("T")
SAMPLE_SIZE = 4096
SGLANG_DECODE_LOG_INTERVAL = 40  # server_args.py: decode_log_interval's default
MAX_GAP_STEPS = 64  # a gap spanning more steps than this is not kept (a log with decode lines far apart)
QUEUED_FREE_USAGE = 0.9  # a line with requests queued and the pool at most this full: "queued while free"
_INTERVAL = re.compile(rb"decode_log_interval=([0-9]{1,9})\b")
_BINARY_PROBE = 1 << 16


class BoundedSample(Generic[T]):
    """Every ``stride``-th item offered, at most ``2 x size`` kept: when full, every other one is dropped and the
    stride doubles. Deterministic and evenly spread over the stream; ``seen`` counts what was offered."""

    def __init__(self, size: int = SAMPLE_SIZE) -> None:
        self.size, self.stride, self.seen = size, 1, 0
        self.items: list[T] = []

    def wants(self) -> bool:
        """Whether the next item offered will be kept (callers may skip building one that will not)."""
        return self.seen % self.stride == 0

    def skip(self) -> None:
        self.seen += 1

    def offer(self, item: T) -> None:
        if self.seen % self.stride == 0:
            self.items.append(item)
            if len(self.items) >= 2 * self.size:
                self.items = self.items[::2]
                self.stride *= 2
        self.seen += 1


@dataclass(frozen=True, slots=True)
class Gap:
    """Seconds the log measured (``seconds``) and the steps that filled them: prefill batches as
    ``("prefill", new tokens, context before them, new sequences, 1)`` (the context: the cached tokens of the new
    sequences, or, for a batch that only continues a chunked prompt, the prompt's tokens so far) and runs of decode steps as ``("decode", running, pool
    tokens, steps)`` (the batch a decode line printed, taken for each of the ``decode_log_interval`` steps it covers)."""

    kind: str  # "decode" or "prefill": which line measured it
    seconds: float
    steps: tuple[tuple, ...]


@dataclass
class LogFacts:
    """What one log says, reduced as it streamed by."""

    path: str
    engine: str | None = None
    lines: int = 0
    ignored_lines: int = 0
    malformed_lines: int = 0
    malformed_at: list[int] = field(default_factory=list)
    pool: PoolLine | None = None  # the last pool line (SGLang: the allocation line's KV bytes carried over)
    pool_kv_bytes: float | None = None
    mha_pool: bool = False
    context_len: int | None = None
    max_prefill_tokens: int | None = None
    available_bytes: float | None = None
    concurrency: ConcurrencyLine | None = None
    decode_log_interval: int = SGLANG_DECODE_LOG_INTERVAL
    prefill_lines: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0
    new_seqs: int = 0  # sequences the prefill lines started
    hit_seqs: int = 0  # ... in lines with cached tokens
    decode_lines: int = 0
    stats_lines: int = 0
    queued_lines: int = 0  # decode / stats lines with requests queued (a prefill line's queue is its token budget's)
    queued_free_lines: int = 0  # ... of those with the pool at most QUEUED_FREE_USAGE full and the batch below the cap
    max_running: int | None = None  # SGLang max_running_requests: a full batch queues whatever the pool
    queued_min_usage: float | None = None  # lowest usage seen while requests were queued
    prefill: BoundedSample = field(default_factory=BoundedSample)
    decode: BoundedSample = field(default_factory=BoundedSample)
    stats: BoundedSample = field(default_factory=BoundedSample)
    gaps: BoundedSample = field(default_factory=BoundedSample)

    @property
    def hit_rate(self) -> float | None:
        """Prefix-cache hits over prompt tokens: SGLang's cached / (new + cached) tokens; vLLM's logged rate (mean)."""
        total = self.new_tokens + self.cached_tokens
        if total:
            return self.cached_tokens / total
        rates = [s.hit_rate for s in self.stats.items if s.hit_rate is not None]
        return sum(rates) / len(rates) if rates else None

    def counts(self) -> dict:
        return {
            "engine": self.engine,
            "lines": self.lines,
            "ignored_lines": self.ignored_lines,
            "malformed_lines": self.malformed_lines,
            "malformed_at": self.malformed_at,
            "prefill_lines": self.prefill_lines,
            "decode_lines": self.decode_lines,
            "stats_lines": self.stats_lines,
        }


def _open(path: str) -> BinaryIO:
    """The log opened for binary reading (iterated a line at a time), after a check that it is not binary."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise DsakvError(f"--log {path}: cannot read ({exc.strerror})") from None
    head = f.read(_BINARY_PROBE)
    if b"\x00" in head:
        f.close()
        raise DsakvError(f"--log {path}: a binary file (NUL byte at offset {head.index(0)}), not an engine log")
    f.seek(0)
    return f


class _Gaps:
    """The steps since the previous decode line and since the previous prefill line (``Gap`` builder)."""

    def __init__(self, facts: LogFacts) -> None:
        self.facts = facts
        self.since_decode: list[tuple] | None = []
        self.since_prefill: list[tuple] | None = None  # unknown until the first prefill line
        self.carry = 0  # tokens so far of a prompt being chunked (a full batch ends in a chunk)

    @staticmethod
    def _add(steps: list[tuple] | None, new: tuple) -> list[tuple] | None:
        """``steps`` with ``new`` appended in place (None: too many, or unknown)."""
        if steps is None or len(steps) >= MAX_GAP_STEPS:
            return None
        steps.append(new)
        return steps

    def prefill(self, p: PrefillLine) -> None:
        context = self.carry if p.new_seqs == 0 else p.cached_tokens
        step = ("prefill", p.new_tokens, context, max(p.new_seqs, 1), 1)
        full = self.facts.max_prefill_tokens is not None and p.new_tokens >= self.facts.max_prefill_tokens
        self.carry = (context + p.new_tokens if p.new_seqs == 0 else p.new_tokens // max(p.new_seqs, 1)) if full else 0
        every_decode = self.facts.decode_log_interval == 1  # only then are the decode steps between all printed
        own = self._add(self.since_prefill, step)
        if own is not None and every_decode and p.throughput and p.new_tokens:
            self._offer("prefill", p.new_tokens / p.throughput, own)
        self.since_prefill = []
        self.since_decode = self._add(self.since_decode, step)

    def decode(self, running: int, tokens: int, throughput: float) -> None:
        k = self.facts.decode_log_interval
        step = ("decode", running, tokens, k)
        steps = self.since_decode
        if steps is not None and len(steps) < MAX_GAP_STEPS and throughput > 0 and running:
            gaps = self.facts.gaps
            if gaps.wants():  # the gap is built only when the sample keeps it
                steps.append(step)
                gaps.offer(Gap("decode", k * running / throughput, tuple(steps)))
            else:
                gaps.skip()
        self.since_decode = []
        # prefill gaps are measured only when every decode step is printed (k = 1)
        self.since_prefill = self._add(self.since_prefill, step) if k == 1 else None

    def _offer(self, kind: str, seconds: float, steps: list[tuple]) -> None:
        gaps = self.facts.gaps
        if gaps.wants():
            gaps.offer(Gap(kind, seconds, tuple(steps)))
        else:
            gaps.skip()


def _queued(facts: LogFacts, queued: int, usage: float | None, running: int) -> None:
    if queued <= 0 or usage is None:
        return
    facts.queued_lines += 1
    capped = facts.max_running is not None and running >= facts.max_running
    if usage <= QUEUED_FREE_USAGE and not capped:
        facts.queued_free_lines += 1
    if facts.queued_min_usage is None or usage < facts.queued_min_usage:
        facts.queued_min_usage = usage


def _take(facts: LogFacts, rec, gaps: _Gaps) -> None:
    if isinstance(rec, DecodeLine):
        facts.decode_lines += 1
        facts.decode.offer(rec)
        gaps.decode(rec.running, rec.tokens, rec.throughput)
        _queued(facts, rec.queued, rec.usage, rec.running)
    elif isinstance(rec, PrefillLine):
        facts.prefill_lines += 1
        facts.new_tokens += rec.new_tokens
        facts.cached_tokens += rec.cached_tokens
        facts.new_seqs += rec.new_seqs
        facts.hit_seqs += rec.new_seqs if rec.cached_tokens else 0
        facts.prefill.offer(rec)
        gaps.prefill(rec)
    elif isinstance(rec, StatsLine):
        facts.stats_lines += 1
        facts.stats.offer(rec)
        _queued(facts, rec.waiting, rec.usage, rec.running)
    elif isinstance(rec, PoolLine):
        if rec.kv_bytes is not None or rec.mha:
            facts.pool_kv_bytes, facts.mha_pool = rec.kv_bytes, rec.mha
        if rec.context_len is not None:
            facts.context_len = rec.context_len
        if rec.max_prefill_tokens is not None:
            facts.max_prefill_tokens = rec.max_prefill_tokens
        if rec.max_running is not None:
            facts.max_running = rec.max_running
        facts.pool = rec
    elif isinstance(rec, AvailableLine):
        facts.available_bytes = rec.available_bytes
    elif isinstance(rec, ConcurrencyLine):
        facts.concurrency = rec
        facts.context_len = rec.context_len
    engine = "vllm" if isinstance(rec, (StatsLine, AvailableLine, ConcurrencyLine)) else "sglang"
    if isinstance(rec, PoolLine):
        engine = rec.engine
    facts.engine = facts.engine or engine


# The fast path's pattern: ``DECODE_PATTERN`` with plain numbers of at most 18 digits (below 2**63, so no overflow
# check) and the queue not followed by a digit group (where ``DECODE_PATTERN``'s greedy group would take it): a line
# it matches, ``DECODE_PATTERN`` matches with the same figures; any other line takes the slow path.
_PLAIN = rb"([0-9]{1,18})"
_THROUGHPUT = b"gen throughput (token/s): "
_FAST_DECODE = re.compile(
    rb"Decode batch(?: \[\d+\])?[.,] #running-req: " + _PLAIN + rb", #(?:full )?token: " + _PLAIN
    + rb", (?:full )?token usage: ([0-9]{1,18}\.[0-9]+), .*?" + re.escape(_THROUGHPUT)
    + rb"([0-9]{1,18}(?:\.[0-9]+)?), #queue-req: " + _PLAIN + rb"(?![0-9]|,[0-9]{3})"
)  # fmt: skip
# ... and its commonest case, tried first (no optional part, the throughput right after the cuda-graph field, so the
# first throughput in the line): a third faster (Python's ``re`` is slow at optional groups and lazy ``.*?``)
_COMMON_DECODE = re.compile(
    rb"Decode batch, #running-req: " + _PLAIN + rb", #token: " + _PLAIN + rb", token usage: ([0-9]{1,18}\.[0-9]+), "
    rb"cuda graph: (?:True|False), " + re.escape(_THROUGHPUT) + rb"([0-9]{1,18}(?:\.[0-9]+)?), #queue-req: " + _PLAIN
    + rb"(?![0-9]|,[0-9]{3})"
)  # fmt: skip


def _read(f: BinaryIO, facts: LogFacts, gaps: _Gaps, fast: bool) -> int:
    """Every line of ``f`` taken; returns their count. The common line, a well-formed SGLang decode line without
    digit grouping, takes the inlined fast path (the same effect as ``_take`` of its ``DecodeLine``, with
    ``_Gaps.decode`` inlined: this runs for most lines of a log): no record is built unless a sample keeps it.
    ``fast`` False: every line through ``parse_line`` (the reference the tests compare with)."""
    common, match = _COMMON_DECODE.match, _FAST_DECODE.match
    decodes, dsample, gsample, skip = 0, facts.decode, facts.gaps, len(_THROUGHPUT)
    number = 0
    for number, raw in enumerate(f, 1):
        at = raw.find(b"Decode batch") if fast else -1
        if at < 0:
            _slow(raw, number, facts, gaps)
            continue
        # the first throughput in the line must be the one matched (``DECODE_PATTERN``'s lazy ``.*?`` stops there)
        if (m := common(raw, at)) is None and (
            (m := match(raw, at)) is None or raw.find(_THROUGHPUT, at) != m.start(4) - skip
        ):
            _slow(raw, number, facts, gaps)
            continue
        r, t, u, tp, q = m.groups()
        running, throughput = int(r), float(tp)
        decodes += 1
        if dsample.seen % dsample.stride == 0:
            dsample.offer(DecodeLine(running, int(t), float(u), throughput, int(q)))
        else:
            dsample.seen += 1
        k = facts.decode_log_interval
        steps = gaps.since_decode
        if steps is not None and len(steps) < MAX_GAP_STEPS and throughput > 0 and running:
            if gsample.seen % gsample.stride == 0:  # the gap is built only when the sample keeps it
                steps.append(("decode", running, int(t), k))
                gsample.offer(Gap("decode", k * running / throughput, tuple(steps)))
            else:
                gsample.seen += 1
        if steps is None or steps:  # an empty list is reused: nothing else holds it
            gaps.since_decode = []
        if k == 1:  # prefill gaps are measured only when every decode step is printed
            gaps.since_prefill = gaps._add(gaps.since_prefill, ("decode", running, int(t), k))
        elif gaps.since_prefill is not None:
            gaps.since_prefill = None
        if q != b"0" and (queued := int(q)) > 0:
            _queued(facts, queued, float(u), running)
        if facts.engine is None:
            facts.engine = "sglang"
    facts.decode_lines += decodes
    return number


def _slow(raw: bytes, number: int, facts: LogFacts, gaps: _Gaps) -> None:
    """Line ``number`` parsed by ``parse_line`` (or the server-args line's decode_log_interval) and taken."""
    if b"decode_log_interval=" in raw and (m := _INTERVAL.search(raw)):
        facts.decode_log_interval = max(int(m.group(1)), 1)
        return
    rec = parse_line(raw)
    if rec is None:
        facts.ignored_lines += 1
    elif rec == MALFORMED:
        facts.malformed_lines += 1
        if len(facts.malformed_at) < 5:
            facts.malformed_at.append(number)
    else:
        for r in rec if isinstance(rec, list) else (rec,):
            _take(facts, r, gaps)


def read_log(path: str, fast: bool = True) -> LogFacts:
    """One streaming pass over the log at ``path`` (see the module's docstring); ``fast`` False: decode lines
    through ``parse_line`` too (the same figures, slower)."""
    facts = LogFacts(path)
    with _open(path) as f:
        facts.lines = _read(f, facts, _Gaps(facts), fast)
    return facts


__all__ = ["QUEUED_FREE_USAGE", "BoundedSample", "Gap", "LogFacts", "read_log"]
