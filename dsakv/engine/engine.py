"""``Engine``: a DSA model on a twin pool, driven by the scheduler: the tiny reference model (``TinyDsaModel``, the
default) or a real GLM-MoE-DSA / DeepSeek-V3.2 checkpoint (``DsaModel``, ``checkpoint=``). Greedy decoding on CPU.

One ``step``: ``Scheduler.step`` plans; the engine carries the plan out in the order ``dsakv.scheduler.batch``
fixes (offloads to host, write-backs to the lower tiers, restores into new pages, load-backs from host
memory or the Redis store, one paged forward per item, greedy sampling with speculative verification; the
tiers' copies are ``dsakv.engine.lower_tiers``) and reports the tokens back with ``Scheduler.update``. The
scheduler owns every page decision; the engine only moves bytes and computes.

Batch invariance (``EngineConfig.batch_invariant``, on by default). CPU GEMM rounds a row differently
depending on how many rows share the call (small calls take another kernel path), so a token's cache bytes
could depend on its chunk size and batch mates (seldom with the float64 tiny model, whose last-bit
differences rarely survive fp8 / bf16 storage; with a float32 model they do). The engine therefore runs one
forward per request and pads its rows to at least ``min_rows`` with throw-away tokens placed after the real
ones (causal: no real token sees them) and written to scratch pages (ids below ``allocator.first_page``,
never handed out; up to ``SCRATCH_SEQS`` padded sequences share one forward). Then prefix hits, chunk sizes, preemption and
speculative decoding leave every byte of both caches unchanged, which the equivalence tests prove (with
one torch CPU thread; the demo and the tests set it).

Speculative decoding: with ``SchedulerConfig.num_speculative_tokens = k`` a ``drafter(request, k)`` proposes the
drafts; the engine writes them to both caches with the last token, accepts the longest prefix that matches
greedy verification, adds the model's own next token, and the scheduler rolls the rest back. With
``EngineConfig.speculative = "mtp"`` the model's own MTP layer drafts instead and keeps its own two caches
(``dsakv.engine.speculative``); the radix tree then keys pages on bigrams and drops the last matched page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from dsakv.cache.events import CacheEvent, NamespacePart
from dsakv.cache.radix import RadixCache
from dsakv.engine.config import SCRATCH_SEQS, EngineConfig
from dsakv.engine.lower_tiers import EngineTiers
from dsakv.engine.offload import HostPages
from dsakv.engine.pool import TwinPool
from dsakv.engine.pool_dcp import DcpPool, pool_for_pages
from dsakv.engine.readback import CacheReadback, read_request_cache
from dsakv.engine.speculative import DraftChoice, MtpSpeculator
from dsakv.errors import DsakvError
from dsakv.model.dsa_model import DsaModel
from dsakv.model.inputs import check_pool, request_slots
from dsakv.model.tiny_dsa import SeqInput, TinyDsaModel
from dsakv.scheduler.batch import BatchItem, BatchPlan, HostCopy
from dsakv.scheduler.request import Request, RequestStats
from dsakv.scheduler.scheduler import Scheduler
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from dsakv.telemetry.figures import MetricSet

__all__ = ["SCRATCH_SEQS", "Drafter", "Engine", "EngineConfig", "EngineTotals", "GenerationResult"]

Drafter = Callable[[Request, int], Sequence[int]]


@dataclass
class GenerationResult:
    request_id: Any
    output_tokens: list[int]
    stats: RequestStats
    cache: CacheReadback | None = None


@dataclass
class EngineTotals:
    steps: int = 0
    forward_calls: int = 0
    offloaded_bytes_main: int = 0
    offloaded_bytes_indexer: int = 0
    restored_bytes: int = 0


def _plain_ints(prompt: Any) -> Any:
    """A prompt as the model reads it: numpy integers become Python ints (a 1-D integer array a list). Checks
    nothing: a prompt that is not a 1-D integer sequence comes back as it is, for the scheduler to refuse."""
    if isinstance(prompt, np.ndarray):
        return prompt.tolist() if prompt.ndim == 1 and prompt.dtype.kind in "iu" else prompt
    if isinstance(prompt, Sequence) and not isinstance(prompt, str | bytes):
        return [int(t) if isinstance(t, np.integer) else t for t in prompt]
    return prompt


@contextmanager
def _extra(field: str, extra: str) -> Iterator[None]:
    """Turn the ImportError of an optional dependency into a ``DsakvError`` naming the option and the extra."""
    try:
        yield
    except ImportError as exc:
        raise DsakvError(f"{field}: needs the {extra} extra (pip install 'dsakv[{extra}]'): {exc}") from None


class Engine:
    """A DSA model (the tiny one, or a checkpoint's ``DsaModel``) + ``TwinPool`` (``DcpPool`` under DCP) + ``Scheduler``
    (+ ``RadixCache`` when the prefix cache is on)."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        spec: ModelSpec | None = None,
        model: TinyDsaModel | DsaModel | None = None,
        drafter: Drafter | None = None,
        checkpoint: str | Path | None = None,
        draft_choice: DraftChoice | None = None,
    ) -> None:
        if config is None:
            config = EngineConfig()
        elif not isinstance(config, EngineConfig):
            raise DsakvError(f"config = {config!r}: must be an EngineConfig or None")
        if checkpoint is not None:  # a GLM-MoE-DSA / DeepSeek-V3.2 folder (config.json + safetensors)
            if model is not None:
                raise DsakvError("give either model or checkpoint, not both")
            model = DsaModel.from_checkpoint(checkpoint, mtp=config.speculative is not None)
        spec = spec or (model.spec if model is not None else ModelSpec.preset("tiny"))
        sched_cfg = config.scheduler
        if sched_cfg.max_context is None:
            sched_cfg = replace(sched_cfg, max_context=spec.max_position_embeddings)
        if config.speculative is not None:
            if drafter is not None:
                raise DsakvError("drafter: give none with speculative = 'mtp' (the model's MTP layer drafts)")
            sched_cfg = replace(sched_cfg, num_speculative_tokens=config.num_speculative_tokens)
        if sched_cfg.num_speculative_tokens and drafter is None and config.speculative is None:
            raise DsakvError("drafter: None, but num_speculative_tokens > 0 needs a drafter(request, k) -> k token ids")
        self.config = config
        self.spec = spec
        self.vocab_size = spec.arch_value("vocab_size")
        self.pool = self._build_pool(config, spec)
        check_pool(spec, self.pool)  # the compute path's refusals (index_kpool > 1) before anything runs
        self.layout = self.pool.layout  # the pages the allocator hands out: page_size x dcp tokens each
        self.allocator = self.pool.allocator
        self._scratch_slots = self.allocator.first_page * self.layout.page_size
        # the top-k index buffer the planner subtracts (max_batched_tokens x index_topk int32), allocated once
        self.topk_indices = torch.empty((sched_cfg.max_batched_tokens, spec.index_topk), dtype=torch.int32)
        self._pending_events: list[CacheEvent] = []  # the cache's events since the last publish
        self.kv_events = None  # the KVEventPublisher, when config.kv_events_endpoint is set
        self.radix = (
            RadixCache(
                self.allocator,
                eviction_policy=config.eviction_policy,
                insert_mode=config.insert_mode,
                hash_name=config.hash_name,
                speculative=config.speculative is not None,  # bigram keys, the last matched page dropped
                event_sink=self._pending_events.append if config.kv_events_endpoint else None,
            )
            if config.prefix_cache
            else None
        )
        # host memory and the shared store below the device pool (None when the config names neither)
        self.tiers = EngineTiers.from_config(config, self.pool)
        self.scheduler = Scheduler(
            self.allocator,
            self.radix,
            sched_cfg,
            on_finish=self._on_finish,
            on_offload=self._on_offload,
            tiers=self.tiers.scheduler_tiers if self.tiers is not None else None,
            vocab_size=self.vocab_size,
        )
        self.model = model or TinyDsaModel(spec, seed=config.seed, mtp=config.speculative is not None)
        self.drafter = drafter
        self.speculator = self._speculator(draft_choice)
        self.totals = EngineTotals()
        self.caches: dict[Any, CacheReadback] = {}
        self._host: dict[Any, HostPages] = {}
        self.metrics = MetricSet(self.scheduler, self.layout.main_page_bytes, self.layout.indexer_page_bytes)
        if self.tiers is not None and self.tiers.host_index is not None:
            self.metrics.add_tier(self.tiers.host_pages)  # cache_pages / cache_bytes{tier="host"}
        self._start_outputs(config)

    @staticmethod
    def _build_pool(config: EngineConfig, spec: ModelSpec) -> TwinPool | DcpPool:
        """The twin pool (one rank) or a DCP group's pools; scratch pages 0 .. first_page - 1 take the padding
        rows, the allocator never hands them out."""
        layout = CacheLayout(
            spec,
            kv_dtype=config.kv_dtype,
            page_size=config.page_size,
            index_kpool=config.index_kpool,
            allow_any_page_size=config.page_size // config.index_kpool != 64,
            indexer_dtype=config.indexer_dtype,
            mtp_layers=config.mtp_layers,
        )
        return pool_for_pages(
            layout,
            config.num_pages,
            dcp=config.dcp,
            padding_slots=config.padding_slots,
            kind=config.pool_kind,
            dcp_replicated=config.dcp_replicated,
        )

    def _start_outputs(self, config: EngineConfig) -> None:
        """Metrics registry and KV-event sockets: last, since nothing after them can fail and leave sockets bound."""
        self.metrics_registry = None  # the engine's own Prometheus registry, when config.metrics is set
        if config.metrics:
            with _extra("metrics", "metrics"):
                from dsakv.telemetry.prometheus import make_registry
            self.metrics_registry = make_registry(self.metrics)
        if config.kv_events_endpoint is not None:
            with _extra("kv_events_endpoint", "events"):
                from dsakv.kvevents.schema import PageCost
                from dsakv.kvevents.wire import KVEventPublisher
            self._page_cost = PageCost.of(self.layout)
            self.kv_events = KVEventPublisher(
                config.kv_events_endpoint, config.kv_events_replay_endpoint, topic=config.kv_events_topic
            )

    def _speculator(self, choice: DraftChoice | None) -> MtpSpeculator | None:
        if self.config.speculative is None:
            if choice is not None:
                raise DsakvError("draft_choice: needs speculative = 'mtp'")
            return None
        layer = getattr(self.model, "mtp", None)
        if layer is None:
            raise DsakvError(
                "model: has no MTP layer; speculative = 'mtp' needs one (TinyDsaModel(..., mtp=True), "
                "or DsaModel.from_checkpoint(..., mtp=True))"
            )
        return MtpSpeculator(layer, self.pool, self.config, self.spec.max_position_embeddings, choice)

    # ----- requests -----------------------------------------------------------------------------
    def add_request(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        request_id: Any = None,
        eos_token_id: int | None = None,
        cache_salt: NamespacePart = None,
        extra_key: NamespacePart = None,
    ) -> Request:
        """Queue a prompt (token ids in ``0 .. vocab_size - 1``); raises ``DsakvError`` and queues nothing if not.

        The scheduler, where every request enters, checks it (``Scheduler.add_request``; it was built with
        the model's ``vocab_size``), the prefix-cache namespace ``(extra_key, cache_salt)`` among it:
        requests of different namespaces never share a page.
        """
        return self.scheduler.add_request(
            _plain_ints(prompt),
            max_new_tokens,
            request_id=request_id,
            eos_token_id=eos_token_id,
            cache_salt=cache_salt,
            extra_key=extra_key,
        )

    def abort(self, request_id: Any) -> Request:
        req = self.scheduler.abort(request_id)
        self._host.pop(request_id, None)
        if self.speculator is not None:
            self.speculator.forget(request_id)
        self._publish_events()
        return req

    def flush_events(self) -> None:
        """Publish the cache's pending events and wait until every batch is sent (a no-op without events)."""
        if self.kv_events is not None:
            self._publish_events()
            self.kv_events.flush()

    def close(self) -> None:
        """Send the KV events still queued and release the event sockets (a no-op without them)."""
        if self.kv_events is not None:
            self._publish_events()
            self.kv_events.close()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        cache_salt: NamespacePart | Sequence[NamespacePart] = None,
        extra_key: NamespacePart | Sequence[NamespacePart] = None,
    ) -> list[GenerationResult]:
        """Greedy generation for every prompt; results in prompt order (rejected ones with their reason).

        ``cache_salt`` / ``extra_key``: one value for every prompt, or a list (or tuple) with one per prompt;
        each prompt's ``(extra_key, cache_salt)`` is its prefix-cache namespace (``add_request``).

        Every prompt and namespace is validated (once, by ``Scheduler.add_requests``) before any is queued: a
        bad one raises ``DsakvError`` and changes nothing.
        """
        if isinstance(prompts, Sequence | np.ndarray) and not isinstance(prompts, str | bytes):
            prompts = [_plain_ints(p) for p in prompts]
        reqs = self.scheduler.add_requests(
            prompts, max_new_tokens, eos_token_id=eos_token_id, cache_salt=cache_salt, extra_key=extra_key
        )
        self.run_until_idle()
        return [GenerationResult(r.id, list(r.outputs), r.stats, self.caches.get(r.id)) for r in reqs]

    @property
    def host_copies(self) -> Mapping[Any, HostPages]:
        """Read-only view: request id -> host copy of both caches of an offloaded request's pages."""
        return MappingProxyType(self._host)

    def run_until_idle(self, max_steps: int | None = None) -> None:
        """Step until no request is left, or ``max_steps`` steps (an integer >= 1, or None for no limit)."""
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise DsakvError(f"max_steps = {max_steps!r}: must be an integer >= 1, or None")
        steps = 0
        while not self.scheduler.is_idle:
            self.step()
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        if self.scheduler.is_idle:
            self.flush_write_throughs()

    def flush_write_throughs(self) -> None:
        """Copy down the write-throughs that wait for a next step (pages the last step inserted into the tree):
        with no step to come (the engine is idle), they would otherwise never reach host or store. Reads the
        device pages only; ``run_until_idle`` calls it once the scheduler is idle."""
        if self.tiers is None:
            return
        plan = BatchPlan(step=-1)
        self.scheduler.tiers.start_plan(self.radix, plan.write_backs)
        self.tiers.write_backs(plan)

    # ----- one step -----------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Plan, execute and report one step; returns the requests that finished in it."""
        plan = self.scheduler.step()
        if self.tiers is not None:
            self.tiers.write_backs(plan)  # before anything writes a page: sources may be pages freed in this plan
        self._move_host_copies(plan)
        if self.tiers is not None:
            loaded = self.tiers.load_backs(plan)  # synchronous: done before the forward reads any page
            if loaded:
                self.scheduler.load_backs_done(loaded)
            self.tiers.end_step()
        sampled = self._run_items(plan.items)
        self.totals.steps += 1
        finished = self.scheduler.update(plan, sampled)
        self._publish_events()
        return finished

    def _publish_events(self) -> None:
        """One ``KVEventBatch`` of the cache's events since the last one (a step's, as vLLM batches them)."""
        if self.kv_events is not None and self._pending_events:
            self.kv_events.publish_cache_events(self._pending_events, self._page_cost)
            self._pending_events.clear()

    def _on_offload(self, copy: HostCopy) -> None:
        lay = self.layout
        self._host[copy.request_id] = self.pool.offload_pages(copy.pages)
        self.totals.offloaded_bytes_main += len(copy.pages) * lay.main_page_bytes
        self.totals.offloaded_bytes_indexer += len(copy.pages) * lay.indexer_page_bytes

    def _move_host_copies(self, plan: BatchPlan) -> None:
        """Restores (offloads were copied by ``_on_offload`` while the pages were still allocated)."""
        for copy in plan.restores:
            host = self._host.pop(copy.request_id)
            self.pool.restore_pages(host, copy.pages)
            self.totals.restored_bytes += host.nbytes

    def _run_items(self, items: list[BatchItem]) -> list[list[int]]:
        """Forward every item (grouped so the padding fits the scratch pages) and sample greedily."""
        sampled: list[list[int]] = []
        group: list[tuple[BatchItem, list[int], SeqInput]] = []
        scratch_used = 0
        proposed = self.speculator.propose(items) if self.speculator is not None else {}
        for i, item in enumerate(items):
            drafts = proposed.get(i, []) if self.speculator is not None else self._drafts(item)
            tokens = list(item.request.tokens(item.end, item.start)) + drafts
            pad = self._pad_rows(item, len(tokens))
            if group and scratch_used + pad > self._scratch_slots:
                sampled += self._forward(group)
                group, scratch_used = [], 0
            group.append((item, drafts, self._seq_input(item, tokens, pad, scratch_used)))
            scratch_used += pad
        if group:
            sampled += self._forward(group)
        return sampled

    def _drafts(self, item: BatchItem) -> list[int]:
        if not item.num_draft:
            return []
        drafts = [int(t) for t in self.drafter(item.request, item.num_draft)]
        if len(drafts) != item.num_draft or any(not 0 <= t < self.vocab_size for t in drafts):
            raise DsakvError(
                f"drafter: returned {drafts!r}; expected {item.num_draft} token ids in 0..{self.vocab_size - 1}"
            )
        return drafts

    def _pad_rows(self, item: BatchItem, n: int) -> int:
        if not self.config.batch_invariant:
            return 0
        length = item.end + item.num_draft
        return max(0, min(self.config.min_rows - n, self.spec.max_position_embeddings - length))

    def _seq_input(self, item: BatchItem, tokens: list[int], pad: int, scratch_start: int) -> SeqInput:
        """Positions ``[start, end + drafts)`` of the request, then ``pad`` throw-away rows in scratch slots."""
        n, length = len(tokens), item.end + item.num_draft
        context = request_slots(item.request.pages, length, self.layout.page_size)
        if pad:
            context = torch.cat([context, torch.arange(scratch_start, scratch_start + pad)])
        return SeqInput(
            token_ids=tokens + [0] * pad,
            positions=torch.arange(length - n, length + pad),
            slots=context[length - n :],
            context_slots=context,
        )

    def _forward(self, group: list[tuple[BatchItem, list[int], SeqInput]]) -> list[list[int]]:
        seqs = [seq for _, _, seq in group]
        paged = self.model.forward_paged(self.pool, seqs, all_logits=True, budget_bytes=self.config.logits_budget_bytes)
        logits = paged.logits
        self.totals.forward_calls += 1
        out, row, firsts = [], 0, []
        for item, drafts, seq in group:
            n = item.end - item.start + item.num_draft
            first = row
            firsts.append(first)
            row += seq.token_ids.numel()
            if not item.sample:
                out.append([])
                continue
            greedy = logits[first + n - 1 - item.num_draft : first + n].argmax(dim=-1).tolist()
            accepted = []
            for draft, verified in zip(drafts, greedy):
                if draft != verified:
                    break
                accepted.append(draft)
            out.append(accepted + [greedy[len(accepted)]])
        if self.speculator is not None:  # the MTP layer's caches at the positions now verified
            self.speculator.extend([(item, new, f) for (item, _, _), new, f in zip(group, out, firsts)], paged.hidden)
        return out

    def _on_finish(self, req: Request) -> None:
        if self.speculator is not None:
            self.speculator.forget(req.id)
        if self.config.capture_cache:
            n = min(req.num_computed, req.num_tokens - 1)
            self.caches[req.id] = read_request_cache(self.pool, req.pages, n)

    # ----- checks -------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Scheduler, radix and allocator invariants, the pool's shapes, and no host copy left behind."""
        self.scheduler.check_integrity()
        self.pool.check_integrity()
        if self.tiers is not None:
            self.tiers.check_integrity()
        offloaded = {r.id for r in self.scheduler.waiting if r.offloaded_tokens}
        if set(self._host) != offloaded:
            raise AssertionError(f"engine: host copies {sorted(self._host)} != offloaded requests {sorted(offloaded)}")
