"""The MTP layer's caches in the twin pool: its own main-KV rows and its own full indexer, in both layouts,
under the target's page ids (freed, offloaded and restored with them: one unit)."""

from __future__ import annotations

import pytest
import torch

from dsakv.engine.pool import TwinPool
from dsakv.model.inputs import request_slots
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


def test_one_mtp_layer_adds_one_main_row_and_one_indexer_entry_per_token():
    spec = ModelSpec.preset("glm-5.3")
    base, mtp = CacheLayout(spec), CacheLayout(spec, mtp_layers=1)
    assert mtp.cell_bytes - base.cell_bytes == base.main_row_bytes + base.indexer_row_bytes  # 656 + 132 = 788
    assert mtp.page_bytes - base.page_bytes == base.page_size * (base.main_row_bytes + base.indexer_row_bytes)
    assert mtp.indexer_layers[-1] == spec.num_hidden_layers and mtp.layer_has_indexer(spec.num_hidden_layers)


@pytest.mark.parametrize("kind", ["slot", "packed"])
def test_mtp_layer_rows_travel_with_the_target_pages_through_offload_and_restore(kind):
    spec = ModelSpec.preset("tiny")
    lay = CacheLayout(spec, page_size=16, allow_any_page_size=True, mtp_layers=1)
    pool = TwinPool.for_pages(lay, 8, padding_slots=16, kind=kind)
    pages = pool.allocator.alloc(3)
    slots = request_slots(pages, 40, 16)
    g = torch.Generator().manual_seed(0)
    mtp = spec.num_hidden_layers
    for layer in range(lay.num_attention_layers):
        pool.store_main(layer, slots, torch.randn(40, spec.kv_lora_rank, generator=g), torch.randn(40, 64, generator=g))
    for layer in lay.indexer_layers:
        pool.store_indexer(layer, slots, torch.randn(40, spec.index_head_dim, generator=g))
    before = [pool.read_main(mtp, slots), pool.read_indexer(mtp, slots), pool.read_main(0, slots)]
    host = pool.offload_pages(pages)
    pool.allocator.free(pages)
    others = pool.allocator.alloc(3)
    pool.store_main(mtp, request_slots(others, 40, 16), torch.zeros(40, spec.kv_lora_rank), torch.zeros(40, 64))
    pool.restore_pages(host, others)
    moved = request_slots(others, 40, 16)
    after = [pool.read_main(mtp, moved), pool.read_indexer(mtp, moved), pool.read_main(0, moved)]
    for a, b in zip(before, after):
        assert all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))
    assert host.nbytes == 3 * lay.page_bytes  # every layer's rows, the MTP layer's included
