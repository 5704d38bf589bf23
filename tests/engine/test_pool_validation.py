"""TwinPool validation: every bad call raises ``DsakvError`` before writing, and the pool stays unchanged
(slots, pages, shapes, dtypes, layers, host copies, budgets, allocator page size, kind, fp8 scale)."""

from __future__ import annotations

import pytest
import torch

from dsakv.cache.allocator import PageAllocator
from dsakv.engine.offload import HostPages
from dsakv.engine.pool import TwinPool
from dsakv.errors import DsakvError
from dsakv.kernels.common import FP8
from dsakv.planner.budget import pool_capacity
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec

TINY = ModelSpec.preset("tiny")
KINDS = ("slot", "packed")


def make_pool(kind="slot", pages=4) -> tuple[TwinPool, list[int]]:
    layout = CacheLayout(TINY)
    pool = TwinPool(layout, PageAllocator(pages, layout.page_size, first_page=1), kind)
    return pool, pool.allocator.alloc(pages - 1)  # leave one page free


def rand(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def snapshot(pool: TwinPool) -> list[torch.Tensor]:
    n = pool.layout.num_attention_layers
    return [pool.main_view(i).clone() for i in range(n)] + [pool.indexer_view(i).clone() for i in range(n)]


def fill(pool: TwinPool, slots: torch.Tensor) -> None:
    spec, n = pool.layout.spec, len(slots)
    for layer in range(pool.layout.num_attention_layers):
        pool.store_main(layer, slots, rand(n, spec.kv_lora_rank, layer), rand(n, spec.qk_rope_head_dim, 99 + layer))
        if pool.layout.layer_has_indexer(layer):
            pool.store_indexer(layer, slots, rand(n, spec.index_head_dim, 50 + layer))


# ----- bad input ---------------------------------------------------------------------------------
BAD_CALLS = {
    "slot out of range": lambda p, pg: p.store_main(0, [5 * 64], rand(1, 512, 0), rand(1, 64, 0)),
    "negative slot": lambda p, pg: p.store_main(0, [-1], rand(1, 512, 0), rand(1, 64, 0)),
    "unallocated page": lambda p, pg: p.store_main(0, [pg[0] * 64, 4 * 64 + 1], rand(2, 512, 0), rand(2, 64, 0)),
    "duplicate slot": lambda p, pg: p.store_indexer(0, [pg[0] * 64] * 2, rand(2, 128, 0)),
    "latent shape": lambda p, pg: p.store_main(0, [pg[0] * 64], rand(1, 256, 0), rand(1, 64, 0)),
    "rope rows": lambda p, pg: p.store_main(0, [pg[0] * 64], rand(1, 512, 0), rand(2, 64, 0)),
    "integer latent": lambda p, pg: p.store_main(0, [pg[0] * 64], torch.ones(1, 512, dtype=torch.long), rand(1, 64, 0)),
    "fp8 key": lambda p, pg: p.store_indexer(0, [pg[0] * 64], rand(1, 128, 0).to(FP8)),
    "shared layer": lambda p, pg: p.store_indexer(1, [pg[0] * 64], rand(1, 128, 0)),
    "layer range": lambda p, pg: p.store_main(4, [pg[0] * 64], rand(1, 512, 0), rand(1, 64, 0)),
    "float slots": lambda p, pg: p.store_main(0, torch.tensor([64.0]), rand(1, 512, 0), rand(1, 64, 0)),
    "2-D slots": lambda p, pg: p.store_indexer(0, torch.tensor([[64]]), rand(1, 128, 0)),
    "move length": lambda p, pg: p.move_slots([pg[0] * 64, pg[0] * 64 + 1], [pg[1] * 64]),
    "move to free page": lambda p, pg: p.move_slots([pg[0] * 64], [4 * 64]),
    "move duplicate dst": lambda p, pg: p.move_slots([pg[0] * 64, pg[0] * 64 + 1], [pg[1] * 64] * 2),
    "restore count": lambda p, pg: p.restore_pages(p.offload_pages(pg[:2]), [pg[2]]),
    "restore duplicate": lambda p, pg: p.restore_pages(p.offload_pages(pg[:2]), [pg[2], pg[2]]),
    "restore into scratch": lambda p, pg: p.restore_pages(p.offload_pages(pg[:1]), [0]),
    "offload free page": lambda p, pg: p.offload_pages([4]),
    "restore short host": lambda p, pg: p.restore_pages(tampered(p.offload_pages(pg[:1]), 100), [pg[2]]),
    "restore float host": lambda p, pg: p.restore_pages(
        HostPages(p.layout, (pg[0],), torch.ones(1, p.layout.page_bytes)), [pg[2]]
    ),
}


def tampered(host: HostPages, cut: int) -> HostPages:
    """A host copy whose blocks lost ``cut`` bytes per page after it was built (bypasses its own check)."""
    object.__setattr__(host, "blocks", host.blocks[:, :-cut].contiguous())
    return host


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_raises_and_leaves_the_pool_unchanged(kind, case):
    pool, pages = make_pool(kind)
    fill(pool, torch.tensor([p * 64 + o for p in pages for o in (0, 1, 2, 40)]))
    before = snapshot(pool)
    with pytest.raises(DsakvError):
        BAD_CALLS[case](pool, pages)
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(pool)))
    pool.check_integrity()


def test_pool_rejects_an_allocator_page_size_the_layout_cannot_serve():
    with pytest.raises(DsakvError, match="page_size"):
        TwinPool(CacheLayout(TINY), PageAllocator(4, page_size=32))


def test_pool_rejects_unknown_kind_and_bad_fp8_scale():
    lay = CacheLayout(TINY, kv_dtype="fp8")
    with pytest.raises(DsakvError, match="slot, packed"):
        TwinPool(lay, PageAllocator(2), kind="paged")
    with pytest.raises(DsakvError, match="fp8_scale"):
        TwinPool(lay, PageAllocator(2), fp8_scale=[1.0, 2.0])


BAD_SIZES = {
    "zero pages": lambda lay: dict(num_pages=0),
    "negative pages": lambda lay: dict(num_pages=-5),
    "float pages": lambda lay: dict(num_pages=10.0),
    "bool pages": lambda lay: dict(num_pages=True),
    "scratch only": lambda lay: dict(num_pages=pool_capacity(lay, available_bytes=2 * lay.page_bytes - 1).num_pages),
    "zero padding": lambda lay: dict(num_pages=4, padding_slots=0),
    "float padding": lambda lay: dict(num_pages=4, padding_slots=16.0),
}


@pytest.mark.parametrize("case", sorted(BAD_SIZES))
def test_budget_without_room_beyond_the_scratch_page_is_rejected(case):
    lay = CacheLayout(TINY)
    with pytest.raises(DsakvError, match="num_pages|padding_slots"):
        TwinPool.for_pages(lay, **BAD_SIZES[case](lay))


@pytest.mark.parametrize(
    "buffer, rows, message",
    [
        (torch.zeros((2, 10), dtype=torch.uint8), [0], r"host buffer: must be a host uint8 tensor"),
        ("page bytes", [0], r"host buffer: must be a host uint8 tensor"),
        (None, [2], r"rows: \[2\] must be 1 row indices in 0..1"),
        (None, [0, 1], r"rows: \[0, 1\] must be 1 row indices"),
        (None, [-1], r"rows: \[-1\] must be 1 row indices"),
    ],
)
def test_host_buffer_copies_reject_bad_buffers_and_rows_and_change_nothing(buffer, rows, message):
    pool = TwinPool(CacheLayout(ModelSpec.preset("tiny")), PageAllocator(3, first_page=1))
    page = pool.allocator.alloc(1)
    if buffer is None:
        buffer = torch.zeros((2, pool.layout.page_bytes), dtype=torch.uint8)
    before = pool.offload_pages(page).blocks.clone()
    with pytest.raises(DsakvError, match=message):
        pool.copy_pages_from_host(buffer, rows, page)
    with pytest.raises(DsakvError, match=message):
        pool.copy_pages_to_host(page, buffer, rows)
    assert torch.equal(pool.offload_pages(page).blocks, before)
