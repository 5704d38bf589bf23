"""Sparse MLA: attending to the selected rows equals dense attention under the index mask."""

from __future__ import annotations

import pytest
import torch

from dsakv.errors import DsakvError
from dsakv.model.sparse_mla import compact_selection, sparse_mla
from dsakv.spec.model_spec import ModelSpec

SPEC = ModelSpec.preset("tiny")
HEADS, RANK, ROPE = SPEC.arch_value("num_attention_heads"), SPEC.kv_lora_rank, SPEC.qk_rope_head_dim
SCALE = (SPEC.arch_value("qk_nope_head_dim") + ROPE) ** -0.5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_inputs(tokens: int, rows: int, top: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q_latent = torch.randn(tokens, HEADS, RANK, generator=g)
    q_rope = torch.randn(tokens, HEADS, ROPE, generator=g)
    latent = torch.randn(rows, RANK, generator=g)
    rope = torch.randn(rows, ROPE, generator=g)
    idx = torch.stack([torch.randperm(rows, generator=g)[:top] for _ in range(tokens)])
    return q_latent, q_rope, latent, rope, idx


def dense_masked(q_latent, q_rope, latent, rope, idx):
    score = (q_latent @ latent.T + q_rope @ rope.T) * SCALE  # [T, H, N]
    allowed = torch.zeros(idx.shape[0], latent.shape[0], dtype=torch.bool)
    for t in range(idx.shape[0]):
        allowed[t, idx[t][idx[t] >= 0]] = True
    p = torch.softmax(score.masked_fill(~allowed.unsqueeze(1), float("-inf")), dim=-1)
    return p @ latent


def test_sparse_equals_dense_attention_under_the_index_mask():
    q_latent, q_rope, latent, rope, idx = make_inputs(5, 90, 24)
    idx[2, 10:] = -1  # a row that selected fewer tokens (short context)
    got = sparse_mla(q_latent, q_rope, latent, rope, idx, SCALE)
    assert torch.allclose(got, dense_masked(q_latent, q_rope, latent, rope, idx), rtol=1e-5, atol=1e-5)


def test_order_of_selected_rows_does_not_matter():
    q_latent, q_rope, latent, rope, idx = make_inputs(3, 50, 16, seed=1)
    a = sparse_mla(q_latent, q_rope, latent, rope, idx, SCALE)
    b = sparse_mla(q_latent, q_rope, latent, rope, idx.flip(1), SCALE)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_compact_selection_reads_each_selected_row_once():
    idx = torch.tensor([[7, 3, -1], [3, 9, 12]])
    c = compact_selection(idx)
    assert c.positions.tolist() == [3, 7, 9, 12]
    assert torch.equal(torch.where(c.local >= 0, c.positions[c.local.clamp(min=0)], -1), idx)


def test_sparse_over_compacted_rows_equals_sparse_over_all_rows():
    q_latent, q_rope, latent, rope, idx = make_inputs(4, 70, 20, seed=2)
    c = compact_selection(idx)
    a = sparse_mla(q_latent, q_rope, latent[c.positions], rope[c.positions], c.local, SCALE)
    b = sparse_mla(q_latent, q_rope, latent, rope, idx, SCALE)
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda a: {**a, "q_latent": a["q_latent"][0]}, "q_latent"),
        (lambda a: {**a, "q_rope": a["q_rope"][:, :1]}, "q_rope"),
        (lambda a: {**a, "latent": a["latent"][:, :256]}, "latent"),
        (lambda a: {**a, "rope": a["rope"].to(torch.int32)}, "rope"),
        (lambda a: {**a, "topk_idx": a["topk_idx"].float()}, "topk_idx"),
        (lambda a: {**a, "topk_idx": a["topk_idx"] + 100}, "topk_idx"),
    ],
)
def test_bad_sparse_mla_input_names_the_field(mutate, field):
    q_latent, q_rope, latent, rope, idx = make_inputs(2, 30, 8)
    args = {"q_latent": q_latent, "q_rope": q_rope, "latent": latent, "rope": rope, "topk_idx": idx, "sm_scale": SCALE}
    with pytest.raises(DsakvError, match=field):
        sparse_mla(**mutate(args))
