"""Request traces in the Mooncake format (JSON lines), read as a stream and validated per line.

One row per request::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ..., 13]}

``timestamp`` is in milliseconds since the trace start; each hash id stands for one 512-token block of
the prompt, the last block partial, so ``len(hash_ids) == ceil(input_length / 512)``. Two optional fields
isolate tenants: ``tenant`` and ``cache_salt`` (each a string or a 64-bit integer; absent or null: none)
become the request's prefix-cache namespace, ``extra_key = tenant`` and ``cache_salt = cache_salt``, so
requests that differ in either never share a page, whatever their hash ids. Two requests that
share a hash-id prefix share those prompt tokens. ``mooncake_tokens`` turns hash ids into concrete token
ids so the radix tree sees exactly the sharing the trace states. Hash ids are any integers in 0..2**63-1
(a cluster's traffic, or copies of a trace offset per user, runs past any small range); token ids are the
prefix cache's uint32, so two encodings share that range:

* a *direct* id ``h < DIRECT_HASH_IDS`` (2**22) is block ``h`` -> ids ``h*512 .. h*512+511``: every token
  id names its block and position, and all of them lie below ``PROMPT_TOKEN_LIMIT`` (2**31);
* a *wide* id ``h >= 2**22`` writes ``v = h - 2**22`` in ``WIDE_DIGITS`` (3) base-``2**21`` digits; the token
  at position ``i`` of the block is ``2**31 + digit[i mod 3] * 512 + i``, in ``[2**31, WIDE_TOKEN_LIMIT)``
  (``2**31 + 2**30``). One token does not name its block, but every run of 3 tokens does, so any two
  different blocks differ on every page of ``page_size >= 3`` tokens that divides 512 (the prefix cache
  compares whole pages, at the same offset of the same path); ``check_wide_page_size`` says so before a run.

The ids from ``WIDE_TOKEN_LIMIT`` up (2**30 of them) are left to outputs (the simulator's count down from
2**32 - 1) and never match a prompt. The direct encoding is the only one the ids below 2**22 ever had, so a
trace within them simulates exactly as before wide ids existed.

Reading is two passes over the file: the first validates every line (so a bad line is reported, with its
line number, before anything is simulated) and checks the timestamp order; the second yields the requests
one at a time. Only when timestamps are out of order are the records held in memory and sorted (stable),
with a ``TraceOrderWarning``. Token ids are never held for the whole trace: callers create them per request
(``MooncakePrompt`` keeps a prompt as its hash ids and expands it only when asked).

A pipe, FIFO or other non-regular file (``/dev/stdin``) can be read only once: the first pass copies it to
an anonymous temporary file and the later passes read that copy. Lines are read as bytes and decoded one at
a time, so a line that is not UTF-8 is a bad line like any other (named, or skipped with ``skip_bad``); a
line longer than ``MAX_LINE_BYTES`` stops the reading (it cannot be skipped without reading it whole).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from dsakv.errors import INT64_MAX, DsakvError, short_repr
from dsakv.spec.jsonio import parse_json
from dsakv.spec.layout import ceil_div

MOONCAKE_BLOCK = 512  # tokens per hash id in the Mooncake traces
PROMPT_TOKEN_LIMIT = 2**31  # direct hash ids' token ids lie below it
WIDE_TOKEN_SPAN = 2**30  # wide hash ids' token ids lie in [PROMPT_TOKEN_LIMIT, WIDE_TOKEN_LIMIT)
WIDE_TOKEN_LIMIT = PROMPT_TOKEN_LIMIT + WIDE_TOKEN_SPAN  # every prompt token id lies below it; outputs above
DIRECT_HASH_IDS = PROMPT_TOKEN_LIMIT // MOONCAKE_BLOCK  # hash ids below it map to h*512 + i (2**22)
WIDE_DIGIT_BASE = WIDE_TOKEN_SPAN // MOONCAKE_BLOCK  # one digit per token, position beside it (2**21)
WIDE_DIGITS = math.ceil(63 / math.log2(WIDE_DIGIT_BASE))  # digits of a hash id below 2**63 (3)
MAX_HASH_ID = 2**63 - 1
MAX_LINE_BYTES = 16 * 2**20  # one request per line: a 10M-token prompt is about 200 KB of hash ids


class TraceOrderWarning(UserWarning):
    """Trace timestamps were not in order; the requests were sorted by timestamp (stable)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace. ``hash_ids`` name the prompt's 512-token blocks (the last one partial)."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    line: int = 0  # 1-based line number in the trace file (0 for generated requests)
    tenant: str | int | None = None  # the prefix-cache namespace's extra_key (isolates tenants)
    cache_salt: str | int | None = None  # the prefix-cache namespace's salt


def _block_tokens(hash_ids: object, input_length: int, block: int, dtype: type = np.int64) -> np.ndarray:
    """Token ids of a prompt as ``dtype`` (int64, or uint32: every token id of the module docstring's two
    encodings fits it), cut at ``input_length``."""
    ids = np.asarray(hash_ids, dtype=np.int64).reshape(-1)
    if input_length > ids.size * block:
        raise DsakvError(f"input_length = {input_length}: {ids.size} hash ids cover at most {ids.size * block} tokens")
    direct_limit = PROMPT_TOKEN_LIMIT // block
    positions = np.arange(block, dtype=dtype)
    if not ids.size or int(ids.max()) < direct_limit:  # direct ids only (the common case)
        tokens = (ids.astype(dtype) * dtype(block))[:, None] + positions
    else:  # wide rows: token i is its row's first token id for digit i mod digits, + i
        base = WIDE_TOKEN_SPAN // block
        digits = math.ceil(63 / math.log2(base))
        # each row's digits, least significant first (a direct row's are not used), then its first id per digit
        digit = ((ids[:, None] - direct_limit) // base ** np.arange(digits, dtype=np.int64)) % base
        starts = PROMPT_TOKEN_LIMIT + digit * block
        if int(ids.min()) < direct_limit:  # direct rows among them: h * block at every digit
            starts = np.where((ids < direct_limit)[:, None], ids[:, None] * block, starts)
        # The starts repeated in whole groups of `digits` (a copy with a contiguous row; a broadcast over the
        # short digit axis, or a gather by i mod digits, costs several times more), cut to the block.
        groups = ceil_div(block, digits)
        repeated = np.repeat(starts.astype(dtype)[:, None, :], groups, axis=1).reshape(ids.size, groups * digits)
        tokens = repeated[:, :block] + positions
    return tokens.reshape(-1)[:input_length]


def block_token(hash_id: int, position: int, block: int = MOONCAKE_BLOCK) -> int:
    """The token id at ``position`` of block ``hash_id`` (one element of ``mooncake_tokens``)."""
    direct_limit = PROMPT_TOKEN_LIMIT // block
    if hash_id < direct_limit:
        return hash_id * block + position
    base = WIDE_TOKEN_SPAN // block
    digit = (hash_id - direct_limit) // base ** (position % math.ceil(63 / math.log2(base))) % base
    return PROMPT_TOKEN_LIMIT + digit * block + position


def check_wide_page_size(page_size: int, block: int = MOONCAKE_BLOCK) -> str | None:
    """Why pages of ``page_size`` tokens cannot tell wide hash ids apart, or None (they can: the size divides
    the block and holds every digit position)."""
    digits = math.ceil(63 / math.log2(WIDE_TOKEN_SPAN // block))
    if block % page_size == 0 and page_size >= digits:
        return None
    return (
        f"hash ids >= {PROMPT_TOKEN_LIMIT // block} need pages of at least {digits} tokens dividing {block}; "
        f"page_size = {page_size}"
    )


def mooncake_tokens(hash_ids: Iterable[int], input_length: int, block: int = MOONCAKE_BLOCK) -> np.ndarray:
    """Token ids of a prompt (the module docstring's encodings: block ``h < 2**22`` becomes
    ``h*block .. h*block+block-1``), cut at ``input_length``.

    Returns a fresh 1-D int64 array (the caller owns it; drop it when the request finishes).
    """
    return _block_tokens(tuple(hash_ids) if not isinstance(hash_ids, np.ndarray) else hash_ids, input_length, block)


class MooncakePrompt(Sequence):
    """The token ids of a trace prompt, kept as its hash ids and expanded only when read.

    ``np.asarray(prompt)`` (and a slice) gives exactly ``mooncake_tokens(hash_ids, input_length)`` (uint32);
    ``len`` is ``input_length``. The simulator queues requests with these, so a backlog of waiting requests
    costs their hash ids (one per 512 tokens, shared with the ``TraceRequest``), not 8 bytes a token: the
    scheduler expands a prompt when it encodes the prompt's radix key, at admission.
    """

    __slots__ = ("hash_ids", "input_length", "block")

    def __init__(self, hash_ids: Sequence[int], input_length: int, block: int = MOONCAKE_BLOCK) -> None:
        if input_length > len(hash_ids) * block:
            raise DsakvError(
                f"input_length = {input_length}: {len(hash_ids)} hash ids cover at most {len(hash_ids) * block} tokens"
            )
        self.hash_ids, self.input_length, self.block = hash_ids, input_length, block

    def __len__(self) -> int:
        return self.input_length

    @property
    def token_id_bounds(self) -> tuple[int, int] | None:
        """Bounds of its token ids without expanding them (``check_prompt`` reads them): every hash id in
        ``0 .. MAX_HASH_ID`` gives tokens in ``0 .. WIDE_TOKEN_LIMIT - 1``; None for any other hash id."""
        ids = self.hash_ids
        if len(ids) and not (0 <= min(ids) and max(ids) <= MAX_HASH_ID):
            return None
        return 0, WIDE_TOKEN_LIMIT - 1

    def __array__(self, dtype: object = None, copy: bool | None = None) -> np.ndarray:
        tokens = _block_tokens(self.hash_ids, self.input_length, self.block, np.uint32)  # fresh: no copy asked for
        return tokens if dtype is None else tokens.astype(dtype)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return np.asarray(self)[index]
        i = index + self.input_length if index < 0 else index
        if not 0 <= i < self.input_length:
            raise IndexError(f"prompt index {index} out of range for {self.input_length} tokens")
        return block_token(self.hash_ids[i // self.block], i % self.block, self.block)


def _field_int(row: dict, key: str, lineno: int, minimum: int) -> int:
    if key not in row:
        raise DsakvError(
            f"trace line {lineno}: missing field {key!r} (required: timestamp, input_length, output_length, hash_ids)"
        )
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= INT64_MAX:
        raise DsakvError(
            f"trace line {lineno}: field {key!r} = {short_repr(value)}: must be an integer in {minimum}..2**63-1"
        )
    return value


def _field_namespace(row: dict, key: str, lineno: int) -> str | int | None:
    value = row.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    raise DsakvError(
        f"trace line {lineno}: field {key!r} = {short_repr(value)}: must be a string or a 64-bit integer (or null: none)"
    )


def _milliseconds(value: object) -> bool:
    """A JSON number usable as a timestamp: finite, >= 0, and convertible to a float (10**400 is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value)) and value >= 0
    except OverflowError:
        return False


def parse_mooncake_line(text: str | bytes, lineno: int, block: int = MOONCAKE_BLOCK) -> TraceRequest:
    """Validate one JSON line (text, or bytes decoded as UTF-8) and return its request; raises ``DsakvError``
    naming the line number."""
    row = parse_json(text, f"trace line {lineno}", with_line=False)
    if not isinstance(row, dict):
        raise DsakvError(f"trace line {lineno}: must be a JSON object, got {type(row).__name__}")
    if "timestamp" not in row:
        raise DsakvError(
            f"trace line {lineno}: missing field 'timestamp' (required: timestamp, input_length, output_length, hash_ids)"
        )
    ts = row["timestamp"]
    if not _milliseconds(ts):
        raise DsakvError(
            f"trace line {lineno}: field 'timestamp' = {short_repr(ts)}: must be a finite number of milliseconds >= 0"
        )
    input_length = _field_int(row, "input_length", lineno, 1)
    output_length = _field_int(row, "output_length", lineno, 0)
    if "hash_ids" not in row:
        raise DsakvError(
            f"trace line {lineno}: missing field 'hash_ids' (required: timestamp, input_length, output_length, hash_ids)"
        )
    hash_ids = row["hash_ids"]
    if not isinstance(hash_ids, list):
        raise DsakvError(f"trace line {lineno}: field 'hash_ids' must be a list of integers >= 0")
    for h in hash_ids:
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= MAX_HASH_ID:
            raise DsakvError(
                f"trace line {lineno}: field 'hash_ids' contains {short_repr(h)}: must be integers in 0..2**63-1"
            )
    expected = ceil_div(input_length, block)
    if len(hash_ids) != expected:
        raise DsakvError(
            f"trace line {lineno}: {len(hash_ids)} hash_ids for input_length = {input_length}: "
            f"must be ceil({input_length}/{block}) = {expected}"
        )
    tenant = _field_namespace(row, "tenant", lineno)
    salt = _field_namespace(row, "cache_salt", lineno)
    return TraceRequest(ts, input_length, output_length, tuple(hash_ids), lineno, tenant, salt)


def is_regular_file(path: str | Path) -> bool:
    """True for a regular file (it can be read again), False for a pipe, FIFO, device or socket (it may not).

    Opens nothing, so a FIFO without a writer does not block. Raises ``DsakvError`` for a path that does not
    exist, cannot be inspected, or is a folder."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise DsakvError(f"trace {str(path)!r}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise DsakvError(f"trace {str(path)!r}: cannot read (it is a folder)")
    return stat.S_ISREG(mode)


def _spooled_lines(spool: IO[bytes], size: int) -> Iterator[bytes]:
    """The lines of the first ``size`` bytes of ``spool``, through a private map (no shared file position)."""
    if size == 0:
        return
    with mmap.mmap(spool.fileno(), size, access=mmap.ACCESS_READ) as mm:
        pos = 0
        while pos < size:
            end = mm.find(b"\n", pos)
            end = size if end < 0 else end + 1
            yield mm[pos:end]
            pos = end


class MooncakeTrace:
    """A validated Mooncake trace file; iterate it for ``TraceRequest`` in timestamp order.

    Construction reads the file once (validation, counts, order check) and keeps only counts, unless
    the timestamps are out of order, in which case the sorted records are kept, or ``hold`` is set (for a
    caller that holds the whole list anyway: the records of that first reading are kept, so iterating reads
    and parses nothing again). With ``skip_bad`` a bad
    line is counted in ``skipped`` (its first message in ``first_error``) instead of raising.
    Iterating is repeatable and does not change the object. A pipe or FIFO is read once, into an anonymous
    temporary file that lives as long as the object (``spooled`` is then True).
    """

    def __init__(
        self, path: str | Path, *, skip_bad: bool = False, block: int = MOONCAKE_BLOCK, hold: bool = False
    ) -> None:
        self.path = Path(path)
        self.skip_bad = skip_bad
        self.block = block
        self.skipped = 0
        self.first_error: str | None = None
        self.num_requests = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.out_of_order = 0  # lines whose timestamp lies below an earlier line's
        self.last_timestamp_ms: float = 0  # the latest timestamp, on line ``last_line`` (0: no request)
        self.last_line = 0
        self._records: list[TraceRequest] | None = None  # the records kept (in timestamp order), if any
        self._spool: IO[bytes] | None = None if is_regular_file(self.path) else tempfile.TemporaryFile()
        self._spool_size = 0
        prev = -math.inf
        held: list[TraceRequest] | None = [] if hold else None
        for req in self._scan(first=True):
            if held is not None:
                held.append(req)
            self.num_requests += 1
            self.input_tokens += req.input_length
            self.output_tokens += req.output_length
            if req.timestamp_ms < prev:
                self.out_of_order += 1
            elif req.timestamp_ms > prev:
                prev = req.timestamp_ms
                self.last_timestamp_ms, self.last_line = prev, req.line
        if self.skipped and not self.num_requests:  # skip_bad skips bad lines of a trace, not a file that is none
            raise DsakvError(
                f"trace {str(self.path)!r}: none of its {self.skipped} lines is a valid request (first: "
                f"{self.first_error})"
            )
        if self.out_of_order:
            self._records = sorted(self._scan(first=False) if held is None else held, key=lambda r: r.timestamp_ms)
            warnings.warn(
                f"trace {str(self.path)!r}: {self.out_of_order} lines have timestamps out of order; sorted by timestamp",
                TraceOrderWarning,
                stacklevel=2,
            )
        elif held is not None:
            self._records = held

    @property
    def spooled(self) -> bool:
        """True when the trace was not a regular file and is replayed from a temporary copy."""
        return self._spool is not None

    def _lines(self, first: bool) -> Iterator[bytes]:
        """Raw lines: from the file (the first pass copies a non-regular one to the spool), or from the spool."""
        if self._spool is not None and not first:
            yield from _spooled_lines(self._spool, self._spool_size)
            return
        try:
            f = self.path.open("rb")
        except OSError as exc:
            raise DsakvError(f"trace {str(self.path)!r}: cannot read ({exc.strerror or exc})") from None
        spool = self._spool
        with f:
            lineno = 0
            while line := f.readline(MAX_LINE_BYTES + 1):
                lineno += 1
                if len(line) > MAX_LINE_BYTES:
                    raise DsakvError(
                        f"trace line {lineno}: longer than {MAX_LINE_BYTES:,} bytes (one request per line)"
                    )
                if spool is not None:
                    spool.write(line)
                yield line
        if spool is not None:
            spool.flush()
            self._spool_size = spool.tell()

    def _scan(self, first: bool) -> Iterator[TraceRequest]:
        for lineno, data in enumerate(self._lines(first), start=1):
            if not data.strip():
                continue
            try:
                yield parse_mooncake_line(data, lineno, self.block)
            except DsakvError as exc:
                if not self.skip_bad:
                    raise
                if first:
                    self.skipped += 1
                    self.first_error = self.first_error or str(exc)

    def __iter__(self) -> Iterator[TraceRequest]:
        if self._records is not None:
            return iter(self._records)
        return self._scan(first=False)

    def __len__(self) -> int:
        return self.num_requests


def read_mooncake(path: str | Path, skip_bad: bool = False) -> Iterator[TraceRequest]:
    """Requests of a Mooncake trace in timestamp order (validated first; see ``MooncakeTrace``)."""
    return iter(MooncakeTrace(path, skip_bad=skip_bad))


def write_mooncake(path: str | Path, requests: Iterable[TraceRequest]) -> int:
    """Write requests as Mooncake JSON lines (integral timestamps written as ints); returns the row count."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as f:
        for r in requests:
            ts = int(r.timestamp_ms) if float(r.timestamp_ms).is_integer() else r.timestamp_ms
            row = {"timestamp": ts, "input_length": r.input_length, "output_length": r.output_length}
            row["hash_ids"] = list(r.hash_ids)
            if r.tenant is not None:
                row["tenant"] = r.tenant
            if r.cache_salt is not None:
                row["cache_salt"] = r.cache_salt
            f.write(json.dumps(row) + "\n")
            n += 1
    return n
