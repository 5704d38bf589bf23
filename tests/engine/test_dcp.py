"""DCP for real: a DCP group's pools (main KV of token t on rank t % dcp, indexer K replicated) give the
greedy tokens of one rank, and every rank holds exactly the DCP-1 run's bytes of its tokens -- with prefix
hits, eviction and preemption during the run, in both layouts (the packed one as two KV-cache groups)."""

from __future__ import annotations

import pytest
import torch

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.engine.pool import TwinPool
from dsakv.engine.pool_dcp import DcpPool, group_layout
from dsakv.model.inputs import request_slots
from dsakv.scheduler import SchedulerConfig
from dsakv.scheduler.pages import pages_for
from dsakv.workloads.chat import chat_workload, compare, run_workload

PAGE = 16
WORKLOAD = chat_workload(conversations=3, turns=2, system_prompts=2, system_tokens=72, max_new_tokens=6, seed=3)
LONGEST = 72 + 2 * 24 + 2 * 6

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def raw_rows(pool, pages, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per rank: (main bytes [layers, tokens of the rank, row], indexer bytes [full layers, n, key + scale])."""
    lay, dcp = pool.layout, pool.dcp
    shards = 1 if dcp == 1 or pool.replicated else dcp  # a dcp_replicated pool holds every row on every rank
    slots = request_slots(pages, n, lay.page_size)
    out = []
    for rank in range(dcp):
        mine = slots[torch.arange(n) % shards == rank % shards]
        page, off = mine // lay.page_size, mine % lay.page_size
        if dcp == 1:
            main = torch.stack([pool.main_view(la)[page, off] for la in range(lay.num_attention_layers)])
            index = [pool.read_indexer(la, slots) for la in lay.indexer_layers]
        else:
            views = [pool.rank_main_view(rank, la) for la in range(lay.num_attention_layers)]
            main = torch.stack([v[page, off // shards] for v in views])
            index = [pool.read_indexer(la, slots, rank=rank) for la in lay.indexer_layers]
        keys = torch.stack([torch.cat([k.view(torch.uint8), s.view(torch.uint8).view(-1, 4)], 1) for k, s in index])
        out.append((main, keys))
    return out


def capture_ranks(engine: Engine) -> dict:
    """Every finished request's rows on every rank, keyed by its prompt (before the finish frees its pages)."""
    rows, original = {}, engine._on_finish

    def on_finish(req):
        original(req)
        rows[tuple(req.prompt)] = raw_rows(engine.pool, req.pages, min(req.num_computed, req.num_tokens - 1))

    engine.scheduler.on_finish = on_finish
    return rows


def preempt_every(engine: Engine, steps: int) -> None:
    """Preempt the newest running request every ``steps`` steps (mid-prefill and mid-decode)."""
    original = engine.step

    def step():
        finished = original()
        sched = engine.scheduler
        if sched.stats.steps % steps == 0 and sched.running:
            sched.preempt(sched.running[-1].id)
        return finished

    engine.step = step


def config(**kw) -> EngineConfig:
    return EngineConfig(page_size=PAGE, capture_cache=True, scheduler=SchedulerConfig(**kw.pop("scheduler")), **kw)


@pytest.fixture(scope="module")
def reference():
    big = dict(max_batched_tokens=4096, chunk_tokens=4096, new_token_ratio=1.0)
    engine = Engine(
        config(num_pages=pages_for(LONGEST, PAGE) * WORKLOAD.num_requests, prefix_cache=False, scheduler=big)
    )
    rows = capture_ranks(engine)
    return run_workload(engine, WORKLOAD), rows


@pytest.mark.parametrize(
    "dcp, kind, preemption",
    [(2, "slot", "offload"), (2, "packed", "recompute"), (4, "packed", "offload")],
)
def test_dcp_greedy_tokens_and_every_ranks_bytes_equal_one_rank(dcp, kind, preemption, reference):
    ref_results, ref_rows = reference
    group_page = PAGE * dcp
    small = pages_for(LONGEST, group_page) + (dcp == 2)  # one request fits, several do not: eviction
    sched = dict(chunk_tokens=group_page, max_batched_tokens=2 * group_page, new_token_ratio=0.0, preemption=preemption)
    engine = Engine(config(num_pages=small, dcp=dcp, pool_kind=kind, scheduler=sched))
    assert isinstance(engine.pool, DcpPool) and engine.layout.page_size == group_page
    rows = capture_ranks(engine)
    preempt_every(engine, 5)
    results = run_workload(engine, WORKLOAD)
    engine.check_integrity()  # incl. every rank's replicas of the indexer K identical
    assert compare(results, ref_results) == (True, True)  # tokens, and the group's cache read back bit-exact
    stats = engine.scheduler.stats
    assert sum(r.stats.hit_tokens for r in results) > 0 and stats.evicted_tokens > 0 and stats.preemptions > 0
    assert rows.keys() == ref_rows.keys()
    for prompt, ranks in rows.items():
        ((ref_main, ref_index),) = ref_rows[prompt]
        n = ref_index.shape[1]
        for rank, (main, index) in enumerate(ranks):
            assert torch.equal(main, ref_main[:, torch.arange(n)[torch.arange(n) % dcp == rank]])
            assert torch.equal(index, ref_index)  # the indexer K of every token on every rank


@pytest.mark.parametrize("kind", ["slot", "packed"])
def test_dcp_replicated_pool_gives_one_ranks_tokens_with_every_row_on_every_rank(kind, reference):
    ref_results, ref_rows = reference
    group_page = PAGE * 2
    sched = dict(chunk_tokens=group_page, max_batched_tokens=2 * group_page, new_token_ratio=0.0)
    engine = Engine(config(num_pages=pages_for(LONGEST, group_page) + 1, dcp=2, dcp_replicated=True, pool_kind=kind,
                           scheduler=sched))  # fmt: skip
    assert engine.pool.replicated and all(
        engine.pool.main_shards(la) == 1 for la in range(engine.layout.num_attention_layers)
    )
    rows = capture_ranks(engine)
    results = run_workload(engine, WORKLOAD)
    engine.check_integrity()  # incl. every rank's replica identical, and the planner's bytes a rank
    assert compare(results, ref_results) == (True, True)
    assert sum(r.stats.hit_tokens for r in results) > 0 and engine.scheduler.stats.evicted_tokens > 0
    for prompt, ranks in rows.items():
        ((ref_main, ref_index),) = ref_rows[prompt]
        assert all(torch.equal(main, ref_main) and torch.equal(index, ref_index) for main, index in ranks)


def test_packed_groups_hit_the_same_tokens_as_the_slot_layout():
    hits = {}
    work = chat_workload(conversations=2, turns=2, system_prompts=1, system_tokens=72, max_new_tokens=3, seed=4)
    for kind in ("slot", "packed"):
        engine = Engine(config(num_pages=6, dcp=2, pool_kind=kind, scheduler=dict(chunk_tokens=32)))
        results = run_workload(engine, work)
        hits[kind] = [r.stats.hit_tokens for r in results]
    assert hits["slot"] == hits["packed"] and sum(hits["slot"]) > 0
    pool = engine.pool
    main, indexer = pool.groups
    assert (main.block_tokens, main.dcp_sharded, indexer.block_tokens, indexer.dcp_sharded) == (32, True, 16, False)
    assert pool.block_tables([5, 7]) == ([5, 7], [10, 11, 14, 15])
    assert pool.hit_tokens([5, 7]) == min(2 * 32, 4 * 16) == 64


@pytest.mark.parametrize("kind", ["slot", "packed"])
def test_dcp_page_copy_is_the_one_rank_block_of_the_same_tokens(kind):
    # Offloaded from a DCP-2 pool (page 16 x 2), restored into a one-rank pool of 32-token pages: same bytes.
    from dsakv.spec.layout import CacheLayout
    from dsakv.spec.model_spec import ModelSpec

    lay = CacheLayout(ModelSpec.preset("tiny"), page_size=16, allow_any_page_size=True)
    dcp_pool = DcpPool.for_pages(lay, 4, 2, kind=kind)
    one = TwinPool.for_pages(dcp_pool.layout, 4, kind="packed" if kind == "slot" else "slot")
    g = torch.Generator().manual_seed(0)
    (p_dcp,), (p_one,) = dcp_pool.allocator.alloc(1), one.allocator.alloc(1)
    spec = lay.spec
    for pool, page in ((dcp_pool, p_dcp), (one, p_one)):
        g.manual_seed(1)
        slots = torch.arange(32) + page * 32
        for layer in range(lay.num_attention_layers):
            latent, rope = (
                torch.randn(32, spec.kv_lora_rank, generator=g),
                torch.randn(32, spec.qk_rope_head_dim, generator=g),
            )
            pool.store_main(layer, slots, latent, rope)
        for layer in lay.indexer_layers:
            pool.store_indexer(layer, slots, torch.randn(32, spec.index_head_dim, generator=g))
    assert torch.equal(dcp_pool.offload_pages([p_dcp]).blocks, one.offload_pages([p_one]).blocks)
    (q,) = dcp_pool.allocator.alloc(1)
    dcp_pool.restore_pages(one.offload_pages([p_one]), [q])
    dcp_pool.move_slots(torch.arange(32) + q * 32, torch.arange(32) + p_dcp * 32)  # a lockstep move back onto p
    dcp_pool.check_integrity()
    assert torch.equal(dcp_pool.offload_pages([q]).blocks, one.offload_pages([p_one]).blocks)
    assert torch.equal(dcp_pool.offload_pages([p_dcp]).blocks, one.offload_pages([p_one]).blocks)


def test_dcp_prefix_evicted_to_the_host_tier_loads_back_on_every_rank_bit_exact():
    import random

    def prompt(seed: int, tokens: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randrange(512) for _ in range(tokens)]

    group_page = 2 * PAGE
    first_prompt = prompt(1, 4 * group_page + 16)  # 4 whole group pages can hit
    fillers = [prompt(10 + i, 5 * group_page + 16) for i in range(3)]  # each evicts the others from 10 pages
    roomy = dict(max_batched_tokens=4096, chunk_tokens=4096, new_token_ratio=1.0)
    ref_engine = Engine(config(num_pages=64, prefix_cache=False, scheduler=roomy))
    ref = {tuple(p): ref_engine.generate([p], 4)[0] for p in [first_prompt, *fillers]}
    host_bytes = 64 * group_layout(ref_engine.layout, 2).page_bytes  # 64 group pages of both caches
    sched = dict(chunk_tokens=group_page, max_batched_tokens=4 * group_page)
    engine = Engine(config(num_pages=10, dcp=2, host_bytes=host_bytes, scheduler=sched))
    runs = [engine.generate([p], 4)[0] for p in [first_prompt, *fillers, first_prompt]]
    engine.check_integrity()
    assert runs[-1].stats.hit_tokens_host == 4 * group_page == runs[-1].stats.hit_tokens
    for run, p in zip(runs, [first_prompt, *fillers, first_prompt]):
        assert run.output_tokens == ref[tuple(p)].output_tokens and run.cache.equals(ref[tuple(p)].cache)
