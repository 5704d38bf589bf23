"""Evicting through the radix cache frees both caches of a page at once: the pool's main KV and indexer K
of an evicted page refuse writes together, and a page handed out again serves both."""

from __future__ import annotations

import pytest
import torch

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.engine.pool import TwinPool
from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


def test_evicted_page_is_freed_in_the_main_and_the_indexer_cache_together() -> None:
    spec = ModelSpec.preset("tiny")
    layout = CacheLayout(spec)
    ps = layout.page_size
    alloc = PageAllocator(4, ps, first_page=1)
    pool = TwinPool(layout, alloc)
    cache = RadixCache(alloc)
    (page,) = alloc.alloc(1)
    slots = torch.arange(page * ps, page * ps + 2)
    full = layout.indexer_layers[0]
    gen = torch.Generator().manual_seed(0)
    latent = torch.randn(2, spec.kv_lora_rank, generator=gen)
    rope = torch.randn(2, spec.qk_rope_head_dim, generator=gen)
    key = torch.randn(2, spec.index_head_dim, generator=gen)
    pool.store_main(full, slots, latent, rope)
    pool.store_indexer(full, slots, key)
    cache.insert(list(range(1, ps + 1)), [page])
    assert cache.evict(1).freed_pages == [page]
    with pytest.raises(DsakvError):
        pool.store_main(full, slots, latent, rope)
    with pytest.raises(DsakvError):
        pool.store_indexer(full, slots, key)
    assert alloc.alloc(1) == [page]  # reused whole: both caches writable again
    pool.store_main(full, slots, latent, rope)
    pool.store_indexer(full, slots, key)
    alloc.check_integrity()
    cache.check_integrity()
    assert alloc.num_free + cache.total_tokens // alloc.page_size + 1 == alloc.num_pages
