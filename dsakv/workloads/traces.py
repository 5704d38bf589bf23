"""Request traces in the Mooncake format (JSON lines), read as a stream and validated per line.

One row per request::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ..., 13]}

``timestamp`` is in milliseconds since the trace start; each hash id stands for one 512-token block of
the prompt, the last block partial, so ``len(hash_ids) == ceil(input_length / 512)``. Two optional fields
isolate tenants: ``tenant`` and ``cache_salt`` (each a string or a 64-bit integer; absent or null: none)
become the request's prefix-cache namespace, ``extra_key = tenant`` and ``cache_salt = cache_salt``, so
requests that differ in either never share a page, whatever their hash ids. Two requests that
share a hash-id prefix share those prompt tokens. ``mooncake_tokens`` turns hash ids into concrete token
ids (block ``h`` -> ids ``h*512 .. h*512+511``) so the radix tree sees exactly the sharing the trace states.
Hash ids are range-checked here, at the edge: prompt token ids stay below ``PROMPT_TOKEN_LIMIT`` (2**31), so
the ids above it are free for outputs (the simulator's count down from 2**32 - 1) and never match a prompt.

Reading is two passes over the file: the first validates every line (so a bad line is reported, with its
line number, before anything is simulated) and checks the timestamp order; the second yields the requests
one at a time. Only when timestamps are out of order are the records held in memory and sorted (stable),
with a ``TraceOrderWarning``. Token ids are never held for the whole trace: callers create them per request.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsakv.errors import DsakvError
from dsakv.spec.layout import ceil_div

MOONCAKE_BLOCK = 512  # tokens per hash id in the Mooncake traces
PROMPT_TOKEN_LIMIT = 2**31  # prompt token ids lie below it; the ids above are left to outputs


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


def mooncake_tokens(hash_ids: Iterable[int], input_length: int, block: int = MOONCAKE_BLOCK) -> np.ndarray:
    """Token ids of a prompt: block ``h`` becomes ``h*block .. h*block+block-1``, cut at ``input_length``.

    Returns a fresh 1-D int64 array (the caller owns it; drop it when the request finishes).
    """
    ids = np.asarray(tuple(hash_ids) if not isinstance(hash_ids, np.ndarray) else hash_ids, dtype=np.int64)
    if input_length > ids.size * block:
        raise DsakvError(f"input_length = {input_length}: {ids.size} hash ids cover at most {ids.size * block} tokens")
    tokens = (ids[:, None] * block + np.arange(block, dtype=np.int64)[None, :]).reshape(-1)
    return tokens[:input_length]


def _field_int(row: dict, key: str, lineno: int, minimum: int) -> int:
    if key not in row:
        raise DsakvError(
            f"trace line {lineno}: missing field {key!r} (required: timestamp, input_length, output_length, hash_ids)"
        )
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DsakvError(f"trace line {lineno}: field {key!r} = {value!r}: must be an integer >= {minimum}")
    return value


def _field_namespace(row: dict, key: str, lineno: int) -> str | int | None:
    value = row.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    raise DsakvError(
        f"trace line {lineno}: field {key!r} = {value!r}: must be a string or a 64-bit integer (or null: none)"
    )


def parse_mooncake_line(text: str, lineno: int, block: int = MOONCAKE_BLOCK) -> TraceRequest:
    """Validate one JSON line and return its request; raises ``DsakvError`` naming the line number."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DsakvError(f"trace line {lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise DsakvError(f"trace line {lineno}: must be a JSON object, got {type(row).__name__}")
    if "timestamp" not in row:
        raise DsakvError(
            f"trace line {lineno}: missing field 'timestamp' (required: timestamp, input_length, output_length, hash_ids)"
        )
    ts = row["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise DsakvError(f"trace line {lineno}: field 'timestamp' = {ts!r}: must be a number of milliseconds >= 0")
    input_length = _field_int(row, "input_length", lineno, 1)
    output_length = _field_int(row, "output_length", lineno, 0)
    if "hash_ids" not in row:
        raise DsakvError(
            f"trace line {lineno}: missing field 'hash_ids' (required: timestamp, input_length, output_length, hash_ids)"
        )
    hash_ids = row["hash_ids"]
    if not isinstance(hash_ids, list):
        raise DsakvError(f"trace line {lineno}: field 'hash_ids' must be a list of integers >= 0")
    limit = PROMPT_TOKEN_LIMIT // block
    for h in hash_ids:
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < limit:
            raise DsakvError(
                f"trace line {lineno}: field 'hash_ids' contains {h!r}: must be integers in 0..{limit - 1} "
                f"(prompt token ids stay below 2**31)"
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


class MooncakeTrace:
    """A validated Mooncake trace file; iterate it for ``TraceRequest`` in timestamp order.

    Construction reads the file once (validation, counts, order check) and keeps only counts, unless
    the timestamps are out of order, in which case the sorted records are kept. With ``skip_bad`` a bad
    line is counted in ``skipped`` (its first message in ``first_error``) instead of raising.
    Iterating is repeatable and does not change the object.
    """

    def __init__(self, path: str | Path, *, skip_bad: bool = False, block: int = MOONCAKE_BLOCK) -> None:
        self.path = Path(path)
        self.skip_bad = skip_bad
        self.block = block
        self.skipped = 0
        self.first_error: str | None = None
        self.num_requests = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.out_of_order = 0  # lines whose timestamp lies below an earlier line's
        self._sorted: list[TraceRequest] | None = None
        prev = -math.inf
        for req in self._scan():
            self.num_requests += 1
            self.input_tokens += req.input_length
            self.output_tokens += req.output_length
            if req.timestamp_ms < prev:
                self.out_of_order += 1
            prev = max(prev, req.timestamp_ms)
        if self.out_of_order:
            self._sorted = sorted(self._scan(count=False), key=lambda r: r.timestamp_ms)
            warnings.warn(
                f"trace {str(self.path)!r}: {self.out_of_order} lines have timestamps out of order; sorted by timestamp",
                TraceOrderWarning,
                stacklevel=2,
            )

    def _scan(self, count: bool = True) -> Iterator[TraceRequest]:
        try:
            f = self.path.open("r", encoding="utf-8")
        except OSError as exc:
            raise DsakvError(f"trace {str(self.path)!r}: cannot read ({exc.strerror or exc})") from None
        with f:
            for lineno, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    yield parse_mooncake_line(text, lineno, self.block)
                except DsakvError as exc:
                    if not self.skip_bad:
                        raise
                    if count:
                        self.skipped += 1
                        self.first_error = self.first_error or str(exc)

    def __iter__(self) -> Iterator[TraceRequest]:
        if self._sorted is not None:
            return iter(self._sorted)
        return self._scan(count=False)

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
