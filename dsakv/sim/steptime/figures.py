"""The per-rank figures of one deployment that the roofline prices every step with, computed once per model.

``RankFigures`` is a typed table: each field is one figure per rank of the attention (TP / DP) group, derived from
the model spec, the cache layout, the planner's weight breakdown (``dsakv.planner.weights.weight_parts``), the GPU's
peaks (``dsakv.planner.gpus``) and the step time's efficiencies. Nothing in it depends on the batch. docs/steptime.md
gives each formula; ``rank_figures`` computes them (the roofline reads ``model.rank``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from dsakv.errors import DsakvError
from dsakv.planner.gpus import gpu_kind
from dsakv.planner.weights import WeightPart, matrix_bytes, shard_divisors, weight_parts
from dsakv.sim.steptime.kernels import (
    AITER_GEMM_DENSE_EFF,
    AITER_GEMM_FIXED_S,
    AITER_GEMM_STREAM_EFF,
    AITER_MOE_COMPUTE_EFF,
    AITER_MOE_STREAM_EFF,
    BATCH1_LAYER_S,
    DEEPGEMM_CONTIGUOUS_M_ALIGNMENT,
    DEEPGEMM_MQA_LOGITS_EFF,
    DSA_MODULE_BATCH1_US,
    EAGER_INDEXER_LAUNCHES,
    EAGER_INDEXER_SHORT_LAUNCHES,
    EAGER_LAYER_S,
    EAGLE_V1_SEND_ONE_DRAFT_STEPS,
    EAGLE_V1_SEND_ONE_PROMPT_TOKENS,
    EAGLE_V1_SEND_ONE_TOKENS,
    EAGLE_V1_STEP_S,
    FA3_MHA_EFF,
    FLASHMLA_SPARSE_DECODE,
    FLASHMLA_SPARSE_PREFILL,
    FLASHMLA_SPARSE_PREFILL_HEADS_PER_SM,
    GEMM_FIXED_S,
    GEMM_STREAM_EFF,
    INDEXER_KERNEL_CHAIN,
    KIMI_K2_ATTENTION_HEADS,
    KIMI_K2_GPU,
    KIMI_K2_TP,
    LAYER_KERNEL_CHAIN,
    STEP_KERNEL_CHAIN,
    TILELANG_DECODE_FIXED_S,
    TILELANG_DECODE_STREAM_EFF,
    TILELANG_PREFILL_SLOT_S,
    TRITON_MOE_REFERENCE_SLICE,
    TRTLLM_MOE_STREAM_EFF,
    chain_fixed_seconds,
    fixed_and_seconds_per_byte,
    flashmla_efficiency,
    tilelang_mla_heads,
    triton_moe_slice_factor,
    trtllm_gen_mla_heads,
)
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_spec

if TYPE_CHECKING:
    from dsakv.sim.steptime.roofline import RooflineStepTime


@dataclass(frozen=True, slots=True)
class StepTerms:
    """The roofline's kernel efficiencies and fixed costs for one GPU kind, each derived (docs/steptime.md, constants)
    unless the model was given a value: the sparse-MLA kernels' efficiencies (FlashMLA's published rates for the
    GPU's kernel generation) and the indexer logits' (DeepGEMM's measured rate), the fixed cost of a layer's and an
    indexer layer's kernel chain (a graph node per kernel, DeepGEMM's fixed cost per GEMM), the per-step overhead
    (the kernels outside the layers and the lm_head's vocabulary gather), the per-layer minimum (Kimi-K2's batch-1
    layer beyond its floor, and the bytes of the heads the rank computes beyond that layer's rank:
    ``batch1_heads_seconds``) and the host time a speculative step exposes where the engine does not overlap it (0
    where it does: ``spec_overlap``), and the host's launch work per layer of an eager prefill forward (0 where the
    engine replays prefill graphs: ``prefill_graph``) and what a full indexer layer adds to it, on a prefill longer
    than top-k and on one within it (the layer's per launch times the indexer chain's launches)."""

    mla_prefill_eff: float
    mla_decode_eff: float
    indexer_eff: float
    layer_floor_s: float
    indexer_floor_s: float
    overhead_s: float
    layer_min_s: float
    spec_host_s: float
    eager_layer_s: float
    eager_indexer_s: float
    eager_indexer_short_s: float


def step_terms(model: RooflineStepTime) -> StepTerms:
    """``model``'s ``StepTerms``: its own value where it names one (not None), else the derived one."""
    gpu = model.gpu
    node = gpu.kernel_node_s
    gemm_fixed = AITER_GEMM_FIXED_S if model.aiter else GEMM_FIXED_S  # each GEMM of the chains (fact 39)

    def given(value: float | None, derived: float) -> float:
        return derived if value is None else value

    floor = given(model.layer_floor_s, chain_fixed_seconds(LAYER_KERNEL_CHAIN, node, gemm_fixed))
    gather = gpu.link_latency_s if model.tp > 1 else 0.0  # the lm_head's vocabulary shards gathered: one collective
    overhead = given(model.overhead_s, chain_fixed_seconds(STEP_KERNEL_CHAIN, node, gemm_fixed) + gather)
    # fact 14: Kimi-K2's batch-1 layer beyond this model's floor, and the heads' bytes this rank has beyond its rank's
    batch1 = batch1_layer_seconds(model) - floor + batch1_heads_seconds(model)
    eager = 0.0 if model.prefill_graph else given(model.eager_layer_s, EAGER_LAYER_S)
    return StepTerms(
        mla_prefill_eff=given(model.mla_prefill_eff, flashmla_efficiency(FLASHMLA_SPARSE_PREFILL, gpu.arch)),
        mla_decode_eff=given(model.mla_decode_eff, flashmla_efficiency(FLASHMLA_SPARSE_DECODE, gpu.arch)),
        indexer_eff=given(model.indexer_eff, DEEPGEMM_MQA_LOGITS_EFF),
        layer_floor_s=floor,
        indexer_floor_s=given(model.indexer_floor_s, chain_fixed_seconds(INDEXER_KERNEL_CHAIN, node, gemm_fixed)),
        overhead_s=overhead,
        layer_min_s=given(model.layer_min_s, max(batch1, 0.0)),
        spec_host_s=0.0 if model.spec_overlap else given(model.spec_host_s, eagle_v1_host_seconds(_pricing(model))),
        eager_layer_s=eager,
        eager_indexer_s=eager * EAGER_INDEXER_LAUNCHES,
        eager_indexer_short_s=eager * EAGER_INDEXER_SHORT_LAUNCHES,
    )


def head_weight_bytes(spec, dtype: str) -> int:
    """One attention head's share of a layer's weights: its q_b columns (``q_lora_rank x (qk_nope + qk_rope)``), its
    kv_b columns (``kv_lora_rank x (qk_nope + v)``) and its o_proj rows (``v x hidden``), in ``dtype`` with their
    block scales (``planner.weights.matrix_bytes``)."""
    a = spec.arch_value
    nope, rope, v = a("qk_nope_head_dim"), spec.qk_rope_head_dim, a("v_head_dim")
    q_in = a("q_lora_rank") or a("hidden_size")
    return (
        matrix_bytes(q_in, nope + rope, dtype)
        + matrix_bytes(spec.kv_lora_rank, nope + v, dtype)
        + matrix_bytes(v, a("hidden_size"), dtype)
    )


@functools.cache
def batch1_head_stream_eff(arch: str) -> float:
    """The fraction of HBM a batch-1 attention module's head bytes stream at on ``arch``: per (GPU kind, model) of
    ``DSA_MODULE_BATCH1_US``, the least-squares line of its latency against the heads' bytes (heads x
    ``head_weight_bytes`` in fp8), its slope's rate over the kind's HBM bandwidth; the mean over the kind's models.
    Hopper's from H200's rows, Blackwell's from B200's; other generations take Hopper's (as FlashMLA's rates do)."""
    rates = []
    for (gpu, model), rows in DSA_MODULE_BATCH1_US.items():
        kind = gpu_kind(gpu)
        if kind.arch != (arch if arch == "blackwell" else "hopper"):
            continue
        head = head_weight_bytes(load_spec(model, None), "fp8")
        slope = fixed_and_seconds_per_byte([(heads * head, us / 1e6) for heads, us in rows])[1]
        rates.append(1 / slope / kind.hbm_bytes_per_s)
    return sum(rates) / len(rates)


def batch1_layer_seconds(model: RooflineStepTime) -> float:
    """Kimi-K2's measured batch-1 layer (``BATCH1_LAYER_S``) on ``model``'s GPU: scaled by the reference part's HBM
    bandwidth over the kind's (a batch-1 layer streams its weights at one fraction of HBM on every kind), or as
    measured where a DSA model's engine decodes outside the scaling's kernels (``batch1_at_reference``; fact 14)."""
    if model.batch1_at_reference and model.has_indexer:
        return BATCH1_LAYER_S
    return BATCH1_LAYER_S * gpu_kind(KIMI_K2_GPU).hbm_bytes_per_s / model.gpu.hbm_bytes_per_s


@functools.cache
def _kimi_k2_rank_head_bytes() -> float:
    """The head bytes of the batch-1 minimum's reference rank: ``KIMI_K2_ATTENTION_HEADS / KIMI_K2_TP`` heads of
    DeepSeek-V3's dimensions (the DeepSeek-V3.2 preset's) in fp8."""
    return KIMI_K2_ATTENTION_HEADS / KIMI_K2_TP * head_weight_bytes(load_spec("deepseek-v3.2", None), "fp8")


def batch1_heads_seconds(model: RooflineStepTime) -> float:
    """What a batch-1 layer of ``model``'s rank takes beyond Kimi-K2's measured one for its attention heads (fact 14):
    the bytes of the heads the rank computes (``num_attention_heads / (tp / dp_attention)`` of the model's, at its
    weight format) less those of Kimi-K2's rank (``KIMI_K2_ATTENTION_HEADS / KIMI_K2_TP`` heads of DeepSeek-V3's
    dimensions in fp8: the DeepSeek-V3.2 preset's), at the rate AIConfigurator's batch-1 module grows at on the GPU's
    generation (``batch1_head_stream_eff``). Negative for a rank with fewer head bytes; 0 for a model without MLA
    heads."""
    spec = model.layout.spec
    a = spec.arch_value
    if not (a("qk_nope_head_dim") and a("v_head_dim")):
        return 0.0
    dtype = model.weight_dtype or spec.weight_dtype
    heads = a("num_attention_heads") / max(model.tp // model.dp_attention, 1)
    ref = _kimi_k2_rank_head_bytes()
    rate = model.gpu.hbm_bytes_per_s * batch1_head_stream_eff(model.gpu.arch)
    return (heads * head_weight_bytes(spec, dtype) - ref) / rate


# The roofline fields that change a step's price (efficiencies and fixed costs) and are not the deployment's.
PRICING_FIELDS = (
    "gemm_eff", "moe_eff", "mla_prefill_eff", "mla_decode_eff", "indexer_eff", "bw_eff", "link_eff",
    "layer_floor_s", "indexer_floor_s", "layer_min_s", "overhead_s",
)  # fmt: skip


def _pricing(model: RooflineStepTime) -> tuple[tuple[str, float | None], ...]:
    return tuple((name, getattr(model, name)) for name in PRICING_FIELDS)


@functools.cache
def eagle_v1_host_seconds(pricing: tuple[tuple[str, float | None], ...] = ()) -> float:
    """The host time one SGLang EAGLE V1 step exposes (``kernels.EAGLE_V1_STEP_S``, sgl-project/sglang#15307): the
    measured batch-1 step less the roofline's price of it (DeepSeek-V3.2 from its preset, 8 x H200, TP8, fp8
    weights, bf16 cache, 3 draft passes, one decode at the run's mean context), priced with ``pricing``'s
    efficiencies and fixed costs (the caller's: measured step = priced GPU work + this, whatever they are)."""
    from dsakv.sim.steptime.roofline import RooflineStepTime  # the roofline imports this module

    layout = CacheLayout(load_spec("deepseek-v3.2", None), kv_dtype="bf16", mtp_layers=1)
    measured = RooflineStepTime(
        layout, gpu_kind("H200"), tp=8, weight_dtype="fp8",
        num_speculative_tokens=EAGLE_V1_SEND_ONE_DRAFT_STEPS, **dict(pricing),
    )  # fmt: skip
    context = EAGLE_V1_SEND_ONE_PROMPT_TOKENS + EAGLE_V1_SEND_ONE_TOKENS // 2
    return max(EAGLE_V1_STEP_S - measured.step_seconds([], [context]), 0.0)


@dataclass(frozen=True, slots=True)
class LinearShare:
    """The linear layers' weights of one rank, split by the rows that go through them: ``attn`` (attention
    projections, indexer, router, norms, MTP's eh_proj, and the shared experts under an all-to-all MoE: the group's
    own rows), ``mlp`` (dense MLP and, with the all-reduce MoE, shared experts: every DP group's rows), the routed
    experts (``expert_bytes``; FLOPs per token that picks its top-k), and the lm_head (FLOPs per row that reaches
    it). Bytes per rank; FLOPs = 2 x parameters per rank."""

    attn_bytes: float = 0.0
    attn_flops: float = 0.0
    mlp_bytes: float = 0.0
    mlp_flops: float = 0.0
    expert_bytes: float = 0.0
    expert_flops_per_token: float = 0.0
    lm_head_bytes: float = 0.0
    lm_head_flops_per_row: float = 0.0


@dataclass(frozen=True, slots=True)
class RankFigures:
    """Every batch-independent figure of one rank the roofline uses (docs/steptime.md, "per-rank figures")."""

    # -- model shape
    hidden: int  # hidden_size: one activation row is 2 x hidden bytes (bf16)
    experts: int  # n_routed_experts (0: a dense model)
    topk_experts: int  # num_experts_per_tok
    attn_tp: int  # ranks one attention group's heads split over: tp / dp_attention
    layers: int  # decoder layers + MTP cache layers (the floors count them)
    dense_layers: int  # decoder layers with a dense MLP (first_k_dense_replace; all of them in a dense model)
    attn_layers: int  # layers with attention (the cache layout's)
    idx_layers: int  # full lightning-indexer layers (0 without the indexer)
    topk: int  # keys a query attends to at most: index_topk; without the indexer, max_position_embeddings (all)
    kpool: int  # index_kpool: tokens per indexer state
    # -- weights per rank (decoder + lm_head; the embedding is a gather and is not priced)
    linear: LinearShare
    lin_bytes: float  # attention + MLP + lm_head weight bytes read once per step
    expert_miss: float  # 1 - top-k / experts: the chance one token leaves a given expert untouched
    dispatch_copies: float  # EP ranks other than its own one token reaches in DeepEP's normal (extend) dispatch
    moe_act: MoeActivations  # the fused MoE's activations per token and MoE layer, by step kind (fact 43)
    # -- per pair / per row / per token
    mla_flops_per_pair: float  # absorbed sparse MLA per (query, key) and layer, heads padded to the kernel block
    mla_decode_flops_per_pair: float  # the same for a decode query: its kernel's head tile (trtllm-gen's or FlashMLA's)
    mha_flops_per_pair: float  # dense (un-absorbed) MHA per (query, key) and layer (SGLang's short prefill; a dense
    # model's every prefill)
    kv_b_flops_per_key: float  # kv_b_proj up-projection of one cached key's latent (dense short prefill)
    idx_flops_per_pair: float  # lightning indexer per (query, key) on a full layer
    idx_key_bytes: float  # indexer K bytes read per key (per indexer state / kpool)
    mla_row_bytes: float  # main latent row bytes read per selected key (per DCP rank)
    # TileLang's decode line (``mla_tilelang``, fact 40): a layer's call beyond its bytes, the chain's sparse-MLA
    # node taken out; the rate its rows stream at (HBM x TILELANG_DECODE_STREAM_EFF); its prefill's time per query
    # row and top-k slot (TILELANG_PREFILL_SLOT_S, fact 41: MI355X's, the one CDNA 4 kind)
    tilelang_decode_fixed_s: float
    tilelang_decode_bw: float
    tilelang_prefill_slot_s: float
    cell_bytes: float  # bytes both caches write per token (main + indexer; main only without the indexer)
    mla_layer_flops: float  # attn_layers x mla_flops_per_pair
    mla_decode_layer_flops: float  # attn_layers x mla_decode_flops_per_pair
    prefill_kernel_row_sms: int  # the SMs a query row's padded heads take in FlashMLA's sparse prefill kernel (fact 44)
    # -- rates (FLOP/s or B/s, efficiencies applied)
    bw: float  # HBM bytes per second x bw_eff
    expert_bw: float  # routed experts: HBM x GEMM_STREAM_EFF under DeepEP, else bw x the slice factor (fact 51)
    deep_gemm_bw: float  # HBM x GEMM_STREAM_EFF: DeepGEMM's grouped GEMMs (vLLM's MoE with DeepGEMM switched on)
    trtllm_moe_bw: float  # HBM x TRTLLM_MOE_STREAM_EFF: TensorRT-LLM's fused MoE (SGLang on Blackwell, fact 37)
    aiter_moe_bw: float  # HBM x AITER_MOE_STREAM_EFF: AITER's fused MoE (SGLang on CDNA 4, fact 38)
    link_bw: float  # NVLink bytes per second x link_eff
    gemm_rate: float  # linear-layer peak (fp8 or bf16 weights) x gemm_eff; under aiter fp8 x AITER_GEMM_DENSE_EFF
    moe_rate: float  # the same peak x moe_eff; under aiter the fp8 peak x AITER_MOE_COMPUTE_EFF (fact 38)
    idx_rate: float  # fp8 peak x indexer_eff
    mha_rate: float  # bf16 peak x FA3's measured efficiency
    lin_bytes_s: float  # lin_bytes / bw (under aiter over HBM x AITER_GEMM_STREAM_EFF, fact 39)
    # -- seconds per step (the floors)
    floor_s: float  # layers x layer floor + idx_layers x indexer floor
    layer_min_s: float  # layers x the per-layer minimum
    # -- one MTP layer (the draft passes)
    mtp: LinearShare  # its weights (one MTP layer's parts); lm_head not repeated (in ``linear``)
    mtp_lin_bytes_s: float  # its attention + MLP bytes + the lm_head's, over bw (AITER's GEMM rate under aiter)
    mtp_cell_bytes: float  # the cache row one draft writes per decode (main + indexer)
    mtp_floor_s: float  # one layer floor + one indexer floor (with the indexer)
    draft_mla_rate: float  # bf16 peak x the draft's sparse-MLA kernel efficiency


def normal_dispatch_ranks(experts: int, topk: int, n_group: int, topk_group: int, ep: int) -> float:
    """The expected number of EP ranks (its own included) that hold at least one of a token's ``topk`` routed
    experts: what DeepEP's normal dispatch sends the token to, once per rank (``Buffer.get_dispatch_layout``'s
    ``is_token_in_rank``, deepseek-ai/DeepEP ``deep_ep/buffers/legacy.py`` at dd758ca), where the low-latency kernels
    send one copy per expert. Routing taken uniform: ``topk_group`` of the ``n_group`` expert groups, then ``topk``
    experts among theirs; rank r holds the r-th contiguous ``experts / ep`` (SGLang's and DeepEP's layout). A rank
    left without one of the token's experts: C(pool - held, topk) / C(pool, topk) of the pool's choices."""
    if experts % ep or experts % n_group or (ep % n_group and n_group % ep):
        raise DsakvError(
            f"moe_a2a deepep: n_routed_experts = {experts}, n_group = {n_group}, ep = {ep}: the experts must split "
            "evenly over the EP ranks and the expert groups, and the groups and ranks must nest"
        )
    per_rank, per_group = experts // ep, experts // n_group
    pool = topk_group * per_group
    missed = math.comb(pool, topk)

    def reached(held: int) -> float:  # a rank holding ``held`` of the pool's experts gets at least one of the token's
        return 1.0 - math.comb(pool - held, topk) / missed

    if ep % n_group == 0:  # a rank's experts lie in one group: in the pool when that group is chosen
        touched = topk_group / n_group * reached(per_rank)
    else:  # a rank holds n_group / ep whole groups, j of them chosen (hypergeometric)
        own = n_group // ep
        touched = sum(
            math.comb(own, j) * math.comb(n_group - own, topk_group - j) * reached(j * per_group)
            for j in range(min(own, topk_group) + 1)
        ) / math.comb(n_group, topk_group)
    return ep * touched


def split_weights(parts: Sequence[WeightPart], div: dict[str, int], has_indexer: bool, a) -> LinearShare:
    """Per-rank weight bytes and FLOPs of ``parts`` grouped by the rows that go through them (``LinearShare``):
    each part's bytes and parameters over its shard divisor; the embedding skipped (a gather of the batch's rows);
    indexer parts skipped for a model without the indexer."""
    attn_bytes = attn_flops = mlp_bytes = mlp_flops = 0.0
    expert_bytes = expert_flops = lm_bytes = lm_flops = 0.0
    for p in parts:
        per_rank_bytes, per_rank_params = p.bytes / div[p.shard], p.params / div[p.shard]
        if p.name == "embedding" or (p.name.startswith("indexer") and not has_indexer):
            continue
        if p.name == "lm_head":
            lm_bytes, lm_flops = per_rank_bytes, 2 * per_rank_params
        elif p.name == "routed experts":
            expert_bytes = per_rank_bytes
            expert_flops = 2 * per_rank_params * a("num_experts_per_tok") / max(a("n_routed_experts"), 1)
        elif p.shard == "tp":  # dense MLP, shared experts of the all-reduce MoE: every DP group's tokens
            mlp_bytes += per_rank_bytes
            mlp_flops += 2 * per_rank_params
        else:  # attention projections, indexer, router, norms (shared experts under all-to-all): own tokens
            attn_bytes += per_rank_bytes
            attn_flops += 2 * per_rank_params
    return LinearShare(attn_bytes, attn_flops, mlp_bytes, mlp_flops, expert_bytes, expert_flops, lm_bytes, lm_flops)


def mtp_layer_parts(spec, dtype: str, moe_a2a: str = "none") -> list[WeightPart]:
    """One MTP layer's weight parts: ``weight_parts`` with one MTP layer minus with none (eh_proj, norms, one
    attention + indexer, one MoE layer); parts with no parameters left out."""
    base = {p.name: p for p in weight_parts(spec, 0, dtype, moe_a2a)}
    out = []
    for p in weight_parts(spec, 1, dtype, moe_a2a):
        b = base.get(p.name)
        params, nbytes = p.params - (b.params if b else 0), p.bytes - (b.bytes if b else 0)
        if params:
            out.append(WeightPart(p.name, params, nbytes, p.shard))
    return out


def _moe_exchange(model: RooflineStepTime, bw: float) -> tuple[float, float, float]:
    """(DeepGEMM's expert rate, the rate the routed experts stream at by default, the other ranks a prefill token is
    dispatched to) for ``model``'s MoE exchange; ``bw`` is the fitted HBM rate. Under DeepEP each rank holds whole
    experts and SGLang runs them in DeepGEMM's grouped GEMMs (the masked layout on low-latency decode steps:
    ``DeepEPMoE`` requires DeepGEMM there): their weights stream at the rate DeepGEMM's decode-size GEMMs publish
    (fact 35); the fused MoE's slices of every expert keep the fitted bw_eff, scaled by the measured fall-off with the
    rank's slice (``kernels.triton_moe_slice_factor``, 1 at the fitted rows' 256 columns: fact 51), except in vLLM's
    DeepGEMM experts where its switch is set (fact 36), in SGLang's TensorRT-LLM fused MoE on Blackwell (fact 37) and
    in its AITER fused MoE on CDNA 4 (fact 38; ``RooflineStepTime._expert_bw`` picks the rate). DeepEP's normal mode
    (extend steps) sends a token once to each other rank holding one of its experts (fact 35)."""
    a = model.layout.spec.arch_value
    experts = a("n_routed_experts")
    deep_gemm_bw = model.gpu.hbm_bytes_per_s * GEMM_STREAM_EFF
    if model.moe_a2a != "deepep":  # the fused MoE's slices of every expert: the fitted rate, by the slice (fact 51)
        slice_columns = a("moe_intermediate_size") * model.ep / model.tp if experts else TRITON_MOE_REFERENCE_SLICE
        return deep_gemm_bw, bw * triton_moe_slice_factor(slice_columns), 0.0
    dispatch_copies = 0.0
    if experts:
        ranks = normal_dispatch_ranks(
            experts, a("num_experts_per_tok"), a("n_group") or 1, a("topk_group") or 1, model.ep
        )
        dispatch_copies = ranks * (model.ep - 1) / model.ep
    return deep_gemm_bw, deep_gemm_bw, dispatch_copies


class MoeActivation(NamedTuple):
    """The fused MoE's activation bytes per token through one MoE layer of a rank (fact 43): what its grouped GEMMs
    read and write beside their weights (``gemm``: priced in their roofline) and what the kernels around them move
    (``kernels``: gathers and scatters, the activation, quantisation, the top-k sum; priced apart). A path that pads
    each local expert's rows to a multiple of ``align`` (DeepGEMM's contiguous layout; 0: none) computes every padding
    row: ``align_gemm`` / ``align_kernels`` are the bytes one such row moves (``alignment_rows`` counts them)."""

    gemm: float
    kernels: float
    align: int = 0
    align_gemm: float = 0.0
    align_kernels: float = 0.0


class MoeActivations(NamedTuple):
    """A rank's ``MoeActivation`` on a decode step, on an extend step (they differ under DeepEP: its low-latency and
    normal modes) and on a step vLLM runs in DeepGEMM's grouped GEMMs (``moe_deep_gemm_min_tokens``), and the layers
    with routed experts they go through (MTP cache layers included); for the padding rows (``alignment_rows``): the
    experts a rank holds and the FLOPs one expert row costs it (``6 h I``)."""

    decode: MoeActivation
    extend: MoeActivation
    deep_gemm: MoeActivation
    layers: int
    local_experts: int = 0
    row_flops: float = 0.0


@functools.lru_cache(maxsize=8192)
def alignment_rows(tokens: int, experts: int, topk: int, local_experts: int, align: int) -> float:
    """Expected padding rows of one MoE layer on a rank whose ``local_experts`` each get their rows rounded up to a
    multiple of ``align``, with ``tokens`` tokens routed, each to ``topk`` of ``experts`` (uniform routing, the
    roofline's rule: an expert's rows ``n`` are Binomial(tokens, topk / experts)): ``local_experts x E[(-n) mod align]``
    (an expert with no row pads none). The binomial's mass is summed over its mean +- 12 standard deviations (the
    rest weighs below 1e-30)."""
    if tokens <= 0 or align <= 1 or not experts:
        return 0.0
    p = topk / experts
    if p >= 1.0:
        return float(local_experts * (-tokens % align))
    mean, sd = tokens * p, math.sqrt(tokens * p * (1.0 - p))
    lo, hi = max(0, math.floor(mean - 12 * sd) - 1), min(tokens, math.ceil(mean + 12 * sd) + 1)
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(tokens + 1)
    expected = 0.0
    for n in range(lo, hi + 1):
        pmf = math.exp(log_n - math.lgamma(n + 1) - math.lgamma(tokens - n + 1) + n * log_p + (tokens - n) * log_q)
        expected += pmf * (-n % align)
    return local_experts * expected


def moe_activation_bytes(model: RooflineStepTime, dtype: str) -> MoeActivations:
    """The activation bytes (``MoeActivation``) per token through one MoE layer of ``model``'s rank, by step kind
    (``MoeActivations``), counted tensor by tensor from each kernel path's code (docs/steptime.md, fact 43; fp32 scales and index metadata left out).
    ``h`` is the hidden width, ``I`` the rank's slice of an expert's intermediate width (``moe_intermediate_size x ep
    / tp``), ``x`` the GEMMs' input bytes (1 under fp8 weights: quantised per token group first, else 2); a rank
    computes ``top-k / ep`` of a token's pairs (its own experts' share).

    * SGLang's Triton fused MoE (``fused_experts_impl``): a pair's gathered input row (``h x``), its gate / up outputs
      (``2I`` bf16, ``intermediate_cache1``), SiLU-and-mul's read of them and ``I`` bf16 write, an fp8 checkpoint's
      quantisation (read ``2I``, write ``I``), the down GEMM's read (``I x``) and ``h`` bf16 outputs
      (``intermediate_cache3``), the top-k sum's read of them; a token's input quantisation (read ``2h``, write
      ``h``) and summed row (``2h``): ``5h + 14I`` a pair, ``5h`` a token under fp8.
    * TensorRT-LLM's fp8 block-scale fused MoE (``moe_trtllm``; FlashInfer ``Fp8BlockScaleLauncher`` and
      ``MoE::Runner::run``): the gate / up GEMM gathers the input rows and writes fp8 (``2I``), one kernel
      (``activationDeepSeekKernel``) reads them and writes the fp8 product (``I``), the down GEMM writes ``2h`` bf16 a
      pair and ``finalizeKernel`` sums them into the token's row: ``5h + 6I`` a pair, ``5h`` a token.
    * DeepEP with DeepGEMM (``moe_a2a`` deepep; SGLang's ``DeepGemmRunnerCore``): the dispatch delivers fp8 rows. A
      decode step (low-latency mode, the masked layout) reads DeepEP's buffer in place, writes ``2I`` bf16, one fused
      SiLU-and-mul-quantise kernel writes ``I`` fp8, the down GEMM ``2h`` bf16, and DeepEP's combine sums them:
      ``3h + 10I`` a pair, nothing a token. An extend step (normal mode, the contiguous layout) copies each pair's
      row into the expert's segment (``ep_scatter``), runs SiLU-and-mul and the quantisation as two kernels, and
      ``ep_gather`` weights and sums a received token's pairs: ``6h + 14I`` a pair, ``3h`` (read, write the
      gather's row) per received copy (``normal_dispatch_ranks`` of them a token) and ``3h`` per own token (its
      quantisation before the dispatch). DeepGEMM's contiguous layout pads each local expert's rows to
      ``DEEPGEMM_CONTIGUOUS_M_ALIGNMENT`` (DeepEP's ``expert_alignment``) and computes the padding rows: each moves the
      GEMMs' ``3h + 5I`` under fp8 (its input, gate / up outputs, product, output) and the two kernels' ``9I``,
      and costs the GEMMs' ``6hI`` FLOPs.
    * vLLM's DeepGEMM experts (``moe_deep_gemm_min_tokens``: a launch with its switch set; ``DeepGemmExperts``,
      v0.18.0): the token's quantisation, ``ep_scatter``'s read of its row and write of each pair's copy, the gate /
      up GEMM's ``2I`` bf16 outputs, one fused SiLU-and-mul-quantise kernel (``I`` fp8), the down GEMM's ``2h``,
      ``ep_gather``'s weighted sum: ``6h + 10I`` a pair, ``6h`` a token. The M blocks that hold an expert's rows are
      computed whole (``DEEPGEMM_CONTIGUOUS_M_ALIGNMENT`` rows), each padding row the GEMMs' ``3h + 5I`` and
      ``6hI`` FLOPs and the fused kernel's ``5I``.

    AITER's fused MoE (``aiter``) is priced from its measured lines, which include this traffic: zero there."""
    spec = model.layout.spec
    a = spec.arch_value
    experts = a("n_routed_experts")
    zero = MoeActivation(0.0, 0.0)
    if not experts:
        return MoeActivations(zero, zero, zero, 0)
    layers = spec.num_hidden_layers + model.layout.mtp_layers - min(a("first_k_dense_replace"), spec.num_hidden_layers)
    if model.aiter:
        return MoeActivations(zero, zero, zero, layers)
    h, bf = a("hidden_size"), 2  # bf16 intermediates
    width = a("moe_intermediate_size") * model.ep / model.tp
    pairs = a("num_experts_per_tok") / model.ep
    fp8 = dtype == "fp8"
    x = 1 if fp8 else bf
    quant = h * bf + h if fp8 else 0  # a token's input quantisation: read bf16, write fp8
    if model.moe_trtllm:  # fp8 only (``sglang_trtllm_moe``)
        gemm = pairs * (h + 2 * width + width + h * bf)
        kernels = pairs * (2 * width + width + h * bf) + h * bf + quant
        act = MoeActivation(gemm, kernels)
        return MoeActivations(act, act, zero, layers)
    # the input rows, the gate / up outputs (bf16), the product, the outputs (bf16): DeepGEMM's and Triton's alike
    gemm = pairs * (h * x + 2 * width * bf + width * x + h * bf)
    if model.moe_a2a == "deepep":
        low_latency = MoeActivation(gemm, pairs * (2 * width * bf + width * x))
        ranks = normal_dispatch_ranks(
            experts, a("num_experts_per_tok"), a("n_group") or 1, a("topk_group") or 1, model.ep
        )
        silu_quant = 2 * width * bf + width * bf + ((width * bf + width) if fp8 else 0)
        per_pair = h * x + silu_quant + h * bf  # the scatter's write, the two kernels, the gather's read
        received = ranks / model.ep * (h * x + h * bf)  # the scatter's read of a received row, the gather's write
        align = DEEPGEMM_CONTIGUOUS_M_ALIGNMENT  # a padding row: the GEMMs' tensors and the two kernels between them
        normal = MoeActivation(gemm, pairs * per_pair + received + quant / model.ep, align, gemm / pairs, silu_quant)
        return MoeActivations(low_latency, normal, zero, layers, experts // model.ep, 6 * h * width)
    per_pair = 2 * width * bf + width * bf + h * bf  # SiLU-and-mul, the top-k sum's read
    if fp8:
        per_pair += width * bf + width  # the product's quantisation
    triton = MoeActivation(gemm, pairs * per_pair + h * bf + quant)
    deep_gemm = zero
    if model.moe_deep_gemm_min_tokens:  # fp8 only (``vllm_deep_gemm_moe_min_tokens``): the scatter's copy, the fused
        # SiLU-and-mul-quantise, the gather's read a pair; a token's quantisation, the scatter's read, the gather's write
        kernels = pairs * (h + 2 * width * bf + width + h * bf) + h + h * bf + quant
        # a padding row of a computed M block: the GEMMs' tensors and the fused SiLU-and-mul-quantise's read and write
        fused = 2 * width * bf + width
        deep_gemm = MoeActivation(gemm, kernels, DEEPGEMM_CONTIGUOUS_M_ALIGNMENT, gemm / pairs, fused)
    return MoeActivations(triton, triton, deep_gemm, layers, experts // model.ep, 6 * h * width)


def _mla_heads(model: RooflineStepTime, heads: float) -> tuple[float, int | float]:
    """The query heads one token's sparse MLA computes on a rank of ``heads`` heads, padding included: (a prefill
    query's, a decode query's). FlashMLA's sparse kernels run whole blocks of ``GpuKind.mla_head_pad`` heads; a decode
    in TensorRT-LLM's trtllm-gen kernel (fact 29) runs that kernel's head tile, and TileLang's kernels (facts 40, 41)
    run theirs for prefill and decode alike."""
    pad = model.gpu.mla_head_pad
    padded = -(-heads // pad) * pad
    if model.mla_decode_trtllm_gen:
        return padded, trtllm_gen_mla_heads(heads)
    if model.runs_tilelang:
        return tilelang_mla_heads(heads), tilelang_mla_heads(heads)
    return padded, padded


def _sparse_mla_figures(model: RooflineStepTime, heads: float) -> dict[str, float | int]:
    """The sparse-MLA kernels' figures of a rank of ``heads`` heads: absorbed MLA per (query, key) pair and layer
    (scores over latent + rope, values over the latent) at each kernel's padded heads, and over the attention layers;
    the SMs one query row takes in FlashMLA's sparse prefill kernel (fact 44); the draft passes' kernel rate."""
    spec, lay, terms = model.layout.spec, model.layout, model.terms
    padded, decode_heads = _mla_heads(model, heads)
    per_head = 2 * (spec.kv_lora_rank + spec.qk_rope_head_dim + spec.kv_lora_rank)
    mla_flops_per_pair, mla_decode_flops_per_pair = padded * per_head, decode_heads * per_head
    draft_eff = terms.mla_prefill_eff if model.mla_prefill_kernel_all else terms.mla_decode_eff
    return {
        "mla_flops_per_pair": mla_flops_per_pair,
        "mla_decode_flops_per_pair": mla_decode_flops_per_pair,
        "mla_layer_flops": lay.num_attention_layers * mla_flops_per_pair,
        "mla_decode_layer_flops": lay.num_attention_layers * mla_decode_flops_per_pair,
        "prefill_kernel_row_sms": max(int(padded) // FLASHMLA_SPARSE_PREFILL_HEADS_PER_SM, 1),
        "draft_mla_rate": model.gpu.bf16_flops * draft_eff,
    }


def rank_figures(model: RooflineStepTime) -> RankFigures:
    """``model``'s per-rank figures (docs/steptime.md gives each formula)."""
    spec, lay, gpu = model.layout.spec, model.layout, model.gpu
    a = spec.arch_value
    dtype = model.weight_dtype or spec.weight_dtype
    attn_tp = max(model.tp // model.dp_attention, 1)  # DP attention: heads split over tp / dp_attention
    div = shard_divisors(model.tp, model.dp_attention)
    # Under an all-to-all MoE the shared experts are whole on every rank and run on its own rows (``replicated``).
    lin = split_weights(weight_parts(spec, lay.mtp_layers, dtype, model.moe_a2a), div, model.has_indexer, a)
    heads = a("num_attention_heads") / attn_tp
    nope, v_dim = a("qk_nope_head_dim"), a("v_head_dim")
    idx_layers = lay.num_indexer_layers if model.has_indexer else 0
    experts, topk_experts = a("n_routed_experts"), a("num_experts_per_tok")
    layers = spec.num_hidden_layers + lay.mtp_layers
    idx_key_bytes = lay.indexer_row_bytes / lay.index_kpool
    bw = gpu.hbm_bytes_per_s * model.bw_eff
    deep_gemm_bw, expert_bw, dispatch_copies = _moe_exchange(model, bw)
    lin_peak = gpu.fp8_flops if dtype == "fp8" else gpu.bf16_flops
    lin_bytes = lin.attn_bytes + lin.mlp_bytes + lin.lm_head_bytes
    # the linear layers' weights at the fitted HBM rate, or at AITER's GEMMs' (fact 39; the bf16 lm_head and router too)
    lin_bw = gpu.hbm_bytes_per_s * AITER_GEMM_STREAM_EFF if model.aiter else bw
    gemm_rate = gpu.fp8_flops * AITER_GEMM_DENSE_EFF if model.aiter else lin_peak * model.gemm_eff
    mtp = split_weights(mtp_layer_parts(spec, dtype, model.moe_a2a), div, model.has_indexer, a)
    terms = model.terms
    return RankFigures(
        hidden=a("hidden_size"),
        experts=experts,
        topk_experts=topk_experts,
        attn_tp=attn_tp,
        layers=layers,
        dense_layers=min(a("first_k_dense_replace"), spec.num_hidden_layers) if experts else spec.num_hidden_layers,
        attn_layers=lay.num_attention_layers,
        idx_layers=idx_layers,
        topk=spec.index_topk if model.has_indexer else spec.max_position_embeddings,
        kpool=lay.index_kpool,
        linear=lin,
        lin_bytes=lin_bytes,
        expert_miss=1.0 - topk_experts / experts if experts else 0.0,
        dispatch_copies=dispatch_copies,
        moe_act=moe_activation_bytes(model, dtype),
        **_sparse_mla_figures(model, heads),
        # Dense MHA per pair and layer: scores over nope + rope, values over v_head_dim; the up-projection of one
        # cached key's latent into every head's K (nope) and V (fact 24).
        mha_flops_per_pair=heads * 2 * (nope + spec.qk_rope_head_dim + v_dim),
        kv_b_flops_per_key=2 * spec.kv_lora_rank * heads * (nope + v_dim),
        idx_flops_per_pair=spec.indexer_flops_per_pair,
        idx_key_bytes=idx_key_bytes,
        mla_row_bytes=lay.main_row_bytes / model.dcp,
        tilelang_decode_fixed_s=max(TILELANG_DECODE_FIXED_S - gpu.kernel_node_s, 0.0),
        tilelang_decode_bw=gpu.hbm_bytes_per_s * TILELANG_DECODE_STREAM_EFF,
        tilelang_prefill_slot_s=TILELANG_PREFILL_SLOT_S,
        cell_bytes=lay.cell_bytes if model.has_indexer else lay.main_bytes_per_token,
        bw=bw,
        expert_bw=expert_bw,
        deep_gemm_bw=deep_gemm_bw,
        trtllm_moe_bw=gpu.hbm_bytes_per_s * TRTLLM_MOE_STREAM_EFF,
        aiter_moe_bw=gpu.hbm_bytes_per_s * AITER_MOE_STREAM_EFF,
        link_bw=gpu.link_bytes_per_s * model.link_eff,
        gemm_rate=gemm_rate,
        moe_rate=gpu.fp8_flops * AITER_MOE_COMPUTE_EFF if model.aiter else lin_peak * model.moe_eff,
        idx_rate=gpu.fp8_flops * terms.indexer_eff,
        mha_rate=gpu.bf16_flops * FA3_MHA_EFF,
        lin_bytes_s=lin_bytes / lin_bw,
        floor_s=layers * terms.layer_floor_s + idx_layers * terms.indexer_floor_s,
        layer_min_s=layers * terms.layer_min_s,
        mtp=mtp,
        mtp_lin_bytes_s=(mtp.attn_bytes + mtp.mlp_bytes + lin.lm_head_bytes) / lin_bw,
        mtp_cell_bytes=lay.main_row_bytes + (idx_key_bytes if idx_layers else 0.0),
        mtp_floor_s=terms.layer_floor_s + (terms.indexer_floor_s if idx_layers else 0.0),
    )
