"""The store tier under DCP, against a real redis-server: a DCP 2 engine writes its pages to the store (one
value a group page, every rank's share), evicts them from the device pool, and loads them back onto every rank
bit-exact; greedy tokens and both caches equal the DCP-1 run."""

from __future__ import annotations

import random

import pytest
import torch

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.model.inputs import request_slots
from dsakv.scheduler import SchedulerConfig

PAGE, DCP, MAX_NEW = 16, 2, 4
GROUP_PAGE = PAGE * DCP
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def prompt(seed: int, tokens: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(tokens)]


PROMPT = prompt(1, 4 * GROUP_PAGE + 16)  # 4 whole group pages can hit (the last token is always computed)
FILLERS = [prompt(10 + i, 5 * GROUP_PAGE + 16) for i in range(2)]  # each evicts the others from 10 pages


def rank_rows(pool, pages, n: int) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """Per rank: its raw main bytes [layers, its tokens, row] and every full layer's (key, scale) of all n
    tokens, from that rank's own tensors (one rank at DCP 1)."""
    lay, d = pool.layout, pool.dcp
    slots = request_slots(pages, n, lay.page_size)
    out = []
    for rank in range(d):
        mine = slots[torch.arange(n) % d == rank]
        page, off = mine // lay.page_size, mine % lay.page_size
        layers = range(lay.num_attention_layers)
        if d == 1:
            main = torch.stack([pool.main_view(la)[page, off] for la in layers])
            index = [t for la in lay.indexer_layers for t in pool.read_indexer(la, slots)]
        else:
            main = torch.stack([pool.rank_main_view(rank, la)[page, off // d] for la in layers])
            index = [t for la in lay.indexer_layers for t in pool.read_indexer(la, slots, rank=rank)]
        out.append((main, index))
    return out


def capture(engine: Engine) -> list:
    """Each finished request's rows on every rank, in finish order (before the finish frees its pages)."""
    rows, original = [], engine._on_finish

    def on_finish(req):
        original(req)
        rows.append(rank_rows(engine.pool, req.pages, min(req.num_computed, req.num_tokens - 1)))

    engine.scheduler.on_finish = on_finish
    return rows


def test_dcp_pages_written_to_the_store_load_back_on_every_rank_bit_exact(redis_server):
    roomy = SchedulerConfig(max_batched_tokens=4096, chunk_tokens=4096, new_token_ratio=1.0)
    ref_engine = Engine(EngineConfig(num_pages=64, page_size=PAGE, prefix_cache=False, capture_cache=True,
                                     scheduler=roomy))  # fmt: skip
    ref_rows = capture(ref_engine)
    ref = ref_engine.generate([PROMPT], MAX_NEW)[0]
    sched = SchedulerConfig(max_batched_tokens=4 * GROUP_PAGE, chunk_tokens=GROUP_PAGE)
    engine = Engine(EngineConfig(num_pages=10, page_size=PAGE, dcp=DCP, capture_cache=True, scheduler=sched,
                                 store_url=redis_server.url))  # fmt: skip
    rows = capture(engine)
    first = engine.generate([PROMPT], MAX_NEW)[0]
    assert redis_server.client().dbsize() >= 4  # one value per group page, written through
    for filler in FILLERS:
        engine.generate([filler], MAX_NEW)
    assert engine.scheduler.stats.evicted_tokens >= 4 * GROUP_PAGE  # PROMPT's pages left the device pool
    again = engine.generate([PROMPT], MAX_NEW)[0]
    engine.check_integrity()  # incl. every rank's replica of the indexer K identical
    assert first.stats.hit_tokens == 0
    assert again.stats.hit_tokens_store == 4 * GROUP_PAGE == again.stats.hit_tokens
    assert engine.tiers.totals.loaded_pages_store == 4 and not engine.tiers.store.store.counters.invalid
    for run in (first, again):
        assert run.output_tokens == ref.output_tokens and run.cache.equals(ref.cache)
    ((ref_main, ref_index),) = ref_rows[0]
    n = ref_index[0].shape[0]
    for rank, (main, index) in enumerate(rows[-1]):  # the run that loaded from the store, rank by rank
        assert torch.equal(main, ref_main[:, torch.arange(n) % DCP == rank])
        assert all(torch.equal(a, b) for a, b in zip(index, ref_index, strict=True))
