"""Lockstep operations: moves and host offload/restore carry main rows, indexer keys and indexer scales
together, bit-exact, and leave every other byte (including neighbours of moved tokens) untouched."""

from __future__ import annotations

import inspect

import pytest
import torch

from dsakv.cache.allocator import PageAllocator
from dsakv.engine.pool import TwinPool
from dsakv.errors import DsakvError
from dsakv.planner.budget import pool_capacity
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec

TINY = ModelSpec.preset("tiny")
KINDS = ("slot", "packed")


def full_pool(kind: str, pages: int = 6, **layout_kw) -> tuple[TwinPool, list[int]]:
    """A pool whose allocated pages hold random data in every token of every layer of both caches."""
    layout = CacheLayout(TINY, **layout_kw)
    pool = TwinPool(layout, PageAllocator(pages, layout.page_size, first_page=1), kind)
    held = pool.allocator.alloc(pages - 2)
    ps, g = layout.page_size, torch.Generator().manual_seed(5)
    slots = torch.tensor([p * ps + o for p in held for o in range(ps)])
    for layer in range(layout.num_attention_layers):
        pool.store_main(
            layer, slots, torch.randn(len(slots), 512, generator=g), torch.randn(len(slots), 64, generator=g)
        )
        if layout.layer_has_indexer(layer):
            pool.store_indexer(layer, slots, torch.randn(len(slots), 128, generator=g) * (layer + 1))
    return pool, held


def snapshot(pool: TwinPool) -> list[torch.Tensor]:
    n = pool.layout.num_attention_layers
    return [pool.main_view(i).clone() for i in range(n)] + [pool.indexer_view(i).clone() for i in range(n)]


def expected_after_move(pool: TwinPool, before: list[torch.Tensor], src: list[int], dst: list[int]):
    """Byte-level model of a lockstep move, written from the layout's offsets (not the pool's code)."""
    lay, n = pool.layout, pool.layout.num_attention_layers
    ps, kp, kb = lay.page_size, lay.index_kpool, lay.indexer_key_bytes
    out = [t.clone() for t in before]
    for s, d in zip(src, dst):
        for layer in range(n):
            out[layer][d // ps, d % ps] = before[layer][s // ps, s % ps]
        for layer in lay.indexer_layers:
            ix_out, ix_in = out[n + layer], before[n + layer]
            ss, ds = (s % ps) // kp, (d % ps) // kp
            k_src, k_dst = lay.indexer_key_offset(ss), lay.indexer_key_offset(ds)
            ix_out[d // ps, k_dst : k_dst + kb] = ix_in[s // ps, k_src : k_src + kb]
            sc_src, sc_dst = lay.indexer_scale_offset_of(ss), lay.indexer_scale_offset_of(ds)
            ix_out[d // ps, sc_dst : sc_dst + 4] = ix_in[s // ps, sc_src : sc_src + 4]
    return out


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"buffer {i} differs in {int((x != y).sum())} bytes"


@pytest.mark.parametrize("kind", KINDS)
def test_move_carries_row_key_and_scale_and_leaves_neighbours_untouched(kind):
    pool, (a, b, c, _) = full_pool(kind)
    src = [a * 64 + 3, a * 64 + 4, c * 64 + 63, b * 64 + 10]
    dst = [b * 64 + 0, b * 64 + 1, a * 64 + 9, c * 64 + 62]
    before = snapshot(pool)
    pool.move_slots(src, dst)
    assert_same(snapshot(pool), expected_after_move(pool, before, src, dst))
    pool.check_integrity()


@pytest.mark.parametrize("kind", KINDS)
def test_overlapping_move_shifts_like_a_simultaneous_copy(kind):
    pool, (a, *_) = full_pool(kind)
    src = [a * 64 + o for o in range(5, 20)]
    dst = [s - 1 for s in src]  # compaction: close a hole at offset 4
    before = snapshot(pool)
    pool.move_slots(src, dst)
    assert_same(snapshot(pool), expected_after_move(pool, before, src, dst))


def test_move_with_kpool_copies_whole_states_and_last_source_wins():
    pool, (a, b, *_) = full_pool("slot", index_kpool=4, page_size=16, allow_any_page_size=True)
    src, dst = [a * 16 + 1, a * 16 + 6], [b * 16 + 12, b * 16 + 13]  # both land in state 3 of page b
    before = snapshot(pool)
    pool.move_slots(src, dst)
    assert_same(snapshot(pool), expected_after_move(pool, before, src, dst))


@pytest.mark.parametrize(
    "src_kind,dst_kind", [("slot", "slot"), ("packed", "packed"), ("slot", "packed"), ("packed", "slot")]
)
def test_offload_restore_into_other_pages_is_bit_exact_for_both_caches(src_kind, dst_kind):
    pool, held = full_pool(src_kind)
    target, _ = full_pool(dst_kind) if dst_kind != src_kind else (pool, None)
    n = pool.layout.num_attention_layers
    old = [held[2], held[0]]
    before_src = snapshot(pool)
    host = pool.offload_pages(old)
    assert host.source_pages == tuple(old) and host.nbytes == 2 * pool.layout.page_bytes
    assert host.blocks.device.type == "cpu"
    assert_same(before_src, snapshot(pool))  # offload does not modify the pool
    new = target.allocator.alloc(2)  # the old pages stay held: the restore lands in other, never-written pages
    assert not set(new) & set(old)
    before = snapshot(target)
    target.restore_pages(host, new)
    after = snapshot(target)
    expect = [t.clone() for t in before]
    for layer in range(n):
        expect[layer][new] = before_src[layer][old]
    for layer in target.layout.indexer_layers:
        expect[n + layer][new] = before_src[n + layer][old]
    assert_same(after, expect)
    target.check_integrity()


def test_restore_rejects_pages_from_another_layout():
    pool, held = full_pool("slot")
    other = TwinPool(CacheLayout(TINY, kv_dtype="bf16"), PageAllocator(3, first_page=1))
    with pytest.raises(DsakvError, match="layout"):
        other.restore_pages(pool.offload_pages(held[:1]), other.allocator.alloc(1))


def test_restore_rejects_pages_stored_under_another_fp8_scale():
    lay = CacheLayout(TINY, kv_dtype="fp8")
    pool = TwinPool(lay, PageAllocator(3, first_page=1), fp8_scale=2.0)
    other = TwinPool(lay, PageAllocator(3, first_page=1), fp8_scale=1.0)
    with pytest.raises(DsakvError, match="fp8_scale"):
        other.restore_pages(pool.offload_pages(pool.allocator.alloc(1)), other.allocator.alloc(1))


# ----- the contract of every public operation, on bytes ---------------------------------------------
# Every public TwinPool method is driven on random pages of pools full of random bytes, and may change:
#   READS    nothing at all;
#   STORES   one layer of one cache (main rows, or indexer entries) at the slots it is given, nothing else;
#   COPIES   the destination tokens only, each receiving its source token's main row in *every* layer and
#            indexer key and scale in *every* full layer: both caches together, never one alone.


def pick(values: list[int], k: int, g: torch.Generator) -> list[int]:
    return [values[i] for i in torch.randperm(len(values), generator=g)[:k].tolist()]


def slots_of(pool: TwinPool, pages: list[int]) -> list[int]:
    ps = pool.layout.page_size
    return [p * ps + o for p in pages for o in range(ps)]


def move(pool, held, target, target_held, g) -> list[tuple[int, int]]:
    """Random sources (repeats allowed) to random distinct destinations, across the held pages."""
    dst = pick(slots_of(pool, held), 40, g)
    src = [slots_of(pool, held)[i] for i in torch.randint(0, len(held) * 64, (40,), generator=g).tolist()]
    pool.move_slots(src, dst)
    return list(zip(dst, src))


def offload_restore(pool, held, target, target_held, g) -> list[tuple[int, int]]:
    """Two random held pages to host, then back into two random other pages of ``target`` (free or held)."""
    old = pick(held, 2, g)
    spare = target.allocator.alloc(target.allocator.num_free)
    new = pick(spare + [p for p in target_held if target is not pool or p not in old], 2, g)
    target.restore_pages(pool.offload_pages(old), new)
    ps = pool.layout.page_size
    return [(n * ps + o, s * ps + o) for n, s in zip(new, old) for o in range(ps)]


def host_buffer_round_trip(pool, held, target, target_held, g) -> list[tuple[int, int]]:
    """Two random held pages into rows of a host buffer (as the host tier keeps them), then from those rows
    into two random other pages of ``target`` (free or held)."""
    old = pick(held, 2, g)
    buffer = torch.zeros((4, pool.layout.page_bytes), dtype=torch.uint8)
    pool.copy_pages_to_host(old, buffer, [3, 1])
    spare = target.allocator.alloc(target.allocator.num_free)
    new = pick(spare + [p for p in target_held if target is not pool or p not in old], 2, g)
    target.copy_pages_from_host(buffer, [3, 1], new)
    ps = pool.layout.page_size
    return [(n * ps + o, s * ps + o) for n, s in zip(new, old) for o in range(ps)]


COPIES = {  # name -> (driver, restore into a pool of the other kind)
    "move_slots": (move, False),
    "restore_pages": (offload_restore, False),
    "restore_pages into the other kind": (offload_restore, True),
    "copy_pages_from_host": (host_buffer_round_trip, False),
    "copy_pages_from_host into the other kind": (host_buffer_round_trip, True),
}


def store_main(pool, held, g) -> tuple[str, int, list[int]]:
    slots, layer = pick(slots_of(pool, held), 30, g), int(torch.randint(0, 4, (1,), generator=g))
    pool.store_main(layer, slots, torch.randn(30, 512, generator=g) * 5, torch.randn(30, 64, generator=g) * 5)
    return "main", layer, slots


def store_indexer(pool, held, g) -> tuple[str, int, list[int]]:
    slots, layer = pick(slots_of(pool, held), 30, g), pick(list(pool.layout.indexer_layers), 1, g)[0]
    pool.store_indexer(layer, slots, torch.randn(30, 128, generator=g) * 9)
    return "indexer", layer, slots


STORES = {"store_main": store_main, "store_indexer": store_indexer}

READS = {
    "page_is_writable": lambda pool, held, g: pool.page_is_writable(held[0]),
    "main_view": lambda pool, held, g: pool.main_view(1),
    "indexer_view": lambda pool, held, g: pool.indexer_view(2),
    "read_main": lambda pool, held, g: pool.read_main(3, pick(slots_of(pool, held), 20, g)),
    "read_main_rank": lambda pool, held, g: pool.read_main_rank(3, 0, pick(slots_of(pool, held), 20, g)),
    "main_shards": lambda pool, held, g: pool.main_shards(1),
    "read_indexer": lambda pool, held, g: pool.read_indexer(0, pick(slots_of(pool, held), 20, g)),
    "read_indexer_dequant": lambda pool, held, g: pool.read_indexer_dequant(2, pick(slots_of(pool, held), 20, g)),
    "offload_pages": lambda pool, held, g: pool.offload_pages(pick(held, 2, g)),
    "copy_pages_to_host": lambda pool, held, g: pool.copy_pages_to_host(
        pick(held, 2, g), torch.zeros((3, pool.layout.page_bytes), dtype=torch.uint8), [2, 0]
    ),
    "check_integrity": lambda pool, held, g: pool.check_integrity(),
    "for_pages": lambda pool, held, g: TwinPool.for_pages(pool.layout, 2, kind=pool.kind),
}


def token_entries(snap: list[torch.Tensor], lay: CacheLayout, slot: int) -> torch.Tensor:
    """Every byte of one token in both caches: its main row in every layer, key and scale in every full layer."""
    n, ps, kb = lay.num_attention_layers, lay.page_size, lay.indexer_key_bytes
    page, state = slot // ps, (slot % ps) // lay.index_kpool
    parts = [snap[layer][page, slot % ps] for layer in range(n)]
    for layer in lay.indexer_layers:
        k, sc = lay.indexer_key_offset(state), lay.indexer_scale_offset_of(state)
        parts += [snap[n + layer][page, k : k + kb], snap[n + layer][page, sc : sc + 4]]
    return torch.cat(parts)


def changed_tokens(before: list[torch.Tensor], after: list[torch.Tensor], lay: CacheLayout):
    """{(cache, layer): slots whose bytes changed}. A main row is a token's whole row; an indexer page is keys
    then scales, so together the token sets account for every byte of the pool."""
    n, ps, kb, s = lay.num_attention_layers, lay.page_size, lay.indexer_key_bytes, lay.indexer_states_per_page
    out = {}
    for la in range(n):
        out["main", la] = set((before[la] != after[la]).any(-1).flatten().nonzero().flatten().tolist())
    for la in lay.indexer_layers:
        diff = before[n + la] != after[n + la]
        per_state = diff[:, : s * kb].reshape(-1, s, kb).any(-1) | diff[:, s * kb :].reshape(-1, s, 4).any(-1)
        out["indexer", la] = {page * ps + state for page, state in per_state.nonzero().tolist()}
    return out


def test_every_public_pool_method_is_driven_by_the_contract_test():
    public = {name for name, _ in inspect.getmembers(TwinPool, callable) if not name.startswith("_")}
    copies = {name.split()[0] for name in COPIES}
    assert public == set(READS) | set(STORES) | copies, "classify the new method in READS, STORES or COPIES"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", sorted(READS) + sorted(STORES) + sorted(COPIES))
def test_every_public_operation_moves_both_caches_together_or_neither(op, kind, seed):
    pool, held = full_pool(kind)
    lay, g = pool.layout, torch.Generator().manual_seed(seed)
    before = snapshot(pool)
    if op in READS:
        READS[op](pool, held, g)
        assert_same(snapshot(pool), before)
        return
    if op in STORES:
        cache, layer, slots = STORES[op](pool, held, g)
        changed = changed_tokens(before, snapshot(pool), lay)
        assert changed.pop((cache, layer)) == set(slots)  # random values: every given slot changes
        assert not any(changed.values())  # no other layer, no other cache
        return
    driver, other_kind = COPIES[op]
    target, target_held = full_pool("packed" if kind == "slot" else "slot") if other_kind else (pool, held)
    target_before = snapshot(target)
    pairs = driver(pool, held, target, target_held, g)
    if target is not pool:
        assert_same(snapshot(pool), before)  # the source pool is only read
    after = snapshot(target)
    for dst, src in pairs:  # each destination carries its source's bytes, in both caches, in every layer
        assert torch.equal(token_entries(after, lay, dst), token_entries(before, lay, src)), (dst, src)
    changed = changed_tokens(target_before, after, lay)
    destinations = {dst for dst, _ in pairs}
    assert set().union(*changed.values()) <= destinations  # nothing but destinations changes
    for dst in destinations:  # a token that changed changed in both caches and every layer at once
        assert {key for key, slots in changed.items() if dst in slots} in (set(), set(changed)), dst


def test_tiny_preset_end_to_end_prefill_decode_preempt_resume():
    """Prefill 150 tokens, decode 20, offload (preempt), free, restore into fresh pages, read back equal."""
    lay = CacheLayout(TINY)
    pool = TwinPool.for_pages(lay, pool_capacity(lay, available_bytes=8 * lay.page_bytes).num_pages, kind="packed")
    g = torch.Generator().manual_seed(21)
    pages = pool.allocator.alloc(lay.pages_for_tokens(150))

    def slots_of(positions: range, pages: list[int]) -> torch.Tensor:
        return torch.tensor([pages[i // 64] * 64 + i % 64 for i in positions])

    def write(positions: range) -> None:
        s = slots_of(positions, pages)
        for layer in range(lay.num_attention_layers):
            pool.store_main(layer, s, torch.randn(len(s), 512, generator=g), torch.randn(len(s), 64, generator=g))
            if lay.layer_has_indexer(layer):
                pool.store_indexer(layer, s, torch.randn(len(s), 128, generator=g))

    write(range(150))
    for pos in range(150, 170):
        if pos // 64 >= len(pages):
            pages += pool.allocator.alloc(1)
        write(range(pos, pos + 1))
    ctx = slots_of(range(170), pages)
    reads = [pool.read_main(layer, ctx) for layer in range(4)] + [pool.read_indexer(0, ctx), pool.read_indexer(2, ctx)]
    host = pool.offload_pages(pages)
    pool.allocator.free(pages)
    pool.allocator.alloc(1)  # someone else takes a page meanwhile
    pages = pool.allocator.alloc(len(pages))
    pool.restore_pages(host, pages)
    ctx = slots_of(range(170), pages)
    again = [pool.read_main(layer, ctx) for layer in range(4)] + [pool.read_indexer(0, ctx), pool.read_indexer(2, ctx)]
    for x, y in zip(reads, again):
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(x, y))
    pool.check_integrity()
