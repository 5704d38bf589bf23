"""The tiny DSA model reads back what the twin pool stored: paged path == dense reference.

Tolerance: the model computes in fp64 (the caches still store fp8/bf16 and read back fp32), so paged and
dense logits differ only by fp64 rounding (measured <= 1e-14); ``LOGIT_ATOL = 1e-9`` leaves room and still
catches any cache bug (a wrong row or scale moves logits by >= 1e-3). Top-k sets must be *equal*: both paths
apply the same selection rule (exact score ties keep the lowest positions) to fp8 queries and keys that
are bit-identical, and the reference scorer accumulates exactly.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsakv import CacheLayout, ModelSpec, PageAllocator
from dsakv.engine.pool import TwinPool
from dsakv.engine.pool_checks import SlotChecker
from dsakv.errors import DsakvError
from dsakv.model.inputs import CheckedSlots, PagedCache
from dsakv.model.tiny_dsa import DENSE_ARCH_FIELDS, MOE_ARCH_FIELDS, SeqInput, TinyDsaModel
from dsakv.spec.model_spec import ARCH_FIELDS

SPEC = ModelSpec.preset("tiny")
LOGIT_ATOL = 1e-9
PAGE = CacheLayout(SPEC).page_size
TOPK = SPEC.index_topk


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> TinyDsaModel:
    return TinyDsaModel(SPEC, seed=0)


class Seq:
    """A sequence's pages in a pool (deliberately out of order) and its token ids."""

    def __init__(self, pool: TwinPool, length: int, seed: int) -> None:
        pages = pool.allocator.alloc(pool.layout.pages_for_tokens(length))
        pages = pages[::-1]  # non-contiguous, descending page ids
        self.slots = torch.tensor([p * PAGE + o for p in pages for o in range(PAGE)])[:length]
        self.ids = torch.randint(
            0, SPEC.arch_value("vocab_size"), (length,), generator=torch.Generator().manual_seed(seed)
        )

    def step(self, start: int, end: int) -> SeqInput:
        """Compute positions start..end-1 over the cached context 0..start-1."""
        return SeqInput(self.ids[start:end], range(start, end), self.slots[start:end], self.slots[:end])


def make_pool(kind: str = "slot", pages: int = 12) -> TwinPool:
    return TwinPool(CacheLayout(SPEC), PageAllocator(pages, PAGE, first_page=1), kind=kind)


def selected(sel: torch.Tensor) -> list[set[int]]:
    return [set(row[row >= 0].tolist()) for row in sel]


def assert_matches_dense(out, dense, seq_rows: slice, all_logits: bool = True) -> None:
    want = dense.logits[seq_rows] if all_logits else dense.logits[seq_rows.stop - 1 : seq_rows.stop]
    assert (out.logits - want).abs().max().item() <= LOGIT_ATOL
    for layer in range(SPEC.num_hidden_layers):
        assert selected(out.selections[layer][0]) == selected(dense.selections[layer][seq_rows])


def test_paged_prefill_matches_dense(model):
    pool = make_pool()
    seq = Seq(pool, 150, seed=1)
    dense = model.forward_dense(seq.ids)
    out = model.forward_paged(pool, [seq.step(0, 150)], all_logits=True)
    assert_matches_dense(out, dense, slice(0, 150))


def test_prefill_over_a_cached_prefix_matches_dense(model):
    pool = make_pool()
    seq = Seq(pool, 200, seed=2)
    dense = model.forward_dense(seq.ids)
    model.forward_paged(pool, [seq.step(0, 96)])  # the cached prefix (ends inside a page)
    out = model.forward_paged(pool, [seq.step(96, 200)], all_logits=True)
    assert_matches_dense(out, dense, slice(96, 200))


def test_many_decode_steps_match_dense(model):
    pool = make_pool()
    seq = Seq(pool, 2 * PAGE + 4, seed=3)
    dense = model.forward_dense(seq.ids)
    model.forward_paged(pool, [seq.step(0, TOPK - 8)])
    for pos in range(TOPK - 8, 2 * PAGE + 4):  # crosses visible = top-k and two page boundaries
        out = model.forward_paged(pool, [seq.step(pos, pos + 1)])
        assert_matches_dense(out, dense, slice(pos, pos + 1), all_logits=False)


def test_a_batch_equals_its_sequences_run_alone(model):
    pool = make_pool()
    a, b = Seq(pool, 130, seed=4), Seq(pool, 70, seed=5)
    model.forward_paged(pool, [a.step(0, 129)])
    out = model.forward_paged(pool, [a.step(129, 130), b.step(0, 70)])  # decode + prefill together
    alone = [model.forward_dense(s.ids).logits[-1] for s in (a, b)]
    assert (out.logits - torch.stack(alone)).abs().max().item() <= LOGIT_ATOL


def spy(pool: TwinPool, name: str) -> list[tuple[int, int]]:
    """Record (layer, rows) of every call of ``pool.<name>``."""
    calls: list[tuple[int, int]] = []
    real = getattr(pool, name)

    def wrapped(layer, slots, *rest):
        calls.append((layer, len(slots)))
        return real(layer, slots, *rest)

    setattr(pool, name, wrapped)
    return calls


@pytest.mark.parametrize("pos", [20, TOPK - 1, TOPK, TOPK + 39])
def test_decode_step_reads_exactly_min_topk_visible_main_rows_per_layer(model, pos):
    pool = make_pool()
    seq = Seq(pool, pos + 1, seed=6)
    model.forward_paged(pool, [seq.step(0, pos)])
    reads = spy(pool, "read_main")
    out = model.forward_paged(pool, [seq.step(pos, pos + 1)])
    want = min(TOPK, pos + 1)
    assert out.main_rows_read == (want,) * SPEC.num_hidden_layers
    assert reads == [(layer, want) for layer in range(SPEC.num_hidden_layers)]
    assert out.indexer_rows_read == tuple(pos + 1 if t == "full" else 0 for t in SPEC.indexer_types)


def test_shared_layers_write_no_indexer_k_and_reuse_the_full_layers_selection(model):
    pool = make_pool()
    seq = Seq(pool, 150, seed=7)
    stores, reads = spy(pool, "store_indexer"), spy(pool, "read_indexer")
    out = model.forward_paged(pool, [seq.step(0, 150)])
    full = list(SPEC.full_indexer_layers)
    assert [layer for layer, _ in stores] == full
    assert [layer for layer, _ in reads] == full
    for layer in range(SPEC.num_hidden_layers):
        assert pool.indexer_view(layer).numel() == (0 if layer not in full else pool.indexer_view(layer).numel())
        source = SPEC.indexer_source_layer[layer]
        assert torch.equal(out.selections[layer][0], out.selections[source][0])
    # Full layers select differently from each other (so reuse is observable).
    assert not torch.equal(out.selections[full[0]][0], out.selections[full[1]][0])


def test_slot_and_packed_pools_give_bit_identical_outputs(model):
    outs = []
    for kind in ("slot", "packed"):
        pool = make_pool(kind)
        seq = Seq(pool, 2 * PAGE + 6, seed=8)
        first = model.forward_paged(pool, [seq.step(0, 2 * PAGE - 6)], all_logits=True)
        steps = [model.forward_paged(pool, [seq.step(p, p + 1)]).logits for p in range(2 * PAGE - 6, 2 * PAGE + 6)]
        outs.append(torch.cat([first.logits, *steps]))
    assert torch.equal(outs[0], outs[1])


def test_short_context_selects_every_visible_token(model):
    pool = make_pool()
    seq = Seq(pool, 10, seed=9)
    out = model.forward_paged(pool, [seq.step(0, 10)], all_logits=True)
    sel = out.selections[0][0]
    assert sel.shape == (10, 10)  # top-k (64) clamped to the visible context
    assert selected(sel) == [set(range(t + 1)) for t in range(10)]


def pool_bytes(pool: TwinPool) -> list[torch.Tensor]:
    layers = range(SPEC.num_hidden_layers)
    return [pool.main_view(la).clone() for la in layers] + [pool.indexer_view(la).clone() for la in layers]


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda s, bad: [s.step(0, 5), SeqInput([1, 2], [0, 1], bad[:2], bad[:2])], "not allocated"),
        (lambda s, bad: [s.step(0, 5), SeqInput([1, 10**6], [0, 1], s.slots[5:7], s.slots[5:7])], "token_ids"),
        (lambda s, bad: [s.step(0, 5), s.step(0, 5)], "share a slot"),
        (lambda s, bad: [SeqInput([1, 2], [3, 4], s.slots[:2], s.slots[:2])], "positions"),
        (lambda s, bad: [SeqInput([1, 2], [0, 1], s.slots[:2], s.slots[1:3])], "context_slots"),
        (lambda s, bad: [SeqInput([1.0, 2.0], [0, 1], s.slots[:2], s.slots[:2])], "token_ids"),
        (lambda s, bad: [SeqInput([1, 2], [0, 1], s.slots[:2], torch.cat([s.slots[1:2], s.slots[:2]]))], "positions"),
        (lambda s, bad: [], "seqs"),
    ],
)
def test_bad_input_raises_and_writes_nothing(model, make, field):
    pool = make_pool()
    seq = Seq(pool, 8, seed=10)
    unallocated = torch.arange(pool.allocator.end_page - 1, pool.allocator.end_page) * PAGE
    unallocated = unallocated.repeat(2) + torch.tensor([0, 1])
    before = pool_bytes(pool)
    with pytest.raises(DsakvError, match=field):
        model.forward_paged(pool, make(seq, unallocated))
    assert all(torch.equal(a, b) for a, b in zip(before, pool_bytes(pool)))


def test_pool_of_another_shape_is_rejected(model):
    other = ModelSpec.preset("tiny").with_all_indexers_full()
    pool = TwinPool(CacheLayout(other), PageAllocator(2, PAGE, first_page=1))
    seq = Seq(pool, 4, seed=11)
    with pytest.raises(DsakvError, match="indexer_types"):
        model.forward_paged(pool, [seq.step(0, 4)])


def test_dense_rejects_bad_token_ids(model):
    with pytest.raises(DsakvError, match="token_ids"):
        model.forward_dense([0, SPEC.arch_value("vocab_size")])
    with pytest.raises(DsakvError, match="token_ids"):
        model.forward_dense([])


def test_same_seed_gives_same_weights():
    ids = torch.arange(12)
    a, b = TinyDsaModel(SPEC, seed=3).forward_dense(ids), TinyDsaModel(SPEC, seed=3).forward_dense(ids)
    assert torch.equal(a.logits, b.logits)
    assert not torch.equal(a.logits, TinyDsaModel(SPEC, seed=4).forward_dense(ids).logits)


def test_fp32_model_tracks_the_fp64_model(model):
    """fp32 paths differ by fp32 noise amplified through fp8 caching: looser tolerance, no top-k claim."""
    fp32 = TinyDsaModel(SPEC, seed=0, dtype=torch.float32)
    pool = make_pool()
    seq = Seq(pool, 100, seed=12)
    paged = fp32.forward_paged(pool, [seq.step(0, 100)], all_logits=True).logits
    assert paged.dtype == torch.float32
    assert (paged.double() - model.forward_dense(seq.ids).logits).abs().max().item() <= 1e-2
    with pytest.raises(DsakvError, match="dtype"):
        TinyDsaModel(SPEC, dtype=torch.bfloat16)


def test_prefill_with_chunked_indexer_logits_is_bit_identical(model, monkeypatch):
    outs = []
    for budget in (None, 1):
        if budget is not None:
            monkeypatch.setattr(
                "dsakv.planner.workspaces.LOGITS_CHECK_MIN_ELEMENTS", 0
            )  # tiny shapes: force row chunks
        pool = make_pool()
        seq = Seq(pool, 90, seed=13)
        outs.append(model.forward_paged(pool, [seq.step(0, 90)], all_logits=True, budget_bytes=budget))
    assert torch.equal(outs[0].logits, outs[1].logits)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(outs[0].selections, outs[1].selections))


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_other_main_kv_dtypes_match_their_dense_emulation(model, kv_dtype):
    pool = TwinPool(CacheLayout(SPEC, kv_dtype=kv_dtype), PageAllocator(4, PAGE, first_page=1))
    seq = Seq(pool, 80, seed=14)
    dense = model.forward_dense(seq.ids, kv_dtype=kv_dtype)
    model.forward_paged(pool, [seq.step(0, 70)])
    out = model.forward_paged(pool, [seq.step(70, 80)], all_logits=True)
    assert_matches_dense(out, dense, slice(70, 80))


def test_batched_decode_reads_each_sequences_selection(model):
    pool = make_pool()
    lengths = (TOPK // 2, TOPK + 30)
    seqs = [Seq(pool, n, seed=15 + i) for i, n in enumerate(lengths)]
    for s, n in zip(seqs, lengths):
        model.forward_paged(pool, [s.step(0, n - 1)])
    out = model.forward_paged(pool, [s.step(n - 1, n) for s, n in zip(seqs, lengths)])
    assert out.main_rows_read == (sum(min(TOPK, n) for n in lengths),) * SPEC.num_hidden_layers


def test_a_forward_checks_each_slot_once_not_once_per_layer(model, monkeypatch):
    # validate_batch checks the batch's slots; every layer then hands the pool the same CheckedSlots, which
    # it trusts, so the pool's own slot check never runs on the model's path.
    pool = make_pool()
    seq = Seq(pool, 90, seed=16)
    pool_checks = []
    real = SlotChecker.slots
    monkeypatch.setattr(SlotChecker, "slots", lambda self, *a, **kw: pool_checks.append(a) or real(self, *a, **kw))
    handed = []
    for name in ("store_main", "store_indexer", "read_main", "read_indexer"):
        method = getattr(pool, name)
        monkeypatch.setattr(
            pool, name, lambda layer, slots, *rest, m=method: handed.append(slots) or m(layer, slots, *rest)
        )
    model.forward_paged(pool, [seq.step(0, 60)])
    model.forward_paged(pool, [seq.step(60, 90)])
    assert handed and all(isinstance(s, CheckedSlots) for s in handed)
    assert pool_checks == []
    with pytest.raises(DsakvError, match="not allocated"):  # a user's own call is still checked
        pool.read_main(0, [pool.allocator.end_page * PAGE - 1])
    assert len(pool_checks) == 1


def test_the_twin_pool_is_the_paged_cache_the_model_uses():
    assert isinstance(make_pool("slot"), PagedCache) and isinstance(make_pool("packed"), PagedCache)


@pytest.mark.parametrize("field", DENSE_ARCH_FIELDS)
def test_the_dense_tiny_model_needs_every_architecture_field_but_the_moe_ones(field):
    assert set(DENSE_ARCH_FIELDS) | set(MOE_ARCH_FIELDS) == set(ARCH_FIELDS)
    assert all(SPEC.arch_value(moe) == 0 for moe in MOE_ARCH_FIELDS if moe != "first_k_dense_replace")
    TinyDsaModel(SPEC)  # a dense spec: no experts
    broken = dataclasses.replace(SPEC, arch={**SPEC.arch, field: 0})
    with pytest.raises(DsakvError, match=field):
        TinyDsaModel(broken)
