"""Step-time models: the roofline's components follow the spec and behave monotonically."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.sim.steptime import ConstantStepTime, RooflineStepTime, _sparse_pairs, gpu_perf
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


@pytest.fixture(scope="module")
def glm():
    return RooflineStepTime(CacheLayout(ModelSpec.preset("glm-5.3")))


def test_sparse_pairs_matches_brute_force():
    for n, ctx, k in [(1, 0, 4), (10, 0, 4), (10, 3, 4), (5, 100, 4), (7, 2, 64), (64, 30, 64)]:
        assert _sparse_pairs(n, ctx, k) == sum(min(ctx + i, k) for i in range(1, n + 1))


def test_indexer_flops_use_the_spec_pair_cost(glm):
    spec, lay = glm.layout.spec, glm.layout
    c = glm.cost([], [10_000])
    assert c.flops["indexer"] == lay.num_indexer_layers * 10_000 * spec.indexer_flops_per_pair


def test_more_full_indexer_layers_cost_more_indexer_time(glm):
    spec = glm.layout.spec
    full = RooflineStepTime(CacheLayout(spec.with_all_indexers_full()))
    assert full.cost([], [100_000] * 8).seconds["indexer"] > glm.cost([], [100_000] * 8).seconds["indexer"]


def test_step_time_grows_with_context_and_batch(glm):
    assert glm.step_seconds([], [8192] * 32) > glm.step_seconds([], [8192] * 8)
    assert glm.step_seconds([], [131072] * 8) > glm.step_seconds([], [8192] * 8)
    assert glm.step_seconds([(2048, 100_000)], []) > glm.step_seconds([(2048, 0)], [])


def test_decode_is_memory_bound_on_weights(glm):
    c = glm.cost([], [4096])
    assert c.seconds["linear"] == pytest.approx(c.bytes["linear"] / (glm.gpu.hbm_bytes_per_s * glm.bw_eff))


def test_empty_step_costs_nothing(glm):
    assert glm.cost([], []).seconds["overhead"] == 0


def test_dcp_divides_main_kv_reads_only(glm):
    dcp = RooflineStepTime(glm.layout, dcp=4)
    a, b = glm.cost([], [50_000] * 4), dcp.cost([], [50_000] * 4)
    assert b.bytes["sparse_mla"] == pytest.approx(a.bytes["sparse_mla"] / 4)
    assert b.bytes["indexer"] == a.bytes["indexer"]


def test_mtp_yields_more_tokens_per_decode(glm):
    assert RooflineStepTime(glm.layout, mtp_draft=1).tokens_per_decode == pytest.approx(1.8)
    assert glm.tokens_per_decode == 1


def test_constant_model_and_validation():
    assert ConstantStepTime(0.01, 0.001).step_seconds([(10, 0)], [5, 5]) == pytest.approx(0.022)
    with pytest.raises(DsakvError):
        ConstantStepTime(-1)
    with pytest.raises(DsakvError):
        gpu_perf("TPU")
    with pytest.raises(DsakvError):
        RooflineStepTime(CacheLayout(ModelSpec.preset("glm-5.3")), compute_eff=0)
