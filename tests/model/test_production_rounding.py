"""The production cache mode rounds exactly what DeepSeek-V3.2's kernels round, checked against an independent
float reference on small tensors (issue 12: the production/exact disagreement had to be told apart from a bug).

Reference, written without dsakv's quantizer or Hadamard matrix: fp8 e4m3 round-to-nearest-even from the
binade of each value (3 mantissa bits, subnormals below 2^-6, saturation at 448), scale ``amax / 448`` per
tile (per 128 latent values, per indexer key, per indexer query head), Hadamard as a fast Walsh-Hadamard
butterfly scaled by ``dim^-0.5``, scores in fp64.
"""

from __future__ import annotations

import math

import torch

from dsakv.engine.pool import TwinPool
from dsakv.model.dsa_config import DsaConfig
from dsakv.model.dsa_layers import Indexer, IndexerRounding
from dsakv.model.indexer import indexer_logits
from dsakv.model.rope import RopeTables
from dsakv.spec.layout import CacheLayout

CONFIG = dict(
    model_type="deepseek_v32", hidden_size=64, num_hidden_layers=1, num_attention_heads=2, q_lora_rank=32,
    kv_lora_rank=256, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, index_head_dim=64, index_n_heads=8,
    index_topk=16, vocab_size=32, intermediate_size=32, moe_intermediate_size=16, n_routed_experts=4,
    num_experts_per_tok=2, n_group=1, topk_group=1,
)  # fmt: skip
EXACT = IndexerRounding(hadamard=False, fp8_query=False)
PRODUCTION = IndexerRounding(hadamard=True, fp8_query=True)


def fp8_round(v: torch.Tensor) -> torch.Tensor:
    """Independent e4m3fn round-to-nearest-even of fp64 values (saturating at +-448)."""
    v = v.double()
    mag = v.abs()
    exp = torch.floor(torch.log2(torch.where(mag > 0, mag, torch.ones_like(mag)))).clamp(min=-6)
    step = torch.pow(2.0, exp - 3)
    return (torch.round(v / step) * step).clamp(-448, 448)  # torch.round: half to even


def fp8_dequant_reference(x: torch.Tensor, tile: int) -> torch.Tensor:
    """Round ``x [..., d]`` to fp8 with one ``amax / 448`` scale per ``tile`` values, back to fp64."""
    t = x.double().reshape(*x.shape[:-1], -1, tile)
    amax = t.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax.float().double() / 448, torch.ones_like(amax))
    scale = scale.float().double()  # the scale is stored as fp32
    return (fp8_round(t / scale) * scale).reshape(x.shape)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh-Hadamard transform over the last dim (Sylvester order)."""
    y = x.double().clone()
    d, h = y.shape[-1], 1
    while h < d:
        y = y.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        y = torch.stack([y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]], dim=-2)
        h *= 2
    return y.reshape(x.shape) / math.sqrt(d)


def reference_logits(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``sum_h w[t, h] relu(q[t, h] . k[s])`` in fp64 (no mask)."""
    return (torch.einsum("thd,sd->ths", q.double(), k.double()).relu() * w.double().unsqueeze(-1)).sum(1)


def _indexer(seed: int = 0) -> tuple[Indexer, DsaConfig]:
    cfg = DsaConfig.from_hf_config(CONFIG)
    gen = torch.Generator().manual_seed(seed)
    p, s = "idx.", cfg.spec
    heads, dim, hid, qr = s.index_n_heads, s.index_head_dim, cfg.hidden_size, cfg.q_lora_rank
    w = {
        p + "wq_b.weight": torch.randn(heads * dim, qr, generator=gen) / math.sqrt(qr),
        p + "wk.weight": torch.randn(dim, hid, generator=gen) / math.sqrt(hid),
        p + "k_norm.weight": 1 + 0.1 * torch.randn(dim, generator=gen),
        p + "k_norm.bias": 0.1 * torch.randn(dim, generator=gen),
        p + "weights_proj.weight": torch.randn(heads, hid, generator=gen) / math.sqrt(hid),
    }
    return Indexer(cfg, w, p), cfg


def _inputs(cfg: DsaConfig, n: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cfg.hidden_size, generator=gen)
    qr = torch.randn(n, cfg.q_lora_rank, generator=gen)
    rope = RopeTables.at(cfg.rope, cfg.spec.qk_rope_head_dim, torch.arange(n))
    return x, qr, rope


def _pool(cfg: DsaConfig, n: int, kv_dtype: str, indexer_dtype: str) -> tuple[TwinPool, list[int]]:
    lay = CacheLayout(cfg.spec, kv_dtype=kv_dtype, page_size=16, allow_any_page_size=True, indexer_dtype=indexer_dtype)
    pool = TwinPool.for_pages(lay, math.ceil(n / 16), padding_slots=16)
    pages = pool.allocator.alloc(math.ceil(n / 16))
    return pool, [p * 16 + o for p in pages for o in range(16)][:n]


def test_reference_fp8_round_equals_torch_e4m3_cast():
    v = torch.randn(4096, dtype=torch.float64) * torch.logspace(-4, 2.6, 4096, dtype=torch.float64)
    v = v.float().double()
    assert torch.equal(fp8_round(v), v.clamp(-448, 448).float().to(torch.float8_e4m3fn).double())


def test_hadamard_alone_changes_no_indexer_score_beyond_float_error():
    idx, cfg = _indexer()
    x, qr, rope = _inputs(cfg, 40)
    had = IndexerRounding(hadamard=True, fp8_query=False)
    q0, k0 = idx.query(x, qr, rope, EXACT), idx.key(x, rope, EXACT)
    q1, k1 = idx.query(x, qr, rope, had), idx.key(x, rope, had)
    assert torch.allclose(fwht(q0.q), q1.q.double(), atol=1e-5) and torch.allclose(fwht(k0), k1.double(), atol=1e-5)
    ref = reference_logits(q0.q, q0.weights, k0)
    assert torch.allclose(reference_logits(q1.q, q1.weights, k1), ref, rtol=1e-5, atol=1e-5)


def test_production_indexer_scores_equal_the_float_reference_of_its_rounding():
    """Hadamard on q and k, fp8 q per (token, head) with its scale folded into the head weights, fp8 k + scale
    through the pool: the logits equal the reference's dequantized fp8 vectors scored in fp64."""
    idx, cfg = _indexer()
    n = 40
    x, qr, rope = _inputs(cfg, n)
    pool, slots = _pool(cfg, n, "fp32", "fp8")
    pool.store_indexer(0, slots, idx.key(x, rope, PRODUCTION))
    k8, k_scale = pool.read_indexer(0, slots)
    q = idx.query(x, qr, rope, PRODUCTION)
    got = indexer_logits(q.q, q.weights, k8, k_scale, torch.full((n,), n))

    exact_q, exact_k = idx.query(x, qr, rope, EXACT), idx.key(x, rope, EXACT)
    ref_q = fp8_dequant_reference(fwht(exact_q.q), cfg.spec.index_head_dim)
    ref_k = fp8_dequant_reference(fwht(exact_k), cfg.spec.index_head_dim)
    ref = reference_logits(ref_q, exact_q.weights, ref_k)
    assert torch.allclose(got.double(), ref, rtol=1e-4, atol=1e-5), (got.double() - ref).abs().max()
    # and the rounding is as small as fp8's: scores move by a few percent of their spread, not more
    exact = reference_logits(exact_q.q, exact_q.weights, exact_k)
    assert (ref - exact).pow(2).mean().sqrt() < 0.05 * exact.std()


def test_fp8_ds_mla_round_trip_equals_the_float_reference():
    """Main KV: 128-value tiles of fp8 latent with fp32 amax/448 scales, bf16 RoPE."""
    _, cfg = _indexer()
    n, r, p = 24, cfg.spec.kv_lora_rank, cfg.spec.qk_rope_head_dim
    gen = torch.Generator().manual_seed(2)
    latent = torch.randn(n, r, generator=gen) * torch.logspace(-2, 1, r)  # tiles of different magnitudes
    latent[3, :128] = 0  # an all-zero tile
    rope = torch.randn(n, p, generator=gen)
    pool, slots = _pool(cfg, n, "fp8_ds_mla", "fp8")
    pool.store_main(0, slots, latent, rope)
    got_latent, got_rope = pool.read_main(0, slots)
    # equal up to the fp32 (pool) vs fp64 (reference) product of fp8 value and scale
    assert torch.allclose(got_latent.double(), fp8_dequant_reference(latent, 128), rtol=1e-6, atol=0)
    assert torch.equal(got_rope, rope.to(torch.bfloat16).float())
    assert torch.equal(got_latent[3, :128], torch.zeros(128))
