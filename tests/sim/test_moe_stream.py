"""The Triton fused MoE's streaming fraction by expert slice (fact 51): bench/moe_stream.py's replay of
AIConfigurator's routing, the constants it derives from the committed tables, and the roofline's use of them."""

from __future__ import annotations

import numpy as np
import pytest

from dsakv.planner.gpus import gpu_kind
from dsakv.sim.steptime import RooflineStepTime
from dsakv.sim.steptime.kernels import (
    TRITON_MOE_REFERENCE_SLICE,
    TRITON_MOE_STREAM_BY_SLICE,
    triton_moe_slice_factor,
)
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_spec


@pytest.fixture
def moe_stream(load_file_module, repo_dir):
    return load_file_module(repo_dir / "bench" / "moe_stream.py")


@pytest.fixture
def aic_routing(load_file_module, repo_dir):
    return load_file_module(repo_dir / "bench" / "aic_routing.py")


@pytest.mark.parametrize("tokens", [1, 8, 32, 64, 512])
def test_aiconfigurators_routing_gives_every_token_its_top_k_once_per_expert(aic_routing, tokens):
    rng = np.random.default_rng(7)
    for _ in range(5):
        counts = aic_routing.aic_expert_counts(tokens, 256, 8, rng)
        assert counts.shape == (256,) and counts.sum() == tokens * 8  # the sum restored exactly
        assert counts.min() >= 0 and counts.max() <= tokens  # an expert takes a token at most once


def test_the_power_law_touches_fewer_experts_than_uniform_routing(aic_routing):
    uniform = 256 * (1 - (1 - 8 / 256) ** 64)  # dsakv's own count (RooflineStepTime._touched): 222.4
    touched = aic_routing.touched_experts(64, 256, 8, draws=32)
    assert 180 < touched < uniform  # the skew concentrates the tokens: about 192
    # seeded: a fresh draw (past the cache) gives the same count
    assert aic_routing.touched_experts.__wrapped__(64, 256, 8, draws=32) == touched


def test_the_slice_constants_are_the_tables_medians(moe_stream):
    # kernels.TRITON_MOE_STREAM_BY_SLICE is what the script derives from the committed H200 tables (0.5.6.post2)
    medians = moe_stream.slice_fractions(moe_stream.Tables.read(moe_stream.TABLES).moe)
    assert list(medians) == [cols for cols, _ in TRITON_MOE_STREAM_BY_SLICE]
    for cols, frac in TRITON_MOE_STREAM_BY_SLICE:
        assert medians[cols] == pytest.approx(frac, abs=0.005), cols


def test_the_slice_factor_is_one_at_the_fitted_rows_slice_and_follows_the_measurement():
    assert triton_moe_slice_factor(TRITON_MOE_REFERENCE_SLICE) == 1.0
    fractions = dict(TRITON_MOE_STREAM_BY_SLICE)
    assert triton_moe_slice_factor(128) == pytest.approx(0.46 / 0.66)  # MoE TP 16 of a 2,048-wide expert
    assert triton_moe_slice_factor(2048) == pytest.approx(0.90 / 0.66)  # whole experts
    assert triton_moe_slice_factor(181.02) == pytest.approx((0.46 + 0.66) / 2 / 0.66, rel=1e-3)  # log2 midpoint
    assert triton_moe_slice_factor(16) == fractions[64] / 0.66 and triton_moe_slice_factor(8192) == 0.90 / 0.66
    xs = [2**k for k in range(6, 12)]  # the measured slices, 64 to 2,048 columns: strictly rising
    assert all(triton_moe_slice_factor(a) < triton_moe_slice_factor(b) for a, b in zip(xs, xs[1:], strict=False))


def _model(tp: int, **kw) -> RooflineStepTime:
    return RooflineStepTime(CacheLayout(load_spec("deepseek-v3.2")), gpu_kind("H20"), tp=tp, weight_dtype="fp8", **kw)


def test_a_tp16_hopper_rank_streams_its_expert_slices_slower_than_the_fitted_rate():
    tp8, tp16 = _model(8), _model(16)
    assert tp8.rank.expert_bw == tp8.rank.bw  # the fitted rows' slice: bw_eff as fitted
    assert tp16.rank.expert_bw == pytest.approx(tp16.rank.bw * 0.46 / 0.66)  # 128 columns a rank
    # DeepEP's whole experts stream at DeepGEMM's published rate, not by the slice
    ep = _model(16, moe_a2a="deepep", ep=16, dp_attention=16)
    assert ep.rank.expert_bw == ep.rank.deep_gemm_bw
    # a decode step of 64 at TP 16 pays its touched experts' weights at that rate: each rank holds half the bytes of a
    # TP 8 rank, and takes 0.66 / 0.46 = 1.43x as long a byte, so its MoE takes 0.72x the TP 8 time, not 0.5x
    moe8, moe16 = (m.cost([], [4096] * 64).seconds["moe"] for m in (tp8, tp16))
    assert moe16 / moe8 == pytest.approx(0.5 * 0.66 / 0.46, rel=0.03)
