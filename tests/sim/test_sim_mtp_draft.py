"""The MTP draft passes of the roofline step time, derived from the MTP layer's own work (docs/steptime.md, MTP
draft), and the per-position acceptance the simulator samples drafts with."""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsakv.errors import DsakvError
from dsakv.planner.draft import draft_pass_cost
from dsakv.planner.gpus import gpu_kind
from dsakv.planner.weights import weight_parts
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.steptime import RooflineStepTime
from dsakv.sim.steptime.kernels import triton_moe_slice_factor
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from dsakv.workloads.traces import TraceRequest
from tests.sim.moe_reference import fused_moe_activation_bytes


@pytest.fixture(scope="module")
def glm5():
    return CacheLayout(ModelSpec.preset("glm-5"), kv_dtype="bf16", mtp_layers=1)


def draft_seconds(model: RooflineStepTime, decode: list[int]) -> float:
    return model.cost([], decode).seconds["mtp_draft"]


def one_pass(layout: CacheLayout, model: RooflineStepTime, ctx: int, *, indexer: bool = True) -> float:
    """One draft pass of one decode at ``ctx`` on one GPU, re-derived: the MTP layer's weights (draft_pass_cost:
    its layer + the lm_head, the experts one token picks) and its caches' reads, at the GPU's bandwidth x
    bw_eff; its sparse MLA and (``indexer``) its indexer scoring each at the slower of their FLOPs (peak x the
    model's efficiency) and their bytes; one cache row of each cache written; its fused MoE's activations (one row);
    one layer's floors. Every figure
    from the spec, the layout and the GPU's datasheet."""
    spec, gpu = layout.spec, model.gpu
    bw = gpu.hbm_bytes_per_s * model.bw_eff
    drafted = draft_pass_cost(layout, [ctx])
    assert drafted.flops / (gpu.bf16_flops * model.gemm_eff) < drafted.weight_bytes / bw  # memory-bound weights
    sel, heads = min(ctx, spec.index_topk), spec.arch_value("num_attention_heads")
    padded = math.ceil(heads / gpu.mla_head_pad) * gpu.mla_head_pad
    mla_flops = sel * padded * 2 * (2 * spec.kv_lora_rank + spec.qk_rope_head_dim)
    mla = max(mla_flops / (gpu.bf16_flops * model.terms.mla_decode_eff), sel * layout.main_row_bytes / bw)
    idx_flops = ctx * 2 * spec.index_n_heads * spec.index_head_dim
    scoring = max(idx_flops / (gpu.fp8_flops * model.terms.indexer_eff), ctx * (layout.indexer_row_bytes + 8) / bw)
    write = (layout.main_row_bytes + layout.indexer_row_bytes) / bw
    activations = sum(fused_moe_activation_bytes(model, 1, 1)) / bw  # its MoE's (fact 43), one row
    # the experts the row picks stream at the fused MoE's rate for the rank's slice of an expert (fact 51)
    a = spec.arch_value
    mtp_experts = {p.name: p.bytes for p in weight_parts(spec, 1)}["routed experts"]
    experts = (mtp_experts - {p.name: p.bytes for p in weight_parts(spec, 0)}["routed experts"]) * (
        a("num_experts_per_tok") / a("n_routed_experts")
    )
    expert_bw = bw * triton_moe_slice_factor(a("moe_intermediate_size") * model.ep / model.tp)
    reads = (drafted.weight_bytes - experts) / bw + experts / expert_bw + activations
    one = max(reads + mla + (scoring if indexer else 0.0) + write, model.terms.layer_min_s)
    return one + model.terms.layer_floor_s + model.terms.indexer_floor_s  # the layer's and its indexer's kernel chains


def test_one_draft_pass_is_the_mtp_layers_roofline_at_the_batchs_context(glm5):
    # k drafts: k - 1 draft steps (SGLang's draft_forward breaks before its last step), the k-th MTP forward being the
    # draft extend, which the decoder prices as its MTP cache layer.
    k, ctx = 3, 5000
    model = RooflineStepTime(glm5, gpu_kind("H200"), tp=1, num_speculative_tokens=k)
    assert draft_seconds(model, [ctx]) == pytest.approx((k - 1) * one_pass(glm5, model, ctx), rel=1e-6)
    assert model.rank.layers == glm5.spec.num_hidden_layers + 1  # the draft extend: the decoder's MTP layer


@pytest.mark.parametrize(("k", "ctx"), [(2, 5000), (3, 5000), (5, 120_000)])
def test_index_sharing_scores_the_indexer_in_the_draft_extend_only(glm5, k, ctx):
    # index_share_for_mtp_iteration: the draft extend (the decoder's MTP layer) scores the MTP layer's indexer, the
    # k - 1 draft steps reuse its top-k (the new token's indexer key still written, the floors kept).
    model = RooflineStepTime(glm5, gpu_kind("H200"), tp=1, num_speculative_tokens=k, mtp_index_share=True)
    want = (k - 1) * one_pass(glm5, model, ctx, indexer=False)
    assert draft_seconds(model, [ctx]) == pytest.approx(want, rel=1e-6)
    assert draft_seconds(model, [ctx]) < draft_seconds(dataclasses.replace(model, mtp_index_share=False), [ctx])


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(1, 200_000), min_size=1, max_size=16),
    st.integers(1, 5),
    st.sampled_from([{}, {"dp_attention": 2}, {"mla_padded_topk": True}, {"tp": 1}]),
)
def test_index_sharing_never_costs_more_and_changes_nothing_at_one_draft(glm5, decode, k, options):
    plain = RooflineStepTime(glm5, num_speculative_tokens=k, **options)
    shared = dataclasses.replace(plain, mtp_index_share=True)
    assert shared.step_seconds([], decode) <= plain.step_seconds([], decode)
    if k == 1:
        assert shared.cost([], decode).seconds == plain.cost([], decode).seconds


def test_index_sharing_flows_from_the_config_to_the_step_time():
    assert build_setup(SimConfig(num_speculative_tokens=3, mtp_index_share=True)).step_time.mtp_index_share is True
    assert build_setup(SimConfig(num_speculative_tokens=3)).step_time.to_dict()["mtp_index_share"] is False
    with pytest.raises(DsakvError, match=r"^mtp_index_share = 1: must be True or False$"):
        SimConfig(num_speculative_tokens=3, mtp_index_share=1)


def test_draft_passes_follow_the_gpus_bandwidth_where_memory_bound(glm5):
    # One decode on one GPU (no collectives), no floors: the reads are the pass (the sparse MLA's FLOPs over 64
    # keys are a few parts in 10^5 of it); twice the bandwidth, half the time.
    h200 = gpu_kind("H200")
    fast = dataclasses.replace(h200, hbm_bytes_per_s=2 * h200.hbm_bytes_per_s)
    bare = {"tp": 1, "num_speculative_tokens": 2, "layer_min_s": 0.0, "layer_floor_s": 0.0, "indexer_floor_s": 0.0}
    slow_s = draft_seconds(RooflineStepTime(glm5, h200, **bare), [64])
    fast_s = draft_seconds(RooflineStepTime(glm5, fast, **bare), [64])
    assert slow_s == pytest.approx(2 * fast_s, rel=1e-4)


def test_draft_passes_scale_with_the_gpu_and_the_context(glm5):
    batch = [8192] * 64
    h200 = draft_seconds(RooflineStepTime(glm5, gpu_kind("H200"), num_speculative_tokens=3), batch)
    b200 = draft_seconds(RooflineStepTime(glm5, gpu_kind("B200"), num_speculative_tokens=3), batch)
    assert b200 < h200
    model = RooflineStepTime(glm5, num_speculative_tokens=3)
    longer = [draft_seconds(model, [ctx] * 64) for ctx in (4096, 8192, 32768)]
    assert longer == sorted(longer) and longer[0] < longer[-1]  # the MTP layer's indexer reads every key


def test_draft_passes_are_k_minus_1_forwards_of_the_mtp_layer_and_none_without_decodes(glm5):
    # one draft is the draft extend's alone (SGLang's EAGLE 1-1-2 runs no draft step); each more draft one pass more
    assert draft_seconds(RooflineStepTime(glm5, num_speculative_tokens=1), [4096] * 16) == 0
    two = draft_seconds(RooflineStepTime(glm5, num_speculative_tokens=2), [4096] * 16)
    three = draft_seconds(RooflineStepTime(glm5, num_speculative_tokens=3), [4096] * 16)
    assert two > 0 and three == pytest.approx(2 * two)
    assert RooflineStepTime(glm5, num_speculative_tokens=3).cost([(4096, 0)], []).seconds["mtp_draft"] == 0


def test_draft_passes_under_dp_attention_carry_every_groups_decodes_in_the_moe(glm5):
    # The MTP layer's experts and shared MLP run on every DP group's decodes (more of its experts touched), its
    # attention on this group's: 13 groups' decodes cost more than the balanced 2 x 1.
    model = RooflineStepTime(glm5, dp_attention=2, num_speculative_tokens=2)
    every = model.cost([], [4096], dp_tokens=2 * 13, dp_decodes=13).seconds["mtp_draft"]
    assert every > draft_seconds(model, [4096])


def chain_mean(accept: tuple[float, ...]) -> float:
    """Expected accepted drafts per decode step: position i counts where 1 .. i are all accepted."""
    return sum(itertools.accumulate(accept, operator.mul))


def test_tokens_per_decode_is_the_chain_of_per_position_acceptances(glm5):
    assert RooflineStepTime(glm5, num_speculative_tokens=3, mtp_accept=(0.9, 0.5, 0.2)).tokens_per_decode == (
        pytest.approx(1 + 0.9 + 0.45 + 0.09)
    )
    assert RooflineStepTime(glm5, num_speculative_tokens=2, mtp_accept=0.5).tokens_per_decode == pytest.approx(1.75)


@pytest.mark.parametrize(
    ("accept", "mtp", "wording"),
    [
        ((0.9, 0.8), 3, "mtp_accept = (0.9, 0.8): 2 per-position probabilities for 3 draft tokens: give one, or 3"),
        ((0.9, 1.2), 2, "mtp_accept = (0.9, 1.2): must be a probability in [0, 1] or a list of them"),
        (True, 1, "mtp_accept = True: must be a probability"),
    ],
)
def test_per_position_acceptance_is_checked(accept, mtp, wording):
    with pytest.raises(DsakvError) as err:
        SimConfig(num_speculative_tokens=mtp, mtp_accept=accept)
    assert str(err.value).startswith(wording) and "\n" not in str(err.value)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("accept", [(0.9, 0.6, 0.3), 0.3])
def test_per_position_acceptance_gives_its_mean_accepted_length_on_a_long_run(accept, shared):
    # One request alone, a constant step: its decode steps are (finish - first token) / step, each yielding
    # 1 + the accepted drafts. Over n steps the mean yield lies within 4 standard errors of 1 + the chain's mean
    # (the per-step count's variance from its law, P(count >= i) = p_1 ... p_i), plus one step's truncation at
    # the end (at most k tokens over n). One probability is the same at every position.
    k, step_s, out = 3, 0.02, 6000
    cfg = SimConfig(
        num_speculative_tokens=k, mtp_accept=accept, mtp_accept_shared=shared, step_model="constant", seed=11
    )
    (rec,) = simulate(cfg, [TraceRequest(0.0, 64, out, (1,))]).records
    steps = round((rec.finish_s - rec.first_token_s) / step_s)
    survive = list(itertools.accumulate(accept if isinstance(accept, tuple) else (accept,) * k, operator.mul))
    mean = sum(survive)
    second = sum((2 * i - 1) * s for i, s in enumerate(survive, 1))  # E[X^2] = sum (2i - 1) P(X >= i)
    sd = math.sqrt((second - mean**2) / steps)
    assert rec.output_tokens == out and steps > 1500
    assert abs((out - 1) / steps - (1 + mean)) < 4 * sd + k / steps


def test_a_shared_acceptance_draw_gives_every_request_of_a_step_the_same_accepted_drafts():
    # SGLang's SGLANG_SIMULATE_ACC_LEN draws one accept length per verify for the whole batch: requests that start
    # together accept alike and finish in the same step. Drawn per request they drift apart (the law of either is
    # the test above's).
    k, out, n = 5, 600, 8
    accept = (1.0, 1.0, 0.5, 0.0, 0.0)  # 3.5 tokens a step: 3 or 4
    trace = [TraceRequest(0.0, 64, out, (i + 1,)) for i in range(n)]
    finishes = {}
    for shared in (True, False):
        cfg = SimConfig(num_speculative_tokens=k, mtp_accept=accept, mtp_accept_shared=shared, step_model="constant")
        records = simulate(cfg, trace, analytic_decode=False).records
        finishes[shared] = {round(r.finish_s, 9) for r in records}
        assert all(r.output_tokens == out for r in records)
    assert len(finishes[True]) == 1 and len(finishes[False]) > 1
    with pytest.raises(DsakvError, match=r"^mtp_accept_shared = 'yes': must be True or False$"):
        SimConfig(num_speculative_tokens=k, mtp_accept_shared="yes")
