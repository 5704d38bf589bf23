"""index_kpool pages for real: main page 128 with kpool 2 (a 64-state physical indexer page, CUDA-legal) is
stored, read, moved, offloaded and copied to the host tier in both layouts and under DCP; the compute path
refuses kpool > 1 with one line saying why."""

from __future__ import annotations

import pytest
import torch

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.engine.host_tier import HostTierBuffer
from dsakv.engine.pool_dcp import pool_for_pages
from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec

LAYOUT = CacheLayout(ModelSpec.preset("tiny"), page_size=128, index_kpool=2)  # no "not for CUDA" option needed


def filled(kind: str, dcp: int):
    pool = pool_for_pages(LAYOUT, 4, dcp=dcp, kind=kind)
    pages = pool.allocator.alloc(2)
    V, spec = pool.layout.page_size, LAYOUT.spec
    slots = torch.cat([torch.arange(V) + p * V for p in pages])
    g = torch.Generator().manual_seed(dcp)
    for layer in range(LAYOUT.num_attention_layers):
        pool.store_main(
            layer,
            slots,
            torch.randn(len(slots), spec.kv_lora_rank, generator=g),
            torch.randn(len(slots), 64, generator=g),
        )
    keys = {la: torch.randn(len(slots), spec.index_head_dim, generator=g) for la in LAYOUT.indexer_layers}
    for layer, key in keys.items():
        pool.store_indexer(layer, slots, key)
    return pool, pages, slots, keys


@pytest.mark.parametrize("dcp", [1, 2])
@pytest.mark.parametrize("kind", ["slot", "packed"])
def test_kpool_2_on_a_128_token_page_stores_reads_moves_offloads_and_tiers(kind, dcp):
    assert (LAYOUT.indexer_physical_page, LAYOUT.indexer_kernel_block) == (64, 128)  # vLLM: kpool x 64
    pool, pages, slots, keys = filled(kind, dcp)
    layer = LAYOUT.indexer_layers[0]
    key, scale = pool.read_indexer(layer, slots)
    assert torch.equal(key[0::2].view(torch.uint8), key[1::2].view(torch.uint8))  # tokens 2i, 2i+1: one state
    dq = key.float() * scale.unsqueeze(1)
    assert torch.allclose(dq[1::2], keys[layer][1::2], rtol=0.07, atol=0.07)  # the state holds the last token's key
    before = pool.offload_pages(pages)
    assert before.blocks.shape[1] == pool.layout.page_bytes
    (spare,) = pool.allocator.alloc(1)
    pool.restore_pages(before, [spare, pages[1]])  # page 0 into a new page (page 1 onto itself), bit-exact
    assert torch.equal(pool.offload_pages([spare]).blocks, before.blocks[:1])
    V = pool.layout.page_size
    pool.move_slots(torch.arange(V) + spare * V, torch.arange(V) + pages[0] * V)  # lockstep move, state by state
    assert torch.equal(pool.offload_pages(pages).blocks, before.blocks)
    host = HostTierBuffer(pool, 3)
    host.write_from_device(pages, [2, 0])
    pool.restore_pages(
        type(before)(pool.layout, (spare,), torch.zeros_like(before.blocks[:1]), before.fp8_scales), [spare]
    )
    host.load_to_device([0], [spare])
    assert torch.equal(pool.offload_pages([spare]).blocks, before.blocks[1:])
    pool.check_integrity()


def test_the_compute_path_refuses_kpool_with_one_line_saying_why():
    with pytest.raises(DsakvError, match="no public code defines how N tokens' index states merge") as exc:
        Engine(EngineConfig(page_size=128, index_kpool=2, num_pages=8))
    assert "\n" not in str(exc.value)
