"""No scheduling path changes a single output token or a single cache byte of a finished request.

Every case runs the same shared-prefix multi-turn workload through the tiny DSA model and compares with a
reference run (prefix cache off, a pool that holds everything, one chunk per prompt, no drafts): generated
tokens equal, and both caches of every finished request read back bit-identical.
"""

from __future__ import annotations

import random

import pytest
import torch

import dsakv.model.indexer
import dsakv.planner.workspaces
from dsakv.engine.engine import Engine, EngineConfig
from dsakv.model.tiny_dsa import TinyDsaModel
from dsakv.scheduler import SchedulerConfig
from dsakv.scheduler.pages import pages_for
from dsakv.spec.model_spec import ModelSpec
from dsakv.workloads.chat import chat_workload, compare, run_workload

PAGE = 16
WORKLOAD = chat_workload(conversations=5, turns=2, system_prompts=2, system_tokens=72, max_new_tokens=8, seed=3)
LONGEST = 72 + 2 * 24 + 2 * 8


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def engine_config(**kw) -> EngineConfig:
    sched = kw.pop("scheduler", {})
    return EngineConfig(page_size=PAGE, capture_cache=True, scheduler=SchedulerConfig(**sched), **kw)


@pytest.fixture(scope="module")
def reference():
    roomy = pages_for(LONGEST, PAGE) * WORKLOAD.num_requests
    big = 4096
    cfg = engine_config(
        num_pages=roomy,
        prefix_cache=False,
        scheduler=dict(max_batched_tokens=big, chunk_tokens=big, new_token_ratio=1.0),
    )
    engine = Engine(cfg)
    results = run_workload(engine, WORKLOAD)
    engine.check_integrity()
    assert all(r.cache is not None and len(r.output_tokens) == WORKLOAD.max_new_tokens for r in results)
    return results


def run_checked(engine: Engine, preempt_every: int = 0) -> list:
    """Run the workload, checking every invariant after every step (and preempting the newest running
    request every ``preempt_every`` steps, if set)."""
    original = engine.step

    def step():
        finished = original()
        engine.check_integrity()
        sched = engine.scheduler
        if preempt_every and sched.stats.steps % preempt_every == 0 and sched.running:
            sched.preempt(sched.running[-1].id)
            engine.check_integrity()
        return finished

    engine.step = step
    results = run_workload(engine, WORKLOAD)
    assert engine.scheduler.is_idle
    return results


def assert_equivalent(results, reference) -> None:
    tokens, caches = compare(results, reference)
    assert tokens, [(a.output_tokens, b.output_tokens) for a, b in zip(results, reference)]
    assert caches


SMALL = pages_for(LONGEST, PAGE) + 1  # one request fits; several do not: eviction and preemption


@pytest.mark.parametrize(
    "name, kw",
    [
        ("prefix_cache_on", dict(num_pages=64)),
        ("prefix_cache_allocate_mode", dict(num_pages=64, insert_mode="allocate")),
        ("chunk_16", dict(num_pages=64, scheduler=dict(chunk_tokens=16, max_batched_tokens=48))),
        (
            "chunk_32_no_cache",
            dict(num_pages=64, prefix_cache=False, scheduler=dict(chunk_tokens=32, max_batched_tokens=64)),
        ),
        (
            "packed_layout",
            dict(num_pages=64, pool_kind="packed", scheduler=dict(chunk_tokens=48, max_batched_tokens=96)),
        ),
    ],
)
def test_outputs_and_caches_identical_across_configs(name, kw, reference):
    results = run_checked(Engine(engine_config(**kw)))
    assert_equivalent(results, reference)
    if "num_pages" in kw and kw.get("prefix_cache", True):
        assert sum(r.stats.hit_tokens for r in results) > 0


@pytest.mark.parametrize("preemption", ["recompute", "offload"])
def test_small_pool_evicts_and_preempts_without_changing_outputs(preemption, reference):
    sched = dict(chunk_tokens=32, max_batched_tokens=64, new_token_ratio=0.0, preemption=preemption)
    engine = Engine(engine_config(num_pages=SMALL, scheduler=sched))
    results = run_checked(engine)
    assert_equivalent(results, reference)
    stats = engine.scheduler.stats
    assert stats.preemptions > 0 and stats.evicted_tokens > 0
    if preemption == "offload":
        assert stats.offloaded_pages == stats.restored_pages > 0
        assert engine.totals.offloaded_bytes_main == stats.offloaded_pages * engine.layout.main_page_bytes
        assert engine.totals.offloaded_bytes_indexer == stats.offloaded_pages * engine.layout.indexer_page_bytes


def oracle_drafter(reference, accept_prob: float, seed: int, rejected: list):
    """Drafts from the reference continuation, each replaced by a random token with ``1 - accept_prob``.

    Every proposal that greedy verification must reject is appended to ``rejected`` as the token sequence
    up to and including its first wrong draft.
    """
    truth = {}
    history = [list(WORKLOAD.system[s]) for s, _ in WORKLOAD.conversations]
    it = iter(reference)
    for turn in range(2):
        for c, (_, turns) in enumerate(WORKLOAD.conversations):
            prompt = history[c] + list(turns[turn])
            out = next(it).output_tokens
            truth[tuple(prompt)] = out
            history[c] = prompt + out
    rng = random.Random(seed)

    def drafter(request, k):
        prompt, done = tuple(request.prompt), len(request.outputs)
        cont = truth[prompt][done:] + [0] * k
        drafts = [t if rng.random() < accept_prob else rng.randrange(512) for t in cont[:k]]
        wrong = next((i for i, (d, t) in enumerate(zip(drafts, cont)) if d != t), None)
        if wrong is not None:
            rejected.append(list(prompt) + truth[prompt][:done] + drafts[: wrong + 1])
        return drafts

    return drafter


@pytest.mark.parametrize("pool", ["large", "small_recompute", "small_offload"])
def test_speculative_decoding_with_random_accept_reject_matches(pool, reference):
    sched = dict(chunk_tokens=32, max_batched_tokens=64, num_speculative_tokens=3, new_token_ratio=0.0)
    if pool != "large":
        sched["preemption"] = pool.removeprefix("small_")
    cfg = engine_config(num_pages=64 if pool == "large" else SMALL, scheduler=sched)
    rejected = []
    engine = Engine(cfg, drafter=oracle_drafter(reference, 0.6, seed=1, rejected=rejected))
    # Drafts add little memory pressure to this short workload: preempt by hand too (mid-speculation).
    results = run_checked(engine, preempt_every=0 if pool == "large" else 4)
    assert_equivalent(results, reference)
    drafted = sum(r.stats.draft_tokens for r in results)
    accepted = sum(r.stats.accepted_draft_tokens for r in results)
    assert 0 < accepted < drafted  # both accepts and rollbacks happened
    assert (engine.scheduler.stats.preemptions > 0) == (pool != "large")
    # No rejected draft ever reached the prefix cache: the cached prefix of each rejected sequence stops
    # before its wrong token (the tree holds whole pages of verified tokens only).
    assert rejected
    for seq in rejected:
        assert engine.radix.match(seq + [0] * PAGE).matched_tokens < len(seq)


def test_logits_budget_row_chunking_matches(reference, monkeypatch):
    # Force the budget check on these small logits and give it two query rows per chunk.
    monkeypatch.setattr(dsakv.planner.workspaces, "LOGITS_CHECK_MIN_ELEMENTS", 0)
    budget = 2 * 256 * 4  # two rows of up to 256 fp32 columns
    chunk_rows = []
    original = dsakv.model.indexer.logits_plan

    def recording_plan(rows, cols, budget_bytes):
        plan = original(rows, cols, budget_bytes)
        chunk_rows.append(plan.chunk_rows)
        return plan

    monkeypatch.setattr(dsakv.model.indexer, "logits_plan", recording_plan)
    results = run_checked(Engine(engine_config(num_pages=64, logits_budget_bytes=budget)))
    assert_equivalent(results, reference)
    assert chunk_rows and min(chunk_rows) <= 2


def test_padding_rows_keep_a_float32_model_bit_exact_across_chunk_sizes():
    # In float32 the CPU GEMM's row-count-dependent rounding does reach the stored bytes; the engine's
    # padding to min_rows (batch_invariant) is what keeps chunked + cached runs identical to one-shot ones.
    model = TinyDsaModel(ModelSpec.preset("tiny"), dtype=torch.float32)
    work = chat_workload(conversations=2, turns=2, system_prompts=1, system_tokens=40, max_new_tokens=4, seed=5)
    whole = dict(max_batched_tokens=4096, chunk_tokens=4096, new_token_ratio=1.0)
    ref = run_workload(Engine(engine_config(num_pages=64, prefix_cache=False, scheduler=whole), model=model), work)
    small = dict(chunk_tokens=16, max_batched_tokens=48)
    results = run_workload(Engine(engine_config(num_pages=64, scheduler=small), model=model), work)
    assert compare(results, ref) == (True, True)
    assert sum(r.stats.hit_tokens for r in results) > 0
