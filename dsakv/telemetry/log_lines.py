"""The lines an SGLang or vLLM server prints about its KV cache and its steps, as typed records.

Formats, from the engines' current sources (docs/diagnose.md cites each):

SGLang (``[2026-08-20 01:37:23 TP0] <message>``)
  * ``KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 1,160,192, KV size: 58.32 GB``
    (``mem_cache/memory_pool.py``, ``KVCache._finalize_allocation_log``; an MHA pool says ``K size: …, V size: …``;
    SGLang's ``GB`` is 2**30 bytes)
  * ``max_total_num_tokens=…, chunked_prefill_size=…, max_prefill_tokens=…, max_running_requests=…, context_len=…``
    (``managers/scheduler.py``)
  * ``Prefill batch, #new-seq: …, #new-token: …, #cached-token: …, token usage: …, #running-req: …, #queue-req: …,
    …, input throughput (token/s): …`` and ``Decode batch, #running-req: …, #token: …, token usage: …, …,
    gen throughput (token/s): …, #queue-req: …`` (``managers/scheduler_components/metrics_reporter.py``; older
    releases wrote ``Prefill batch.`` / ``Decode batch.`` and no ``#pending-token``)

vLLM (``INFO 08-20 01:37:23 [file.py:123] <message>``)
  * ``Available KV cache memory: 30.81 GiB`` (``v1/worker/gpu_worker.py``)
  * ``GPU KV cache size: 569,600 tokens`` and ``Maximum concurrency for 202,752 tokens per request: 2.81x``, one
    line or two (``v1/core/kv_cache_utils.py``)
  * ``Engine 000: Avg prompt throughput: … tokens/s, Avg generation throughput: … tokens/s, Running: … reqs,
    Waiting: … reqs, GPU KV cache usage: …%, Prefix cache hit rate: …%`` (``v1/metrics/loggers.py``)

``parse_line(raw)`` returns the record of one line (bytes, without or with its newline), ``None`` for a line
that is none of these (ignored), or ``MALFORMED`` for one that starts like them and then is not (truncated, a
number past 2**63 - 1): the reader counts both. Nothing here raises on any input.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from dsakv.errors import INT64_MAX

GIB = 2**30  # SGLang's "GB" and vLLM's "GiB"


class PoolLine(NamedTuple):
    """A pool size the engine printed: ``tokens`` (SGLang ``#tokens`` / ``max_total_num_tokens``, vLLM ``GPU KV
    cache size``); ``kv_bytes``: the pool's bytes on one rank where stated (SGLang ``KV size``, 2 decimals of GiB);
    ``mha``: the pool is a K/V (MHA) pool, not an MLA one."""

    engine: str
    tokens: int
    kv_bytes: float | None = None
    mha: bool = False
    context_len: int | None = None
    max_prefill_tokens: int | None = None
    max_running: int | None = None  # SGLang max_running_requests


class AvailableLine(NamedTuple):
    """vLLM's ``Available KV cache memory`` (bytes, from 2 decimals of GiB)."""

    available_bytes: float


class ConcurrencyLine(NamedTuple):
    """vLLM's ``Maximum concurrency for L tokens per request: X x``."""

    context_len: int
    concurrency: float


class PrefillLine(NamedTuple):
    """One SGLang prefill batch: new and cached tokens, the pool's usage, the queues, and the prompt tokens per
    second since the previous prefill line (``throughput``; None in releases that did not print it)."""

    new_seqs: int
    new_tokens: int
    cached_tokens: int
    usage: float
    running: int
    queued: int
    throughput: float | None


class DecodeLine(NamedTuple):
    """One SGLang decode-batch line (every ``decode_log_interval`` decode steps): the batch, the pool's used
    tokens and usage, and the generated tokens per second since the previous decode line."""

    running: int
    tokens: int
    usage: float
    throughput: float
    queued: int


class StatsLine(NamedTuple):
    """vLLM's periodic stats line (averages over the logging interval); ``usage`` and ``hit_rate`` as fractions."""

    prompt_throughput: float
    gen_throughput: float
    running: int
    waiting: int
    usage: float | None
    hit_rate: float | None


Record = PoolLine | AvailableLine | ConcurrencyLine | PrefillLine | DecodeLine | StatsLine
MALFORMED = "malformed"

_INT = rb"([0-9]+(?:,[0-9]{3})*)"  # digit groups of three (vLLM prints 569,600)
_NUM = rb"([0-9]+(?:,[0-9]{3})*(?:\.[0-9]+)?)"
_SG_POOL = re.compile(
    rb"KV Cache is allocated\. .*?#tokens: " + _INT + rb", (?:KV size: " + _NUM + rb" GB|(K size): " + _NUM + rb" GB)"
)
_SG_MAX = re.compile(
    rb"max_total_num_tokens=" + _INT + rb"(?:.*?max_prefill_tokens=" + _INT + rb")?"
    rb"(?:.*?max_running_requests=" + _INT + rb")?(?:.*?context_len=" + _INT + rb")?"
)
_SG_PREFILL = re.compile(
    rb"Prefill batch(?: \[\d+\])?[.,] #new-seq: " + _INT + rb", #new-token: " + _INT + rb", #cached-token: " + _INT
    + rb", (?:full )?token usage: " + _NUM + rb", .*?#running-req: " + _INT + rb", #queue-req: " + _INT
    + rb"(?:.*?input throughput \(token/s\): " + _NUM + rb")?"
)  # fmt: skip
DECODE_PATTERN = re.compile(
    rb"Decode batch(?: \[\d+\])?[.,] #running-req: " + _INT + rb", #(?:full )?token: " + _INT
    + rb", (?:full )?token usage: " + _NUM + rb", .*?gen throughput \(token/s\): " + _NUM + rb", #queue-req: " + _INT
)  # fmt: skip
_VL_AVAILABLE = re.compile(rb"Available KV cache memory: " + _NUM + rb" GiB")
_VL_SIZE = re.compile(rb"GPU KV cache size: " + _INT + rb" tokens")
_VL_CONC = re.compile(rb"Maximum concurrency for " + _INT + rb" tokens per request: " + _NUM + rb"x")
_VL_STATS = re.compile(
    rb"Avg prompt throughput: " + _NUM + rb" tokens/s, Avg generation throughput: " + _NUM + rb" tokens/s, Running: "
    + _INT + rb" reqs, (?:Swapped: [0-9]+ reqs, )?(?:Waiting|Pending): " + _INT + rb" reqs"
    + rb"(?:, GPU KV cache usage: (?:" + _NUM + rb"%|n/a))?(?:, Prefix cache hit rate: (?:" + _NUM + rb"%|n/a))?"
)  # fmt: skip
# (substring a line must hold, regex, builder): the substring test keeps unrelated lines at one `in` each
_MARKERS = (b"Decode batch", b"Prefill batch", b"KV Cache is allocated", b"max_total_num_tokens=")
_VLLM_MARKERS = (b"Avg prompt throughput", b"GPU KV cache size", b"Maximum concurrency for", b"Available KV cache")


class _Overflow(Exception):
    pass


def _int(text: bytes) -> int:
    value = int(text.replace(b",", b"") if b"," in text else text)
    if value > INT64_MAX:
        raise _Overflow
    return value


def _num(text: bytes | None) -> float | None:
    if text is None:
        return None
    value = float(text.replace(b",", b"") if b"," in text else text)
    if value > INT64_MAX:
        raise _Overflow
    return value


def _sglang(raw: bytes) -> Record | str | None:
    if b"Decode batch" in raw:
        if (m := DECODE_PATTERN.search(raw)) is None:
            return MALFORMED
        g = m.groups()
        return DecodeLine(_int(g[0]), _int(g[1]), _num(g[2]), _num(g[3]), _int(g[4]))
    if b"Prefill batch" in raw:
        if (m := _SG_PREFILL.search(raw)) is None:
            return MALFORMED
        g = m.groups()
        return PrefillLine(*(_int(x) for x in g[:3]), _num(g[3]), _int(g[4]), _int(g[5]), _num(g[6]))
    if b"KV Cache is allocated" in raw:
        if (m := _SG_POOL.search(raw)) is None:
            return MALFORMED
        tokens, kv, mha, k = m.groups()
        return PoolLine("sglang", _int(tokens), None if mha else _num(kv) * GIB, mha=mha is not None)
    if (m := _SG_MAX.search(raw)) is None:
        return MALFORMED
    tokens, prefill, running, context = (None if g is None else _int(g) for g in m.groups())
    return PoolLine("sglang", tokens, context_len=context, max_prefill_tokens=prefill, max_running=running)


def _vllm(raw: bytes) -> Record | str | None:
    if b"Avg prompt throughput" in raw:
        if (m := _VL_STATS.search(raw)) is None:
            return MALFORMED
        g = m.groups()
        usage, hit = _num(g[4]), _num(g[5])
        return StatsLine(
            _num(g[0]), _num(g[1]), _int(g[2]), _int(g[3]), None if usage is None else usage / 100,
            None if hit is None else hit / 100,
        )  # fmt: skip
    out: list[Record] = []
    if b"GPU KV cache size" in raw:
        if (m := _VL_SIZE.search(raw)) is None:
            return MALFORMED
        out.append(PoolLine("vllm", _int(m.group(1))))
    if b"Maximum concurrency for" in raw:
        if (m := _VL_CONC.search(raw)) is None:
            return MALFORMED
        out.append(ConcurrencyLine(_int(m.group(1)), _num(m.group(2))))
    if b"Available KV cache" in raw:
        if (m := _VL_AVAILABLE.search(raw)) is None:
            return MALFORMED
        out.append(AvailableLine(_num(m.group(1)) * GIB))
    if not out:
        return None
    return out[0] if len(out) == 1 else out  # the merged capacity line carries two (a list)


def parse_line(raw: bytes) -> Record | list[Record] | str | None:
    """The record of one log line (a list of two for vLLM's merged capacity line), ``None`` (not a line of
    interest) or ``MALFORMED``. Records are named tuples (cheap to build: a log has millions of lines)."""
    try:
        for marker in _MARKERS:
            if marker in raw:
                return _sglang(raw)
        for marker in _VLLM_MARKERS:
            if marker in raw:
                return _vllm(raw)
    except (_Overflow, ValueError):
        return MALFORMED
    return None


__all__ = [
    "DECODE_PATTERN",
    "GIB",
    "MALFORMED",
    "AvailableLine",
    "ConcurrencyLine",
    "DecodeLine",
    "PoolLine",
    "PrefillLine",
    "Record",
    "StatsLine",
    "parse_line",
]
