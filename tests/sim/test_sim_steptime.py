"""Step-time models: the roofline's components follow the spec and behave monotonically."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.planner.gpus import GPU_KINDS, gpu_kind
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.steptime import ConstantStepTime, RooflineStepTime, runs
from dsakv.sim.steptime.sums import clipped_sum, sparse_pairs
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


@pytest.fixture(scope="module")
def glm():
    return RooflineStepTime(CacheLayout(ModelSpec.preset("glm-5.3")))


def test_sparse_pairs_matches_brute_force():
    for n, ctx, k in [(1, 0, 4), (10, 0, 4), (10, 3, 4), (5, 100, 4), (7, 2, 64), (64, 30, 64)]:
        assert sparse_pairs(n, ctx, k) == sum(min(ctx + i, k) for i in range(1, n + 1))


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
    assert RooflineStepTime(glm.layout, num_speculative_tokens=1).tokens_per_decode == pytest.approx(1.8)
    assert glm.tokens_per_decode == 1


def test_constant_model_and_validation():
    assert ConstantStepTime(0.01, 0.001).step_seconds([(10, 0)], [5, 5]) == pytest.approx(0.022)
    with pytest.raises(DsakvError):
        ConstantStepTime(-1)
    with pytest.raises(DsakvError):
        gpu_kind("TPU")
    with pytest.raises(DsakvError):
        RooflineStepTime(CacheLayout(ModelSpec.preset("glm-5.3")), gemm_eff=0)


def test_roofline_prices_with_the_planner_gpu_catalogue():
    # One catalogue: the GPU kind that sizes the pool is the one whose speeds price the step.
    setup = build_setup(SimConfig(gpu=GpuSetting(gpu="b200")))
    assert setup.step_time.gpu is GPU_KINDS["B200"] is gpu_kind(setup.setting.gpu)
    assert setup.step_time.to_dict()["hbm_bytes_per_s"] == GPU_KINDS["B200"].hbm_bytes_per_s == 8e12
    assert setup.capacity.memory.total_bytes == GPU_KINDS["B200"].memory_bytes


@pytest.mark.parametrize("name", sorted(GPU_KINDS))
def test_every_gpu_kind_has_memory_and_speeds(name):
    kind = gpu_kind(name.lower())
    assert kind.name == name and kind.memory_bytes > 50 * 2**30
    assert 0 < kind.bf16_flops < kind.fp8_flops and kind.hbm_bytes_per_s > 1e12 and kind.link_bytes_per_s > 1e11


def test_unknown_gpu_has_one_wording_in_the_planner_and_the_step_time():
    wording = "gpu = 'A100': must be one of H100, H800, H200, H20, H20-3e, B200, B300, GB200, GB300, MI300X, MI355X"
    with pytest.raises(DsakvError) as planner_error:
        GpuSetting(gpu="A100")
    # A memory figure lets the planner run, but the roofline still needs the kind's speeds.
    with pytest.raises(DsakvError) as step_time_error:
        build_setup(SimConfig(gpu=GpuSetting(gpu="A100", gpu_memory_bytes=200 * 2**30)))
    assert str(planner_error.value) == str(step_time_error.value) == wording


def test_amd_peaks_are_computed_from_compute_units_and_clock():
    # The datasheet figures (MI300X 2614.9, MI355X 5033.2 dense FP8 TFLOP/s) follow from CUs x FLOP/clock x clock.
    assert GPU_KINDS["MI300X"].fp8_flops == pytest.approx(2614.9e12, rel=1e-4)
    assert GPU_KINDS["MI355X"].fp8_flops == pytest.approx(5033.2e12, rel=1e-4)
    assert all(GPU_KINDS[k].bf16_flops * 2 == GPU_KINDS[k].fp8_flops for k in ("MI300X", "MI355X"))


@given(st.lists(st.integers(1, 10_000), max_size=40), st.integers(1, 5000))
def test_clipped_sum_is_the_sum_of_clipped_values(values, cap):
    total, largest = sum(values), max(values, default=0)
    assert clipped_sum(values, total, largest, cap) == sum(min(v, cap) for v in values)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"num_speculative_tokens": 2},
        {"mla_padded_topk": True, "dp_attention": 2, "num_speculative_tokens": 3},
        {"num_speculative_tokens": 3, "mtp_index_share": True},
        {"gpu": GPU_KINDS["MI355X"], "mla_tilelang": True, "num_speculative_tokens": 2},  # fact 40's line
    ],
)
@given(st.lists(st.integers(1, 6000), max_size=24), st.integers(1, 200))
def test_decode_run_seconds_equal_the_steps_one_by_one(glm, options, contexts, steps):
    # Bit for bit: the analytic decode runs of the simulator (dsakv.sim.group) rely on it.
    model = RooflineStepTime(glm.layout, **options)
    run = model.run_seconds(contexts, steps)
    assert [float(t) for t in run] == [model.step_seconds([], [c + j for c in contexts]) for j in range(steps)]
    constant = ConstantStepTime(0.01, 0.001)
    assert list(constant.run_seconds(contexts, steps)) == [constant.step_seconds([], contexts)] * steps


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"num_speculative_tokens": 1},
        {"dp_attention": 2},
        {"num_speculative_tokens": 2, "mtp_index_share": True},
        {"gpu": GPU_KINDS["MI355X"], "mla_tilelang": True, "dp_attention": 2},
    ],
)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(-150, 300), min_size=1, max_size=3), st.integers(1, 60), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_saturated_decode_seconds_read_back_equal_the_steps_one_by_one(glm, options, runs):
    # Runs of decodes around top-k share one model, so later runs read steps an earlier one priced (and the
    # tables grow past them): those whose decodes all see their whole top-k, or of one decode (from below
    # top-k too), are read back; the others, whose context sums say less, never touch the tables. Bit for bit
    # the steps either way; dp passed or not.
    model = RooflineStepTime(glm.layout, **options)
    least = (1 + model.num_speculative_tokens) * model.layout.spec.index_topk
    for offsets, steps, with_dp in runs:
        contexts = [least + o for o in offsets] if len(offsets) > 1 else [1 + 10 * (offsets[0] + 150)]
        dp = (2 * len(contexts), 2 * len(contexts)) if with_dp else (None, None)
        run = model.run_seconds(contexts, steps, (), *dp)
        assert [float(t) for t in run] == [model.step_seconds([], [c + j for c in contexts], *dp) for j in range(steps)]


def test_saturated_decode_tables_stay_within_their_budget_and_price_past_it(glm, monkeypatch):
    # Contexts of a million tokens would need tables of millions of entries: past the budget a stretch is
    # priced, the same bits, and nothing is kept.
    monkeypatch.setattr(runs, "SATURATED_TABLE_ENTRIES", 50_000)
    model, topk = RooflineStepTime(glm.layout), glm.layout.spec.index_topk
    for contexts in ([topk] * 4, [topk + 3] * 4, [1_000_000] * 2, [topk] * 4):
        run = model.run_seconds(contexts, 20)
        assert [float(t) for t in run] == [model.step_seconds([], [c + j for c in contexts]) for j in range(20)]
        assert sum(t.size for t in model._saturated.values()) <= 50_000
    assert set(model._saturated) == {(4, None, None)}


def test_decodes_below_top_k_are_priced_as_they_are_after_saturated_ones_of_the_same_context_sum(glm):
    # The same count and context sums as a run already read into the tables, but half the decodes below top-k
    # (fewer sparse-MLA rows): priced as they are, not read back.
    model, topk = RooflineStepTime(glm.layout), glm.layout.spec.index_topk
    saturated, below = [topk] * 64, [topk - 500] * 32 + [topk + 500] * 32
    for contexts in (saturated, below):
        run = model.run_seconds(contexts, 40)
        assert [float(t) for t in run] == [model.step_seconds([], [c + j for c in contexts]) for j in range(40)]
    assert model.run_seconds(below, 40)[0] != model.run_seconds(saturated, 40)[0]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"mla_mixed_batch": True},
        {"mla_padded_topk": True, "dp_attention": 2},
        {"mla_dense_short_prefill": True},
        {"gpu": GPU_KINDS["MI355X"], "mla_tilelang": True, "mla_dense_short_prefill": True},
    ],
)
@given(
    st.lists(st.integers(1, 6000), max_size=8),
    st.lists(st.tuples(st.integers(2, 4096), st.integers(0, 9000)), min_size=1, max_size=12),
    st.integers(2, 4096),
    st.integers(0, 8),
    st.integers(1, 9000),
)
def test_run_seconds_with_chunks_equal_the_steps_one_by_one(glm, options, contexts, chunks, size, after, joining):
    # Stretches of equal chunk sizes, short (priced step by step) and long (as arrays), then the request they
    # prefilled decoding with the others: bit for bit either way.
    chunks = [(size, ctx) for _, ctx in chunks[: len(chunks) // 2]] + chunks[len(chunks) // 2 :]
    steps = len(chunks) + after
    batches = [([chunk], [c + j for c in contexts]) for j, chunk in enumerate(chunks)]
    batches += [([], [c + j for c in [*contexts, joining]]) for j in range(len(chunks), steps)]
    model = RooflineStepTime(glm.layout, **options)
    run = model.run_seconds(contexts, steps, chunks, joining=joining)
    assert [float(t) for t in run] == [model.step_seconds(*batch) for batch in batches]
    constant = ConstantStepTime(0.01, 0.001)
    assert list(constant.run_seconds(contexts, steps, chunks, joining=joining)) == [
        constant.step_seconds(prefill, contexts + [joining] * (not prefill)) for prefill, _ in batches
    ]
