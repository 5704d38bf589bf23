"""The Triton sparse-MLA decode kernel matches the torch reference (CPU interpreter on tiny shapes)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # decided when the kernel module is first imported
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from dsakv.kernels.sparse_mla_kernels import sparse_mla_torch, sparse_mla_triton  # noqa: E402
from dsakv.spec.model_spec import ModelSpec  # noqa: E402

SPEC = ModelSpec.preset("tiny")
HEADS, RANK, ROPE = SPEC.arch_value("num_attention_heads"), SPEC.kv_lora_rank, SPEC.qk_rope_head_dim
SCALE = (SPEC.arch_value("qk_nope_head_dim") + ROPE) ** -0.5
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("tokens, rows, top, seed", [(1, 1, 1, 0), (2, 40, 17, 1), (3, 100, 64, 2)])
def test_triton_sparse_mla_matches_reference(tokens, rows, top, seed):
    g = torch.Generator().manual_seed(seed)
    q_latent = torch.randn(tokens, HEADS, RANK, generator=g)
    q_rope = torch.randn(tokens, HEADS, ROPE, generator=g)
    latent = torch.randn(rows, RANK, generator=g)
    rope = torch.randn(rows, ROPE, generator=g)
    idx = torch.stack([torch.randperm(rows, generator=g)[:top] for _ in range(tokens)])
    if tokens > 1:
        idx[1, top // 2 :] = -1  # padded row: fewer selected tokens
    args = [t.to(DEVICE) for t in (q_latent, q_rope, latent, rope, idx)]
    ref = sparse_mla_torch(*args, SCALE)
    got = sparse_mla_triton(*args, SCALE)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_row_with_no_selected_token_gives_zeros():
    q = torch.randn(1, HEADS, RANK, device=DEVICE)
    qr = torch.randn(1, HEADS, ROPE, device=DEVICE)
    lat, rp = torch.randn(4, RANK, device=DEVICE), torch.randn(4, ROPE, device=DEVICE)
    idx = torch.full((1, 3), -1, dtype=torch.int64, device=DEVICE)
    assert (sparse_mla_triton(q, qr, lat, rp, idx, SCALE) == 0).all()
    assert (sparse_mla_torch(q, qr, lat, rp, idx, SCALE) == 0).all()
