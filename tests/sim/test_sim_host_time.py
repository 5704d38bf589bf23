"""The host's time where an engine exposes it (docs/steptime.md, Constants and Known gaps): speculative steps without
the overlap scheduler (SGLang's EAGLE V1), the host time each step exposes, derived from one published measurement
(sgl-project/sglang#15307) and priced once per step with decodes; and eager prefill forwards (SGLang on a DSA model),
whose kernel launches put a floor under every step with prefill tokens (sgl-project/sglang#12160). The SGLang rows of
the calibration files are replayed with both."""

from __future__ import annotations

import dataclasses
import datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsakv.cli import build_parser
from dsakv.cli.simulate import build_config
from dsakv.errors import DsakvError
from dsakv.planner.gpus import gpu_kind
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.steptime import RooflineStepTime
from dsakv.sim.steptime.figures import eagle_v1_host_seconds
from dsakv.sim.steptime.kernels import (
    EAGER_INDEXER_LAUNCHES,
    EAGER_INDEXER_SHORT_LAUNCHES,
    EAGER_LAYER_S,
    EAGLE_V1_SEND_ONE_ACCEPT_LENGTH,
    EAGLE_V1_SEND_ONE_PROMPT_TOKENS,
    EAGLE_V1_SEND_ONE_S,
    EAGLE_V1_SEND_ONE_TOKENS,
    INDEXER_KERNEL_CHAIN,
    INDEXER_SHORT_PREFILL_KERNEL_CHAIN,
    LAYER_KERNEL_CHAIN,
)
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


@pytest.fixture(scope="module")
def glm5():
    return CacheLayout(ModelSpec.preset("glm-5"), kv_dtype="bf16", mtp_layers=1)


def test_the_host_time_is_the_measured_step_less_the_rooflines_price_of_it():
    # sgl-project/sglang#15307: DeepSeek-V3.2 TP8, EAGLE V1, batch 1: 1,024 tokens in 7.922 s at accept length 2.960.
    step = 7.922 / (1024 / 2.960)
    assert (EAGLE_V1_SEND_ONE_S, EAGLE_V1_SEND_ONE_TOKENS, EAGLE_V1_SEND_ONE_ACCEPT_LENGTH) == (7.922, 1024, 2.960)
    layout = CacheLayout(ModelSpec.preset("deepseek-v3.2"), kv_dtype="bf16", mtp_layers=1)
    gpu_work = RooflineStepTime(layout, gpu_kind("H200"), tp=8, weight_dtype="fp8", num_speculative_tokens=3)
    context = EAGLE_V1_SEND_ONE_PROMPT_TOKENS + 512
    assert eagle_v1_host_seconds() == pytest.approx(step - gpu_work.step_seconds([], [context]), rel=1e-12)
    assert 5e-3 < eagle_v1_host_seconds() < 15e-3  # host milliseconds, not a GPU's step
    # The same GPU work priced on B200 (the measurement's GPU kind is not printed) moves it by under 2 %: SGLang of
    # that month (December 2025) decoded a DSA model on Blackwell from FlashMLA's rows, at the reference batch-1
    # layer (fact 14's exception, kernels.sglang_batch1_at_reference).
    b200 = dataclasses.replace(gpu_work, gpu=gpu_kind("B200"), batch1_at_reference=True)
    assert abs(b200.step_seconds([], [context]) / gpu_work.step_seconds([], [context]) - 1) < 0.02


def test_with_other_efficiencies_measured_step_is_still_gpu_work_plus_host(glm5):
    v1 = RooflineStepTime(glm5, tp=8, num_speculative_tokens=3, spec_overlap=False, bw_eff=0.5)
    layout = CacheLayout(ModelSpec.preset("deepseek-v3.2"), kv_dtype="bf16", mtp_layers=1)
    gpu_work = RooflineStepTime(layout, tp=8, weight_dtype="fp8", num_speculative_tokens=3, bw_eff=0.5)
    measured = EAGLE_V1_SEND_ONE_S / (EAGLE_V1_SEND_ONE_TOKENS / EAGLE_V1_SEND_ONE_ACCEPT_LENGTH)
    context = EAGLE_V1_SEND_ONE_PROMPT_TOKENS + 512
    assert v1.terms.spec_host_s + gpu_work.step_seconds([], [context]) == pytest.approx(measured, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    decode=st.lists(st.integers(1, 70_000), min_size=0, max_size=6),
    prefill=st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 20_000)), min_size=0, max_size=2),
    k=st.integers(0, 3),
)
def test_v1_adds_the_host_time_once_per_step_with_decodes(glm5, decode, prefill, k):
    overlapped = RooflineStepTime(glm5, tp=8, num_speculative_tokens=k)
    v1 = dataclasses.replace(overlapped, spec_overlap=False)
    with_host = bool(decode) and k > 0
    host = v1.terms.spec_host_s
    assert overlapped.terms.spec_host_s == 0.0 and host > 0
    cost, base = v1.cost(prefill, decode), overlapped.cost(prefill, decode)
    assert cost.total_seconds == pytest.approx(base.total_seconds + (host if with_host else 0.0), rel=1e-12)
    assert cost.seconds.get("spec_host", 0.0) == (host if with_host else 0.0)
    assert sum(cost.seconds.values()) == pytest.approx(cost.total_seconds, rel=1e-12)
    assert v1.step_seconds(prefill, decode) == cost.total_seconds


def test_a_run_priced_as_arrays_pays_the_host_time_per_step_bit_for_bit(glm5):
    v1 = RooflineStepTime(glm5, tp=8, num_speculative_tokens=3, spec_overlap=False)
    contexts, steps = [1000, 5000, 30_000], 40
    run = v1.run_seconds(contexts, steps)
    each = np.array([v1.step_seconds([], [c + j for c in contexts]) for j in range(steps)])
    assert np.array_equal(run, each)


def test_a_given_host_time_is_used_and_bad_values_are_one_line_errors(glm5):
    given_host = RooflineStepTime(glm5, num_speculative_tokens=2, spec_overlap=False, spec_host_s=1e-3)
    assert given_host.terms.spec_host_s == 1e-3
    assert given_host.to_dict()["spec_host_s"] == 1e-3 and given_host.to_dict()["spec_overlap"] is False
    with pytest.raises(DsakvError, match=r"step time spec_host_s = -1.0: must be >= 0"):
        RooflineStepTime(glm5, spec_host_s=-1.0)
    with pytest.raises(DsakvError, match=r"step time spec_overlap = 'no': must be True or False"):
        RooflineStepTime(glm5, spec_overlap="no")
    with pytest.raises(DsakvError, match=r"^spec_overlap = 0: must be True or False$"):
        SimConfig(spec_overlap=0)


def test_no_spec_overlap_flag_reaches_the_step_time():
    cfg, _ = build_config(build_parser().parse_args(["simulate", "--num-speculative-tokens", "2", "--no-spec-overlap"]))
    assert cfg.spec_overlap is False
    assert build_setup(cfg).step_time.spec_overlap is False
    default, _ = build_config(build_parser().parse_args(["simulate"]))
    assert default.spec_overlap is True


def test_sglang_mtp_rows_replay_without_the_overlap_scheduler(calibrate):
    row = {"id": "x-sgl-tp8", "engine": "sglang", "gpu": "H200", "gpus": "8", "dp": "1", "mtp": "3"}
    assert calibrate.engine_spec_overlap(row) is False
    assert calibrate.engine_spec_overlap({**row, "mtp": "0"}) is True
    assert calibrate.engine_spec_overlap({**row, "id": "x-vllm-tp8", "engine": "vllm"}) is True


def test_the_held_out_batch_1_mtp_rows_are_in_band(calibrate, repo_dir):
    # EAGLE 3 at concurrency 1: GLM-5 on B200 and H200, DeepSeek-V3.2-Exp on B200 (SGLang 0.5.6, EAGLE V1), in no file
    # the model was fitted or derived on.
    path = repo_dir / "bench" / "calibration"
    anchors = [a for a in calibrate.read_anchors(path / "heldout.csv") if a["id"].endswith("-mtp3-c1")]
    assert len(anchors) == 3
    for anchor in anchors:
        tpot = [r for r in calibrate.replay(anchor, path / "traces") if r.metric == "tpot_ms"]
        assert tpot and all(r.band_ok for r in tpot), [(r.id, r.ratio) for r in tpot]


def test_the_eager_floor_is_the_measured_forward_per_layer():
    # sgl-project/sglang#12160: DeepSeek-V3 (61 layers), one new token, "forward cost 82.64 ms" eager.
    assert EAGER_LAYER_S == pytest.approx(82.64e-3 / 61, rel=1e-12)
    layout = CacheLayout(ModelSpec.preset("deepseek-v3.2"), kv_dtype="bf16")
    # the measured model has no indexer: the DSA preset without it re-prices the measured step
    dense = RooflineStepTime(layout, tp=8, weight_dtype="fp8", prefill_graph=False, has_indexer=False)
    assert dense.step_seconds([(1, 1)], []) == pytest.approx(82.64e-3, rel=1e-12)
    # each of the 61 full indexer layers adds its chain's launches at the layer's cost per launch: the keys-only
    # chain (SGLang's _forward_cuda_k_only, 10 kernels of the layer's 20) within top-k, the whole chain (20) past it
    assert (len(INDEXER_SHORT_PREFILL_KERNEL_CHAIN), len(INDEXER_KERNEL_CHAIN), len(LAYER_KERNEL_CHAIN)) == (10, 20, 20)
    dsa = dataclasses.replace(dense, has_indexer=True)
    assert dsa.step_seconds([(1, 1)], []) == pytest.approx(82.64e-3 * 1.5, rel=1e-12)
    topk = dsa.rank.topk
    assert dsa.step_seconds([(1, topk - 1)], []) == pytest.approx(82.64e-3 * 1.5, rel=1e-12)  # topk keys: short
    assert dsa.step_seconds([(1, topk)], []) == pytest.approx(82.64e-3 * 2, rel=1e-12)  # topk + 1 keys: whole chain


@settings(max_examples=40, deadline=None)
@given(
    decode=st.lists(st.integers(1, 70_000), min_size=0, max_size=6),
    prefill=st.lists(st.tuples(st.integers(1, 16_384), st.integers(0, 20_000)), min_size=0, max_size=2),
)
def test_an_eager_prefill_step_takes_at_least_its_launches(glm5, decode, prefill):
    graphs = RooflineStepTime(glm5, tp=8)
    eager = dataclasses.replace(graphs, prefill_graph=False)
    assert graphs.terms.eager_layer_s == 0.0 and eager.terms.eager_layer_s == EAGER_LAYER_S
    base, cost = graphs.cost(prefill, decode), eager.cost(prefill, decode)
    short = all(ctx + n <= eager.rank.topk for n, ctx in prefill)
    indexer = EAGER_INDEXER_SHORT_LAUNCHES if short else EAGER_INDEXER_LAUNCHES
    floor = (eager.rank.layers + eager.rank.idx_layers * indexer) * EAGER_LAYER_S
    want = max(base.total_seconds, floor) if prefill else base.total_seconds
    assert cost.total_seconds == pytest.approx(want, rel=1e-12)
    assert cost.seconds.get("eager_launch", 0.0) == pytest.approx(want - base.total_seconds, abs=1e-15)
    assert sum(cost.seconds.values()) == pytest.approx(cost.total_seconds, rel=1e-12)
    assert eager.step_seconds(prefill, decode) == cost.total_seconds


@settings(max_examples=25, deadline=None)
@given(
    decode=st.lists(st.integers(1, 70_000), min_size=0, max_size=6),
    prefill=st.lists(st.tuples(st.integers(1, 16_384), st.integers(0, 20_000)), min_size=1, max_size=2),
)
def test_a_deepep_eager_prefill_pays_its_launches_on_top_of_its_gpu_work(glm5, decode, prefill):
    # Fact 35: DeepEP's normal dispatch makes the host wait for the GPU at every MoE layer (its CPU-side count
    # poll), so an eager prefill step's launches do not hide under the GPU's work: they add to it.
    graphs = RooflineStepTime(glm5, tp=8, ep=8, moe_a2a="deepep")
    eager = dataclasses.replace(graphs, prefill_graph=False)
    base, cost = graphs.cost(prefill, decode), eager.cost(prefill, decode)
    short = all(ctx + n <= eager.rank.topk for n, ctx in prefill)
    indexer = EAGER_INDEXER_SHORT_LAUNCHES if short else EAGER_INDEXER_LAUNCHES
    launches = (eager.rank.layers + eager.rank.idx_layers * indexer) * EAGER_LAYER_S
    assert cost.total_seconds == pytest.approx(base.total_seconds + launches, rel=1e-12)
    assert cost.seconds["eager_launch"] == pytest.approx(launches, rel=1e-12)
    assert eager.step_seconds(prefill, decode) == cost.total_seconds
    # a decode-only step replays its graph either way
    assert eager.step_seconds([], decode or [1]) == graphs.step_seconds([], decode or [1])


def test_a_run_with_chunks_priced_as_arrays_keeps_the_floor_bit_for_bit(glm5):
    eager = RooflineStepTime(glm5, tp=8, prefill_graph=False)
    contexts, steps, chunks = [1000, 3000], 12, [(64, 64 * j) for j in range(12)]
    run = eager.run_seconds(contexts, steps, chunks)
    each = np.array([eager.step_seconds([chunks[j]], [c + j for c in contexts]) for j in range(steps)])
    assert np.array_equal(run, each)
    assert (run >= (eager.rank.layers + eager.rank.idx_layers * EAGER_INDEXER_SHORT_LAUNCHES) * EAGER_LAYER_S).all()


def test_no_prefill_graph_flag_reaches_the_step_time_and_bad_values_are_one_line_errors(glm5):
    cfg, _ = build_config(build_parser().parse_args(["simulate", "--no-prefill-graph"]))
    assert cfg.prefill_graph is False and build_setup(cfg).step_time.prefill_graph is False
    with pytest.raises(DsakvError, match=r"step time eager_layer_s = -2.0: must be >= 0"):
        RooflineStepTime(glm5, eager_layer_s=-2.0)
    with pytest.raises(DsakvError, match=r"^prefill_graph = 1: must be True or False$"):
        SimConfig(prefill_graph=1)


def test_sglang_rows_replay_eager_prefill_and_vllm_rows_graphs(calibrate):
    row = {"id": "x-sgl-tp8", "engine": "sglang", "gpu": "H200", "gpus": "8", "dp": "1", "mtp": "0"}
    assert calibrate.engine_prefill_graph(row) is False
    assert calibrate.engine_prefill_graph({**row, "id": "x-vllm-tp8", "engine": "vllm"}) is True
    # sgl-project/sglang#23351 (2026-05-22) lets a DSA model's prefill run piecewise graphs, except under DP attention
    # or an all-to-all MoE backend.
    assert calibrate.engine_prefill_graph({**row, "version": "commit 947927bdb"}) is False
    assert calibrate.engine_prefill_graph({**row, "version": "v0.5.14"}) is True
    assert calibrate.engine_prefill_graph({**row, "version": "v0.5.14", "dp": "8"}) is False
    assert calibrate.engine_prefill_graph({**row, "version": "v0.5.14", "moe_a2a": "deepep"}) is False
    # A dense-MLA model (indexer 0) had them by default from 2026-03-02 (c64274c74): a build cut after that day replays
    # them (v0.5.12's cut is bounded below by its DeepSeek-V4 cherry-pick, and every later release's by it); a release
    # only dated by the day it was in use (0.5.9 by 2026-03-04, 0.5.10.post1, v0.5.7) cannot be placed and stays eager.
    dense = {**row, "indexer": "0"}
    for version, graphs in (
        ("v0.5.14", True), ("lmsysorg/sglang:v0.5.12-cu130", True), ("0.5.13.post1", True),
        ("0.5.9", False), ("lmsysorg/sglang:v0.5.9-cu130", False), ("0.5.10.post1", False),
        ("lmsysorg/sglang:v0.5.7-cu129-amd64", False), ("commit 947927bdb", False), ("main @ 09ca4fc", True), ("", False),
    ):  # fmt: skip
        assert calibrate.engine_prefill_graph({**dense, "version": version}) is graphs, version
    assert calibrate.engine_prefill_graph({**dense, "version": "v0.5.12", "dp": "8"}) is False
    assert calibrate.engine_prefill_graph({**dense, "version": "v0.5.12", "gpu": "MI355X"}) is False
    assert (
        calibrate.sglang_cut_no_earlier({**dense, "version": "v0.5.14"}) == calibrate.SGLANG_RELEASE_CUT_AFTER["0.5.12"]
    )
    assert calibrate.sglang_cut_no_earlier({**dense, "version": "main @ 09ca4fc"}) == datetime.date(2026, 6, 26)
