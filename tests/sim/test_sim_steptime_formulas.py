"""The step-time formulas of docs/steptime.md: each engine knob changes the step the way the docs say."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.planner.gpus import gpu_kind
from dsakv.planner.weights import weight_parts
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.steptime import (
    RooflineStepTime,
    sglang_aiter,
    sglang_tilelang,
    sglang_trtllm_gen_decode,
    sglang_trtllm_moe,
    tilelang_mla_heads,
    trtllm_gen_mla_heads,
)
from dsakv.sim.steptime.figures import (
    alignment_rows,
    batch1_head_stream_eff,
    batch1_heads_seconds,
    batch1_layer_seconds,
    head_weight_bytes,
    normal_dispatch_ranks,
)
from dsakv.sim.steptime.kernels import (
    AITER_FMOE_MI355X_GLM5_TP8_US,
    AITER_GEMM_DENSE_EFF,
    AITER_GEMM_FIXED_S,
    AITER_GEMM_MI355X_GLM5_TP8_US,
    AITER_GEMM_STREAM_EFF,
    AITER_MOE_COMPUTE_EFF,
    AITER_MOE_STREAM_EFF,
    BATCH1_LAYER_S,
    GEMM_FIXED_S,
    GEMM_STREAM_EFF,
    INDEXER_KERNEL_CHAIN,
    KIMI_K2_GPU,
    LAYER_KERNEL_CHAIN,
    TILELANG_DECODE_FIXED_S,
    TILELANG_DECODE_MI355X_US,
    TILELANG_DECODE_STREAM_EFF,
    TILELANG_PREFILL_MI355X_MS,
    TILELANG_PREFILL_SLOT_S,
    TRTLLM_MOE_B300_MXFP8_MS,
    TRTLLM_MOE_STREAM_EFF,
    chain_fixed_seconds,
    sglang_batch1_at_reference,
    triton_moe_slice_factor,
    vllm_deep_gemm_moe_min_tokens,
)
from dsakv.sim.steptime.runs import run_stretch
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from tests.sim.moe_reference import fused_moe_activation_bytes, moe_layers, segment_padding_rows


@pytest.fixture(scope="module")
def glm52():
    return CacheLayout(ModelSpec.preset("glm-5.2"))


def test_weight_dtype_flag_reaches_the_step_time(glm52):
    # The glm-5.2 preset is a bf16 checkpoint; --weight-dtype fp8 halves the expert bytes a decode reads.
    bf16 = build_setup(SimConfig(model="glm-5.2", pool_tokens=1 << 16)).step_time
    fp8 = build_setup(SimConfig(model="glm-5.2", gpu=GpuSetting(weight_dtype="fp8"))).step_time
    assert fp8.weight_dtype == "fp8"
    a, b = bf16.cost([], [4096] * 32), fp8.cost([], [4096] * 32)
    act_a, act_b = (sum(fused_moe_activation_bytes(m, 32, moe_layers(m))) for m in (bf16, fp8))
    assert act_b < act_a  # fp8 inputs to the GEMMs (fact 43)
    assert b.bytes["moe"] - act_b == pytest.approx((a.bytes["moe"] - act_a) / 2, rel=1e-3)  # + fp8 block scales
    assert b.total_seconds < 0.75 * a.total_seconds


def test_dp_attention_prices_the_moe_with_every_group_tokens(glm52):
    dp = RooflineStepTime(glm52, dp_attention=8)
    tp = RooflineStepTime(glm52)
    a, b = dp.cost([], [4096] * 13), tp.cost([], [4096] * 13 * 8)
    assert a.flops["moe"] == pytest.approx(b.flops["moe"])
    assert a.bytes["moe"] == pytest.approx(b.bytes["moe"])  # 104 tokens touch ~96% of the experts, not 34%
    assert a.bytes["moe"] / dp.rank.linear.expert_bytes > 0.9


def test_uneven_dp_groups_price_the_moe_with_the_sum_of_their_tokens(glm52):
    # Two DP groups with 1 and 12 decodes: the MoE reads the experts 13 tokens touch, 1 - (1 - k/E)^13 of them,
    # and computes 13 tokens' top-k; attention stays each group's own. Not 2 x 12 = 24 (dp x the largest batch).
    st = RooflineStepTime(glm52, dp_attention=2)
    c, k_over_e = st.rank.linear, 8 / 256
    small, large = [4096], [4096] * 12
    layers = moe_layers(st)
    for decode in (small, large):
        cost = st.cost([], decode, dp_tokens=13, dp_decodes=13)
        assert cost.flops["moe"] == pytest.approx(13 * c.expert_flops_per_token)
        act = sum(fused_moe_activation_bytes(st, 13, layers))  # 13 tokens' activations (fact 43)
        assert cost.bytes["moe"] == pytest.approx(c.expert_bytes * (1 - (1 - k_over_e) ** 13) + act)
        assert cost.flops["sparse_mla"] == st.cost([], decode).flops["sparse_mla"]  # the group's own queries
    balanced = st.cost([], large)  # no sum given: 12 x 2 tokens, the balanced assumption
    act = sum(fused_moe_activation_bytes(st, 24, layers))
    assert balanced.bytes["moe"] == pytest.approx(c.expert_bytes * (1 - (1 - k_over_e) ** 24) + act)
    step = max(st.step_seconds([], d, 13, 13) for d in (small, large))
    assert step == st.step_seconds([], large, 13, 13) < balanced.total_seconds


def test_sparse_mla_heads_are_padded_to_the_kernel_block(glm52):
    # GLM: 64 heads / TP8 = 8 per rank, padded to 64 on Hopper and 128 on Blackwell.
    per_head = 2 * (512 + 64 + 512)
    assert RooflineStepTime(glm52).rank.mla_flops_per_pair == 64 * per_head
    assert RooflineStepTime(glm52, gpu=gpu_kind("B200")).rank.mla_flops_per_pair == 128 * per_head


@pytest.mark.parametrize(
    "heads, tile", [(1, 8), (4, 8), (8, 8), (12, 16), (16, 16), (24, 32), (32, 32), (48, 64), (64, 64), (128, 128)]
)
def test_trtllm_gen_tiles_a_rank_heads_not_flashmla_blocks(heads, tile):
    # FlashInfer's selectSparseMlaGenerationKernel: up to 32 heads one swapped-AB tile of the head count (at least 8,
    # a power of two), above 32 tiles of 64.
    assert trtllm_gen_mla_heads(heads) == tile


def test_trtllm_gen_decode_computes_the_rank_heads_only(glm52):
    # SGLang's trtllm decode backend on B200: GLM-5.2's 8 heads a rank in an 8-head tile, not FlashMLA's 128 block;
    # prefill keeps its kernel's block, and the rows read are the same.
    per_head = 2 * (512 + 64 + 512)
    b200 = gpu_kind("B200")
    flashmla = RooflineStepTime(glm52, gpu=b200)
    trtllm = RooflineStepTime(glm52, gpu=b200, mla_decode_trtllm_gen=True)
    assert trtllm.rank.mla_decode_flops_per_pair == 8 * per_head
    assert trtllm.rank.mla_flops_per_pair == flashmla.rank.mla_flops_per_pair == 128 * per_head
    decode = [9000] * 16  # each decode attends to its top-k 2048 keys
    a, b = flashmla.cost([], decode), trtllm.cost([], decode)
    layers = glm52.num_attention_layers
    assert a.flops["sparse_mla"] == layers * 16 * 2048 * 128 * per_head
    assert b.flops["sparse_mla"] == layers * 16 * 2048 * 8 * per_head
    assert a.bytes["sparse_mla"] == b.bytes["sparse_mla"]
    # at 8 heads the rows' bytes bind: the sparse MLA takes its bytes' time, a 16th of the compute priced before
    assert b.seconds["sparse_mla"] == pytest.approx(b.bytes["sparse_mla"] / (b200.hbm_bytes_per_s * trtllm.bw_eff))
    assert b.seconds["sparse_mla"] < a.seconds["sparse_mla"] / 4
    pf = [(2048, 4096)]  # a prefill chunk beyond top-k: FlashMLA's sparse prefill either way
    assert trtllm.cost(pf, []).flops["sparse_mla"] == flashmla.cost(pf, []).flops["sparse_mla"]
    with pytest.raises(DsakvError, match="mla_decode_trtllm_gen: .*Blackwell only; gpu H200 is hopper"):
        RooflineStepTime(glm52, mla_decode_trtllm_gen=True)


@pytest.mark.parametrize(
    "kv, gpu, policy, trtllm",
    [
        ("fp8", "B200", "prefill_first", True),  # SGLang's 576-byte fp8 rows: the trtllm backend's own format
        ("bf16", "B300", "prefill_first", True),  # bf16 on SM >= 10: decode backend trtllm
        ("fp8_ds_mla", "B200", "prefill_first", False),  # FlashMLA's 656-byte rows: flashmla_kv
        ("bf16", "H200", "prefill_first", False),  # Hopper: FA3 / FlashMLA
        ("fp8", "B200", "mixed", False),  # vLLM's FlashMLA-sparse backend
    ],
)
def test_sglang_decodes_in_trtllm_gen_on_blackwell_with_its_own_rows(kv, gpu, policy, trtllm):
    cfg = SimConfig(model="glm-5.2", gpu=GpuSetting(gpu=gpu), kv_dtype=kv, schedule_policy=policy, pool_tokens=1 << 16)
    assert build_setup(cfg).step_time.mla_decode_trtllm_gen is trtllm
    layout = CacheLayout(ModelSpec.preset("glm-5.2"), kv_dtype=kv)
    assert sglang_trtllm_gen_decode(layout, gpu_kind(gpu).arch, policy) is trtllm


@pytest.mark.parametrize(
    "heads, tile", [(1, 16), (8, 16), (16, 16), (24, 32), (32, 32), (48, 64), (64, 64), (128, 128)]
)
def test_tilelang_tiles_a_rank_heads_in_sixteen_rows_at_least(heads, tile):
    # SGLang's TileLang sparse-MLA kernels: padded_H = max(next_power_of_2(heads), 16) up to 64 heads, whole tiles of
    # 64 above (REPLICATE_H).
    assert tilelang_mla_heads(heads) == tile


def test_tilelangs_decode_line_is_the_least_squares_line_of_its_mi355x_timings():
    # Fact 40: sgl-project/sglang#39106's TileLang decode timings on MI355X (16 heads, 576-byte rows, top-k 2,048),
    # refitted here with the normal equations against each row count's bytes: 2,048 rows of 576 bytes a query.
    pts = [(n * 2048 * 576, us / 1e6) for n, us in TILELANG_DECODE_MI355X_US]
    slope = _normal_equations_slope(pts)
    fixed = sum(t for _, t in pts) / len(pts) - slope * sum(b for b, _ in pts) / len(pts)
    rate = 1 / slope / gpu_kind("MI355X").hbm_bytes_per_s
    assert (TILELANG_DECODE_FIXED_S, TILELANG_DECODE_STREAM_EFF) == pytest.approx((fixed, rate))
    assert (round(TILELANG_DECODE_FIXED_S * 1e6, 2), round(TILELANG_DECODE_STREAM_EFF, 3)) == (20.73, 0.422)
    # one line holds from 4 to 512 queries: every timing within 2 us of it
    assert all(abs(fixed + b * slope - t) < 2e-6 for b, t in pts)


def test_tilelangs_prefill_slot_time_is_its_mi355x_timing_of_an_8148_token_chunk():
    # Fact 41: sgl-project/sglang#37847 timed TileLang's prefill (the same partial kernel) on MI355X: 8,148 query rows,
    # top-k 2,048, 576-byte fp8 rows, at 4 / 8 / 12 / 16 heads (one 16-row tile: within 3 % of their mean).
    times = [ms / 1e3 for _, ms in TILELANG_PREFILL_MI355X_MS]
    mean = sum(times) / 4
    assert all(abs(t / mean - 1) < 0.03 for t in times)
    assert TILELANG_PREFILL_SLOT_S == pytest.approx(mean / (8148 * 2048))
    assert round(TILELANG_PREFILL_SLOT_S * 1e12, 1) == 136.3  # ps a (query row, top-k slot)
    # less a slot than the decode line's slope, 576 bytes at its rate: a chunk fills the GPU with one group a row
    assert TILELANG_PREFILL_SLOT_S < 576 / (gpu_kind("MI355X").hbm_bytes_per_s * TILELANG_DECODE_STREAM_EFF)


@pytest.mark.parametrize(
    "kv, gpu, policy, tilelang",
    [
        ("bf16", "MI355X", "prefill_first", True),  # ROCm's default cache: gfx950 reports SM 9.5
        ("fp8", "MI355X", "prefill_first", True),  # --kv-cache-dtype fp8_e4m3: the 576-byte fp8 partial kernel
        ("fp8_ds_mla", "MI355X", "prefill_first", False),  # FlashMLA's rows: not a ROCm format
        ("bf16", "MI300X", "prefill_first", False),  # CDNA 3: other tiles (32 slots for bf16), no timing
        ("bf16", "MI355X", "mixed", False),  # vLLM on ROCm: not modelled
        ("bf16", "H200", "prefill_first", False),
    ],
)
def test_sglang_runs_its_sparse_mla_in_tilelang_on_cdna4(kv, gpu, policy, tilelang):
    cfg = SimConfig(model="glm-5.2", gpu=GpuSetting(gpu=gpu), kv_dtype=kv, schedule_policy=policy, pool_tokens=1 << 16)
    assert build_setup(cfg).step_time.mla_tilelang is tilelang
    layout = CacheLayout(ModelSpec.preset("glm-5.2"), kv_dtype=kv)
    assert sglang_tilelang(layout, gpu_kind(gpu).arch, policy) is tilelang


def test_tilelang_prices_decode_at_its_line_and_prefill_at_its_slot_time(glm52):
    # Fact 40: on MI355X a decode step's sparse MLA is, per attention layer, the line's fixed part (less the one graph
    # node the layer chain prices for the sparse MLA) plus the rows' bytes at TILELANG_DECODE_STREAM_EFF of HBM; fact
    # 41: a prefill's is every top-k slot of its tokens, masked ones included, at TILELANG_PREFILL_SLOT_S each, whatever
    # its rows' bytes. The bytes reported are as before, the FLOPs at a 16-row head tile.
    mi355x = gpu_kind("MI355X")
    tl = RooflineStepTime(glm52, gpu=mi355x, mla_tilelang=True)
    base = RooflineStepTime(glm52, gpu=mi355x)
    layers, row = glm52.num_attention_layers, glm52.main_row_bytes
    fixed = TILELANG_DECODE_FIXED_S - mi355x.kernel_node_s
    rate = mi355x.hbm_bytes_per_s * TILELANG_DECODE_STREAM_EFF
    per_head = 2 * (512 + 64 + 512)
    for decodes in (1, 16, 256):
        on, off = tl.cost([], [9000] * decodes), base.cost([], [9000] * decodes)  # each its whole top-k 2,048
        assert on.bytes["sparse_mla"] == off.bytes["sparse_mla"] == layers * decodes * 2048 * row
        assert on.seconds["sparse_mla"] == pytest.approx(layers * fixed + on.bytes["sparse_mla"] / rate)
        assert on.seconds["sparse_mla"] > off.seconds["sparse_mla"]  # 0.42 of HBM and a fixed part, against 0.60
        assert on.flops["sparse_mla"] == layers * decodes * 2048 * 16 * per_head
    for pf in ([(4096, 4096)], [(4096, 0)]):  # beyond top-k from its first token, and a fresh prompt (masked slots)
        pf_on, pf_off = tl.cost(pf, []), base.cost(pf, [])
        assert pf_on.bytes["sparse_mla"] == pf_off.bytes["sparse_mla"]
        assert pf_on.seconds["sparse_mla"] == pytest.approx(layers * 4096 * 2048 * TILELANG_PREFILL_SLOT_S)
        assert pf_on.seconds["sparse_mla"] > pf_off.seconds["sparse_mla"]  # FlashMLA's Hopper rate was the lower bound
        assert pf_on.flops["sparse_mla"] == layers * 4096 * 2048 * 16 * per_head  # 16 rows, not FlashMLA's 64
    fp8 = RooflineStepTime(CacheLayout(ModelSpec.preset("glm-5.2"), kv_dtype="fp8"), gpu=mi355x, mla_tilelang=True)
    assert fp8.cost(pf, []).seconds["sparse_mla"] == pytest.approx(pf_on.seconds["sparse_mla"])  # a slot's time
    pf = [(4096, 4096)]
    # a step that prefills and decodes: the prefill's part, the decodes' call added to it
    both, only_pf = tl.cost(pf, [9000] * 16), tl.cost(pf, [])
    dec_bytes = layers * 16 * 2048 * row
    assert both.seconds["sparse_mla"] == pytest.approx(
        only_pf.seconds["sparse_mla"] + layers * fixed + dec_bytes / rate
    )
    # the draft passes decode in the same kernel: one layer's call a pass
    k3 = dict(gpu=mi355x, num_speculative_tokens=3, mtp_index_share=True)
    m_on, m_off = RooflineStepTime(glm52, mla_tilelang=True, **k3), RooflineStepTime(glm52, **k3)
    n = 256  # enough rows that the passes' layer is past the batch-1 minimum either way
    args = (n, n, n * 9000, n * 2048, max)
    line = fixed + n * 2048 * row / rate
    flashmla = max(
        n * 2048 * m_off.rank.mla_decode_flops_per_pair / m_off.rank.draft_mla_rate, n * 2048 * row / m_off.rank.bw
    )
    assert m_on._draft_seconds(*args) - m_off._draft_seconds(*args) == pytest.approx(2 * (line - flashmla))
    # the step prices a run the same, bit for bit
    contexts = [9000 + 7 * i for i in range(16)]
    run = run_stretch(tl, contexts, 0, 6, (), (None, None))
    assert list(run) == [tl.step_seconds([], [c + j for c in contexts]) for j in range(6)]
    # a dense-MLA model (DeepSeek-R1 / V3 through the DSA preset) is not served by the DSA backend's kernels: the switch
    # changes nothing there, prefill, decode or draft passes
    k3 = dict(gpu=mi355x, num_speculative_tokens=3, has_indexer=False)
    dense_on, dense_off = RooflineStepTime(glm52, mla_tilelang=True, **k3), RooflineStepTime(glm52, **k3)
    for step in (([(4096, 0)], []), ([], [9000] * 16), ([(512, 9000)], [9000] * 16)):
        assert dense_on.cost(*step).seconds == dense_off.cost(*step).seconds
    with pytest.raises(DsakvError, match=r"^step time mla_tilelang: .*CDNA 4 \(MI355X\) only; gpu H200 is hopper$"):
        RooflineStepTime(glm52, mla_tilelang=True)
    with pytest.raises(DsakvError, match=r"^step time mla_tilelang: .*vLLM's kernel modes"):
        RooflineStepTime(glm52, gpu=mi355x, mla_tilelang=True, mla_mixed_batch=True)
    with pytest.raises(DsakvError, match=r"^step time mla_tilelang = 1: must be True or False$"):
        RooflineStepTime(glm52, gpu=mi355x, mla_tilelang=1)


def test_collectives_pay_a_latency_per_collective(glm52):
    st = RooflineStepTime(glm52)
    layers = glm52.num_attention_layers
    c = st.cost([], [4096])
    bytes_s = c.bytes["collectives"] / (st.gpu.link_bytes_per_s * st.link_eff)
    assert c.seconds["collectives"] == pytest.approx(bytes_s + 2 * layers * st.gpu.link_latency_s)


def test_ep_all_to_all_replaces_the_moe_all_reduce(glm52):
    tp, ep = RooflineStepTime(glm52), RooflineStepTime(glm52, ep=8, moe_a2a="deepep")
    layers, hidden, k, tokens = glm52.num_attention_layers, 6144, 8, 64
    a, b = tp.cost([], [4096] * tokens), ep.cost([], [4096] * tokens)
    attn_ar = layers * tokens * hidden * 2 * 2 * 7 / 8  # attention all-reduce, both
    assert a.bytes["collectives"] == pytest.approx(2 * attn_ar)
    per_rank = tokens / 8  # DeepEP: each rank sends its own tokens' top-k copies, fp8 out and bf16 back
    dense = glm52.spec.arch_value("first_k_dense_replace")  # 3 dense layers keep the MLP all-reduce
    a2a = (layers - dense) * per_rank * k * hidden * 3 * 7 / 8
    assert b.bytes["collectives"] == pytest.approx(attn_ar + a2a + dense * tokens * hidden * 2 * 2 * 7 / 8)
    # --ep without DeepEP moves whole experts to ranks: the same expert bytes a rank, but a rank computes only its own
    # experts' (token, expert) pairs, 1 / ep of the TP MoE's, so its activations move less (fact 43)
    moved = RooflineStepTime(glm52, ep=8)
    prefill = [(4096, 0)]
    for model, step in ((tp, tp.cost(prefill, [])), (moved, moved.cost(prefill, []))):
        act = fused_moe_activation_bytes(model, 4096, moe_layers(model))
        assert step.bytes["moe"] - sum(act) == pytest.approx(tp.rank.linear.expert_bytes)
    tp_act, ep_act = (sum(fused_moe_activation_bytes(m, 4096, 1)) for m in (tp, moved))
    assert ep_act < tp_act / 3
    assert moved.cost(prefill, []).seconds["moe"] < tp.cost(prefill, []).seconds["moe"]


def _ranks_reached_by_enumeration(experts, topk, n_group, topk_group, ep):
    # the reference: every choice of groups, then every choice of top-k experts among them, equally likely
    per_group, per_rank = experts // n_group, experts // ep
    total = count = 0
    for groups in itertools.combinations(range(n_group), topk_group):
        pool = [e for g in groups for e in range(g * per_group, (g + 1) * per_group)]
        for chosen in itertools.combinations(pool, topk):
            total += len({e // per_rank for e in chosen})
            count += 1
    return total / count


@pytest.mark.parametrize(
    "experts, topk, n_group, topk_group, ep",
    [(8, 2, 1, 1, 4), (12, 3, 1, 1, 3), (16, 3, 4, 2, 8), (16, 4, 4, 2, 2), (24, 2, 6, 3, 2), (16, 2, 8, 4, 4)],
)
def test_normal_dispatch_reaches_each_rank_holding_one_of_the_tokens_experts(experts, topk, n_group, topk_group, ep):
    # DeepEP's normal mode sends a token once per rank that holds one of its experts (is_token_in_rank)
    got = normal_dispatch_ranks(experts, topk, n_group, topk_group, ep)
    assert got == pytest.approx(_ranks_reached_by_enumeration(experts, topk, n_group, topk_group, ep), rel=1e-12)


def test_deepep_prefill_dispatches_once_per_rank_and_decode_once_per_expert(glm52):
    # Fact 35: GLM-5.2 routes 8 of 256 experts without groups; at EP 8 a token reaches 4.63 other ranks on an extend
    # step (normal mode), 7 x 8 / 8 = 7 copies on a decode step (low-latency mode, one per expert).
    st = RooflineStepTime(glm52, tp=8, ep=8, moe_a2a="deepep")
    other = (8 - 1) * (1 - math.comb(256 - 32, 8) / math.comb(256, 8))
    assert st.rank.dispatch_copies == pytest.approx(other) == pytest.approx(4.633, abs=1e-3)
    layers, hidden, tokens = glm52.num_attention_layers, 6144, 4096
    dense = glm52.spec.arch_value("first_k_dense_replace")
    attn_ar = layers * tokens * hidden * 2 * 2 * 7 / 8
    dense_ar = dense * tokens * hidden * 2 * 2 * 7 / 8
    c = st.cost([(tokens, 0)], [])
    per_rank = tokens / 8  # without DP attention each TP rank dispatches an eighth of the tokens
    assert c.bytes["collectives"] == pytest.approx(
        attn_ar + dense_ar + (layers - dense) * per_rank * other * hidden * 3
    )
    d = st.cost([], [4096] * 64)
    per_expert = (layers - dense) * 64 / 8 * 8 * hidden * 3 * 7 / 8
    assert d.bytes["collectives"] == pytest.approx(64 / tokens * (attn_ar + dense_ar) + per_expert)
    # group-limited routing (DeepSeek-V3: 4 of 8 groups, a group a rank at EP 8) reaches fewer ranks
    ds = RooflineStepTime(CacheLayout(ModelSpec.preset("deepseek-v3.2")), tp=8, ep=8, moe_a2a="deepep")
    assert ds.rank.dispatch_copies == pytest.approx(7 * 4 / 8 * (1 - math.comb(128 - 32, 8) / math.comb(128, 8)))
    with pytest.raises(DsakvError, match=r"^moe_a2a deepep: n_routed_experts = 256, n_group = 1, ep = 3: "):
        normal_dispatch_ranks(256, 8, 1, 1, 3)


def test_deepep_under_dp_attention_gathers_only_the_dense_layers(glm52):
    # SGLang's LayerCommunicator keeps a MoE layer's tokens scattered when an all-to-all backend is set (DeepEP
    # dispatches them); only the first_k_dense_replace dense layers gather every DP group's tokens and scatter back.
    st = RooflineStepTime(glm52, dp_attention=8, ep=8, moe_a2a="deepep")
    layers, hidden, k, tokens = glm52.num_attention_layers, 6144, 8, 16
    dense = glm52.spec.arch_value("first_k_dense_replace")
    c = st.cost([], [4096] * tokens)  # attention TP 1: no attention all-reduce; 8 x 16 tokens reach the MLPs
    gather = dense * 8 * tokens * hidden * 2 * 2 * 7 / 8
    a2a = (layers - dense) * tokens * k * hidden * 3 * 7 / 8
    assert c.bytes["collectives"] == pytest.approx(gather + a2a)
    assert c.seconds["collectives"] == pytest.approx(
        c.bytes["collectives"] / (st.gpu.link_bytes_per_s * st.link_eff)
        + (2 * dense + 2 * (layers - dense)) * st.gpu.link_latency_s
    )


def test_deepep_runs_whole_shared_experts_on_the_rank_own_tokens(glm52):
    # Under DeepEP SGLang's shared experts are whole on every rank (tp_size=1) and forward_deepep runs them on the
    # rank's own tokens: under DP8 attention a decode step reads all of them (7/8 more bytes than the TP slice the
    # all-reduce MoE reads) for the same FLOPs (the whole expert on 16 tokens = an eighth of it on 8 x 16).
    shared = {p.name: p for p in weight_parts(glm52.spec, 0)}["shared experts"]
    tp = RooflineStepTime(glm52, dp_attention=8, ep=8)
    a2a = RooflineStepTime(glm52, dp_attention=8, ep=8, moe_a2a="deepep")
    a, b = tp.cost([], [4096] * 16), a2a.cost([], [4096] * 16)
    assert b.bytes["linear"] - a.bytes["linear"] == pytest.approx(shared.bytes * 7 / 8)
    assert b.flops["linear"] == pytest.approx(a.flops["linear"])
    # without DP attention a rank's own tokens are every token: the same FLOPs, the whole weights still read
    c, d = RooflineStepTime(glm52, ep=8).cost([], [4096] * 16), RooflineStepTime(glm52, ep=8, moe_a2a="deepep")
    assert d.cost([], [4096] * 16).bytes["linear"] - c.bytes["linear"] == pytest.approx(shared.bytes * 7 / 8)


def test_deepep_experts_stream_at_deepgemms_decode_gemm_rate(glm52):
    # Fact 35: under DeepEP SGLang runs each rank's whole experts in DeepGEMM's grouped GEMMs, whose weights stream
    # at the rate DeepGEMM publishes for decode-size GEMMs (GEMM_STREAM_EFF); the fused MoE without an all-to-all
    # keeps the fitted bw_eff, scaled for its slice of an expert (fact 51: whole experts here, ep = tp).
    tp = RooflineStepTime(glm52, dp_attention=8, ep=8)
    a2a = RooflineStepTime(glm52, dp_attention=8, ep=8, moe_a2a="deepep")
    hbm = tp.gpu.hbm_bytes_per_s
    whole = glm52.spec.arch_value("moe_intermediate_size")
    assert tp.rank.expert_bw == pytest.approx(hbm * tp.bw_eff * triton_moe_slice_factor(whole))
    assert a2a.rank.expert_bw == pytest.approx(hbm * GEMM_STREAM_EFF) and GEMM_STREAM_EFF > a2a.bw_eff
    weights = []
    for st in (tp, a2a):
        c = st.cost([], [4096] * 16)  # 128 tokens reach the MoE: every expert byte-bound
        gemm_act, kernel_act = fused_moe_activation_bytes(st, 128, moe_layers(st))
        weights.append(c.bytes["moe"] - gemm_act - kernel_act)
        assert c.seconds["moe"] == pytest.approx(weights[-1] / st.rank.expert_bw + (gemm_act + kernel_act) / st.rank.bw)
        assert c.seconds["moe"] > c.flops["moe"] / st.rank.moe_rate
    assert weights[1] == pytest.approx(weights[0])  # the same experts' weights; DeepEP's own activations (fact 43)


def test_vllm_runs_its_tensor_parallel_experts_in_triton_unless_deepgemm_is_switched_on(glm52):
    # Fact 36: vLLM's fp8 block-quantised MoE on Hopper under tensor parallelism runs Triton's fused MoE at every step
    # size (v0.13.0: DeepGEMM's MoE off at TP >= 8 unless VLLM_MOE_USE_DEEP_GEMM is set; the oracle of v0.18.0:
    # Triton first without expert parallelism); with the switch set, DeepGEMM at every step size (E8M0 on SM90).
    assert vllm_deep_gemm_moe_min_tokens("hopper", "mixed", "fp8", True) == 1
    for args in (
        ("hopper", "mixed", "fp8", False),  # vLLM's default: Triton
        ("hopper", "prefill_first", "fp8", True),  # SGLang: Triton under the all-reduce
        ("hopper", "mixed", "bf16", True),  # DeepGEMM's grouped GEMMs take fp8 block weights
        ("blackwell", "mixed", "fp8", True),  # vLLM's Blackwell MoE choices: not modelled
    ):
        assert vllm_deep_gemm_moe_min_tokens(*args) == 0, args
    vllm = RooflineStepTime(glm52, weight_dtype="fp8", moe_deep_gemm_min_tokens=1)
    base = RooflineStepTime(glm52, weight_dtype="fp8")
    hbm = vllm.gpu.hbm_bytes_per_s
    assert vllm.rank.deep_gemm_bw == pytest.approx(hbm * GEMM_STREAM_EFF)
    layers = moe_layers(vllm)
    for decodes in (1, 16, 120):
        on, off = vllm.cost([], [4096] * decodes), base.cost([], [4096] * decodes)
        gemm_act, kernel_act = fused_moe_activation_bytes(vllm, decodes, layers)
        weights = on.bytes["moe"] - gemm_act - kernel_act
        assert weights == pytest.approx(off.bytes["moe"] - sum(fused_moe_activation_bytes(base, decodes, layers)))
        streamed = weights / (hbm * GEMM_STREAM_EFF) + gemm_act / vllm.rank.bw
        assert on.seconds["moe"] == pytest.approx(streamed + kernel_act / vllm.rank.bw)
        assert streamed > on.flops["moe"] / vllm.rank.moe_rate  # byte-bound: the rate is what moved
    # the draft passes' MoE: the MTP layer over the decodes, the same rule on their count; at 16 rows the contiguous
    # layout's whole 128-row block per touched expert (fact 43) moves more than DeepGEMM's faster stream saves
    k3 = dict(weight_dtype="fp8", num_speculative_tokens=3)
    on, off = RooflineStepTime(glm52, moe_deep_gemm_min_tokens=1, **k3), RooflineStepTime(glm52, **k3)
    draft_on, draft_off = (m.cost([], [4096] * 16).seconds["mtp_draft"] for m in (on, off))
    assert draft_on > draft_off
    for bad in (-1, True, 1.5):
        with pytest.raises(DsakvError, match=r"^step time moe_deep_gemm_min_tokens = .*: must be an integer >= 0"):
            RooflineStepTime(glm52, moe_deep_gemm_min_tokens=bad)


def test_build_setup_gives_vllm_rows_deepgemms_experts_only_when_switched_on():
    hopper = GpuSetting(gpu="H200", num_gpus=8, weight_dtype="fp8")
    vllm = SimConfig(model="glm-5", gpu=hopper, schedule_policy="mixed")
    assert build_setup(vllm).step_time.moe_deep_gemm_min_tokens == 0
    assert build_setup(dataclasses.replace(vllm, moe_deep_gemm=True)).step_time.moe_deep_gemm_min_tokens == 1
    sglang = SimConfig(model="glm-5", gpu=hopper, schedule_policy="prefill_first", moe_deep_gemm=True)
    assert build_setup(sglang).step_time.moe_deep_gemm_min_tokens == 0
    with pytest.raises(DsakvError, match=r"^moe_deep_gemm = 0: must be True or False$"):
        SimConfig(moe_deep_gemm=0)


def _check_decode_experts_stream_at(switched: RooflineStepTime, base: RooflineStepTime, eff: float) -> None:
    """A kernel switch's decode steps at 1, 16 and 96 decodes (every step size, not from an alignment on): the same
    expert bytes as without it, streamed at ``eff`` of HBM where the base streams them at its fitted ``bw_eff``."""
    hbm = base.gpu.hbm_bytes_per_s
    for decodes in (1, 16, 96):
        on, off = switched.cost([], [4096] * decodes), base.cost([], [4096] * decodes)
        # the activations (fact 43) at the fitted rate; none under AITER, whose measured lines include them
        act_on, act_off = (sum(fused_moe_activation_bytes(m, decodes, moe_layers(m))) for m in (switched, base))
        assert on.bytes["moe"] - act_on == pytest.approx(off.bytes["moe"] - act_off)
        assert on.seconds["moe"] == pytest.approx((on.bytes["moe"] - act_on) / (hbm * eff) + act_on / switched.rank.bw)
        assert off.seconds["moe"] == pytest.approx(off.bytes["moe"] / (hbm * base.bw_eff))


def _check_engine_kernel_switch(layout, flag: str, gpu_name: str, wrong_gpu: str) -> None:
    """What SGLang's kernel switches (``moe_trtllm``, ``aiter``) share: the draft passes (the MTP layer's forwards)
    run the same kernels (SGLang's speculative runner defaults to them), the step time refuses the switch on another
    GPU generation, under an all-to-all and as a non-bool, and ``build_setup`` sets it for SGLang (not vLLM) unless
    ``SimConfig`` turns it off."""
    gpu = gpu_kind(gpu_name)
    k3 = dict(gpu=gpu, weight_dtype="fp8", num_speculative_tokens=3)
    draft = lambda m: m.cost([], [4096] * 16).seconds["mtp_draft"]  # noqa: E731
    assert draft(RooflineStepTime(layout, **{flag: True}, **k3)) != draft(RooflineStepTime(layout, **k3))
    with pytest.raises(DsakvError, match=rf"^step time {flag}: {wrong_gpu}"):
        RooflineStepTime(layout, **{flag: True})
    with pytest.raises(DsakvError, match=rf"^step time {flag}: .*moe_a2a is 'deepep'$"):
        RooflineStepTime(layout, gpu=gpu, tp=8, ep=8, moe_a2a="deepep", **{flag: True})
    with pytest.raises(DsakvError, match=rf"^step time {flag} = 1: must be True or False$"):
        RooflineStepTime(layout, gpu=gpu, **{flag: 1})
    setting = GpuSetting(gpu=gpu_name, num_gpus=8, weight_dtype="fp8")
    sglang = SimConfig(model="glm-5", gpu=setting, schedule_policy="prefill_first")
    assert getattr(build_setup(sglang).step_time, flag) is True
    assert getattr(build_setup(dataclasses.replace(sglang, **{flag: False})).step_time, flag) is False
    assert getattr(build_setup(dataclasses.replace(sglang, schedule_policy="mixed")).step_time, flag) is False
    with pytest.raises(DsakvError, match=rf"^{flag} = 0: must be True or False$"):
        SimConfig(**{flag: 0})


def test_trtllms_fused_moe_rate_is_the_least_squares_slope_of_flashinfers_b300_table():
    # Fact 37: flashinfer-ai/flashinfer#5301's TRTLLM MXFP8 latencies (B300, DeepSeek's MoE, 32 local experts of 256,
    # top-8) against the bytes of the experts the tokens touch (uniform routing), fitted here independently of
    # kernels.fixed_and_seconds_per_byte with the normal equations.
    expert_bytes = 3 * 7168 * 2048 * (1 + 1 / 32)  # gate / up and down, fp8, one UE8M0 scale per 32 weights
    pts = [(32 * (1 - (1 - 8 / 256) ** n) * expert_bytes, ms / 1e3) for n, ms in TRTLLM_MOE_B300_MXFP8_MS]
    sx, sy = sum(b for b, _ in pts), sum(t for _, t in pts)
    sxx, sxy = sum(b * b for b, _ in pts), sum(b * t for b, t in pts)
    slope = (len(pts) * sxy - sx * sy) / (len(pts) * sxx - sx * sx)
    assert TRTLLM_MOE_STREAM_EFF == pytest.approx(1 / slope / gpu_kind("B300").hbm_bytes_per_s)
    assert round(TRTLLM_MOE_STREAM_EFF, 3) == 0.878  # docs/steptime.md's value: beside DeepGEMM's 0.836 on H800
    assert [n for n, _ in TRTLLM_MOE_B300_MXFP8_MS] == [2**i for i in range(10)]


def test_sglang_runs_fp8_experts_on_blackwell_in_trtllms_fused_moe(glm52):
    # Fact 37: SGLang's automatic MoE runner is flashinfer_trtllm for a DeepSeek-family model's fp8 experts on
    # SM100 / SM103 without an all-to-all; its experts stream at TRTLLM_MOE_STREAM_EFF at every step size.
    assert sglang_trtllm_moe("blackwell", "prefill_first", "fp8", "none", True)
    for args in (
        ("hopper", "prefill_first", "fp8", "none", True),  # Triton's fused MoE on Hopper
        ("blackwell", "mixed", "fp8", "none", True),  # vLLM's Blackwell MoE choices: not modelled
        ("blackwell", "prefill_first", "bf16", "none", True),  # the rule is for fp8 checkpoints
        ("blackwell", "prefill_first", "fp8", "deepep", True),  # DeepEP's experts run DeepGEMM (fact 35)
        ("blackwell", "prefill_first", "fp8", "none", False),  # another --moe-runner-backend, an earlier build
    ):
        assert not sglang_trtllm_moe(*args), args
    b200 = gpu_kind("B200")
    trt = RooflineStepTime(glm52, gpu=b200, weight_dtype="fp8", moe_trtllm=True)
    base = RooflineStepTime(glm52, gpu=b200, weight_dtype="fp8")
    hbm = b200.hbm_bytes_per_s
    assert trt.rank.trtllm_moe_bw == pytest.approx(hbm * TRTLLM_MOE_STREAM_EFF)
    _check_decode_experts_stream_at(trt, base, TRTLLM_MOE_STREAM_EFF)
    _check_engine_kernel_switch(glm52, "moe_trtllm", "B200", r"TensorRT-LLM's fused MoE runs on Blackwell .* H200")


def test_each_moe_path_moves_its_own_activations(glm52):
    # Fact 43, counted from each path's code: per (token, expert) pair SGLang's Triton fused MoE moves 5h + 14I bytes
    # (fp8), TensorRT-LLM's fp8 block-scale MoE 5h + 6I (fp8 gate / up outputs, one activation kernel), DeepGEMM under
    # DeepEP 3h + 10I on a decode step (low-latency: DeepEP's buffer read in place, a fused SiLU-and-mul-quantise,
    # DeepEP's combine sums) and 6h + 14I on an extend step (normal: ep_scatter's copy, two kernels, ep_gather).
    h, width = 6144, 2048  # GLM-5.2
    b200 = gpu_kind("B200")
    deepep = RooflineStepTime(glm52, weight_dtype="fp8", dp_attention=8, ep=8, moe_a2a="deepep")
    ranks = deepep.rank.dispatch_copies * 8 / 7  # the EP ranks a token reaches in the normal dispatch, its own included
    cases = [  # (model, extend, bytes a pair, bytes a token)
        (RooflineStepTime(glm52, weight_dtype="fp8"), False, 5 * h + 14 * width // 8, 5 * h),
        (RooflineStepTime(glm52, gpu=b200, weight_dtype="fp8", moe_trtllm=True), False, 5 * h + 6 * width // 8, 5 * h),
        (deepep, False, 3 * h + 10 * width, 0),
        (deepep, True, 6 * h + 14 * width, ranks / 8 * 3 * h + 3 * h / 8),
    ]
    for st, extend, per_pair, per_token in cases:
        layers = moe_layers(st)
        c = st.cost([(512, 0)], []) if extend else st.cost([], [4096] * 16)
        tokens = (512 if extend else 16) * st.dp_attention
        act = c.bytes["moe"] - st.rank.linear.expert_bytes * st._touched(tokens)
        assert act == pytest.approx(sum(fused_moe_activation_bytes(st, tokens, layers, extend)))
        # the contiguous layout's padding rows (normal mode only): the GEMMs' 3h + 5I and the two kernels' 9I a row
        padding = segment_padding_rows(st, tokens) * (3 * h + 14 * width) if extend else 0.0
        assert (act / layers - padding) / tokens == pytest.approx(8 / st.ep * per_pair + per_token)


def _normal_equations_slope(pts: list[tuple[float, float]]) -> float:
    sx, sy = sum(x for x, _ in pts), sum(y for _, y in pts)
    sxx, sxy = sum(x * x for x, _ in pts), sum(x * y for x, y in pts)
    return (len(pts) * sxy - sx * sy) / (len(pts) * sxx - sx * sx)


def _aiter_rates(rows, hidden: int, intermediate: int) -> tuple[float, float]:
    """(stream, compute) fractions of MI355X's peaks from one of AITER's tuned fused-MoE tables: 256 routed experts
    at top-8 plus the shared expert fused in, fp8 weights with one fp32 scale per 128 x 128 block."""
    mi355x = gpu_kind("MI355X")
    per_expert = 3 * hidden * intermediate + 4 * 3 * math.ceil(intermediate / 128) * math.ceil(hidden / 128)
    stream = [((256 * (1 - (1 - 8 / 256) ** n) + 1) * per_expert, us / 1e6) for n, us in rows if n <= 512]
    compute = [(n * 9 * 3 * 2 * hidden * intermediate, us / 1e6) for n, us in rows if n >= 4096]
    return (
        1 / _normal_equations_slope(stream) / mi355x.hbm_bytes_per_s,
        1 / _normal_equations_slope(compute) / mi355x.fp8_flops,
    )


def test_aiters_fused_moe_rates_are_the_least_squares_slopes_of_its_mi355x_table():
    # Fact 38: AITER's tuned GLM-5 table on MI355X (hidden 6144, expert intermediate 256 = 2048 / TP 8), refitted
    # here with the normal equations: the stream rate from the bytes of the experts 1-512 tokens touch, the compute
    # rate from 4,096 tokens on.
    assert (AITER_MOE_STREAM_EFF, AITER_MOE_COMPUTE_EFF) == pytest.approx(
        _aiter_rates(AITER_FMOE_MI355X_GLM5_TP8_US, 6144, 256)
    )
    assert (round(AITER_MOE_STREAM_EFF, 3), round(AITER_MOE_COMPUTE_EFF, 3)) == (0.721, 0.153)  # docs' values
    assert [n for n, _ in AITER_FMOE_MI355X_GLM5_TP8_US] == [2**i for i in range(16)]
    # The same file's DeepSeek-V3 table at TP 4 (hidden 7168, intermediate 512; ROCm/aiter
    # aiter/configs/model_configs/a8w8_blockscale_tuned_fmoe_ds_v3.csv, cu_num 256, rows added by #3024) gives
    # rates within 3 % and 5 %: one kernel family's rates, not one shape's.
    ds_v3_tp4 = (
        (1, 56.8428), (2, 62.7228), (4, 78.6512), (8, 128.1741), (16, 211.2661), (32, 328.3517), (64, 418.7021),
        (128, 471.9978), (256, 515.699), (512, 540.5007), (1024, 673.6803), (2048, 873.5909), (4096, 1294.01),
        (8192, 2305.846),
    )  # fmt: skip
    stream, compute = _aiter_rates(ds_v3_tp4, 7168, 512)
    assert stream == pytest.approx(AITER_MOE_STREAM_EFF, rel=0.03)
    assert compute == pytest.approx(AITER_MOE_COMPUTE_EFF, rel=0.05)


def test_aiters_fp8_gemm_rates_come_from_its_mi355x_glm5_table():
    # Fact 39: AITER's tuned GLM-5 GEMM table on MI355X, refitted here: the decode rows (M 1-64) with the normal
    # equations against DeepGEMM's byte count (weight N x K, input M x K, bf16 output 2 M N); the M = 4,096 rows'
    # geometric-mean rate over the fp8 peak.
    mi355x = gpu_kind("MI355X")
    rows = [(m, n, k, us) for (n, k), shape in AITER_GEMM_MI355X_GLM5_TP8_US.items() for m, us in shape]
    pts = [(n * k + m * k + 2 * m * n, us / 1e6) for m, n, k, us in rows if m <= 64]
    slope = _normal_equations_slope(pts)
    fixed = sum(t for _, t in pts) / len(pts) - slope * sum(b for b, _ in pts) / len(pts)
    assert (AITER_GEMM_FIXED_S, AITER_GEMM_STREAM_EFF) == pytest.approx((fixed, 1 / slope / mi355x.hbm_bytes_per_s))
    rates = [2 * m * n * k / (us / 1e6) for m, n, k, us in rows if m == 4096]
    assert AITER_GEMM_DENSE_EFF == pytest.approx(math.exp(sum(map(math.log, rates)) / len(rates)) / mi355x.fp8_flops)
    assert (round(AITER_GEMM_FIXED_S * 1e6, 2), round(AITER_GEMM_STREAM_EFF, 3)) == (5.26, 0.223)  # docs' values
    assert round(AITER_GEMM_DENSE_EFF, 3) == 0.192
    assert len(rates) == len(AITER_GEMM_MI355X_GLM5_TP8_US) == 5 and len(pts) == 39


def test_sglang_runs_an_fp8_checkpoint_on_cdna4_in_aiters_kernels(glm52):
    # Fact 38: SGLang's ROCm image runs the routed experts in AITER's fused MoE; on MI355X (CDNA 4) they stream at
    # AITER_MOE_STREAM_EFF and compute at AITER_MOE_COMPUTE_EFF of the fp8 peak, at every step size.
    assert sglang_aiter("cdna4", "prefill_first", "fp8", "none", True)
    for args in (
        ("cdna3", "prefill_first", "fp8", "none", True),  # MI300X / MI325X: no measured row in AITER's tables
        ("cdna4", "mixed", "fp8", "none", True),  # vLLM on ROCm: not modelled
        ("cdna4", "prefill_first", "bf16", "none", True),  # the tables are the fp8 block-scale kernels'
        ("cdna4", "prefill_first", "fp8", "deepep", True),  # an all-to-all backend
        ("cdna4", "prefill_first", "fp8", "none", False),  # SGLANG_USE_AITER=0, or a build before the tables
        ("hopper", "prefill_first", "fp8", "none", True),
    ):
        assert not sglang_aiter(*args), args
    mi355x = gpu_kind("MI355X")
    aiter = RooflineStepTime(glm52, gpu=mi355x, weight_dtype="fp8", aiter=True)
    base = RooflineStepTime(glm52, gpu=mi355x, weight_dtype="fp8")
    hbm = mi355x.hbm_bytes_per_s
    assert aiter.rank.aiter_moe_bw == pytest.approx(hbm * AITER_MOE_STREAM_EFF)
    assert aiter.rank.moe_rate == pytest.approx(mi355x.fp8_flops * AITER_MOE_COMPUTE_EFF)
    _check_decode_experts_stream_at(aiter, base, AITER_MOE_STREAM_EFF)
    # an 8,192-token prefill chunk is compute-bound: its FLOPs at AITER's measured rate, which includes its
    # activations' traffic (fact 43), 2.9x DeepGEMM's price of the FLOPs alone (0.44 / 0.153)
    on, off = aiter.cost([(8192, 0)], []), base.cost([(8192, 0)], [])
    assert on.flops["moe"] == pytest.approx(off.flops["moe"])
    assert on.seconds["moe"] == pytest.approx(on.flops["moe"] / (mi355x.fp8_flops * AITER_MOE_COMPUTE_EFF))
    assert on.seconds["moe"] > 2.5 * off.flops["moe"] / base.rank.moe_rate
    # fact 39: its linear layers in AITER's fp8 GEMMs: their bytes at AITER_GEMM_STREAM_EFF of HBM, their FLOPs at
    # AITER_GEMM_DENSE_EFF of the fp8 peak, and each GEMM of the kernel chains at AITER_GEMM_FIXED_S
    assert aiter.rank.lin_bytes_s == pytest.approx(aiter.rank.lin_bytes / (hbm * AITER_GEMM_STREAM_EFF))
    assert base.rank.lin_bytes_s == pytest.approx(base.rank.lin_bytes / (hbm * base.bw_eff))
    assert aiter.rank.gemm_rate == pytest.approx(mi355x.fp8_flops * AITER_GEMM_DENSE_EFF)
    node = mi355x.kernel_node_s
    for chain, name in ((LAYER_KERNEL_CHAIN, "layer_floor_s"), (INDEXER_KERNEL_CHAIN, "indexer_floor_s")):
        assert getattr(aiter.terms, name) == pytest.approx(chain_fixed_seconds(chain, node, AITER_GEMM_FIXED_S))
        assert getattr(base.terms, name) == pytest.approx(chain_fixed_seconds(chain, node))
    assert aiter.terms.layer_floor_s > base.terms.layer_floor_s  # 5.3 us a GEMM against DeepGEMM's 2.6
    on, off = aiter.cost([], [4096] * 16), base.cost([], [4096] * 16)
    assert on.seconds["linear"] == pytest.approx(aiter.rank.lin_bytes_s)  # a decode step's weights bind
    assert on.seconds["linear"] > 2.5 * off.seconds["linear"]  # 0.60 / 0.223 of the fitted rate's time
    _check_engine_kernel_switch(glm52, "aiter", "MI355X", r"AITER's kernel rates .* H200 is hopper")


def test_every_layer_pays_the_launch_floor_and_every_indexer_layer_its_kernel_chain(glm52):
    # glm-5.2 keeps the indexer on its full layers only (IndexCache): those pay the indexer's 20 kernels on top.
    st = RooflineStepTime(glm52, layer_min_s=0.0)
    layers, idx_layers = glm52.spec.num_hidden_layers, glm52.num_indexer_layers
    assert 0 < idx_layers < layers
    node, gemm = st.gpu.kernel_node_s, GEMM_FIXED_S  # one graph node per kernel, DeepGEMM's fixed cost per GEMM
    assert st.terms.layer_floor_s == pytest.approx(20 * node + 10 * gemm)  # 20 kernels, 10 of them GEMMs
    assert st.terms.indexer_floor_s == pytest.approx(20 * node + 3 * gemm)  # SGLang's decode path; 3 GEMMs
    expected = layers * st.terms.layer_floor_s + idx_layers * st.terms.indexer_floor_s
    assert st.cost([], [10]).seconds["floor"] == pytest.approx(expected)
    dense = RooflineStepTime(glm52, has_indexer=False, layer_min_s=0.0)
    assert dense.cost([], [10]).seconds["floor"] == pytest.approx(layers * st.terms.layer_floor_s)


def test_a_step_lasts_at_least_layers_times_the_layer_minimum(glm52):
    # t = overhead + floors + max(layers x layer_min_s, W): a batch-1 decode's work hides in the kernels' latency,
    # a large step's work is above the minimum and pays nothing more.
    st, bare = RooflineStepTime(glm52), RooflineStepTime(glm52, layer_min_s=0.0)
    layers = glm52.spec.num_hidden_layers
    for step, binds in ((([], [1000]), True), (([(4096, 0)], []), False)):
        c, b = st.cost(*step), bare.cost(*step)
        work = sum(v for k, v in b.seconds.items() if k not in ("floor", "overhead"))
        assert (work < layers * st.terms.layer_min_s) is binds
        assert c.total_seconds == pytest.approx(b.total_seconds + max(0.0, layers * st.terms.layer_min_s - work))


def test_trtllms_fused_moe_grows_beyond_the_layer_minimum_from_one_token(dsv32):
    # Fact 49: the layer minimum holds TensorRT-LLM's fused MoE at one token; what more tokens add to the experts'
    # bytes runs after the rest of the layer's latency, not under it. A batch-1 decode costs what the minimum says;
    # a batch-8 decode whose other kernels stay under the minimum costs that plus the MoE's growth, exactly.
    # Hopper's Triton MoE (its rate the fitted bw_eff) stays inside the minimum (fact 14).
    b300, h200 = gpu_kind("B300"), gpu_kind("H200")
    trt = RooflineStepTime(dsv32, gpu=b300, weight_dtype="fp8", moe_trtllm=True)
    one, eight = trt.cost([], [1024]), trt.cost([], [1024] * 8)
    assert one.seconds["moe"] == pytest.approx(trt.moe_one_token_seconds())
    assert one.total_seconds == pytest.approx(trt.terms.overhead_s + trt.rank.floor_s + trt.rank.layer_min_s)

    def rest(c) -> float:
        return sum(v for k, v in c.seconds.items() if k not in ("floor", "overhead", "moe"))

    assert rest(eight) < trt.rank.layer_min_s - trt.moe_one_token_seconds()  # the other kernels stay under it
    growth = eight.seconds["moe"] - one.seconds["moe"]
    assert growth > 0.25 * one.total_seconds  # 49 more experts a layer: not a rounding
    assert eight.total_seconds - one.total_seconds == pytest.approx(growth)
    big = trt.cost([(8192, 0)], [])  # a step whose work is above the minimum pays the floors only
    assert big.seconds["floor"] == pytest.approx(trt.rank.floor_s)
    # a run of decodes priced as arrays keeps the same floor, bit for bit
    contexts, steps = [1024] * 8, 6
    run = trt.run_seconds(contexts, steps)
    assert np.array_equal(run, [trt.step_seconds([], [c + j for c in contexts]) for j in range(steps)])
    triton = RooflineStepTime(dsv32, gpu=h200, weight_dtype="fp8")
    work8 = sum(v for k, v in triton.cost([], [1024] * 8).seconds.items() if k not in ("floor", "overhead"))
    assert triton.moe_one_token_seconds() > 0.0 and triton.rank.layer_min_s > 0.0
    floor8 = triton.rank.floor_s + max(0.0, triton.rank.layer_min_s - work8)
    assert triton.cost([], [1024] * 8).seconds["floor"] == pytest.approx(floor8)


def test_batch_one_decode_of_a_dense_mla_model_takes_kimi_k2s_tpot():
    # Fact 14: Kimi-K2 (61 DeepSeek-V3 layers, no indexer), SGLang TP8, concurrency 1, 1,024-token prompts: TPOT
    # 11.4 ms (sgl-project/sglang#13466). The DeepSeek preset without the indexer prices that step at 11.4 ms.
    # Kimi-K2's rank computes 8 heads (64 over TP 8): the preset's at TP 16 (128 / 16), or at TP 8 less its 8 more
    # heads' bytes (fact 14, batch1_heads_seconds).
    lay = CacheLayout(ModelSpec.preset("deepseek-v3.2"), kv_dtype="bf16")
    st = RooflineStepTime(lay, gpu_kind("H200"), has_indexer=False, weight_dtype="fp8")
    extra = 61 * batch1_heads_seconds(st)
    assert st.step_seconds([], [1024 + 8]) - extra == pytest.approx(0.0114, rel=0.01)
    kimi_rank = RooflineStepTime(lay, gpu_kind("H200"), tp=16, has_indexer=False, weight_dtype="fp8")
    assert batch1_heads_seconds(kimi_rank) == 0.0


def test_a_batch_one_layer_takes_longer_for_each_head_a_rank_computes(dsv32, glm52):
    # Fact 14: the batch-1 minimum is Kimi-K2's TP 8 layer, 8 heads a rank; a rank computing more heads (DP attention:
    # all of them) streams their q_b / kv_b / o_proj weights beyond it at the rate AIConfigurator's batch-1 module
    # grows at on its GPU's generation.
    head = head_weight_bytes(dsv32.spec, "fp8")
    assert head == (1536 * 192 + 512 * 256 + 128 * 7168) + 4 * (12 * 2 + 4 * 2 + 1 * 56)  # + fp32 128 x 128 scales
    for gpu in ("H200", "B200"):
        bw = gpu_kind(gpu).hbm_bytes_per_s * batch1_head_stream_eff(gpu_kind(gpu).arch)
        dp = RooflineStepTime(dsv32, gpu_kind(gpu), dp_attention=8, weight_dtype="fp8")
        tp = RooflineStepTime(dsv32, gpu_kind(gpu), weight_dtype="fp8")
        assert batch1_heads_seconds(dp) == pytest.approx((128 - 8) * head / bw)
        assert dp.terms.layer_min_s - tp.terms.layer_min_s == pytest.approx(112 * head / bw)
        one = (dp.step_seconds([], [4096]), tp.step_seconds([], [4096]))
        assert one[0] > one[1]  # the minimum binds both at one decode; DP attention's rank pays its 112 more heads
    # GLM-5.2 at TP 8: 8 heads a rank of bigger heads (v_head_dim 256): their extra bytes only
    glm = RooflineStepTime(glm52, weight_dtype="fp8")
    extra = 8 * head_weight_bytes(glm52.spec, "fp8") - 8 * head
    rate = glm.gpu.hbm_bytes_per_s * batch1_head_stream_eff("hopper")
    assert batch1_heads_seconds(glm) == pytest.approx(extra / rate) and extra > 0
    assert RooflineStepTime(glm52, layer_min_s=0.0).terms.layer_min_s == 0.0  # a given minimum is kept


def test_the_batch_one_layer_streams_at_one_fraction_of_hbm_on_every_kind():
    # Fact 14: Kimi-K2's batch-1 layer was measured on a ~141 GB Hopper part (4.8 TB/s, KIMI_K2_GPU); another kind's is
    # that time x 4.8 TB/s / its HBM bandwidth. The minimum over the floor shrinks by exactly the scaled difference.
    dense = CacheLayout(ModelSpec.preset("deepseek-v3.2"), kv_dtype="fp8")
    ref = gpu_kind(KIMI_K2_GPU).hbm_bytes_per_s
    assert ref == gpu_kind("H20-3e").hbm_bytes_per_s == 4.8e12
    for gpu in ("H200", "H20-3e", "H100", "B200", "B300", "GB300", "MI355X"):
        st = RooflineStepTime(dense, gpu_kind(gpu), has_indexer=False, weight_dtype="fp8")
        assert batch1_layer_seconds(st) == pytest.approx(BATCH1_LAYER_S * ref / gpu_kind(gpu).hbm_bytes_per_s)
        t = st.terms
        assert t.layer_min_s == pytest.approx(batch1_layer_seconds(st) - t.layer_floor_s + batch1_heads_seconds(st))
    h200, b200 = (RooflineStepTime(dense, gpu_kind(g), has_indexer=False, weight_dtype="fp8") for g in ("H200", "B200"))
    assert batch1_layer_seconds(b200) == pytest.approx(BATCH1_LAYER_S * 0.6)  # 8 TB/s: 112 us where H200 has 186.5
    # at one decode the minimum binds on both; B200's step is shorter by 61 scaled layers (floors and heads aside)
    gap = h200.step_seconds([], [1032]) - b200.step_seconds([], [1032])
    heads = 61 * (batch1_heads_seconds(h200) - batch1_heads_seconds(b200))
    floors = 61 * (h200.terms.layer_floor_s - b200.terms.layer_floor_s) + h200.terms.overhead_s - b200.terms.overhead_s
    assert gap == pytest.approx(61 * BATCH1_LAYER_S * 0.4 + heads + floors, rel=0.02)


def test_sglangs_older_blackwell_dsa_path_keeps_the_reference_layer():
    # Fact 14's exception (kernels.sglang_batch1_at_reference): SGLang (prefill_first) decoding a DSA model on Blackwell
    # from FlashMLA's fp8_ds_mla rows or a bf16 cache keeps Kimi-K2's 186.5 us; TensorRT-LLM's fp8 rows, a dense-MLA
    # model, another engine (vLLM's mixed policy) and a Hopper GPU follow the HBM scaling.
    def terms_of(kv: str, gpu: str = "B200", policy: str = "prefill_first", indexer: bool = True):
        cfg = SimConfig(
            model="glm-5.2", kv_dtype=kv, gpu=GpuSetting(gpu=gpu), schedule_policy=policy, pool_tokens=1 << 16
        )
        st = dataclasses.replace(build_setup(cfg).step_time, has_indexer=indexer)
        return st, batch1_layer_seconds(st)

    for kv in ("fp8_ds_mla", "bf16"):
        st, layer = terms_of(kv)
        assert st.batch1_at_reference and layer == BATCH1_LAYER_S
        assert terms_of(kv, indexer=False)[1] == pytest.approx(BATCH1_LAYER_S * 0.6)  # dense MLA: trtllm_mla
        assert terms_of(kv, policy="mixed")[1] == pytest.approx(BATCH1_LAYER_S * 0.6)
        assert terms_of(kv, gpu="H200")[1] == pytest.approx(BATCH1_LAYER_S)
    st, layer = terms_of("fp8")
    assert not st.batch1_at_reference and layer == pytest.approx(BATCH1_LAYER_S * 0.6)
    assert sglang_batch1_at_reference(
        CacheLayout(ModelSpec.preset("glm-5.2"), kv_dtype="fp8_ds_mla"), "blackwell", "prefill_first"
    )
    with pytest.raises(DsakvError, match="batch1_at_reference"):
        RooflineStepTime(CacheLayout(ModelSpec.preset("glm-5.2")), gpu_kind("B200"), batch1_at_reference=1)


def test_the_head_term_is_the_rate_aiconfigurators_batch_one_module_grows_at():
    # AIConfigurator's DSA module (SGLang 0.5.14, one request at context 4,096; bench/calibration/aiconfigurator):
    # its batch-1 latency grows with the heads a rank computes at a rate of the heads' weight bytes, refitted here
    # from the extract's unrounded rows with numpy: each model's rate near its generation's derived one.
    import csv

    table = Path(__file__).resolve().parents[2] / "bench/calibration/aiconfigurator/dsa_module.csv"
    rows = [r for r in csv.DictReader(table.open()) if r["phase"] == "generation" and r["version"] == "sglang 0.5.14"]
    for gpu in ("H200", "B200"):
        for model in ("deepseek-v3.2", "glm-5"):
            pts = [
                (int(r["heads"]) * head_weight_bytes(ModelSpec.preset(model), "fp8"), float(r["latency_us"]) / 1e6)
                for r in rows
                if (r["gpu"], r["model"], r["batch"], r["context"]) == (gpu, model, "1", "4096")
                and r["kv_dtype"] == "fp8"
            ]
            assert len(pts) >= 4
            x, y = zip(*pts, strict=True)
            rate = 1 / np.polyfit(x, y, 1)[0] / gpu_kind(gpu).hbm_bytes_per_s
            assert rate == pytest.approx(batch1_head_stream_eff(gpu_kind(gpu).arch), rel=0.05), (gpu, model)
    assert batch1_head_stream_eff("hopper") == pytest.approx(0.619, abs=0.001)
    assert batch1_head_stream_eff("blackwell") == pytest.approx(0.458, abs=0.001)
    assert batch1_head_stream_eff("cdna4") == batch1_head_stream_eff("hopper")


def test_a_model_without_the_indexer_has_no_indexer_cost(dsv32):
    # DeepSeek-R1 on the DSA preset: no indexer weights, logits, keys or indexer-cache writes.
    dsa, dense = RooflineStepTime(dsv32), RooflineStepTime(dsv32, has_indexer=False)
    a, b = dsa.cost([(1000, 0)], [1500] * 8), dense.cost([(1000, 0)], [1500] * 8)
    assert a.flops["indexer"] > 0 and b.flops["indexer"] == 0 == b.bytes["indexer"] == b.seconds["indexer"]
    idx_part = next(p for p in weight_parts(dsv32.spec, 0, "fp8") if p.name.startswith("indexer"))
    assert a.bytes["linear"] - b.bytes["linear"] == pytest.approx(idx_part.bytes)  # replicated: whole on a rank
    assert b.bytes["cache_write"] == 1008 * dsv32.main_bytes_per_token < a.bytes["cache_write"]
    # within top-k keys both attend every key: the same rows read
    assert (
        b.bytes["sparse_mla"]
        == a.bytes["sparse_mla"]
        == dsv32.num_attention_layers * (1000 + 8 * 1500) * dsv32.main_row_bytes
    )


def test_a_dense_mla_model_attends_its_whole_context(dsv32):
    # Fact 31: without the indexer every query sees every key. A decode reads and scores its whole context, not
    # top-k rows; every prefill step is dense, un-absorbed MHA over the causal pairs (SGLang's MHA_ONE_SHOT /
    # MHA_CHUNKED_KV, vLLM's MLA prefill), whatever the sparse kernels' mode flags say.
    dsa, dense = RooflineStepTime(dsv32), RooflineStepTime(dsv32, has_indexer=False)
    layers, row, topk = dsv32.num_attention_layers, dense.rank.mla_row_bytes, dsv32.spec.index_topk
    decodes = [3000, 9000]
    assert dense.cost([], decodes).bytes["sparse_mla"] == layers * sum(decodes) * row
    assert dense.cost([], decodes).flops["sparse_mla"] == layers * sum(decodes) * dense.rank.mla_flops_per_pair
    assert dsa.cost([], decodes).bytes["sparse_mla"] == layers * 2 * topk * row
    n, ctx = 1024, 4096  # past top-k keys: still dense MHA, each key read once, the prefix keys up-projected
    beyond = dense.cost([(n, ctx)], [])
    mha = layers * ((n * ctx + n * (n + 1) // 2) * dense.rank.mha_flops_per_pair + ctx * dense.rank.kv_b_flops_per_key)
    assert beyond.flops["sparse_mla"] == pytest.approx(mha)
    assert beyond.bytes["sparse_mla"] == layers * (n + ctx) * row
    # the sparse kernels' modes do not apply to a dense model's attention
    for flags in ({"mla_mixed_batch": True}, {"mla_prefill_kernel_all": True}, {"mla_padded_topk": True}):
        moded = RooflineStepTime(dsv32, has_indexer=False, **flags)
        for step in (([(n, ctx)], []), ([(128, 0)], [300, 5000]), ([], [300])):
            assert moded.cost(*step).seconds == dense.cost(*step).seconds, flags
    # a run of decode steps priced as arrays gives the same bits as one step at a time
    stretch = run_stretch(dense, [3000, 100_000], 0, 40, (), (None, None))
    assert list(stretch) == [dense.step_seconds([], [3000 + j, 100_000 + j]) for j in range(40)]


def test_gemm_efficiencies_are_deepgemms_measured_rates():
    # DeepGEMM README (2025-02), H800: dense M = 4096 on DeepSeek-V3 shapes; masked grouped GEMM, 4 x M 256.
    dense = (1058 * 990 * 590 * 1358 * 1304 * 1025) ** (1 / 6) / 1978.9
    grouped = (932 * 815) ** 0.5 / 1978.9
    assert RooflineStepTime.gemm_eff == pytest.approx(dense) == pytest.approx(0.515, abs=1e-3)
    assert RooflineStepTime.moe_eff == pytest.approx(grouped) == pytest.approx(0.440, abs=1e-3)


@pytest.fixture(scope="module")
def dsv32():
    return CacheLayout(ModelSpec.preset("deepseek-v3.2"))


@pytest.mark.parametrize("gpu", ["H200", "H20-3e", "B200", "MI355X"])
def test_indexer_efficiency_is_deepgemms_measured_mqa_logits_rate(dsv32, gpu):
    # Fact 45: DeepGEMM's own test of fp8_mqa_logits on a Hopper GPU (sgl-project/sglang#11989): 64 heads x 128,
    # 2,048 rows each scoring the keys before it, 4K / 8K / 16K / 32K keys; over the Hopper SXM fp8 peak, on every kind.
    measured = (1004 * 1081 * 1126 * 1144) ** (1 / 4) / 1978.9
    model = RooflineStepTime(dsv32, gpu_kind(gpu))
    assert model.indexer_eff is None  # derived, not fitted
    assert model.terms.indexer_eff == pytest.approx(measured) == pytest.approx(0.549, abs=1e-3)
    assert model.to_dict()["indexer_eff"] == model.terms.indexer_eff
    # a long chunk's scoring binds at that rate: its seconds are its FLOPs at the fp8 peak's fraction
    cost = model.cost([(4096, 28672)], [])
    assert cost.seconds["indexer"] == pytest.approx(cost.flops["indexer"] / (gpu_kind(gpu).fp8_flops * measured))
    # a value given overrides it (experiments, --set, --step-settings)
    assert RooflineStepTime(dsv32, gpu_kind(gpu), indexer_eff=0.3).terms.indexer_eff == 0.3


def test_vllm_mixed_batch_prefill_reads_each_tokens_rows_at_the_decode_kernels_rate(dsv32):
    # vLLM, fp8 cache, 16 heads per rank (< 32): every prefill token is a decode query reading its own top-k rows.
    plain, mixed = RooflineStepTime(dsv32), RooflineStepTime(dsv32, mla_mixed_batch=True)
    n, layers, row = 1000, dsv32.num_attention_layers, dsv32.main_row_bytes
    pairs = n * (n + 1) // 2  # query i (1-based) sees i keys, all below top-k 2048
    assert plain.cost([(n, 0)], []).bytes["sparse_mla"] == layers * n * row  # each row read once per chunk
    assert mixed.cost([(n, 0)], []).bytes["sparse_mla"] == layers * pairs * row
    flops = layers * pairs * 64 * 2 * (512 + 64 + 512)  # 16 heads padded to 64
    rates = ((plain, plain.terms.mla_prefill_eff), (mixed, mixed.terms.mla_decode_eff))
    compute = {st: flops / (st.gpu.bf16_flops * eff) for st, eff in rates}
    # the prefill kernel's 1,000 one-SM rows run in 8 waves of 132 (fact 44); the decode kernel splits its keys
    waves = {plain: 8 * 132 / n, mixed: 1.0}
    for st in (plain, mixed):
        c = st.cost([(n, 0)], [])
        bw = c.bytes["sparse_mla"] / (st.gpu.hbm_bytes_per_s * st.bw_eff)
        assert c.seconds["sparse_mla"] == pytest.approx(waves[st] * max(compute[st], bw))
    assert plain.cost([], [3000] * 4).seconds == mixed.cost([], [3000] * 4).seconds  # decodes: the same kernel


def test_vllm_mixed_batch_follows_vllms_rule(dsv32):
    from dsakv.sim.steptime import vllm_mixed_batch

    assert vllm_mixed_batch(dsv32, 8, 1, "mixed")  # 128 / 8 = 16 heads per rank
    assert not vllm_mixed_batch(dsv32, 8, 8, "mixed")  # DP attention: 128 heads per rank
    assert not vllm_mixed_batch(dsv32, 4, 1, "mixed")  # 32 heads: the bf16 prefill kernel
    assert not vllm_mixed_batch(dsv32, 8, 1, "prefill_first")  # SGLang keeps its prefill kernel
    assert not vllm_mixed_batch(CacheLayout(dsv32.spec, kv_dtype="bf16"), 8, 1, "mixed")


def test_vllm_bf16_cache_runs_every_query_through_the_sparse_prefill_kernel(dsv32):
    # vLLM, bf16 cache: FlashMLASparseImpl.forward sends the whole batch, decodes included, to
    # flash_mla_sparse_prefill: every query reads its own top-k rows (bf16 rows) at the prefill kernel's rate.
    bf16 = CacheLayout(dsv32.spec, kv_dtype="bf16")
    one = RooflineStepTime(bf16, mla_prefill_kernel_all=True)
    plain = RooflineStepTime(bf16)
    n, layers, row = 1000, bf16.num_attention_layers, bf16.main_row_bytes
    pairs = n * (n + 1) // 2  # query i (1-based) sees i keys, all below top-k 2048
    assert one.cost([(n, 0)], []).bytes["sparse_mla"] == layers * pairs * row
    assert plain.cost([(n, 0)], []).bytes["sparse_mla"] == layers * n * row  # SGLang-like: each row once a chunk
    decodes = [3000] * 4
    dec_flops = layers * 4 * 2048 * 64 * 2 * (512 + 64 + 512)  # 16 heads padded to 64, top-k 2048 each
    # the prefill kernel runs the 4 queries on 4 of the H200's 132 SMs (fact 44); the decode kernel splits their keys
    for st, eff, waves in ((one, one.terms.mla_prefill_eff, 132 / 4), (plain, plain.terms.mla_decode_eff, 1.0)):
        c = st.cost([], decodes)
        compute = dec_flops / (st.gpu.bf16_flops * eff)
        bw = layers * 4 * 2048 * row / (st.gpu.hbm_bytes_per_s * st.bw_eff)
        assert c.bytes["sparse_mla"] == layers * 4 * 2048 * row
        assert c.seconds["sparse_mla"] == pytest.approx(waves * max(compute, bw))
    with pytest.raises(DsakvError, match="one kernel"):
        RooflineStepTime(dsv32, mla_mixed_batch=True, mla_prefill_kernel_all=True)


def test_padded_sparse_prefill_on_b200_takes_vllms_measured_kernel_time(dsv32):
    # vllm-project/vllm#33451 (vLLM's attention benchmark, mla_prefill config): FLASHMLA_SPARSE, the bf16-cache path,
    # 16 query heads per rank (TP8), one layer: 8 requests x 512 new tokens 1.609 ms, 4 x 2,048 3.174 ms, 8 x 1,024
    # 3.175 ms. On Blackwell the kernel pads 16 heads to 128 and computes every top-k slot (facts 2, 8, 19): priced at
    # FlashMLA's published sparse-prefill rate the padded work takes the measured time, whatever the prompts' length.
    bf16 = CacheLayout(dsv32.spec, kv_dtype="bf16")
    b200 = gpu_kind("B200")
    assert b200.mla_head_pad == 128
    st = RooflineStepTime(bf16, b200, mla_prefill_kernel_all=True, mla_padded_topk=True)
    assert b200.bf16_flops * st.terms.mla_prefill_eff == pytest.approx(
        1450e12, rel=0.01
    )  # README: "1450 TFlops on B200"
    layers = bf16.num_attention_layers
    for chunks, measured_s in (([(512, 0)] * 8, 1.609e-3), ([(2048, 0)] * 4, 3.174e-3), ([(1024, 0)] * 8, 3.175e-3)):
        tokens = sum(n for n, _ in chunks)
        flops = tokens * 2048 * 128 * 2 * (512 + 64 + 512)  # every token: top-k 2048 slots x 128 padded heads
        compute = flops / (b200.bf16_flops * st.terms.mla_prefill_eff)
        units = tokens * 128 // 64  # a token's 128 padded heads on a CTA pair (fact 44): whole waves of 148 SMs
        waves = -(-units // 148) * 148 / units
        per_layer = st.cost(chunks, []).seconds["sparse_mla"] / layers
        assert per_layer == pytest.approx(compute * waves)  # compute-bound: the padded FLOPs at the published rate
        assert per_layer == pytest.approx(measured_s, rel=0.02)


def test_vllm_prefill_kernel_all_follows_the_cache_dtype(dsv32):
    from dsakv.sim.steptime import vllm_prefill_kernel_all

    bf16 = CacheLayout(dsv32.spec, kv_dtype="bf16")
    assert vllm_prefill_kernel_all(bf16, "mixed")
    assert not vllm_prefill_kernel_all(dsv32, "mixed")  # fp8_ds_mla: the fp8 decode kernel serves decodes
    assert not vllm_prefill_kernel_all(bf16, "prefill_first")  # SGLang keeps its own kernels


def test_fa3_rate_is_the_measured_head_dim_128_forward_rate():
    from dsakv.sim.steptime import FA3_MHA_EFF

    # pytorch/benchmark#2391: flash_v3, head dim 128, sequence 1K / 2K, H100 SXM5: 517.099 / 565.544 TFLOP/s.
    assert FA3_MHA_EFF * 989.4 == pytest.approx((517.099 * 565.544) ** 0.5)
    assert 0.5 < FA3_MHA_EFF < 640 / 989.4  # below FlashMLA's sparse prefill rate (fact 4)


def test_sglang_prefill_within_topk_keys_runs_dense_mha(dsv32):
    # SGLang's MHA_ONE_SHOT (fact 24): a prefill step whose chunks hold at most top-k keys runs un-absorbed MHA over
    # every causal pair (nope 128 + rope 64 scores, v 128 values per head, 16 heads a TP8 rank, no padding) at FA3's
    # rate, and up-projects the prefix keys' latents (kv_b_proj: 512 -> 16 x (128 + 128)) at the GEMM rate.
    from dsakv.sim.steptime import FA3_MHA_EFF

    bf16 = CacheLayout(dsv32.spec, kv_dtype="bf16")
    sparse, dense = RooflineStepTime(bf16), RooflineStepTime(bf16, mla_dense_short_prefill=True)
    layers, topk, gpu = bf16.num_attention_layers, dsv32.spec.index_topk, dense.gpu
    n, ctx = 1024, topk - 1024  # the chunk's last query sees exactly top-k keys
    pairs = n * ctx + n * (n + 1) // 2
    attention = layers * pairs * 16 * 2 * (128 + 64 + 128) / (gpu.bf16_flops * FA3_MHA_EFF)
    up_projection = layers * ctx * 2 * 512 * 16 * (128 + 128) / (gpu.fp8_flops * dense.gemm_eff)
    c = dense.cost([(n, ctx)], [])
    bw = c.bytes["sparse_mla"] / (gpu.hbm_bytes_per_s * dense.bw_eff)
    assert c.seconds["sparse_mla"] == pytest.approx(max(attention + up_projection, bw))
    assert c.seconds["sparse_mla"] < sparse.cost([(n, ctx)], []).seconds["sparse_mla"]
    # One key more than top-k anywhere in the step: the whole step runs the sparse kernel, as the engine does.
    for step in (([(n, ctx + 1)], []), ([(n, ctx), (8, topk)], []), ([], [3000, 100])):
        assert dense.cost(*step).seconds == sparse.cost(*step).seconds


def test_dense_short_prefill_follows_sglangs_rule(dsv32):
    from dsakv.sim.steptime import sglang_dense_short_prefill

    bf16 = CacheLayout(dsv32.spec, kv_dtype="bf16")
    fp8 = CacheLayout(dsv32.spec, kv_dtype="fp8")
    assert sglang_dense_short_prefill(bf16, "hopper", "prefill_first")
    assert sglang_dense_short_prefill(bf16, "blackwell", "prefill_first")  # SM 100-109
    # an fp8 pool too, either row format (sgl-project/sglang#12964: "FP8 will be dequantized on-demand")
    assert sglang_dense_short_prefill(dsv32, "hopper", "prefill_first")
    assert sglang_dense_short_prefill(fp8, "hopper", "prefill_first")
    assert not sglang_dense_short_prefill(bf16, "hopper", "mixed")  # vLLM v0.13: absorbed sparse prefill only
    # ROCm reports gfx942 / gfx950 as SM 9.4 / 9.5: set_dsa_prefill_impl's SM 90 / 100-109 test fails on CDNA
    assert not sglang_dense_short_prefill(bf16, "cdna3", "prefill_first")
    assert not sglang_dense_short_prefill(fp8, "cdna4", "prefill_first")
    sgl = SimConfig(model="deepseek-v3.2", pool_tokens=1 << 16, schedule_policy="prefill_first", kv_dtype="bf16")
    assert build_setup(sgl).step_time.mla_dense_short_prefill
    for gpu in ("MI300X", "MI355X"):
        amd = dataclasses.replace(sgl, gpu=GpuSetting(gpu=gpu))
        assert not build_setup(amd).step_time.mla_dense_short_prefill
    # the builds that turned it off (GLM-5 on Blackwell, 2026-02 .. 06): SimConfig.dense_short_prefill
    off = dataclasses.replace(sgl, dense_short_prefill=False)
    assert not build_setup(off).step_time.mla_dense_short_prefill
    with pytest.raises(DsakvError, match="^dense_short_prefill = 1: must be True or False$"):
        dataclasses.replace(sgl, dense_short_prefill=1)


def test_sglang_prefills_an_fp8_pool_on_hopper_in_the_decode_kernel(dsv32):
    # flashmla_auto on SM90 with FlashMLA's fp8 rows takes flashmla_kv: every prefill token a decode query of its
    # own, reading its own top-k rows at the decode kernel's rate (vLLM's mixed-batch pricing); Blackwell and bf16 pools
    # keep the sparse prefill kernel.
    from dsakv.sim.steptime import sglang_prefill_in_decode_kernel

    bf16 = CacheLayout(dsv32.spec, kv_dtype="bf16")
    assert sglang_prefill_in_decode_kernel(dsv32, "hopper", "prefill_first")
    assert not sglang_prefill_in_decode_kernel(dsv32, "blackwell", "prefill_first")
    assert not sglang_prefill_in_decode_kernel(bf16, "hopper", "prefill_first")
    sgl = SimConfig(model="deepseek-v3.2", pool_tokens=1 << 16, schedule_policy="prefill_first")
    st = build_setup(sgl).step_time
    assert st.mla_mixed_batch and st.mla_dense_short_prefill
    layers, row = dsv32.num_attention_layers, st.rank.mla_row_bytes
    beyond = st.cost([(1024, 4096)], [])  # past top-k: each token's own rows, the decode kernel
    pairs = sum(min(4096 + i, 2048) for i in range(1, 1025))
    assert beyond.bytes["sparse_mla"] == layers * pairs * row
    assert beyond.flops["sparse_mla"] == layers * pairs * st.rank.mla_flops_per_pair
    within = st.cost([(1024, 512)], [])  # within top-k: dense MHA, each key read once
    assert within.bytes["sparse_mla"] == layers * (1024 + 512) * row
    assert within.flops["sparse_mla"] == pytest.approx(
        layers * ((1024 * 512 + 1024 * 1025 // 2) * st.rank.mha_flops_per_pair + 512 * st.rank.kv_b_flops_per_key)
    )


def test_padded_topk_computes_every_topk_slot_and_reads_only_valid_rows(dsv32):
    # FlashMLA's sparse kernels without topk_length: a query seeing c < top-k keys still computes top-k slots.
    plain, padded = RooflineStepTime(dsv32), RooflineStepTime(dsv32, mla_padded_topk=True)
    layers, per_pair, topk = dsv32.num_attention_layers, 64 * 2 * (512 + 64 + 512), dsv32.spec.index_topk
    n, decodes = 128, [300, 5000]
    assert plain.cost([(n, 0)], []).flops["sparse_mla"] == layers * n * (n + 1) // 2 * per_pair
    assert padded.cost([(n, 0)], []).flops["sparse_mla"] == layers * n * topk * per_pair
    assert padded.cost([], decodes).flops["sparse_mla"] == layers * 2 * topk * per_pair
    assert plain.cost([], decodes).flops["sparse_mla"] == layers * (300 + topk) * per_pair
    for step in (([(n, 0)], []), ([], decodes)):  # padded slots gather nothing: the bytes are the valid rows
        assert padded.cost(*step).bytes["sparse_mla"] == plain.cost(*step).bytes["sparse_mla"]
    # Past top-k context nothing is padded: a long decode costs the same.
    assert padded.cost([], [5000]).seconds == plain.cost([], [5000]).seconds


def test_padded_topk_follows_the_engine(dsv32):
    from dsakv.sim.steptime import vllm_padded_topk

    assert vllm_padded_topk("mixed") and not vllm_padded_topk("prefill_first")
    vllm = build_setup(SimConfig(model="deepseek-v3.2", pool_tokens=1 << 16)).step_time
    sgl = build_setup(SimConfig(model="deepseek-v3.2", pool_tokens=1 << 16, schedule_policy="prefill_first"))
    assert vllm.mla_padded_topk and not sgl.step_time.mla_padded_topk


def test_dp_attention_collectives_follow_the_formula(dsv32):
    # SGLang: decode (MAX_LEN) all-gathers before the MLP and reduce-scatters after it; extend (SUM_LEN) gathers
    # with an all-reduce of a zero-filled buffer, all-reduces the MLP output and scatters by a local copy.
    st, d, tokens = RooflineStepTime(dsv32, dp_attention=8), 8, 13
    layers, hid2 = dsv32.num_attention_layers, 7168 * 2
    link = st.gpu.link_bytes_per_s * st.link_eff
    t_all = tokens * d  # attention TP = 1: no attention all-reduce
    all_gather_reduce_scatter = layers * t_all * hid2 * ((d - 1) / d + 7 / 8)
    c = st.cost([], [4096] * tokens)
    assert c.bytes["collectives"] == pytest.approx(all_gather_reduce_scatter)
    assert c.seconds["collectives"] == pytest.approx(c.bytes["collectives"] / link + 2 * layers * st.gpu.link_latency_s)
    t_all = (100 + tokens) * d
    gather_all_reduce = layers * t_all * hid2 * 2 * (d - 1) / d
    moe_all_reduce = layers * t_all * hid2 * 2 * 7 / 8
    c = st.cost([(100, 0)], [4096] * tokens)
    assert c.bytes["collectives"] == pytest.approx(gather_all_reduce + moe_all_reduce)
    assert c.seconds["collectives"] == pytest.approx(c.bytes["collectives"] / link + 2 * layers * st.gpu.link_latency_s)


def test_decode_cost_rises_gently_from_4k_to_128k_almost_only_through_the_indexer():
    # Issue 25, item 4 (the DeepSeek-V3.2 decode cost curve, H800 TP8, a batch of 32): from 4K to 128K context the
    # step's cost rises by less than 2x, monotonically, and the indexer's linear term carries almost all of the rise
    # (sparse MLA reads top-k rows whatever the context; weights and floors do not depend on it).
    lay = CacheLayout(ModelSpec.preset("deepseek-v3.2"))
    st = RooflineStepTime(lay, gpu_kind("H800"))
    costs = [st.cost([], [4096 * 2**i] * 32) for i in range(6)]
    totals = [c.total_seconds for c in costs]
    assert all(a < b for a, b in zip(totals, totals[1:], strict=False))
    assert 1.05 < totals[-1] / totals[0] < 2.0
    rise = totals[-1] - totals[0]
    assert costs[-1].seconds["indexer"] - costs[0].seconds["indexer"] > 0.99 * rise
    for a, b in zip(costs, costs[1:], strict=False):  # linear: twice the context, twice the indexer's seconds
        assert b.seconds["indexer"] == pytest.approx(2 * a.seconds["indexer"], rel=0.01)


def test_deepgemms_contiguous_layout_computes_each_experts_rows_in_whole_blocks(glm52):
    # Fact 43: DeepGEMM's contiguous layout (DeepEP's normal mode on an extend step, vLLM's DeepGemmExperts) pads each
    # local expert's rows to a multiple of 128 and computes the padding: its FLOPs (6hI a row), its GEMM tensors and
    # the kernels between the GEMMs. Uniform routing: an expert's rows are Binomial(tokens, 8 / 256).
    h, width = 6144, 2048
    for tokens, ep in ((1, 8), (8, 8), (64, 8), (1000, 8), (8192, 8), (16, 1), (4096, 1)):
        model = RooflineStepTime(glm52, weight_dtype="fp8", dp_attention=8, ep=8, moe_a2a="deepep")
        if ep == 1:
            model = RooflineStepTime(glm52, weight_dtype="fp8", moe_deep_gemm_min_tokens=1)
        local = 256 // ep
        assert alignment_rows(tokens, 256, 8, local, 128) == pytest.approx(segment_padding_rows(model, tokens))
    assert alignment_rows(256, 8, 8, 8, 128) == 0.0  # every expert picked by every token: 256 rows, none padded
    assert alignment_rows(100, 8, 8, 8, 128) == pytest.approx(8 * 28)
    assert alignment_rows(0, 256, 8, 32, 128) == 0.0
    deepep = RooflineStepTime(glm52, weight_dtype="fp8", dp_attention=8, ep=8, moe_a2a="deepep")
    layers, tokens = moe_layers(deepep), 512 * 8
    extend = deepep.cost([(512, 0)], [])
    pad = segment_padding_rows(deepep, tokens)
    assert 1000 < pad < 2 * 1000  # about 63.5 rows for each of the 32 local experts at 128 rows each on average
    per_token = deepep.rank.linear.expert_flops_per_token
    assert extend.flops["moe"] == pytest.approx(tokens * per_token + layers * pad * 6 * h * width)
    decode = deepep.cost([], [4096] * 64)  # low-latency mode, the masked layout: no contiguous padding
    assert decode.flops["moe"] == pytest.approx(64 * 8 * per_token)
    triton = RooflineStepTime(glm52, weight_dtype="fp8")  # Triton's fused MoE: no contiguous layout
    assert triton.cost([(4096, 0)], []).flops["moe"] == pytest.approx(4096 * triton.rank.linear.expert_flops_per_token)
    assert triton.rank.moe_act.extend.align == 0 and triton.rank.moe_act.decode.align == 0
