"""FlashMLA's sparse prefill kernel fills the GPU only with enough query rows (docs/steptime.md, fact 44): one CTA
(pair) a row's 64-head blocks, each looping over all of its top-k blocks, in whole waves of the GPU's SMs."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsakv.errors import DsakvError
from dsakv.planner.gpus import GPU_KINDS, gpu_kind
from dsakv.sim.steptime import RooflineStepTime
from dsakv.sim.steptime.kernels import prefill_kernel_waves
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


@given(st.integers(min_value=1, max_value=100_000), st.sampled_from(sorted({g.sm_count for g in GPU_KINDS.values()})))
def test_waves_are_whole_and_never_below_the_work(units, sms):
    waves = prefill_kernel_waves(units, sms)
    assert waves >= 1.0
    assert round(waves * units) % sms == 0  # whole waves of the GPU's SMs
    assert (waves - 1.0) * units < sms  # less than one wave more than the work


def test_no_rows_no_waves_and_one_row_takes_a_whole_wave():
    assert prefill_kernel_waves(0, 132) == 1.0
    assert prefill_kernel_waves(132, 132) == 1.0
    assert prefill_kernel_waves(1, 132) == 132.0
    assert prefill_kernel_waves(133, 132) == 264 / 133


def test_every_gpu_kind_has_its_sms_and_a_kind_without_is_refused():
    assert {name: g.sm_count for name, g in GPU_KINDS.items()} == {
        "H100": 132, "H800": 132, "H200": 132, "H20": 78, "H20-3e": 78, "B200": 148, "B300": 160,
        "GB200": 152, "GB300": 160, "MI300X": 304, "MI355X": 256,
    }  # fmt: skip
    with pytest.raises(DsakvError, match=r"^gpu 'H200': sm_count = 0: must be at least 1"):
        dataclasses.replace(gpu_kind("H200"), sm_count=0)


def test_one_decode_in_the_prefill_kernel_takes_one_sms_time_as_vllms_hopper_run_shows():
    # vllm-project/vllm#46189 (2026-06-19): GLM-5.1-FP8, vLLM TP 8 on Hopper, bf16 cache, batch 1, 512 in / 512 out:
    # TPOT 19.318 ms with FlashMLA's sparse prefill kernel for every query (8 heads padded to 64), 14.767 ms with FA3's
    # split-key decode. One query row is one CTA: 2,048 slots x 64 heads at one SM's share of the published rate, on
    # each of GLM-5's 78 layers; the TPOT difference (FlashMLA's time less FA3's) bounds it from below.
    lay = CacheLayout(ModelSpec.preset("glm-5"), kv_dtype="bf16")
    h200 = gpu_kind("H200")
    model = RooflineStepTime(lay, h200, mla_prefill_kernel_all=True, mla_padded_topk=True)
    row_flops = 2048 * 64 * 2 * (512 + 64 + 512)
    one_sm = row_flops / (h200.bf16_flops / h200.sm_count * model.terms.mla_prefill_eff)
    priced = model.cost([], [768]).seconds["sparse_mla"]  # the run's mean context, below top-k: compute-bound
    assert priced == pytest.approx(lay.num_attention_layers * one_sm)
    assert (19.318 - 14.767) * 1e-3 <= priced <= 1.05 * (19.318 - 14.767) * 1e-3
    # 132 decodes fill one wave: each the same time, the step no longer than one decode's
    assert model.cost([], [768] * 132).seconds["sparse_mla"] == pytest.approx(priced)


def test_the_decode_kernels_and_large_prefills_keep_their_rate():
    lay = CacheLayout(ModelSpec.preset("glm-5"), kv_dtype="bf16")
    sglang = RooflineStepTime(lay, gpu_kind("H200"))  # decodes in a split-key kernel: no waves
    one, many = sglang.cost([], [4096]).seconds["sparse_mla"], sglang.cost([], [4096] * 100).seconds["sparse_mla"]
    assert many == pytest.approx(100 * one)
    h200 = gpu_kind("H200")
    vllm = RooflineStepTime(lay, h200, mla_prefill_kernel_all=True, mla_padded_topk=True)
    n, layers = 132 * 16, lay.num_attention_layers  # 16 whole waves: the work at the whole GPU's rate
    compute = layers * n * 2048 * 64 * 2 * (512 + 64 + 512) / (h200.bf16_flops * vllm.terms.mla_prefill_eff)
    rows = sum(min(i, 2048) for i in range(1, n + 1))  # each query's own rows
    read = layers * rows * lay.main_row_bytes / (h200.hbm_bytes_per_s * vllm.bw_eff)
    assert vllm.cost([(n, 0)], []).seconds["sparse_mla"] == pytest.approx(max(compute, read))
