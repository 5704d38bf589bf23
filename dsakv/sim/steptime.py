"""Step-time models: how long one scheduler step (one forward pass over a batch) takes on a GPU group.

A model sees only the shape of the step: the prefill chunks (new tokens, context before them) and the
decodes (context length each), and returns seconds. ``dsakv.sim.config.STEP_MODELS`` names the choices:

* ``roofline`` (default): an analytic roofline per component, from the spec, the cache layout, the
  planner's weight breakdown and the GPU's peak speeds (the planner's GPU catalogue,
  ``dsakv.planner.gpus``); every constant and assumption is in ``docs/steptime.md``. Per rank of one TP
  group::

      t = overhead + layers * floor + indexer_layers * indexer_floor + max(layers * layer_min, W) + MTP
      W = sum over components c of max(flops_c / (peak_c * eff_c), bytes_c / (hbm_bw * bw_eff))
          + collective_bytes / (link_bw * link_eff) + collectives * link_latency
      MTP = k x max(sum over the MTP layer's components of max(flops / (peak x eff), bytes / (hbm_bw x bw_eff))
                    + its collectives, layer_min) + its floors     (k draft passes; steps with decodes)

  components: linear layers (weights read once per step; routed experts only where touched), sparse MLA
  (top-k latent rows read per query; vLLM's mixed-batch mode runs prefill through the decode kernel), the
  lightning indexer (every context key scored per query on the full layers, fp8; none for a model without it),
  the cache writes of both caches, collectives (bandwidth + latency), MTP draft passes, the small kernels'
  floors (per layer, and the indexer's per full indexer layer), a per-layer minimum that the work of a tiny
  batch hides in, and a per-step overhead.
  Everything constant for a model and deployment is computed once in the constructor (``_constants``).
* ``constant``: a fixed time per step plus a time per token (tests, or calibrated engines).

Both offer ``step_seconds(prefill, decode, dp_tokens=None, dp_decodes=None)`` (``prefill``: ``(new_tokens,
context_before)`` per chunk; ``decode``: the context length, including the new token, per decoding request;
``dp_tokens`` / ``dp_decodes``: every DP group's tokens and decodes this step, for the MoE under DP attention),
``step_tokens(prefill, decode)`` (the tokens one group's step computes), ``run_seconds`` (the seconds of each
step of a run of decode steps, every context one longer per step, optionally with one prefill chunk a step:
equal to ``step_seconds`` step by step, bit for bit) and ``to_dict()``. The roofline reduces a batch to integer aggregates (``sums`` ->
``StepSums``) and prices those (``price``), so a run is priced as arrays in one pass.
Models hold no state between steps; ``step_seconds`` does not change the model (the roofline keeps a cache of
the seconds of decode steps that see their whole top-k, ``_saturated_decodes``: the same bits, read back).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from dsakv.errors import DsakvError, check_choice
from dsakv.planner.gpus import GpuKind, gpu_kind
from dsakv.planner.weights import shard_divisors, weight_parts
from dsakv.spec.layout import CacheLayout


@dataclass(frozen=True)
class ConstantStepTime:
    """``seconds = per_step + per_token * tokens`` (tokens = prefill tokens + decodes)."""

    per_step_s: float = 0.02
    per_token_s: float = 0.0

    def __post_init__(self) -> None:
        if self.per_step_s < 0 or self.per_token_s < 0:
            raise DsakvError("constant step time: per_step_s and per_token_s must be >= 0")

    def step_tokens(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> int:
        return sum(n for n, _ in prefill) + len(decode)

    def step_seconds(
        self,
        prefill: Sequence[tuple[int, int]],
        decode: Sequence[int],
        dp_tokens: int | None = None,
        dp_decodes: int | None = None,
    ) -> float:
        """``dp_tokens`` / ``dp_decodes`` (every DP group's, as the roofline takes them) do not change a constant."""
        return self.per_step_s + self.per_token_s * self.step_tokens(prefill, decode)

    def run_seconds(
        self,
        contexts: Sequence[int],
        steps: int,
        chunks: Sequence[tuple[int, int]] = (),
        dp_tokens: int | None = None,
        dp_decodes: int | None = None,
        joining: int | None = None,
    ) -> np.ndarray:
        """Seconds of each of ``steps`` steps of these decodes, with ``chunks[j]`` prefilled in step ``j`` while
        there is one, and a decode of ``joining + j`` from step ``len(chunks)`` on (``RooflineStepTime``'s twin)."""
        out = [self.step_seconds((chunk,), contexts) for chunk in chunks[:steps]]
        rest = steps - len(out)
        if rest:
            out += [self.step_seconds((), [*contexts, *(() if joining is None else (joining,))])] * rest
        return np.array(out)

    def to_dict(self) -> dict:
        return {"model": "constant", "per_step_s": self.per_step_s, "per_token_s": self.per_token_s}


def check_accept(accept: object, k: int, name: str = "mtp_accept") -> float | tuple[float, ...]:
    """``accept`` checked: one acceptance probability in [0, 1] for every draft position, or a tuple (a list is
    taken as one) of ``k`` of them, position ``i``'s acceptance given positions ``1 .. i-1`` were accepted."""
    values = tuple(accept) if isinstance(accept, (list, tuple)) else (accept,)
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1 for v in values):
        raise DsakvError(
            f"{name} = {accept!r}: must be a probability in [0, 1] or a list of them, one per draft position"
        )
    if len(values) > 1 and len(values) != k:
        raise DsakvError(
            f"{name} = {accept!r}: {len(values)} per-position probabilities for {k} draft tokens: give one, or {k}"
        )
    return values if isinstance(accept, (list, tuple)) else accept


def accept_positions(accept: float | tuple[float, ...], k: int) -> tuple[float, ...]:
    """The acceptance probability of each of ``k`` draft positions (``accept`` as ``check_accept`` returns it)."""
    return tuple(accept) if isinstance(accept, tuple) else (accept,) * k


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes (per rank) of one step, per component, and the resulting seconds. ``total_seconds`` is
    the components' sum, added left to right in ``seconds``' order (what ``sum`` does on Python 3.11; spelled
    out so a run of steps priced as arrays adds in the same order as one step priced as floats)."""

    flops: dict[str, float]
    bytes: dict[str, float]
    seconds: dict[str, float]
    total_seconds: float


class StepSums(NamedTuple):
    """One step's batch as the integer aggregates the roofline prices (``RooflineStepTime.sums``)."""

    pf_chunks: int  # prefill chunks (each sends one row to the lm_head)
    pf_tokens: int  # new prefill tokens
    pf_keys: int  # keys the chunks' indexer reads (context + new tokens, per chunk)
    pf_idx_pairs: int  # causal (query, key) indexer pairs of the chunks
    pf_pairs: int  # sparse-MLA (query, key) pairs of the chunks: min(position, top-k) per query
    pf_chunk_rows: int  # latent rows a chunk reads once: min(context + new, new x top-k) per chunk
    n_dec: int  # decodes
    dec_sum: int  # their context lengths summed
    dec_topk: int  # ... each clipped at top-k
    dec_rows: int  # ... each clipped at (1 + drafts) x top-k (dec_topk without drafts)


MOE_A2A = ("none", "deepep")  # MoE collectives: all-reduce over TP (none) or DeepEP all-to-all over EP ranks
# vLLM's FlashMLA-sparse backend runs prefill tokens through the fp8 decode kernel ("mixed batch" mode) when a
# rank has fewer query heads than this and the cache is fp8 (vllm/v1/attention/backends/mla/flashmla_sparse.py:
# MIN_HEADS_FOR_BF16_PREFILL); SGLang's NSA backend keeps a prefill kernel.
VLLM_MIN_HEADS_FOR_BF16_PREFILL = 32
# DeepGEMM's measured fp8 rates (TFLOP/s) of DeepSeek-V3's dense shapes at M = 4096 on H800 SXM (README of the
# 2025-02 release, "Normal GEMMs for dense models": N x K = 2112 x 7168, 24576 x 1536, 32768 x 512, 7168 x 16384,
# 4096 x 7168, 7168 x 2048), over H800's dense fp8 peak (1978.9 TFLOP/s): their geometric mean prices the
# linear layers of prefill-sized steps.
DEEPGEMM_DENSE_M4096_TFLOPS = (1058, 990, 590, 1358, 1304, 1025)
H800_FP8_TFLOPS = 1978.9
DEEPGEMM_DENSE_EFF = math.prod(DEEPGEMM_DENSE_M4096_TFLOPS) ** (1 / len(DEEPGEMM_DENSE_M4096_TFLOPS)) / H800_FP8_TFLOPS
# The grouped MoE GEMMs at prefill / large-batch shapes: DeepGEMM's masked-layout rows with 256 tokens per expert
# (4 groups x M 256: N x K = 4096 x 7168 and 7168 x 2048; a DP8 prefill of 8 x 1,024 tokens gives 8,192 x 8 / 256
# = 256 tokens per expert), over the same peak: 0.44.
DEEPGEMM_GROUPED_M256_TFLOPS = (932, 815)
DEEPGEMM_GROUPED_EFF = (
    math.prod(DEEPGEMM_GROUPED_M256_TFLOPS) ** (1 / len(DEEPGEMM_GROUPED_M256_TFLOPS)) / H800_FP8_TFLOPS
)
# SGLang's NSA backend runs a prefill batch whose every sequence holds at most top-k keys (prefix + new) as dense,
# un-absorbed MHA through FlashAttention-3's varlen kernel on Hopper (MHA_ONE_SHOT; sgl-project/sglang#11892, threshold
# SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = index_topk, docs/steptime.md fact 24). FA3's measured forward rate
# at head dim 128, sequence 1K and 2K, H100 SXM5 (pytorch/benchmark#2391, tritonbench flash_v3, the FA3 paper's sizes),
# over H100's dense bf16 peak: its geometric mean prices that kernel.
FA3_FWD_HDIM128_TFLOPS = (517.099, 565.544)
H100_BF16_TFLOPS = 989.4
FA3_MHA_EFF = math.prod(FA3_FWD_HDIM128_TFLOPS) ** (1 / len(FA3_FWD_HDIM128_TFLOPS)) / H100_BF16_TFLOPS
# Small kernels per layer and step that the layer floor stands for (docs/steptime.md, fact 4), and those the
# lightning indexer adds on each full indexer layer (fact 12: wq_b, wk, weights_proj GEMMs, k LayerNorm, RoPE,
# q fp8 quantisation, k quantise-and-store, fp8 MQA logits, top-k): the indexer floor is the layer floor's
# per-kernel share times its kernels.
LAYER_KERNELS = 20
INDEXER_KERNELS = 9
# Runs of steps shorter than this are priced step by step, longer ones as arrays: numpy's fixed cost per operation
# passes a scalar step's price at about four steps (measured on the x1 cluster bench's batches).
ARRAY_STRETCH_STEPS = 4
# The most entries (8 bytes each) the tables of decode steps that see their whole top-k hold, all together
# (``RooflineStepTime._saturated_decodes``): 64 MiB; the x1 cluster bench's take ~17 MiB. Past it a stretch is
# priced and not kept (long contexts with many decodes run sums up into the millions).
SATURATED_TABLE_ENTRIES = 2**23


def vllm_mixed_batch(layout: CacheLayout, tp: int, dp_attention: int, schedule_policy: str) -> bool:
    """Whether vLLM (the ``mixed`` schedule policy) serves this layout's prefill with the fp8 decode kernel."""
    heads_rank = layout.spec.arch_value("num_attention_heads") / max(tp // dp_attention, 1)
    fp8_cache = layout.kv_dtype == "fp8_ds_mla"
    return schedule_policy == "mixed" and fp8_cache and heads_rank < VLLM_MIN_HEADS_FOR_BF16_PREFILL


def vllm_prefill_kernel_all(layout: CacheLayout, schedule_policy: str) -> bool:
    """Whether vLLM (the ``mixed`` schedule policy) runs every query of this layout, decodes included, through
    FlashMLA's sparse prefill kernel: a bf16 cache has no sparse decode kernel in vLLM's FlashMLA-sparse backend
    (``FlashMLASparseImpl.forward``: ``if not use_fp8_cache: _forward_bf16_kv`` for the whole batch,
    ``flash_mla_sparse_prefill`` with the heads padded to 64 on Hopper; docs/steptime.md, fact 19)."""
    return schedule_policy == "mixed" and layout.kv_dtype == "bf16"


def sglang_dense_short_prefill(layout: CacheLayout, schedule_policy: str) -> bool:
    """Whether the engine runs a prefill batch whose sequences all hold at most top-k keys as dense MHA: SGLang (the
    ``prefill_first`` stand-in) with a bf16 cache since sgl-project/sglang#11892 (``handle_attention_nsa``: an extend
    batch with ``max_kv_len <= index_topk`` and a bf16 KV pool takes ``MHA_ONE_SHOT``, FA3 varlen on Hopper); vLLM v0.13
    runs every prefill through the absorbed sparse kernels (its dense path came with vllm-project/vllm#47327, 2026-07).
    docs/steptime.md, fact 24."""
    return schedule_policy == "prefill_first" and layout.kv_dtype == "bf16"


def vllm_padded_topk(schedule_policy: str) -> bool:
    """Whether the engine's sparse-MLA kernels compute all top-k slots of every query, padding included.

    vLLM (the ``mixed`` schedule policy) runs every DSA query through FlashMLA's sparse kernels, and its wrapper
    of the calibrated era (v0.13: ``flash_mla_with_kvcache(..., is_fp8_kvcache, indices)``,
    ``flash_mla_sparse_prefill(q, kv, indices, sm_scale, d_v)``) passes no per-query ``topk_length``: a query
    with fewer than top-k visible keys still runs the whole width, its ``-1`` slots masked (docs/steptime.md,
    fact 8). The SGLang stand-in (``prefill_first``) is priced as gpustack ran it, with the FA3 NSA backends,
    which take each query's key count ``min(context, top-k)`` as its sequence length.
    """
    return schedule_policy == "mixed"


@dataclass(frozen=True)
class RooflineStepTime:
    """Analytic roofline of one TP group (``tp`` GPUs) serving the batch; see ``docs/steptime.md``.

    ``dcp`` splits the main-KV reads of sparse MLA across the DCP group (the indexer K is replicated,
    so indexer work is not split). ``dp_attention`` groups split the TP ranks for attention: the simulated
    batch is one group's, and the MoE / dense MLP (and their collectives) carry all ``dp_attention`` groups'
    tokens: the sum over the groups when the caller passes it (``dp_tokens``: ``dsakv.sim.cluster`` steps every
    group), else the simulated group's batch scaled by the group count (balanced round-robin groups). ``ep`` ranks
    hold the routed experts; with ``moe_a2a = "deepep"`` the MoE exchanges tokens all-to-all (fp8 dispatch,
    bf16 combine) instead of all-reducing. ``num_speculative_tokens`` draft tokens per decode are verified each step
    (``1 + num_speculative_tokens`` query rows) and cost ``num_speculative_tokens`` draft-model passes; ``tokens_per_decode`` is the
    expected yield, for reports (``mtp_accept``: one probability or one per draft position, ``check_accept``); each
    draft pass is the MTP layer's own roofline at the batch's context (``_draft_seconds``; no fitted constant);
    ``mtp_index_share`` (SGLang's ``index_share_for_mtp_iteration``): passes 2 .. k skip the MTP layer's indexer.
    ``weight_dtype`` (None: the config's) prices the linear layers.
    ``mla_mixed_batch``: vLLM's FlashMLA-sparse "mixed batch" mode (fp8 cache, fewer than 32 heads per rank),
    where prefill tokens go through the fp8 decode kernel one query row at a time: priced at the decode
    kernel's efficiency, each prefill token reading its own top-k rows (no reuse across the chunk).
    ``mla_prefill_kernel_all``: vLLM with a bf16 cache, where every query, decodes included, goes through the
    sparse prefill kernel: priced at the prefill kernel's efficiency, each query reading its own top-k rows.
    ``mla_padded_topk``: the sparse-MLA kernels compute all top-k slots of every query (``-1`` padding of a
    query with fewer visible keys masked, not skipped): FLOPs of ``top-k`` pairs per query; the rows read
    stay the valid ones (padded slots gather nothing).
    ``mla_dense_short_prefill``: SGLang's MHA_ONE_SHOT, a prefill step whose chunks all hold at most top-k keys
    (prefix + new) runs dense, un-absorbed MHA: the causal pairs at ``qk_nope + rope + v`` per head (no head padding,
    FA3 varlen) at FA3's measured rate, plus the up-projection (``kv_b_proj``) of the prefix keys at the GEMM rate.
    ``indexer``: False prices the model without its lightning indexer (a dense-MLA checkpoint such as
    DeepSeek-R1 / V3 served through the DSA preset: no indexer weights, kernels or indexer-cache writes); the
    sparse-MLA terms stay (at contexts up to top-k, sparse and dense MLA attend to the same keys).
    """

    layout: CacheLayout
    gpu: GpuKind = field(default_factory=lambda: gpu_kind("H200"))
    tp: int = 8
    dp_attention: int = 1
    dcp: int = 1
    ep: int = 1
    moe_a2a: str = "none"
    weight_dtype: str | None = None
    num_speculative_tokens: int = 0
    mtp_accept: float | tuple[float, ...] = 0.8  # one probability, or one per draft position (check_accept)
    mtp_index_share: bool = False  # index_share_for_mtp_iteration: draft passes 2 .. k reuse pass 1's top-k
    mla_mixed_batch: bool = False
    mla_prefill_kernel_all: bool = False
    mla_padded_topk: bool = False
    mla_dense_short_prefill: bool = False
    has_indexer: bool = True  # the model has a lightning indexer (False: a dense-MLA model)
    gemm_eff: float = DEEPGEMM_DENSE_EFF  # dense GEMMs (DeepGEMM normal GEMMs at M = 4096): 0.515
    moe_eff: float = DEEPGEMM_GROUPED_EFF  # grouped MoE GEMMs (DeepGEMM masked layout, 256 tokens per expert): 0.44
    mla_prefill_eff: float = 640 / 989.4  # FlashMLA sparse prefill, H800: 640 TFLOP/s
    mla_decode_eff: float = 0.395  # fitted, below FlashMLA sparse fp8 decode's 410 / 989.4 TFLOP/s on H800
    indexer_eff: float = 0.64  # fitted
    bw_eff: float = 0.69  # fitted
    link_eff: float = 0.35  # fitted (NCCL ring bus bandwidth of small messages)
    layer_floor_s: float = 60e-6  # fitted; launch / small-kernel floor per layer and step
    layer_min_s: float = 104e-6  # the shortest a layer's roofline work takes (Kimi-K2's batch-1 TPOT), per layer
    overhead_s: float = 0.0014  # fitted; scheduling and sampling per step

    def __post_init__(self) -> None:
        for name in ("tp", "dp_attention", "dcp", "ep"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DsakvError(f"step time {name} = {v!r}: must be a positive integer")
        if self.tp % self.ep:
            raise DsakvError(f"step time ep = {self.ep}: must divide tp = {self.tp}")
        check_choice("moe_a2a", self.moe_a2a, MOE_A2A)
        if self.mla_mixed_batch and self.mla_prefill_kernel_all:
            raise DsakvError("step time mla_mixed_batch and mla_prefill_kernel_all: one kernel serves every query")
        if self.moe_a2a == "deepep" and self.ep < 2:
            raise DsakvError("moe_a2a = 'deepep': needs ep >= 2 (the experts split over ranks)")
        for name in ("gemm_eff", "moe_eff", "mla_prefill_eff", "mla_decode_eff", "indexer_eff", "bw_eff", "link_eff"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise DsakvError(f"step time {name} = {v!r}: must be in (0, 1]")
        if min(self.layer_floor_s, self.layer_min_s, self.overhead_s) < 0:
            raise DsakvError("step time layer_floor_s, layer_min_s and overhead_s must be >= 0")
        if not isinstance(self.mtp_index_share, bool):
            raise DsakvError(f"step time mtp_index_share = {self.mtp_index_share!r}: must be True or False")
        object.__setattr__(
            self, "mtp_accept", check_accept(self.mtp_accept, self.num_speculative_tokens, "step time mtp_accept")
        )
        arch = self.layout.spec.arch_value
        if not (arch("hidden_size") and arch("num_attention_heads")):
            raise DsakvError("the roofline step time needs hidden_size and num_attention_heads in the config")
        # Derived per-rank constants, computed once (frozen dataclass: set through object.__setattr__).
        object.__setattr__(self, "_const", self._constants())
        # seconds of decode steps that see their whole top-k (or of one decode), by (decodes, dp) and context sum
        object.__setattr__(self, "_saturated", {})

    def _constants(self) -> dict[str, float]:
        spec, lay = self.layout.spec, self.layout
        a = spec.arch_value
        dtype = self.weight_dtype or spec.weight_dtype
        parts = weight_parts(spec, lay.mtp_layers, dtype)
        attn_tp = max(self.tp // self.dp_attention, 1)  # DP attention: heads split over tp / dp_attention
        div = shard_divisors(self.tp, self.dp_attention)
        c = dict.fromkeys(("attn_bytes", "attn_flops", "mlp_bytes", "mlp_flops", "expert_bytes"), 0.0)
        c["lm_head_bytes"] = c["lm_head_flops_per_row"] = c["expert_flops_per_token"] = 0.0
        for p in parts:
            per_rank_bytes, per_rank_params = p.bytes / div[p.shard], p.params / div[p.shard]
            if p.name == "embedding" or (p.name.startswith("indexer") and not self.has_indexer):
                continue  # the embedding is a gather of the batch's rows; a model without the indexer has no indexer
            if p.name == "lm_head":
                c["lm_head_bytes"] = per_rank_bytes
                c["lm_head_flops_per_row"] = 2 * per_rank_params
            elif p.name == "routed experts":
                c["expert_bytes"] = per_rank_bytes
                c["expert_flops_per_token"] = (
                    2 * per_rank_params * a("num_experts_per_tok") / max(a("n_routed_experts"), 1)
                )
            elif p.shard == "tp":  # dense MLP, shared experts: run on every DP group's tokens
                c["mlp_bytes"] += per_rank_bytes
                c["mlp_flops"] += 2 * per_rank_params
            else:  # attention projections, indexer, router, norms: the group's own tokens
                c["attn_bytes"] += per_rank_bytes
                c["attn_flops"] += 2 * per_rank_params
        heads = a("num_attention_heads") / attn_tp
        pad = self.gpu.mla_head_pad
        padded = -(-heads // pad) * pad  # FlashMLA's sparse kernels run whole blocks of `pad` query heads
        # Absorbed MLA per (query, key) pair and layer: scores over latent+rope, values over the latent.
        c["mla_flops_per_pair"] = padded * 2 * (spec.kv_lora_rank + spec.qk_rope_head_dim + spec.kv_lora_rank)
        # Dense (un-absorbed) MHA per (query, key) pair and layer: scores over nope+rope, values over v_head_dim; and
        # the up-projection of one cached key's latent into every head's K (nope) and V (fact 24).
        nope, v_dim = a("qk_nope_head_dim"), a("v_head_dim")
        c["mha_flops_per_pair"] = heads * 2 * (nope + spec.qk_rope_head_dim + v_dim)
        c["kv_b_flops_per_key"] = 2 * spec.kv_lora_rank * heads * (nope + v_dim)
        c["hidden"] = a("hidden_size")
        c["experts"] = a("n_routed_experts")
        c["topk_experts"] = a("num_experts_per_tok")
        c["attn_tp"] = attn_tp
        c["layers"] = spec.num_hidden_layers + lay.mtp_layers
        # Per-step constants of cost(): layer counts, per-pair / per-row figures, peaks and bandwidths.
        idx_layers = lay.num_indexer_layers if self.has_indexer else 0
        c["attn_layers"], c["idx_layers"], c["topk"] = lay.num_attention_layers, idx_layers, spec.index_topk
        c["idx_flops_per_pair"] = spec.indexer_flops_per_pair
        c["idx_key_bytes"] = lay.indexer_row_bytes / lay.index_kpool
        c["kpool"] = lay.index_kpool
        c["mla_row_bytes"] = lay.main_row_bytes / self.dcp
        c["cell_bytes"] = lay.cell_bytes if self.has_indexer else lay.main_bytes_per_token
        c["lin_peak"] = self.gpu.fp8_flops if dtype == "fp8" else self.gpu.bf16_flops
        c["bw"] = self.gpu.hbm_bytes_per_s * self.bw_eff
        c["link_bw"] = self.gpu.link_bytes_per_s * self.link_eff
        # price()'s subexpressions that hold no batch figure, computed once by the same operations (same bits)
        c["lin_bytes"] = c["attn_bytes"] + c["mlp_bytes"] + c["lm_head_bytes"]
        c["lin_bytes_s"] = c["lin_bytes"] / c["bw"]
        c["gemm_rate"] = c["lin_peak"] * self.gemm_eff
        c["moe_rate"] = c["lin_peak"] * self.moe_eff
        c["idx_rate"] = self.gpu.fp8_flops * self.indexer_eff
        c["mla_layer_flops"] = c["attn_layers"] * c["mla_flops_per_pair"]
        c["mha_rate"] = self.gpu.bf16_flops * FA3_MHA_EFF
        c["floor_s"] = c["layers"] * self.layer_floor_s + idx_layers * self.indexer_floor_s
        c["layer_min_s"] = c["layers"] * self.layer_min_s
        c["expert_miss"] = 1.0 - c["topk_experts"] / c["experts"] if c["experts"] else 0.0
        c.update(self._mtp_constants(c, dtype, div))
        return c

    def _mtp_constants(self, c: dict[str, float], dtype: str, div: dict[str, int]) -> dict[str, float]:
        """Per-rank figures of one MTP layer (``_draft_seconds``): its weights (``weight_parts`` with one MTP layer
        minus with none: eh_proj, norms, one attention + indexer, one MoE layer), split as ``_constants`` splits the
        decoder's; the cache row it writes per token; its launch floors; the draft's sparse-MLA rate."""
        spec, lay = self.layout.spec, self.layout
        base = {p.name: p for p in weight_parts(spec, 0, dtype)}
        m = dict.fromkeys(
            ("mtp_attn_bytes", "mtp_attn_flops", "mtp_mlp_bytes", "mtp_mlp_flops", "mtp_expert_bytes"), 0.0
        )
        m["mtp_expert_flops_per_token"] = 0.0
        a = spec.arch_value
        for p in weight_parts(spec, 1, dtype):
            b = base.get(p.name)
            params, nbytes = p.params - (b.params if b else 0), p.bytes - (b.bytes if b else 0)
            if not params or (p.name.startswith("indexer") and not self.has_indexer):
                continue
            per_rank_bytes, per_rank_params = nbytes / div[p.shard], params / div[p.shard]
            if p.name == "routed experts":
                m["mtp_expert_bytes"] = per_rank_bytes
                m["mtp_expert_flops_per_token"] = (
                    2 * per_rank_params * a("num_experts_per_tok") / max(a("n_routed_experts"), 1)
                )
            elif p.shard == "tp":  # shared experts (dense MLP): every DP group's rows
                m["mtp_mlp_bytes"] += per_rank_bytes
                m["mtp_mlp_flops"] += 2 * per_rank_params
            else:  # eh_proj, attention projections, indexer, router, norms: the group's own rows
                m["mtp_attn_bytes"] += per_rank_bytes
                m["mtp_attn_flops"] += 2 * per_rank_params
        m["mtp_lin_bytes_s"] = (m["mtp_attn_bytes"] + m["mtp_mlp_bytes"] + c["lm_head_bytes"]) / c["bw"]
        m["mtp_cell_bytes"] = lay.main_row_bytes + (c["idx_key_bytes"] if c["idx_layers"] else 0.0)
        m["mtp_floor_s"] = self.layer_floor_s + (self.indexer_floor_s if c["idx_layers"] else 0.0)
        draft_eff = self.mla_prefill_eff if self.mla_prefill_kernel_all else self.mla_decode_eff
        m["draft_mla_rate"] = self.gpu.bf16_flops * draft_eff
        return m

    @property
    def indexer_floor_s(self) -> float:
        """The indexer's kernel chain per full indexer layer and step: its kernels at the layer floor's
        per-kernel share (``INDEXER_KERNELS / LAYER_KERNELS`` of ``layer_floor_s``; docs/steptime.md, fact 12)."""
        return self.layer_floor_s * INDEXER_KERNELS / LAYER_KERNELS

    @property
    def tokens_per_decode(self) -> float:
        """Expected tokens one decode step yields per request (1 without MTP): the token, plus draft position ``i``
        where it and every earlier one are accepted (``1 + sum_i p_1 ... p_i``)."""
        return 1.0 + sum(
            itertools.accumulate(accept_positions(self.mtp_accept, self.num_speculative_tokens), operator.mul)
        )

    def _touched(self, tokens: float) -> float:
        """Fraction of the routed experts at least one of ``tokens`` tokens picks (uniform routing)."""
        c = self._const
        return 1.0 if not c["experts"] else 1.0 - c["expert_miss"] ** tokens

    def step_tokens(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> int:
        """Tokens one group's step computes: its prefill tokens and ``1 + num_speculative_tokens`` query rows per decode."""
        return sum(n for n, _ in prefill) + len(decode) * (1 + self.num_speculative_tokens)

    def cost(
        self,
        prefill: Sequence[tuple[int, int]],
        decode: Sequence[int],
        dp_tokens: int | None = None,
        dp_decodes: int | None = None,
    ) -> StepCost:
        """One DP group's step. ``dp_tokens`` / ``dp_decodes``: the tokens (``step_tokens``) and decodes of every
        DP group of the instance in this step, this one's included, which the MoE, dense MLP, their collectives
        and the draft passes carry; None: this group's times ``dp_attention`` (balanced groups)."""
        return self.price(self.sums(prefill, decode), dp_tokens, dp_decodes)

    def sums(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> StepSums:
        """The batch reduced to the integer aggregates ``price`` needs."""
        q = 1 + self.num_speculative_tokens  # query rows per decode (the token + its drafts)
        n_dec = len(decode)
        topk = self._const["topk"]
        # Decode sums: the plain sum is C-level; the clipped ones need a pass only past top-k (equal when q = 1).
        dec_sum = sum(decode)
        longest = max(decode) if n_dec else 0
        dec_topk = _clipped_sum(decode, dec_sum, longest, topk)
        dec_rows = dec_topk if q == 1 else _clipped_sum(decode, dec_sum, longest, q * topk)
        pf_tokens = pf_keys = pf_idx_pairs = pf_pairs = pf_chunk_rows = 0
        for n, ctx in prefill:
            pf_tokens += n
            pf_keys += n + ctx
            pf_idx_pairs += n * ctx + n * (n + 1) // 2
            pf_pairs += _sparse_pairs(n, ctx, topk)
            pf_chunk_rows += min(n + ctx, n * topk)
        return StepSums(
            len(prefill), pf_tokens, pf_keys, pf_idx_pairs, pf_pairs, pf_chunk_rows, n_dec, dec_sum, dec_topk, dec_rows
        )

    def price(self, s: StepSums, dp_tokens: int | None = None, dp_decodes: int | None = None) -> StepCost:
        """FLOPs, bytes and seconds of a step from its aggregates. The context sums (``pf_keys``, ``pf_idx_pairs``,
        ``pf_pairs``, ``pf_chunk_rows``, ``dec_sum``, ``dec_topk``, ``dec_rows``) may be int64 arrays, one entry per
        step of a run of the same batch shape: every figure is then an array, each entry computed by the same
        operations in the same order as for one step (``run_seconds``)."""
        return self._price(s, dp_tokens, dp_decodes, breakdown=True, arrays=np.ndarray in map(type, s))

    def _price(
        self, s: StepSums, dp_tokens: int | None, dp_decodes: int | None, breakdown: bool, arrays: bool
    ) -> StepCost | float | np.ndarray:
        """``price``; without ``breakdown`` only its ``total_seconds``, by the same operations (the per-component
        dictionaries and the FLOPs no second depends on are left out: a step is priced per simulated step).
        ``arrays``: some figure of ``s`` is an array (the caller knows)."""
        c, g = self._const, self.gpu
        q = 1 + self.num_speculative_tokens  # query rows per decode (the token + its drafts)
        pf_tokens, pf_keys, pf_idx_pairs = s.pf_tokens, s.pf_keys, s.pf_idx_pairs
        n_dec, dec_sum = s.n_dec, s.dec_sum
        # max of two figures: element-wise over a run's arrays (the same value per entry: no NaN is priced)
        larger = np.maximum if arrays else max
        tokens = pf_tokens + n_dec * q  # this DP group's tokens
        # every DP group's tokens go through the MoE / dense MLP
        moe_tokens = tokens * self.dp_attention if dp_tokens is None else dp_tokens
        rows = s.pf_chunks + n_dec * q  # rows that reach the lm_head
        layers, idx_layers = c["attn_layers"], c["idx_layers"]
        # Linear layers: weights once per step; each routed expert read if at least one token picked it.
        lin_flops = tokens * c["attn_flops"] + moe_tokens * c["mlp_flops"] + rows * c["lm_head_flops_per_row"]
        moe_bytes = c["expert_bytes"] * self._touched(moe_tokens)
        moe_flops = moe_tokens * c["expert_flops_per_token"]
        # Indexer pairs (query, key) per full layer, causal; keys read once per chunk / per decode.
        idx_pairs = pf_idx_pairs + dec_sum * q
        if c["kpool"] != 1:  # one score per indexer state: kpool tokens share one (keys are per state too)
            idx_pairs = idx_pairs / c["kpool"]
        idx_flops = idx_layers * idx_pairs * c["idx_flops_per_pair"]
        idx_bytes = idx_layers * ((pf_keys + dec_sum) * c["idx_key_bytes"] + idx_pairs * 8)
        # Sparse MLA: each query attends to min(position, top-k) keys.
        mla_bytes, mla_compute_s, pf_pairs, dec_pairs, mha_flops = self._sparse_mla(s, q, breakdown)
        write_bytes = tokens * c["cell_bytes"]
        bw = c["bw"]
        coll_bytes, coll_count = self._collectives(tokens, moe_tokens, layers, extend=s.pf_chunks > 0)
        linear_s = larger(lin_flops / c["gemm_rate"], c["lin_bytes_s"])
        moe_s = larger(moe_flops / c["moe_rate"], moe_bytes / bw)
        mla_s = larger(mla_compute_s, mla_bytes / bw)
        idx_s = larger(idx_flops / c["idx_rate"], idx_bytes / bw)
        write_s = write_bytes / bw
        coll_s = coll_bytes / c["link_bw"] + coll_count * g.link_latency_s
        draft_s = 0.0
        if n_dec and self.num_speculative_tokens:  # the draft passes: forwards of the MTP layer (docs/steptime.md)
            draft_rows = n_dec * self.dp_attention if dp_decodes is None else dp_decodes
            draft_s = self._draft_seconds(n_dec, draft_rows, dec_sum, s.dec_topk, larger)
        # left to right in ``seconds``' order, as total_seconds adds them: its partial sum
        components = linear_s + moe_s + mla_s + idx_s + write_s + coll_s + draft_s
        if tokens:  # small kernels' floor; below layers x layer_min_s the big kernels' work is their own latency
            work = components - draft_s  # the draft passes are forwards of their own
            floor_s = c["floor_s"] + larger(0.0, c["layer_min_s"] - work)
        else:
            floor_s = 0.0
        overhead_s = self.overhead_s if tokens else 0.0
        total = components + floor_s + overhead_s
        if not breakdown:
            return total
        mla_flops = layers * (pf_pairs + dec_pairs) * c["mla_flops_per_pair"]
        if mha_flops is not None:
            mla_flops = mla_flops + mha_flops
        flops = {"linear": lin_flops, "moe": moe_flops, "sparse_mla": mla_flops, "indexer": idx_flops}
        nbytes = {"linear": c["lin_bytes"], "moe": moe_bytes, "sparse_mla": mla_bytes, "indexer": idx_bytes}
        flops["cache_write"], nbytes["cache_write"] = 0.0, write_bytes
        flops["collectives"], nbytes["collectives"] = 0.0, coll_bytes
        secs = {"linear": linear_s, "moe": moe_s, "sparse_mla": mla_s, "indexer": idx_s, "cache_write": write_s}
        secs.update(collectives=coll_s, mtp_draft=draft_s, floor=floor_s, overhead=overhead_s)
        return StepCost(flops, nbytes, secs, total)

    def _sparse_mla(self, s: StepSums, q: int, breakdown: bool) -> tuple:
        """The sparse MLA of a step (each query attends to min(position, top-k) keys): the bytes of the rows
        it reads, its compute seconds (SGLang's dense MHA of short prefills included), the prefill and decode
        pairs it computes (top-k padding included) and, with ``breakdown``, the dense prefill's FLOPs (None
        where it does not apply)."""
        c, g = self._const, self.gpu
        topk, layers = c["topk"], c["attn_layers"]
        pf_tokens, pf_keys, pf_idx_pairs, pf_pairs, pf_chunk_rows = (
            s.pf_tokens, s.pf_keys, s.pf_idx_pairs, s.pf_pairs, s.pf_chunk_rows
        )  # fmt: skip
        n_dec, dec_topk, dec_rows = s.n_dec, s.dec_topk, s.dec_rows
        dec_pairs = q * dec_topk
        dec_eff = self.mla_decode_eff
        if self.mla_mixed_batch:  # every prefill token is a decode query of its own: its rows read per token
            pf_rows, pf_eff = pf_pairs, self.mla_decode_eff
        elif self.mla_prefill_kernel_all:  # every query, decodes too, in the prefill kernel: rows read per query
            pf_rows, pf_eff, dec_eff = pf_pairs, self.mla_prefill_eff, self.mla_prefill_eff
        else:  # one prefill kernel per chunk: each selected row read once for the chunk
            pf_rows, pf_eff = pf_chunk_rows, self.mla_prefill_eff
        mla_bytes = layers * (pf_rows + dec_rows) * c["mla_row_bytes"]
        if self.mla_padded_topk:  # the kernel computes every one of the top-k slots, -1 padding included
            pf_pairs, dec_pairs = pf_tokens * topk, n_dec * q * topk
        mha_flops = None  # SGLang's dense prefill FLOPs, where it applies
        if self.mla_dense_short_prefill and pf_tokens:
            # SGLang's MHA_ONE_SHOT (fact 24): no query sees more than top-k keys exactly when every sparse pair count
            # equals the causal one; such a step runs dense MHA instead of the sparse kernel.
            dense = s.pf_pairs == s.pf_idx_pairs  # before any top-k padding of the pair count
            pick = np.where if isinstance(dense, np.ndarray) else (lambda cond, a, b: a if cond else b)
            mha_s = layers * (
                pf_idx_pairs * c["mha_flops_per_pair"] / c["mha_rate"]
                + (pf_keys - pf_tokens) * c["kv_b_flops_per_key"] / c["gemm_rate"]
            )
            if breakdown:
                mha_flops = pick(
                    dense,
                    layers * (pf_idx_pairs * c["mha_flops_per_pair"] + (pf_keys - pf_tokens) * c["kv_b_flops_per_key"]),
                    0,
                )
            pf_pairs = pick(dense, 0, pf_pairs)
            mla_compute_s = (c["mla_layer_flops"] * (pf_pairs / pf_eff + dec_pairs / dec_eff)) / g.bf16_flops
            mla_compute_s = mla_compute_s + pick(dense, mha_s, 0.0)
        else:
            mla_compute_s = (c["mla_layer_flops"] * (pf_pairs / pf_eff + dec_pairs / dec_eff)) / g.bf16_flops
        return mla_bytes, mla_compute_s, pf_pairs, dec_pairs, mha_flops

    def run_seconds(
        self,
        contexts: Sequence[int],
        steps: int,
        chunks: Sequence[tuple[int, int]] = (),
        dp_tokens: int | None = None,
        dp_decodes: int | None = None,
        joining: int | None = None,
    ) -> np.ndarray:
        """Seconds of each of ``steps`` steps of a run: step ``j`` decodes ``contexts[i] + j`` for every ``i``
        and, while there is one, prefills the chunk ``chunks[j] = (new tokens, context before)``; after the
        chunks, with ``joining``, the request they prefilled decodes ``joining + j`` too (``dp_tokens`` /
        ``dp_decodes`` as ``cost``'s, the same every step of the run). Entry ``j`` equals ``step_seconds`` of
        that step's batch bit for bit: the sums are exact integers per step and ``price`` prices each stretch of
        equal chunk sizes (or of decodes alone) in one pass."""
        out, j = [], 0
        for n, stretch in itertools.groupby(chunks[:steps], key=operator.itemgetter(0)):
            starts = [start for _, start in stretch]
            out.append(self._run_stretch(contexts, j, len(starts), (n, starts), (dp_tokens, dp_decodes)))
            j += len(starts)
        if j < steps:
            decodes = contexts if joining is None else [*contexts, joining]
            out.append(self._run_stretch(decodes, j, steps - j, (), (dp_tokens, dp_decodes)))
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _run_stretch(
        self,
        contexts: Sequence[int],
        first_step: int,
        steps: int,
        chunk: tuple[int, list[int]] | tuple[()],
        dp: tuple[int | None, int | None],
    ) -> np.ndarray:
        """Seconds of steps ``first_step .. first_step + steps - 1`` of a run whose chunks (if any) all have
        ``chunk = (new tokens, [context before, per step])``: as arrays, or step by step when that is cheaper
        (fewer than ``ARRAY_STRETCH_STEPS``; the same bits either way)."""
        decode = [c + first_step for c in contexts]
        if not chunk and steps >= ARRAY_STRETCH_STEPS and decode:
            low = min(decode)  # the tables are indexed by the context sum: never below 0
            if low >= 0 and (len(decode) == 1 or low >= (1 + self.num_speculative_tokens) * self._const["topk"]):
                return self._saturated_decodes(decode, steps, dp)
        if steps < ARRAY_STRETCH_STEPS:
            return np.array(
                [
                    self.step_seconds(((chunk[0], chunk[1][j]),) if chunk else (), [c + j for c in decode], *dp)
                    for j in range(steps)
                ]
            )
        return self._price_decodes(decode, steps, dp, chunk)

    def _price_decodes(
        self,
        decode: list[int],
        steps: int,
        dp: tuple[int | None, int | None],
        chunk: tuple[int, list[int]] | tuple[()] = (),
    ) -> np.ndarray:
        """``price`` over arrays of ``steps`` steps: step ``j`` decodes ``c + j`` for each ``c`` in ``decode``
        and prefills ``(chunk[0], chunk[1][j])`` (none without ``chunk``)."""
        topk = self._const["topk"]
        first = self.sums((), decode)
        j = np.arange(steps, dtype=np.int64)
        dec_sum = first.dec_sum + len(decode) * j
        q = 1 + self.num_speculative_tokens
        dec_topk = _clipped_run(decode, first.dec_topk, topk, j)
        dec_rows = dec_topk if q == 1 else _clipped_run(decode, first.dec_rows, q * topk, j)
        if chunk:
            n, starts = chunk
            ctx = np.array(starts, dtype=np.int64)
            pairs = np.array([_sparse_pairs(n, c, topk) for c in starts], dtype=np.int64)
            prefill = (1, n, n + ctx, n * ctx + n * (n + 1) // 2, pairs, np.minimum(n + ctx, n * topk))
        else:
            prefill = (0, 0, 0, 0, 0, 0)
        run = StepSums(*prefill, first.n_dec, dec_sum, dec_topk, dec_rows)
        return self._price(run, *dp, breakdown=False, arrays=True)  # dec_sum: an array

    def _saturated_decodes(self, decode: list[int], steps: int, dp: tuple[int | None, int | None]) -> np.ndarray:
        """``_run_stretch`` of ``steps`` decode steps whose every query sees its whole top-k (each context at
        least ``(1 + num_speculative_tokens) * topk``), or of a single decode: such a step's price depends only on the decode
        count, the context sum and ``dp``, so it is read from ``_saturated`` (key: count and ``dp``; entry: the
        context sum, NaN until priced; no price is NaN) and only a stretch with an entry missing is priced,
        whole, and stored.
        The same bits as pricing every stretch: each entry is one step's ``price``. The tables hold 8 bytes
        per context sum up to the largest seen (≈ 17 MiB for the x1 cluster bench, shared by every instance),
        ``SATURATED_TABLE_ENTRIES`` at most in all: a stretch that would grow them past it is priced only."""
        n, first = len(decode), sum(decode)
        last = first + n * (steps - 1)  # the context sum of the stretch's last step
        key = (n, *dp)
        table = self._saturated.get(key)
        if table is None or table.size <= last:
            held = table.size if table is not None else 0
            size = max(last + 1, held * 5 // 4)
            if sum(t.size for t in self._saturated.values()) - held + size > SATURATED_TABLE_ENTRIES:
                return self._price_decodes(decode, steps, dp)
            grown = np.full(size, np.nan)
            if table is not None:
                grown[:held] = table
            table = self._saturated[key] = grown
        known = table[first : last + 1 : n]  # a view: step j's context sum is first + n * j
        if not np.isnan(known).any():
            return known.copy()
        seconds = self._price_decodes(decode, steps, dp)
        known[:] = seconds
        return seconds

    def _collectives(self, tokens: int, moe_tokens: int, layers: int, extend: bool) -> tuple[float, int]:
        """Link bytes per rank and collective count of one step (docs/steptime.md, collectives). ``extend``: the
        step carries prefill tokens (SGLang's DP-attention padding mode: SUM_LEN for extend, MAX_LEN for decode)."""
        if self.tp == 1 or not tokens:
            return 0.0, 0
        c = self._const
        hid2 = c["hidden"] * 2  # one bf16 hidden row
        attn_tp, d, tp = c["attn_tp"], self.dp_attention, self.tp
        nbytes, count = 0.0, 0
        if attn_tp > 1:  # attention output all-reduce inside the attention group (ring: 2 (n-1)/n)
            nbytes += layers * tokens * hid2 * 2 * (attn_tp - 1) / attn_tp
            count += layers
        deepep = self.moe_a2a == "deepep"
        if d > 1 and deepep:  # gather every group's tokens before the MLP, scatter after
            nbytes += layers * moe_tokens * hid2 * 2 * (d - 1) / d
            count += 2 * layers
        elif d > 1 and not extend:
            # SGLang DP attention, decode (MAX_LEN padding): all-gather every group's tokens before the MLP; after
            # it a reduce-scatter (dp_reduce_scatter_tensor) in place of the MLP all-reduce and the scatter
            nbytes += layers * moe_tokens * hid2 * ((d - 1) / d + (tp - 1) / tp)
            return nbytes, count + 2 * layers
        elif d > 1:  # extend (SUM_LEN padding): the gather is an all-reduce of a zero-filled buffer, the scatter a copy
            nbytes += layers * moe_tokens * hid2 * 2 * (d - 1) / d
            count += layers
        if deepep:  # per rank: its tokens, top-k copies, fp8 out, bf16 back
            rank_tokens = tokens / attn_tp
            ep = self.ep
            nbytes += layers * rank_tokens * c["topk_experts"] * c["hidden"] * (1 + 2) * (ep - 1) / ep
            count += 2 * layers
        else:  # MLP output all-reduce over the TP ranks
            nbytes += layers * moe_tokens * hid2 * 2 * (tp - 1) / tp
            count += layers
        return nbytes, count

    def _draft_seconds(self, n_dec: int, rows: int, dec_sum, dec_topk, larger) -> float | np.ndarray:
        """``num_speculative_tokens`` passes of the MTP layer over the decodes (SGLang EAGLE/MTP: k - 1 draft steps + 1
        draft extend), each priced as one decoder layer of the target is, at the batch's context (docs/steptime.md,
        MTP draft): the MTP layer's own weights (``weight_parts`` with one MTP layer less none; experts where
        ``rows``, every DP group's decodes, touch them) and the lm_head; its attention projections, sparse MLA
        (``dec_topk`` pairs) and indexer (``dec_sum`` keys) on this group's ``n_dec``; its MLP / experts on ``rows``;
        one cache row of the MTP layer written per decode; its two collectives; at least ``layer_min_s``, plus
        one layer floor and one indexer floor. With ``mtp_index_share`` passes 2 .. k reuse the previous pass's
        top-k and drop the indexer term. ``dec_sum`` / ``dec_topk`` may be a run's arrays (``larger``:
        ``np.maximum`` then)."""
        c = self._const
        bw = c["bw"]
        lin_flops = n_dec * c["mtp_attn_flops"] + rows * c["mtp_mlp_flops"] + n_dec * c["lm_head_flops_per_row"]
        linear_s = max(lin_flops / c["gemm_rate"], c["mtp_lin_bytes_s"])
        expert_bytes = c["mtp_expert_bytes"] * self._touched(rows)
        moe_s = max(rows * c["mtp_expert_flops_per_token"] / c["moe_rate"], expert_bytes / bw)
        mla_pairs = n_dec * c["topk"] if self.mla_padded_topk else dec_topk  # padded: every top-k slot computed
        mla_s = larger(mla_pairs * c["mla_flops_per_pair"] / c["draft_mla_rate"], dec_topk * c["mla_row_bytes"] / bw)
        idx_s = 0.0
        if c["idx_layers"]:  # the MTP layer has its own full indexer: every context key scored
            pairs = dec_sum / c["kpool"] if c["kpool"] != 1 else dec_sum  # one score per indexer state
            idx_bytes = dec_sum * c["idx_key_bytes"] + pairs * 8  # keys read, scores written and read (fp32)
            idx_s = larger(pairs * c["idx_flops_per_pair"] / c["idx_rate"], idx_bytes / bw)
        coll_bytes, coll_count = self._collectives(n_dec, rows, 1, extend=False)
        coll_s = coll_bytes / c["link_bw"] + coll_count * self.gpu.link_latency_s
        write_s = n_dec * c["mtp_cell_bytes"] / bw
        one = linear_s + moe_s + mla_s + idx_s + write_s + coll_s
        one = larger(one, self.layer_min_s) + c["mtp_floor_s"]  # fact 14: one layer; its launch floors
        if not self.mtp_index_share or self.num_speculative_tokens == 1:
            return self.num_speculative_tokens * one
        # index_share_for_mtp_iteration: passes 2 .. k attend the previous pass's top-k (no indexer scoring; the
        # new token's indexer key is still written, the floors stay)
        shared = larger(linear_s + moe_s + mla_s + write_s + coll_s, self.layer_min_s) + c["mtp_floor_s"]
        return one + (self.num_speculative_tokens - 1) * shared

    def step_seconds(
        self,
        prefill: Sequence[tuple[int, int]],
        decode: Sequence[int],
        dp_tokens: int | None = None,
        dp_decodes: int | None = None,
    ) -> float:
        return self._price(self.sums(prefill, decode), dp_tokens, dp_decodes, breakdown=False, arrays=False)

    def to_dict(self) -> dict:
        out = {"model": "roofline", "gpu": self.gpu.name}
        for name in (
            "tp", "dp_attention", "dcp", "ep", "moe_a2a", "weight_dtype", "num_speculative_tokens", "mtp_accept", "mla_mixed_batch",
            "mtp_index_share", "mla_prefill_kernel_all", "mla_padded_topk", "mla_dense_short_prefill",
            "has_indexer",
            "gemm_eff",
            "moe_eff", "mla_prefill_eff", "mla_decode_eff", "indexer_eff", "bw_eff", "link_eff", "layer_floor_s",
            "indexer_floor_s", "layer_min_s", "overhead_s",
        ):  # fmt: skip
            out[name] = getattr(self, name)
        out.update(
            peak_bf16_flops=self.gpu.bf16_flops,
            peak_fp8_flops=self.gpu.fp8_flops,
            hbm_bytes_per_s=self.gpu.hbm_bytes_per_s,
            link_bytes_per_s=self.gpu.link_bytes_per_s,
            link_latency_s=self.gpu.link_latency_s,
            mla_head_pad=self.gpu.mla_head_pad,
        )
        return out


def _clipped_run(values: Sequence[int], first: int, cap: int, steps: np.ndarray) -> np.ndarray | int:
    """``sum(min(v + j, cap) for v in values)`` for each ``j`` in ``steps``, given its value ``first`` at j = 0:
    only the values below ``cap`` still grow (each by ``min(j, cap - v)``); exact int64. ``first`` itself when
    none is below ``cap`` (the same every step: ``price`` computes what depends on it once)."""
    gaps = [cap - v for v in values if v < cap]
    if not gaps:
        return first
    return first + np.minimum(steps[:, None], np.array(gaps, dtype=np.int64)[None, :]).sum(axis=1)


def _clipped_sum(values: Sequence[int], total: int, largest: int, cap: int) -> int:
    """``sum(min(v, cap) for v in values)`` given their sum and maximum: only the values above ``cap`` are
    visited, without a ``min`` call each (the step time runs once per simulated step)."""
    if largest <= cap:
        return total
    over = [v for v in values if v > cap]
    return total - sum(over) + cap * len(over)


def _sparse_pairs(n: int, ctx: int, topk: int) -> int:
    """Sum over the chunk's queries at positions ctx..ctx+n-1 of min(position + 1, topk)."""
    lo, hi = ctx + 1, ctx + n  # keys visible to the first and last query
    if lo >= topk:
        return n * topk
    below = min(hi, topk - 1)  # queries seeing fewer than topk keys: lo..below
    ramp = (lo + below) * (below - lo + 1) // 2
    return ramp + (hi - below) * topk
