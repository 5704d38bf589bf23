"""Decode steps of the tiny model through the Triton kernels (pool store/gather, indexer, sparse MLA) match
the torch kernels (CPU interpreter; the prefix is prefilled with the torch kernels to keep it fast).

Tolerance: the Triton kernels compute in fp32 where the torch references of the indexer and sparse MLA
compute in fp64, and an fp32-rounded value can land on the other side of an fp8 rounding step when it is
cached, so logits agree within ``LOGIT_ATOL`` (measured 5e-4 on logits of magnitude ~2), not to fp64 rounding.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # decided when the kernel modules are first imported
    os.environ["TRITON_INTERPRET"] = "1"

from dsakv import CacheLayout, ModelSpec, PageAllocator  # noqa: E402
from dsakv.engine.pool import TwinPool  # noqa: E402
from dsakv.model.tiny_dsa import SeqInput, TinyDsaModel  # noqa: E402

SPEC = ModelSpec.preset("tiny")
LOGIT_ATOL = 2e-3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(model: TinyDsaModel, monkeypatch, kernels: str) -> tuple[torch.Tensor, list]:
    layout = CacheLayout(SPEC)
    pool = TwinPool(layout, PageAllocator(3, layout.page_size, first_page=1))
    pages = pool.allocator.alloc(2)[::-1]
    slots = torch.tensor([p * layout.page_size + o for p in pages for o in range(layout.page_size)])
    ids = torch.randint(
        0, SPEC.arch_value("vocab_size"), (layout.page_size + 2,), generator=torch.Generator().manual_seed(0)
    )
    n = ids.numel()
    monkeypatch.setenv("DSAKV_KERNELS", "torch")
    model.forward_paged(pool, [SeqInput(ids[: n - 2], range(n - 2), slots[: n - 2], slots[: n - 2])])
    monkeypatch.setenv("DSAKV_KERNELS", kernels)
    logits, sels = [], []
    for p in (n - 2, n - 1):
        out = model.forward_paged(pool, [SeqInput(ids[p : p + 1], [p], slots[p : p + 1], slots[: p + 1])])
        logits.append(out.logits)
        sels.append(out.selections)
    return torch.cat(logits), sels


def test_model_through_triton_kernels_matches_torch_kernels(monkeypatch):
    model = TinyDsaModel(SPEC, seed=0)
    ref_logits, ref_sel = run(model, monkeypatch, "torch")
    got_logits, got_sel = run(model, monkeypatch, "triton")
    assert (got_logits.double() - ref_logits).abs().max().item() <= LOGIT_ATOL
    for a, b in zip(ref_sel, got_sel):
        assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
