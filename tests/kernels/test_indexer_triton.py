"""The Triton indexer-logits kernel matches the torch reference (CPU interpreter on tiny shapes)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # decided when the kernel module is first imported
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from dsakv.kernels.cache_ops import quantize_tiles  # noqa: E402
from dsakv.kernels.indexer_kernels import indexer_logits_torch, indexer_logits_triton  # noqa: E402
from dsakv.model.indexer import indexer_topk  # noqa: E402
from dsakv.spec.model_spec import ModelSpec  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SPEC = ModelSpec.preset("tiny")
HEADS, DIM = SPEC.index_n_heads, SPEC.index_head_dim


def make_inputs(rows: int, cols: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q8, q_scale = quantize_tiles(torch.randn(rows * HEADS, DIM, generator=g), DIM)
    weights = torch.randn(rows, HEADS, generator=g) * q_scale.view(rows, HEADS)
    k8, k_scale = quantize_tiles(torch.randn(cols, DIM, generator=g), DIM)
    visible = torch.arange(cols - rows + 1, cols + 1)
    return q8.view(rows, HEADS, DIM), weights, k8, k_scale.reshape(-1), visible


@pytest.mark.parametrize("rows, cols, seed", [(1, 1, 0), (3, 45, 1), (7, 130, 2)])
def test_triton_indexer_logits_match_reference(rows, cols, seed):
    q, w, k8, ks, vis = (t.to(DEVICE) for t in make_inputs(rows, cols, seed))
    ref = indexer_logits_torch(q, w, k8, ks, vis)
    got = indexer_logits_triton(q, w, k8, ks, vis)
    assert torch.equal(torch.isinf(ref), torch.isinf(got))
    seen = torch.isfinite(ref)
    # fp32 accumulation in the kernel vs exact fp64 in the reference.
    assert torch.allclose(got[seen], ref[seen], rtol=1e-5, atol=1e-5)


def test_dispatcher_selects_with_the_triton_kernel(monkeypatch):
    q, w, k8, ks, vis = (t.to(DEVICE) for t in make_inputs(4, 90, seed=4))
    ref = indexer_topk(q, w, k8, ks, vis, topk=16)
    monkeypatch.setenv("DSAKV_KERNELS", "triton")
    got = indexer_topk(q, w, k8, ks, vis, topk=16)
    assert torch.equal(got.indices, ref.indices)
