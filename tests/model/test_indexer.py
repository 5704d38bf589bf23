"""Lightning indexer: scoring semantics, causal mask, selection rule, logits budget and row chunking."""

from __future__ import annotations

import pytest
import torch

from dsakv.errors import DsakvError
from dsakv.kernels.cache_ops import quantize_tiles
from dsakv.model.indexer import device_logits_budget, indexer_logits, indexer_topk, select_topk
from dsakv.planner.workspaces import (
    LOGIT_BYTES,
    LOGITS_CHECK_MIN_ELEMENTS,
    LOGITS_COL_ALIGN,
    chunk_rows,
    logits_budget_bytes,
)
from dsakv.spec.model_spec import ModelSpec

GiB = 1 << 30


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_inputs(rows: int, cols: int, seed: int = 0, heads: int | None = None, dim: int | None = None):
    spec = ModelSpec.preset("tiny")
    heads, dim = heads or spec.index_n_heads, dim or spec.index_head_dim
    g = torch.Generator().manual_seed(seed)
    q8, q_scale = quantize_tiles(torch.randn(rows * heads, dim, generator=g), dim)
    weights = torch.randn(rows, heads, generator=g) * q_scale.view(rows, heads)
    k8, k_scale = quantize_tiles(torch.randn(cols, dim, generator=g), dim)
    visible = torch.arange(cols - rows + 1, cols + 1)  # the last `rows` positions of a causal context
    return q8.view(rows, heads, dim), weights, k8, k_scale.reshape(-1), visible


def test_logits_equal_weighted_relu_sum_over_dequantized_keys():
    q, w, k8, ks, vis = make_inputs(6, 40)
    logits = indexer_logits(q, w, k8, ks, vis)
    k = k8.float() * ks.unsqueeze(1)  # scale > 0 folds in after the head sum
    expect = (torch.einsum("thd,sd->ths", q.float(), k).relu() * w.unsqueeze(-1)).sum(1)
    seen = torch.isfinite(logits)
    assert torch.allclose(logits[seen], expect[seen], rtol=1e-5, atol=1e-5)


def test_columns_beyond_visible_are_masked():
    q, w, k8, ks, vis = make_inputs(6, 40)
    logits = indexer_logits(q, w, k8, ks, vis)
    cols = torch.arange(40)
    assert torch.equal(torch.isfinite(logits), cols.unsqueeze(0) < vis.unsqueeze(1))


def test_topk_larger_than_visible_is_clamped():
    q, w, k8, ks, _ = make_inputs(4, 30)
    vis = torch.tensor([1, 5, 17, 30])
    sel = indexer_topk(q, w, k8, ks, vis, topk=64)
    assert sel.width == 30
    assert sel.counts.tolist() == [1, 5, 17, 30]
    for r, v in enumerate(vis.tolist()):
        row = sel.indices[r]
        assert row[:v].tolist() == list(range(v))  # everything visible is chosen
        assert (row[v:] == -1).all()


def test_selection_is_the_topk_of_visible_scores_in_position_order():
    q, w, k8, ks, vis = make_inputs(5, 200, seed=3)
    topk = 16
    sel = indexer_topk(q, w, k8, ks, vis, topk)
    logits = indexer_logits(q, w, k8, ks, vis)
    for r in range(5):
        chosen = sel.indices[r]
        assert torch.equal(chosen, chosen.sort().values)
        assert int(chosen.max()) < int(vis[r])
        best = torch.topk(logits[r], topk).values
        assert torch.equal(logits[r][chosen].sort(descending=True).values, best)


def test_exact_ties_keep_the_lowest_positions():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.5, 2.0, 2.0, float("-inf")]])
    assert select_topk(logits, torch.tensor([3]), 3).tolist() == [[1, 2, 4]]
    assert select_topk(logits, torch.tensor([1]), 1).tolist() == [[1]]


def test_chunked_and_unchunked_selection_are_identical(monkeypatch):
    rows, cols, topk = 37, 300, 24
    q, w, k8, ks, vis = make_inputs(rows, cols, seed=5)
    whole = indexer_topk(q, w, k8, ks, vis, topk, budget_bytes=0)  # below 8 M elements: never chunked
    assert whole.num_chunks == 1
    # Tiny shapes stay below the 8 M-element threshold; lower it so the budget applies.
    monkeypatch.setattr("dsakv.planner.workspaces.LOGITS_CHECK_MIN_ELEMENTS", 0)
    padded_row_bytes = -(-cols // LOGITS_COL_ALIGN) * LOGITS_COL_ALIGN * LOGIT_BYTES
    budget = 5 * padded_row_bytes + 1
    chunked = indexer_topk(q, w, k8, ks, vis, topk, budget_bytes=budget)
    assert chunked.rows_per_chunk == chunk_rows(budget, cols) == 5
    assert chunked.num_chunks == -(-rows // 5)
    assert torch.equal(chunked.indices, whole.indices)


def test_chunks_hold_at_least_one_row_when_the_budget_is_tiny(monkeypatch):
    monkeypatch.setattr("dsakv.planner.workspaces.LOGITS_CHECK_MIN_ELEMENTS", 0)
    q, w, k8, ks, vis = make_inputs(3, 50, seed=6)
    sel = indexer_topk(q, w, k8, ks, vis, 8, budget_bytes=0)
    assert (sel.rows_per_chunk, sel.num_chunks) == (1, 3)
    assert torch.equal(sel.indices, indexer_topk(q, w, k8, ks, vis, 8).indices)


def test_device_budget_follows_the_design_formula():
    budget = device_logits_budget("cpu", mem_fraction_static=0.9)
    assert 0 < budget <= logits_budget_bytes(1 << 50, 0.9, 1 << 50)
    assert LOGITS_CHECK_MIN_ELEMENTS == 8_000_000  # SGLang's _MQA_LOGITS_STATIC_SKIP_ELEMS (decimal, not 8 MiB)
    assert chunk_rows(4 * GiB // 1024, 1 << 20) == 1  # one 1M-context fp32 row is 4 MiB (DESIGN.md section 3)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda a: {**a, "q": a["q"][0]}, "q"),
        (lambda a: {**a, "weights": a["weights"][:, :2]}, "weights"),
        (lambda a: {**a, "k": a["k"][:, :64]}, "indexer k"),
        (lambda a: {**a, "k": a["k"].to(torch.int32)}, "indexer k"),
        (lambda a: {**a, "k_scale": a["k_scale"].double()}, "k_scale"),
        (lambda a: {**a, "visible": a["visible"] + 1}, "visible"),
        (lambda a: {**a, "visible": a["visible"].float()}, "visible"),
        (lambda a: {**a, "topk": 0}, "topk"),
    ],
)
def test_bad_indexer_input_names_the_field(mutate, field):
    q, w, k8, ks, vis = make_inputs(3, 20)
    args = mutate({"q": q, "weights": w, "k": k8, "k_scale": ks, "visible": vis, "topk": 8})
    with pytest.raises(DsakvError, match=field):
        indexer_topk(**args)
