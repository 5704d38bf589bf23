"""The demo's workload: a shared-prefix multi-turn chat through the engine, and the runs that compare a
pressured engine with an unpressured reference.

Conversations share a few system prompts; each turn's prompt is the whole history (system prompt, earlier
turns and the model's answers) plus a new user message, so later turns hit the prefix cache.
``pressure_summary`` runs the workload on a pool small enough to force eviction and preemption, then again
with the prefix cache off and a pool large enough for everything at once, and reports whether every
generated token and every finished request's cache read-back (both caches, bit for bit) match.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsakv.engine.config import EngineConfig
from dsakv.engine.engine import Engine, GenerationResult
from dsakv.scheduler.config import SchedulerConfig
from dsakv.spec.layout import ceil_div


@dataclass(frozen=True)
class ChatWorkload:
    """``system[i]``: token ids; ``conversations[c] = (system index, [user message of each turn])``."""

    system: tuple[tuple[int, ...], ...]
    conversations: tuple[tuple[int, tuple[tuple[int, ...], ...]], ...]
    max_new_tokens: int

    @property
    def num_requests(self) -> int:
        return sum(len(turns) for _, turns in self.conversations)

    @property
    def longest_request(self) -> int:
        """An upper bound on the tokens of any request: the longest system prompt, the most user tokens of a
        conversation and every turn's answer."""
        turns = max(len(t) for _, t in self.conversations)
        longest_user = max(sum(len(m) for m in t) for _, t in self.conversations)
        return max(len(s) for s in self.system) + longest_user + turns * self.max_new_tokens

    def pages_needed(self, page_size: int) -> int:
        """Pages of the longest request: a smaller pool rejects it."""
        return ceil_div(self.longest_request, page_size)


def chat_workload(
    *,
    conversations: int = 6,
    turns: int = 2,
    system_prompts: int = 2,
    system_tokens: int = 80,
    user_tokens: tuple[int, int] = (8, 24),
    max_new_tokens: int = 8,
    vocab_size: int = 512,
    seed: int = 0,
) -> ChatWorkload:
    """A seeded shared-prefix multi-turn workload (token ids drawn uniformly from the vocabulary)."""
    rng = random.Random(seed)
    lo, hi = user_tokens

    def draw(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(vocab_size) for _ in range(n))

    system = tuple(draw(system_tokens) for _ in range(system_prompts))
    convs = tuple(
        (c % system_prompts, tuple(draw(rng.randint(lo, hi)) for _ in range(turns))) for c in range(conversations)
    )
    return ChatWorkload(system, convs, max_new_tokens)


def run_workload(engine: Engine, workload: ChatWorkload) -> list[GenerationResult]:
    """Run turn by turn (all conversations of a turn together); returns every ``GenerationResult``."""
    history = [list(workload.system[s]) for s, _ in workload.conversations]
    results: list[GenerationResult] = []
    for turn in range(max(len(t) for _, t in workload.conversations)):
        active = [c for c, (_, turns) in enumerate(workload.conversations) if turn < len(turns)]
        prompts = [history[c] + list(workload.conversations[c][1][turn]) for c in active]
        outs = engine.generate(prompts, workload.max_new_tokens)
        for c, prompt, out in zip(active, prompts, outs):
            history[c] = prompt + out.output_tokens
        results += outs
    return results


def compare(results_a: list[GenerationResult], results_b: list[GenerationResult]) -> tuple[bool, bool]:
    """(every output token equal, every finished request's cache read-back bit-identical)."""
    tokens = len(results_a) == len(results_b) and all(
        a.output_tokens == b.output_tokens for a, b in zip(results_a, results_b)
    )
    caches = tokens and all(
        (a.cache is None) == (b.cache is None) and (a.cache is None or a.cache.equals(b.cache))
        for a, b in zip(results_a, results_b)
    )
    return tokens, caches


def _pressure_configs(
    workload: ChatWorkload,
    pages: int,
    ps: int,
    pool_kind: str,
    preemption: str,
    new_token_ratio: float,
    exact: bool,
    host_bytes: int | None,
    store_url: str | None,
    engine_options: dict | None,
    reference_options: dict | None = None,
) -> tuple[EngineConfig, EngineConfig]:
    """The pressured engine's config (``pages`` pages, small batches, the tiers) and the reference's (room
    for every request at once, no prefix cache)."""
    group = ps * (engine_options or {}).get("dcp", 1)  # a DCP group's page: page_size x dcp tokens
    # A checkpoint model (``DsaModel``) runs in both engines; ``exact`` picks the fp32 cache mode.
    dtypes = dict(kv_dtype="fp32", indexer_dtype="fp32") if exact else {}
    small = EngineConfig(
        **dtypes,
        num_pages=pages,
        page_size=ps,
        pool_kind=pool_kind,
        capture_cache=True,
        host_bytes=host_bytes,
        store_url=store_url,
        **(engine_options or {}),
        scheduler=SchedulerConfig(
            max_batched_tokens=4 * group,
            chunk_tokens=2 * group,
            new_token_ratio=new_token_ratio,
            preemption=preemption,
        ),
    )
    roomy = workload.pages_needed(ps) * workload.num_requests
    reference = EngineConfig(
        **dtypes,
        num_pages=roomy,
        page_size=ps,
        prefix_cache=False,
        capture_cache=True,
        **(reference_options or {}),
        scheduler=SchedulerConfig(max_batched_tokens=roomy * ps, chunk_tokens=roomy * ps, new_token_ratio=1.0),
    )
    return small, reference


def pressure_summary(
    workload: ChatWorkload,
    *,
    pages: int,
    page_size: int = 16,
    pool_kind: str = "slot",
    preemption: str = "offload",
    new_token_ratio: float = 0.0,
    model: Any = None,
    exact: bool = False,
    host_bytes: int | None = None,
    store_url: str | None = None,
    engine_options: dict | None = None,
    on_engine: Callable[[Engine], None] | None = None,
    reference_options: dict | None = None,
) -> dict:
    """Run ``workload`` on a ``pages``-page pool and as the reference; every figure of the demo's report.

    ``pages`` below ``workload.pages_needed(page_size)`` leaves the longest requests rejected (counted in
    ``rejected``), so the outputs do not match the reference's. ``host_bytes`` / ``store_url`` give the small
    engine a host tier / a Redis store below its pool; the report then adds the hit tokens per tier and the
    store's counters (a store that cannot be reached costs hits, never a result).

    ``engine_options``: more ``EngineConfig`` fields of the pressured engine (KV events, metrics);
    ``on_engine(engine)`` is called with it before it runs (to serve its metrics), and the caller then owns
    closing it (``Engine.close``: its event sockets stay up for late subscribers until then).
    ``reference_options``: more ``EngineConfig`` fields of the reference engine (with MTP speculative decoding
    in the pressured one, the reference runs the MTP layer without drafts, so both hold the same layers).
    """
    ps = page_size
    small, reference = _pressure_configs(
        workload,
        pages,
        ps,
        pool_kind,
        preemption,
        new_token_ratio,
        exact,
        host_bytes,
        store_url,
        engine_options,
        reference_options,
    )
    engine, ref_engine = Engine(small, model=model), Engine(reference, model=model)
    if on_engine is not None:
        on_engine(engine)
    results = run_workload(engine, workload)
    ref_results = run_workload(ref_engine, workload)
    tokens_match, caches_match = compare(results, ref_results)
    engine.check_integrity()
    lay, st, totals = engine.layout, engine.scheduler.stats, engine.totals
    written = sum(r.stats.pages_written for r in results)
    ref_written = sum(r.stats.pages_written for r in ref_results)
    summary = {
        "requests": len(results),
        "prompt_tokens": sum(r.stats.prompt_tokens for r in results),
        "output_tokens": sum(len(r.output_tokens) for r in results),
        "hit_tokens": sum(r.stats.hit_tokens + r.stats.resume_hit_tokens for r in results),
        "pool_pages": pages,
        "page_size": ps,
        "pages_written": written,
        "pages_written_reference": ref_written,
        "pages_saved": ref_written - written,
        "evicted_tokens": st.evicted_tokens,
        "preemptions": st.preemptions,
        "preemption": preemption,
        "offloaded_pages": st.offloaded_pages,
        "offloaded_bytes_main": totals.offloaded_bytes_main,
        "offloaded_bytes_indexer": totals.offloaded_bytes_indexer,
        "kv_dtype": lay.kv_dtype,
        "main_page_bytes": lay.main_page_bytes,
        "indexer_page_bytes": lay.indexer_page_bytes,
        "rejected": st.rejected,
        "steps": st.steps,
        "outputs_match": tokens_match,
        "caches_match": caches_match,
    } | _event_and_metric_figures(engine)
    if engine.tiers is not None:
        summary.update(tier_summary(engine, results, summary["hit_tokens"]))
    return summary


def tier_summary(engine: Engine, results: list[GenerationResult], hit_tokens: int) -> dict:
    """Hit tokens per tier (device + host + store = ``hit_tokens``; lower-tier hits are counted at first
    admission, so the device's share includes the re-admission hits) and the tiers' traffic."""
    host = sum(r.stats.hit_tokens_host for r in results)
    store = sum(r.stats.hit_tokens_store for r in results)
    tiers, page_bytes = engine.tiers, engine.layout.page_bytes
    out = {
        "hit_tokens_device": hit_tokens - host - store,
        "hit_tokens_host": host,
        "hit_tokens_store": store,
    }
    if tiers.host is not None:
        out["host_pages"] = tiers.host.num_pages
        out["host_bytes_written"] = tiers.totals.written_pages_host * page_bytes
        out["host_bytes_read"] = tiers.totals.loaded_pages_host * page_bytes
    if tiers.store is not None:
        counters = tiers.store.store.counters
        out["store_url"] = str(tiers.store.store)
        out["store_bytes_written"] = tiers.totals.written_pages_store * page_bytes
        out["store_bytes_read"] = tiers.totals.loaded_pages_store * page_bytes
        out["store_invalid_values"] = counters.invalid_total
        out["store_failed_calls"] = counters.failed_calls
    return out


def _event_and_metric_figures(engine: Engine) -> dict:
    """The prefix-cache counters the metrics expose, and with KV events on, what went on the wire: the
    batches sent and the pages the tree holds at the end (what a subscriber's index must hold)."""
    out = {}
    if engine.radix is not None:
        out["prefix_cache_queries"] = engine.radix.metrics.lookup_tokens
        out["prefix_cache_hits"] = engine.radix.metrics.hit_tokens
    if engine.kv_events is not None:
        engine.flush_events()
        out["kv_events_batches"] = engine.kv_events.next_seq
        out["cached_pages"] = len(engine.radix.page_hashes())
    return out
