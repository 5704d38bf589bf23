"""``dsakv simulate --emit-log FILE --log-format sglang|vllm``: a simulated run's log in an engine's format.

``LogEmitter`` is the driver's step observer (``dsakv.sim.run(..., observer=)``, called with an
``AppliedSteps`` once per step after the step is applied: the group, the plan and the step's start and end in
simulated seconds). It writes what the engine would
print for the same run, with the same meaning (``dsakv.telemetry.log_lines`` lists the formats and their sources):

* SGLang: a server-args line (``decode_log_interval``), the pool's allocation line (``#tokens``: the pool's tokens,
  ``KV size``: its bytes on one rank in 2**30 units, both caches) and ``max_total_num_tokens=…``; then, after each
  step with prefill chunks, a ``Prefill batch`` line (``input throughput``: its new tokens over the time since the
  previous prefill line), and after every ``interval``-th decode-only step a ``Decode batch`` line (``gen
  throughput``: the tokens sampled by the decode steps since the previous decode line over that time). ``#token``
  and ``token usage`` are the pool's tokens held by requests (the prefix cache's evictable pages count as free),
  as SGLang's ``num_used``.
* vLLM: ``Available KV cache memory``, ``GPU KV cache size`` and ``Maximum concurrency`` once; then every
  ``interval`` simulated seconds (vLLM's ``VLLM_LOG_STATS_INTERVAL``, 10 s) the stats line over that interval.

Timestamps start at ``EPOCH``. The run must be stepped one step at a time (``analytic_decode=False``) and be one
DP group (``dsakv simulate`` checks both).
"""

from __future__ import annotations

import datetime as dt
from typing import IO, Any

from dsakv.errors import DsakvError, check_choice
from dsakv.scheduler import BatchPlan
from dsakv.sim.cluster import AppliedSteps
from dsakv.sim.config import SimSetup

LOG_FORMATS = ("sglang", "vllm")
SGLANG_DECODE_LOG_INTERVAL = 40  # SGLang server_args.py: decode_log_interval
VLLM_LOG_STATS_INTERVAL_S = 10.0  # vLLM envs.py: VLLM_LOG_STATS_INTERVAL
EPOCH = dt.datetime(2026, 1, 1)
GIB = 2**30


class LogEmitter:
    """Writes one run's log to ``out`` (an open text file) as the loop steps (see the module's docstring)."""

    def __init__(self, out: IO[str], log_format: str, setup: SimSetup, interval: float | None = None) -> None:
        check_choice("log_format", log_format, LOG_FORMATS)
        self.out, self.format, self.setup = out, log_format, setup
        default = SGLANG_DECODE_LOG_INTERVAL if log_format == "sglang" else VLLM_LOG_STATS_INTERVAL_S
        self.interval = default if interval is None else interval
        if not self.interval > 0 or (log_format == "sglang" and self.interval != int(self.interval)):
            raise DsakvError(
                f"log_interval = {interval!r}: must be a positive integer of decode steps (sglang) "
                "or a positive number of seconds (vllm)"
            )
        self.pool_tokens = setup.num_pages * setup.group_page_tokens
        self._prefill_tic = self._decode_tic = self._stats_tic = 0.0
        self._decode_steps = self._generated = 0
        self._prompt = self._queries = self._hits = 0
        self._header()

    # ----- lines ------------------------------------------------------------------------------------------
    def _stamp(self, seconds: float) -> str:
        t = EPOCH + dt.timedelta(seconds=seconds)
        if self.format == "sglang":
            return f"[{t:%Y-%m-%d %H:%M:%S} TP0] "
        return f"INFO {t:%m-%d %H:%M:%S} [loggers.py:123] "

    def _write(self, seconds: float, message: str) -> None:
        self.out.write(self._stamp(seconds) + message + "\n")

    def _header(self) -> None:
        s = self.setup
        pool_bytes = s.num_pages * s.cell.page_bytes
        context = s.spec.max_position_embeddings
        if self.format == "sglang":
            self._write(
                0, f"server_args=ServerArgs(page_size={s.layout.page_size}, decode_log_interval={int(self.interval)})"
            )
            self._write(
                0,
                f"KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: {self.pool_tokens}, "
                f"KV size: {pool_bytes / GIB:.2f} GB",
            )
            self._write(
                0,
                f"max_total_num_tokens={self.pool_tokens}, chunked_prefill_size={s.scheduler.chunk_tokens}, "
                f"max_prefill_tokens={s.scheduler.max_batched_tokens}, "
                f"max_running_requests={s.scheduler.max_running}, context_len={context}",
            )
            return
        self._write(0, f"Available KV cache memory: {s.capacity.available_bytes / GIB:.2f} GiB")
        self._write(
            0,
            f"GPU KV cache size: {self.pool_tokens:,} tokens, Maximum concurrency for {context:,} tokens per "
            f"request: {self.pool_tokens / context:.2f}x",
        )

    def _used(self, sim: Any) -> int:
        """Tokens of the pool held by requests (SGLang's num_used: evictable cache pages count as free)."""
        alloc = sim.allocator
        cached = sim.radix.evictable_tokens // sim.setup.group_page_tokens if sim.radix is not None else 0
        return (alloc.num_allocated - cached) * sim.setup.group_page_tokens

    # ----- the driver's observer ----------------------------------------------------------------------------
    def __call__(self, steps: AppliedSteps) -> None:
        if steps.plan is None:  # a run of steps: its items are not the log's to read one by one
            raise DsakvError("--emit-log: the run must be stepped one step at a time (analytic_decode=False)")
        self.step(steps.group, steps.plan, steps.start_s, steps.ends[-1])

    def step(self, sim: Any, plan: BatchPlan, start_s: float, end_s: float) -> None:
        """The lines the engine prints after one applied step of ``sim`` (a ``Group``)."""
        chunks = [it for it in plan.items if it.end - it.start > 1]
        decodes = [it for it in plan.items if it.end - it.start <= 1]
        admitted = {r.id for r in plan.admitted}
        new_seqs = [it for it in chunks if it.request.id in admitted]
        new_tokens = sum(it.end - it.start for it in chunks)
        cached = sum(it.start for it in new_seqs)
        sampled = sum(1 + it.num_draft for it in plan.items if it.sample)  # an upper bound with drafts
        self._prompt += new_tokens
        self._queries += sum(it.request.prompt_len for it in new_seqs)
        self._hits += cached
        used = self._used(sim)
        usage = used / self.pool_tokens
        running, queued = len(sim.scheduler.running), len(sim.scheduler.waiting)
        if self.format == "vllm":
            self._generated += sampled
            self._vllm_stats(end_s, running, queued, usage)
            return
        if chunks:
            gap = end_s - self._prefill_tic
            self._prefill_tic = end_s
            self._write(
                end_s,
                f"Prefill batch, #new-seq: {len(new_seqs)}, #new-token: {new_tokens}, #cached-token: {cached}, "
                f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}, #pending-token: 0, "
                f"cuda graph: False, input throughput (token/s): {new_tokens / gap if gap > 0 else 0.0:.2f}",
            )
            return
        self._decode_steps += 1
        self._generated += sampled
        if self._decode_steps % int(self.interval):
            return
        gap = end_s - self._decode_tic
        self._decode_tic = end_s
        self._write(
            end_s,
            f"Decode batch, #running-req: {len(decodes)}, #token: {used}, token usage: {usage:.2f}, cuda graph: True, "
            f"gen throughput (token/s): {self._generated / gap if gap > 0 else 0.0:.2f}, #queue-req: {queued}, ",
        )
        self._generated = 0

    def _vllm_stats(self, now: float, running: int, waiting: int, usage: float) -> None:
        gap = now - self._stats_tic
        if gap < self.interval:
            return
        hit = f"{100 * self._hits / self._queries:.1f}%" if self._queries else "0.0%"
        self._write(
            now,
            f"Engine 000: Avg prompt throughput: {self._prompt / gap:.1f} tokens/s, Avg generation throughput: "
            f"{self._generated / gap:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, "
            f"GPU KV cache usage: {100 * usage:.1f}%, Prefix cache hit rate: {hit}",
        )
        self._stats_tic = now
        self._prompt = self._generated = self._queries = self._hits = 0


__all__ = ["LOG_FORMATS", "LogEmitter"]
