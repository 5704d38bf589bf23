"""The analytic roofline of one TP group serving a batch: what each component of a step costs in FLOPs, bytes
and seconds (docs/steptime.md). The per-rank figures are ``figures.RankFigures`` (computed once per model), the
engine-kernel facts ``kernels``, the batch's aggregates ``sums.StepSums``, and a run of steps is priced as arrays
by ``runs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dsakv.errors import DsakvError, check_choice
from dsakv.planner.gpus import GpuKind, gpu_kind
from dsakv.planner.weights import MOE_A2A
from dsakv.sim.steptime import runs
from dsakv.sim.steptime.acceptance import check_accept, tokens_per_decode
from dsakv.sim.steptime.figures import RankFigures, StepTerms, alignment_rows, rank_figures, step_terms
from dsakv.sim.steptime.fitted import BW_EFF, LINK_EFF
from dsakv.sim.steptime.kernels import DEEPGEMM_DENSE_EFF, DEEPGEMM_GROUPED_EFF, prefill_kernel_waves
from dsakv.sim.steptime.sums import StepSums, batch_sums
from dsakv.spec.layout import CacheLayout


def _where_of(cond):
    """``np.where`` for a run's array of conditions, a plain choice for one step's."""
    return np.where if isinstance(cond, np.ndarray) else (lambda c, a, b: a if c else b)


def _within_topk(s: StepSums):
    """Whether no query of the step's prefill sees more than top-k keys (every sparse pair count equals the causal
    one): SGLang's rule for its dense short prefill and for the indexer's keys-only chain (a run's array, or a bool)."""
    return s.pf_pairs == s.pf_idx_pairs


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes (per rank) of one step, per component, and the resulting seconds. ``total_seconds`` is
    the components' sum, added left to right in ``seconds``' order (what ``sum`` does on Python 3.11; spelled
    out so a run of steps priced as arrays adds in the same order as one step priced as floats)."""

    flops: dict[str, float]
    bytes: dict[str, float]
    seconds: dict[str, float]
    total_seconds: float


@dataclass(frozen=True)
class RooflineStepTime:
    """Analytic roofline of one TP group (``tp`` GPUs) serving the batch; see ``docs/steptime.md``.

    ``dcp`` splits the main-KV reads of sparse MLA across the DCP group (the indexer K is replicated,
    so indexer work is not split). ``dp_attention`` groups split the TP ranks for attention: the simulated
    batch is one group's, and the MoE / dense MLP (and their collectives) carry all ``dp_attention`` groups'
    tokens: the sum over the groups when the caller passes it (``dp_tokens``: ``dsakv.sim.cluster`` steps every
    group), else the simulated group's batch scaled by the group count (balanced round-robin groups). ``ep`` ranks
    hold the routed experts; with ``moe_a2a = "deepep"`` the MoE exchanges tokens all-to-all (fp8 dispatch,
    bf16 combine) instead of all-reducing, the experts' weights stream at DeepGEMM's published decode-GEMM rate
    (``kernels.GEMM_STREAM_EFF``, not ``bw_eff``) and an eager prefill's launch work adds to its GPU work (DeepEP's
    normal dispatch makes the host wait for the GPU at every MoE layer; docs/steptime.md, fact 35).
    ``num_speculative_tokens`` draft tokens per decode are verified each step
    (``1 + num_speculative_tokens`` query rows) and cost ``num_speculative_tokens`` forwards of the MTP layer: the
    decoder's MTP cache layer (the draft extend) and ``num_speculative_tokens - 1`` draft passes;
    ``tokens_per_decode`` is the expected yield, for reports (``mtp_accept``: one probability or one per draft
    position, ``check_accept``); each draft pass is the MTP layer's own roofline at the batch's context
    (``_draft_seconds``; no fitted constant);
    ``mtp_index_share`` (SGLang's ``index_share_for_mtp_iteration``): the draft steps skip the MTP layer's indexer.
    ``spec_overlap``: the engine overlaps its host work with the GPU's on speculative steps (vLLM, SGLang with spec
    v2); False (SGLang's EAGLE V1, its default: no overlap scheduler) adds ``spec_host_s`` to every step with decodes
    (None: derived, ``figures.eagle_v1_host_seconds``, sgl-project/sglang#15307).
    ``prefill_graph``: the engine replays CUDA graphs for prefill steps too (vLLM V1's piecewise graphs); False
    (SGLang on a DSA model: eager extend forwards) puts a floor of ``layers x eager_layer_s`` (plus each full
    indexer layer's launches: ``kernels.EAGER_INDEXER_LAUNCHES``, or ``EAGER_INDEXER_SHORT_LAUNCHES`` on a prefill
    within top-k) under every step with prefill tokens, the host's launch work (None: derived,
    ``kernels.EAGER_LAYER_S``, sgl-project/sglang#12160).
    ``weight_dtype`` (None: the config's) prices the linear layers.
    ``mla_mixed_batch``: prefill tokens go through FlashMLA's fp8 decode kernel one query row at a time: vLLM's
    FlashMLA-sparse "mixed batch" mode (fp8 cache, fewer than 32 heads per rank), and SGLang's ``flashmla_kv``
    prefill of an fp8 pool on Hopper (fact 30); priced at the decode kernel's efficiency, each prefill token reading
    its own top-k rows (no reuse across the chunk), except on SGLang's dense short prefill steps.
    ``mla_prefill_kernel_all``: vLLM with a bf16 cache, where every query, decodes included, goes through the
    sparse prefill kernel: priced at the prefill kernel's efficiency, each query reading its own top-k rows.
    ``mla_padded_topk``: the sparse-MLA kernels compute all top-k slots of every query (``-1`` padding of a
    query with fewer visible keys masked, not skipped): FLOPs of ``top-k`` pairs per query; the rows read
    stay the valid ones (padded slots gather nothing).
    ``mla_dense_short_prefill``: SGLang's MHA_ONE_SHOT, a prefill step whose chunks all hold at most top-k keys
    (prefix + new) runs dense, un-absorbed MHA: the causal pairs at ``qk_nope + rope + v`` per head (no head padding,
    FA3 varlen) at FA3's measured rate, plus the up-projection (``kv_b_proj``) of the prefix keys at the GEMM rate.
    ``mla_decode_trtllm_gen``: the sparse-MLA decode (draft passes included) runs TensorRT-LLM's trtllm-gen
    generation kernel (SGLang's ``trtllm`` DSA decode backend on Blackwell, ``kernels.sglang_trtllm_gen_decode``),
    whose head tile is the rank's head count (``kernels.trtllm_gen_mla_heads``: 8 for GLM-5.2 at TP8) instead of
    FlashMLA's 128-head blocks; priced at FlashMLA's decode efficiency (no trtllm-gen sparse rate is published; at
    up to 16 heads a rank its rows' bytes bind). Blackwell only.
    ``mla_tilelang``: the sparse MLA, prefill and decode (draft passes included), runs TileLang's split-K partial +
    combine kernels (SGLang's ``tilelang`` DSA backends, its ROCm default, ``kernels.sglang_tilelang``), priced at
    their published MI355X timings, compute included (16-row head tiles, ``kernels.tilelang_mla_heads``): the decodes
    at their line, per layer with decodes ``TILELANG_DECODE_FIXED_S`` less the one graph node the layer chain already
    prices for the sparse MLA, plus the decode rows' bytes at HBM x ``TILELANG_DECODE_STREAM_EFF`` (fact 40); the
    prefill tokens' top-k slots, masked ones included, at ``TILELANG_PREFILL_SLOT_S`` each (fact 41). CDNA 4 only; a
    model without the indexer (``has_indexer`` False) is not served by the DSA backend's kernels and ignores it.
    ``has_indexer``: False prices the model without its lightning indexer (a dense-MLA checkpoint such as
    DeepSeek-R1 / V3 served through the DSA preset: no indexer weights, kernels or indexer-cache writes), whose
    attention sees every key (``rank.topk``: the model's whole context, ``figures.rank_figures``): a decode reads
    and scores its whole context, and every prefill step is dense, un-absorbed MHA over the causal pairs (SGLang's
    MHA_ONE_SHOT / MHA_CHUNKED_KV for an extend, vLLM's MLA prefill alike), the rule of ``mla_dense_short_prefill``
    whatever that field says; the sparse kernels' modes (``mla_mixed_batch``, ``mla_prefill_kernel_all``,
    ``mla_padded_topk``) do not apply (docs/steptime.md, fact 31).
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
    mtp_index_share: bool = False  # index_share_for_mtp_iteration: draft steps reuse the draft extend's top-k
    spec_overlap: bool = True  # False: SGLang EAGLE V1, the host's work of each speculative step exposed
    prefill_graph: bool = True  # False: eager prefill forwards (SGLang on DSA models), a launch floor per prefill step
    mla_mixed_batch: bool = False
    mla_prefill_kernel_all: bool = False
    mla_padded_topk: bool = False
    mla_dense_short_prefill: bool = False
    mla_decode_trtllm_gen: bool = False  # decodes in TensorRT-LLM's trtllm-gen kernel (SGLang on Blackwell, fact 29)
    # a DSA model's batch-1 layer at the Kimi-K2 part's time, not scaled by HBM (SGLang's FlashMLA / bf16 decode on
    # Blackwell, kernels.sglang_batch1_at_reference; fact 14); a dense-MLA model (has_indexer False) always scales
    batch1_at_reference: bool = False
    # the sparse MLA in TileLang's split-K kernels at their published MI355X timings (SGLang on CDNA 4): a layer's
    # decode call TILELANG_DECODE_FIXED_S plus its rows' bytes at HBM x TILELANG_DECODE_STREAM_EFF (fact 40), a
    # prefill token's top-k slots at TILELANG_PREFILL_SLOT_S each (fact 41), 16-row head tiles
    mla_tilelang: bool = False
    # from this many MoE tokens in a step the routed experts run DeepGEMM's grouped GEMMs (vLLM on Hopper with its
    # DeepGEMM switch set: 1, fact 36), their weights at HBM x GEMM_STREAM_EFF; 0: never (DeepEP's experts always
    # do, ``moe_a2a``)
    moe_deep_gemm_min_tokens: int = 0
    # the routed experts run TensorRT-LLM's fused fp8 MoE at every step size (SGLang on Blackwell without an
    # all-to-all, fact 37), their weights at HBM x TRTLLM_MOE_STREAM_EFF
    moe_trtllm: bool = False
    # the engine runs AITER's kernels at AITER's published rates (SGLang on CDNA 4 without an all-to-all): the routed
    # experts in its fused fp8 MoE (fact 38: HBM x AITER_MOE_STREAM_EFF, the fp8 peak x AITER_MOE_COMPUTE_EFF) and
    # the linear layers in its fp8 GEMMs (fact 39: HBM x AITER_GEMM_STREAM_EFF, the fp8 peak x AITER_GEMM_DENSE_EFF,
    # AITER_GEMM_FIXED_S per GEMM of the kernel chains)
    aiter: bool = False
    has_indexer: bool = True  # the model has a lightning indexer (False: a dense-MLA model)
    gemm_eff: float = DEEPGEMM_DENSE_EFF  # dense GEMMs (DeepGEMM normal GEMMs at M = 4096): 0.515
    moe_eff: float = DEEPGEMM_GROUPED_EFF  # grouped MoE GEMMs (DeepGEMM masked layout, 256 tokens per expert): 0.44
    # None: derived per GPU kind (``terms``, ``figures.step_terms``); a number overrides (experiments, --step-settings)
    mla_prefill_eff: float | None = (
        None  # FlashMLA sparse prefill's published rate: 640 / 989.4 Hopper, 1450 / 2250 B200
    )
    mla_decode_eff: float | None = None  # FlashMLA sparse fp8 decode's: 410 / 989.4 Hopper, 350 / 2250 Blackwell
    indexer_eff: float | None = None  # DeepGEMM's fp8 MQA logits' measured rate: 1,087 / 1,978.9 (fact 45)
    bw_eff: float = BW_EFF  # fitted (one of two, fitted.py)
    link_eff: float = LINK_EFF  # fitted (one of two, fitted.py)
    layer_floor_s: float | None = None  # derived: the layer's kernel chain (kernels.LAYER_KERNEL_CHAIN)
    indexer_floor_s: float | None = None  # derived: the indexer's kernel chain per full indexer layer
    layer_min_s: float | None = None  # derived: Kimi-K2's batch-1 layer beyond its floor (fact 14)
    overhead_s: float | None = None  # derived: the kernels outside the layers, the lm_head gather (kernels.py)
    spec_host_s: float | None = None  # derived (spec_overlap False): EAGLE V1's host time per step (kernels.py)
    eager_layer_s: float | None = None  # derived (prefill_graph False): an eager forward's launch work per layer
    terms: StepTerms = field(init=False, repr=False, compare=False)  # the resolved efficiencies and fixed costs
    rank: RankFigures = field(init=False, repr=False, compare=False)  # the per-rank figures (``rank_figures``)

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
        if self.mla_decode_trtllm_gen and self.gpu.arch != "blackwell":
            raise DsakvError(
                f"step time mla_decode_trtllm_gen: TensorRT-LLM's trtllm-gen kernels run on Blackwell only; "
                f"gpu {self.gpu.name} is {self.gpu.arch}"
            )
        if self.mla_tilelang and self.gpu.arch != "cdna4":
            raise DsakvError(
                f"step time mla_tilelang: TileLang's kernels are timed on CDNA 4 (MI355X) only; "
                f"gpu {self.gpu.name} is {self.gpu.arch}"
            )
        if self.mla_tilelang and (self.mla_mixed_batch or self.mla_prefill_kernel_all):
            raise DsakvError(
                "step time mla_tilelang: SGLang's TileLang kernels do not combine with vLLM's kernel modes "
                "(mla_mixed_batch, mla_prefill_kernel_all)"
            )
        if self.moe_trtllm and (self.gpu.arch != "blackwell" or self.moe_a2a != "none"):
            raise DsakvError(
                f"step time moe_trtllm: TensorRT-LLM's fused MoE runs on Blackwell without an all-to-all; gpu "
                f"{self.gpu.name} is {self.gpu.arch}, moe_a2a is {self.moe_a2a!r}"
            )
        if self.aiter and (self.gpu.arch != "cdna4" or self.moe_a2a != "none"):
            raise DsakvError(
                f"step time aiter: AITER's kernel rates are published for CDNA 4 without an all-to-all; gpu "
                f"{self.gpu.name} is {self.gpu.arch}, moe_a2a is {self.moe_a2a!r}"
            )
        v = self.moe_deep_gemm_min_tokens
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise DsakvError(f"step time moe_deep_gemm_min_tokens = {v!r}: must be an integer >= 0 (0: never)")
        if self.moe_a2a == "deepep" and self.ep < 2:
            raise DsakvError("moe_a2a = 'deepep': needs ep >= 2 (the experts split over ranks)")
        for name in ("gemm_eff", "moe_eff", "mla_prefill_eff", "mla_decode_eff", "indexer_eff", "bw_eff", "link_eff"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1):
                raise DsakvError(f"step time {name} = {v!r}: must be in (0, 1] (or None: derived)")
        for name in ("layer_floor_s", "indexer_floor_s", "layer_min_s", "overhead_s", "spec_host_s", "eager_layer_s"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise DsakvError(f"step time {name} = {v!r}: must be >= 0 (or None: derived)")
        for name in (
            "mtp_index_share", "spec_overlap", "prefill_graph", "moe_trtllm", "aiter", "mla_tilelang",
            "batch1_at_reference",
        ):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise DsakvError(f"step time {name} = {getattr(self, name)!r}: must be True or False")
        object.__setattr__(
            self, "mtp_accept", check_accept(self.mtp_accept, self.num_speculative_tokens, "step time mtp_accept")
        )
        arch = self.layout.spec.arch_value
        if not (arch("hidden_size") and arch("num_attention_heads")):
            raise DsakvError("the roofline step time needs hidden_size and num_attention_heads in the config")
        # Derived terms and per-rank constants, computed once (frozen dataclass: set through object.__setattr__).
        object.__setattr__(self, "terms", step_terms(self))
        object.__setattr__(self, "rank", rank_figures(self))
        # seconds of decode steps that see their whole top-k (or of one decode), by (decodes, dp) and context sum
        object.__setattr__(self, "_saturated", {})
        object.__setattr__(self, "_moe_one_s", self.moe_one_token_seconds() if self.moe_trtllm else 0.0)

    @property
    def runs_tilelang(self) -> bool:
        """Whether the sparse MLA is priced as TileLang's kernels (``mla_tilelang``, facts 40-41): only a model with the
        indexer, the DSA backend's; SGLang serves a dense-MLA model through other kernels."""
        return self.mla_tilelang and self.has_indexer

    @property
    def tokens_per_decode(self) -> float:
        """Expected tokens one decode step yields per request (1 without MTP): the token, plus draft position ``i``
        where it and every earlier one are accepted (``1 + sum_i p_1 ... p_i``)."""
        return tokens_per_decode(self.mtp_accept, self.num_speculative_tokens)

    def moe_one_token_seconds(self) -> float:
        """The routed experts' seconds on a batch-1 decode step (one token through every MoE layer, the step kind
        the layer minimum was measured on: Kimi-K2 at concurrency 1, fact 14); 0 for a model without them."""
        r = self.rank
        if not r.experts:
            return 0.0
        one = r.linear.expert_bytes * self._touched(1)
        return self._moe_seconds(r.linear.expert_flops_per_token, one, 1, r.moe_act.layers, False, max)[0]

    def _touched(self, tokens: float) -> float:
        """Fraction of the routed experts at least one of ``tokens`` tokens picks (uniform routing)."""
        r = self.rank
        return 1.0 if not r.experts else 1.0 - r.expert_miss**tokens

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
        """The batch reduced to the integer aggregates ``price`` needs (``sums.batch_sums``)."""
        return batch_sums(prefill, decode, self.rank.topk, 1 + self.num_speculative_tokens)

    def price(self, s: StepSums, dp_tokens: int | None = None, dp_decodes: int | None = None) -> StepCost:
        """FLOPs, bytes and seconds of a step from its aggregates. The context sums (``pf_keys``, ``pf_idx_pairs``,
        ``pf_pairs``, ``pf_chunk_rows``, ``dec_sum``, ``dec_topk``, ``dec_rows``) may be int64 arrays, one entry per
        step of a run of the same batch shape: every figure is then an array, each entry computed by the same
        operations in the same order as for one step (``run_seconds``)."""
        return self._price(s, dp_tokens, dp_decodes, breakdown=True, arrays=np.ndarray in map(type, s))

    def price_seconds(
        self, s: StepSums, dp_tokens: int | None = None, dp_decodes: int | None = None, arrays: bool = False
    ) -> float | np.ndarray:
        """``price(s, ...).total_seconds`` by the same operations, without the breakdown (``arrays``: some figure of
        ``s`` is an array, as ``runs`` prices a run)."""
        return self._price(s, dp_tokens, dp_decodes, breakdown=False, arrays=arrays)

    def _price(
        self, s: StepSums, dp_tokens: int | None, dp_decodes: int | None, breakdown: bool, arrays: bool
    ) -> StepCost | float | np.ndarray:
        """``price``; without ``breakdown`` only its ``total_seconds``, by the same operations (the per-component
        dictionaries and the FLOPs no second depends on are left out: a step is priced per simulated step).
        ``arrays``: some figure of ``s`` is an array (the caller knows)."""
        r, g = self.rank, self.gpu
        q = 1 + self.num_speculative_tokens  # query rows per decode (the token + its drafts)
        pf_tokens, pf_keys, pf_idx_pairs = s.pf_tokens, s.pf_keys, s.pf_idx_pairs
        n_dec, dec_sum = s.n_dec, s.dec_sum
        # max of two figures: element-wise over a run's arrays (the same value per entry: no NaN is priced)
        larger = np.maximum if arrays else max
        tokens = pf_tokens + n_dec * q  # this DP group's tokens
        # every DP group's tokens go through the MoE / dense MLP
        moe_tokens = tokens * self.dp_attention if dp_tokens is None else dp_tokens
        rows = s.pf_chunks + n_dec * q  # rows that reach the lm_head
        layers, idx_layers = r.attn_layers, r.idx_layers
        # Linear layers: weights once per step; each routed expert read if at least one token picked it.
        lin_flops = (
            tokens * r.linear.attn_flops + moe_tokens * r.linear.mlp_flops + rows * r.linear.lm_head_flops_per_row
        )
        moe_bytes = r.linear.expert_bytes * self._touched(moe_tokens)
        moe_flops = moe_tokens * r.linear.expert_flops_per_token
        # Indexer pairs (query, key) per full layer, causal; keys read once per chunk / per decode.
        idx_pairs = pf_idx_pairs + dec_sum * q
        if r.kpool != 1:  # one score per indexer state: kpool tokens share one (keys are per state too)
            idx_pairs = idx_pairs / r.kpool
        idx_flops = idx_layers * idx_pairs * r.idx_flops_per_pair
        idx_bytes = idx_layers * ((pf_keys + dec_sum) * r.idx_key_bytes + idx_pairs * 8)
        # Sparse MLA: each query attends to min(position, top-k) keys.
        mla_bytes, mla_s, pf_pairs, dec_pairs, mha_flops = self._sparse_mla(s, q, breakdown, larger)
        write_bytes = tokens * r.cell_bytes
        bw, extend = r.bw, s.pf_chunks > 0
        coll_bytes, coll_count = self._collectives(tokens, moe_tokens, layers, r.dense_layers, extend)
        linear_s = larger(lin_flops / r.gemm_rate, r.lin_bytes_s)
        moe_s, act_bytes, pad = self._moe_seconds(moe_flops, moe_bytes, moe_tokens, r.moe_act.layers, extend, larger)
        idx_s = larger(idx_flops / r.idx_rate, idx_bytes / bw)
        write_s = write_bytes / bw
        coll_s = coll_bytes / r.link_bw + coll_count * g.link_latency_s
        draft_s = 0.0
        if n_dec and self.num_speculative_tokens:  # the draft passes: forwards of the MTP layer (docs/steptime.md)
            draft_rows = n_dec * self.dp_attention if dp_decodes is None else dp_decodes
            draft_s = self._draft_seconds(n_dec, draft_rows, dec_sum, s.dec_topk, larger)
        # left to right in ``seconds``' order, as total_seconds adds them: its partial sum
        components = linear_s + moe_s + mla_s + idx_s + write_s + coll_s + draft_s
        # the draft passes are forwards of their own, outside the layers' minimum
        floor_s = self._floor_seconds(components - draft_s, moe_s, larger) if tokens else 0.0
        overhead_s = self.terms.overhead_s if tokens else 0.0
        total = components + floor_s + overhead_s
        spec_host_s = 0.0
        if n_dec and self.num_speculative_tokens and not self.spec_overlap:  # EAGLE V1: the host's work exposed
            spec_host_s = self.terms.spec_host_s
            total = total + spec_host_s
        eager_s = 0.0
        if pf_tokens and not self.prefill_graph:  # an eager forward: no sooner than its kernels are launched
            launch_s = self._eager_launch_seconds(s)
            # DeepEP's normal dispatch (SGLang's on extend steps) makes the host wait for the GPU at every MoE layer:
            # its launches are priced in series with the GPU's work, not hidden under it (fact 35)
            eager_s = launch_s if self.moe_a2a == "deepep" else larger(0.0, launch_s - total)
            total = total + eager_s
        if not breakdown:
            return total
        mla_flops = layers * (pf_pairs * r.mla_flops_per_pair + dec_pairs * r.mla_decode_flops_per_pair)
        if mha_flops is not None:
            mla_flops = mla_flops + mha_flops
        flops = {"linear": lin_flops, "moe": moe_flops + pad, "sparse_mla": mla_flops, "indexer": idx_flops}
        nbytes = {"linear": r.lin_bytes, "moe": moe_bytes + act_bytes, "sparse_mla": mla_bytes, "indexer": idx_bytes}
        flops["cache_write"], nbytes["cache_write"] = 0.0, write_bytes
        flops["collectives"], nbytes["collectives"] = 0.0, coll_bytes
        secs = {"linear": linear_s, "moe": moe_s, "sparse_mla": mla_s, "indexer": idx_s, "cache_write": write_s}
        secs.update(collectives=coll_s, mtp_draft=draft_s, floor=floor_s, overhead=overhead_s)
        if spec_host_s:
            secs["spec_host"] = spec_host_s
        if np.any(eager_s):
            secs["eager_launch"] = eager_s
        return StepCost(flops, nbytes, secs, total)

    def _floor_seconds(self, work, moe_s, larger):
        """A non-empty step's floor: the small kernels' chains, and what the layer minimum adds where the big kernels'
        ``work`` is below it (their own latency, fact 14). Under TensorRT-LLM's fused MoE the minimum holds only its
        one-token time: what more tokens add to its bytes (``moe_s``) comes after the rest of the layer's latency, not
        under it (fact 49). ``larger``: ``max``, or ``np.maximum`` over a run's arrays."""
        r = self.rank
        rest = work - moe_s if self.moe_trtllm else work
        return r.floor_s + larger(0.0, r.layer_min_s - self._moe_one_s - rest)

    def _eager_launch_seconds(self, s: StepSums) -> float | np.ndarray:
        """The host's launch work of an eager prefill forward: every layer's chain, and each full indexer layer's
        (SGLang's keys-only chain where no sequence of the step holds more than top-k keys, the whole one else)."""
        short = _within_topk(s)
        indexer_s = _where_of(short)(short, self.terms.eager_indexer_short_s, self.terms.eager_indexer_s)
        return self.rank.layers * self.terms.eager_layer_s + self.rank.idx_layers * indexer_s

    def _sparse_mla(self, s: StepSums, q: int, breakdown: bool, larger) -> tuple:
        """The sparse MLA of a step (each query attends to min(position, top-k) keys): the bytes of the rows
        it reads, its seconds (the larger of its compute, SGLang's dense MHA of short prefills included, and its
        bytes at the fitted HBM rate; with ``mla_tilelang`` TileLang's measured rates, added), the
        prefill and decode pairs it computes (top-k padding included) and, with ``breakdown``, the dense prefill's
        FLOPs (None where it does not apply). ``larger``: ``max``, or ``np.maximum`` over a run's arrays."""
        r, g = self.rank, self.gpu
        topk, layers = r.topk, r.attn_layers
        pf_tokens, pf_keys, pf_idx_pairs, pf_pairs, pf_chunk_rows = (
            s.pf_tokens, s.pf_keys, s.pf_idx_pairs, s.pf_pairs, s.pf_chunk_rows
        )  # fmt: skip
        n_dec, dec_topk, dec_rows = s.n_dec, s.dec_topk, s.dec_rows
        dec_pairs = q * dec_topk
        dec_eff = self.terms.mla_decode_eff
        sparse = self.has_indexer  # a dense-MLA model runs none of the sparse kernels' modes (fact 31)
        # SGLang's MHA_ONE_SHOT (fact 24): a step no query of which sees more than top-k keys runs dense MHA; a
        # dense-MLA model's every prefill step (its top-k is its whole context: always within)
        short_rule = (self.mla_dense_short_prefill or not sparse) and pf_tokens
        dense = _within_topk(s) if short_rule else False
        pick = _where_of(dense)
        if self.mla_mixed_batch and sparse:  # every prefill token is a decode query of its own: its rows read per
            # token (a dense step reads each key once, as the chunk kernel does)
            pf_rows, pf_eff = pick(dense, pf_chunk_rows, pf_pairs), self.terms.mla_decode_eff
        elif self.mla_prefill_kernel_all and sparse:  # every query, decodes too, in the prefill kernel: rows read
            # per query
            pf_rows, pf_eff, dec_eff = pf_pairs, self.terms.mla_prefill_eff, self.terms.mla_prefill_eff
        else:  # one prefill kernel per chunk: each selected row read once for the chunk
            pf_rows, pf_eff = pf_chunk_rows, self.terms.mla_prefill_eff
        mla_bytes = layers * (pf_rows + dec_rows) * r.mla_row_bytes
        if self.mla_padded_topk and sparse:  # the kernel computes every one of the top-k slots, -1 padding included
            pf_pairs, dec_pairs = pf_tokens * topk, n_dec * q * topk
        mha_flops = None  # SGLang's dense prefill FLOPs, where it applies
        if short_rule:
            mha_s = layers * (
                pf_idx_pairs * r.mha_flops_per_pair / r.mha_rate
                + (pf_keys - pf_tokens) * r.kv_b_flops_per_key / r.gemm_rate
            )
            if breakdown:
                mha_flops = pick(
                    dense,
                    layers * (pf_idx_pairs * r.mha_flops_per_pair + (pf_keys - pf_tokens) * r.kv_b_flops_per_key),
                    0,
                )
            pf_pairs = pick(dense, 0, pf_pairs)
            dense_s = pick(dense, mha_s, 0.0)
        else:
            dense_s = 0.0
        if self.runs_tilelang:  # TileLang's measured rates, compute included: the decodes' call at its line (fact
            # 40), every top-k slot of the sparse prefill's tokens, masked ones too, at its time a slot (fact 41)
            dec_s = (layers * r.tilelang_decode_fixed_s if n_dec else 0.0) + layers * dec_rows * r.mla_row_bytes / (
                r.tilelang_decode_bw
            )
            pf_slots = pick(dense, 0, pf_tokens * topk)
            pf_s = layers * pf_slots * r.tilelang_prefill_slot_s
            return mla_bytes, dense_s + pf_s + dec_s, pf_slots, dec_pairs, mha_flops
        # FlashMLA's sparse prefill kernel fills the GPU only with enough query rows (fact 44): its queries' work at
        # the whole GPU's rate, times its waves; vLLM's bf16 path runs every query of the step in one call
        if self.mla_prefill_kernel_all and sparse:
            pf_waves = dec_waves = prefill_kernel_waves(
                (pf_tokens + n_dec * q) * r.prefill_kernel_row_sms, self.gpu.sm_count
            )
        elif sparse and not self.mla_mixed_batch:  # the prefill chunks (not a dense step's), decodes elsewhere
            pf_waves = pick(dense, 1.0, prefill_kernel_waves(pf_tokens * r.prefill_kernel_row_sms, self.gpu.sm_count))
            dec_waves = 1.0
        else:
            pf_waves = dec_waves = 1.0
        # each kernel's FLOPs over its efficiency: the FLOPs the bf16 peak would take as long for
        at_peak = (
            r.mla_layer_flops * pf_pairs / pf_eff * pf_waves
            + r.mla_decode_layer_flops * dec_pairs / dec_eff * dec_waves
        )
        mla_compute_s = at_peak / g.bf16_flops + dense_s
        bytes_s = layers * (pf_rows * pf_waves + dec_rows * dec_waves) * r.mla_row_bytes / r.bw
        return mla_bytes, larger(mla_compute_s, bytes_s), pf_pairs, dec_pairs, mha_flops

    def run_seconds(
        self,
        contexts: Sequence[int],
        steps: int,
        chunks: Sequence[tuple[int, int]] = (),
        dp_tokens: int | None = None,
        dp_decodes: int | None = None,
        joining: int | None = None,
    ) -> np.ndarray:
        """Seconds of each of ``steps`` steps of a run of decodes (``runs.run_seconds``): step ``j`` decodes ``contexts[i] + j``
        and prefills ``chunks[j]`` while there is one; entry ``j`` equals ``step_seconds`` of that step bit for bit."""
        return runs.run_seconds(self, contexts, steps, chunks, dp_tokens, dp_decodes, joining)

    def _collectives(
        self, tokens: int, moe_tokens: int, layers: int, dense_layers: int, extend: bool
    ) -> tuple[float, int]:
        """Link bytes per rank and collective count of one step (docs/steptime.md, collectives) over ``layers``
        layers, ``dense_layers`` of them with a dense MLP. ``extend``: the step carries prefill tokens (SGLang's
        DP-attention padding mode: SUM_LEN for extend, MAX_LEN for decode). Under DeepEP a MoE layer keeps each rank's
        tokens where they are and dispatches them (SGLang's ``LayerCommunicator``: SCATTERED when an all-to-all
        backend is set); only the dense layers gather every group's tokens and all-reduce their MLP."""
        if self.tp == 1 or not tokens:
            return 0.0, 0
        r = self.rank
        hid2 = r.hidden * 2  # one bf16 hidden row
        attn_tp, d, tp = r.attn_tp, self.dp_attention, self.tp
        nbytes, count = 0.0, 0
        if attn_tp > 1:  # attention output all-reduce inside the attention group (ring: 2 (n-1)/n)
            nbytes += layers * tokens * hid2 * 2 * (attn_tp - 1) / attn_tp
            count += layers
        deepep = self.moe_a2a == "deepep"
        moe_layers = layers - dense_layers
        if d > 1 and deepep:  # the dense layers gather every group's tokens before the MLP, scatter after
            nbytes += dense_layers * moe_tokens * hid2 * 2 * (d - 1) / d
            count += 2 * dense_layers
        elif d > 1 and not extend:
            # SGLang DP attention, decode (MAX_LEN padding): all-gather every group's tokens before the MLP; after
            # it a reduce-scatter (dp_reduce_scatter_tensor) in place of the MLP all-reduce and the scatter
            nbytes += layers * moe_tokens * hid2 * ((d - 1) / d + (tp - 1) / tp)
            return nbytes, count + 2 * layers
        elif d > 1:  # extend (SUM_LEN padding): the gather is an all-reduce of a zero-filled buffer, the scatter a copy
            nbytes += layers * moe_tokens * hid2 * 2 * (d - 1) / d
            count += layers
        if deepep:  # MoE layers, per rank: its tokens, fp8 out, bf16 back to and from the other EP ranks
            rank_tokens = tokens / attn_tp
            ep = self.ep
            # normal mode (extend steps): once per rank holding one of the token's experts; low-latency mode
            # (decode): one copy per expert (fact 35)
            copies = r.dispatch_copies if extend else r.topk_experts * (ep - 1) / ep
            nbytes += moe_layers * rank_tokens * copies * r.hidden * (1 + 2)
            count += 2 * moe_layers
            if d == 1 and dense_layers:  # the dense MLP's output all-reduce over the TP ranks
                nbytes += dense_layers * moe_tokens * hid2 * 2 * (tp - 1) / tp
                count += dense_layers
        else:  # MLP output all-reduce over the TP ranks
            nbytes += layers * moe_tokens * hid2 * 2 * (tp - 1) / tp
            count += layers
        return nbytes, count

    def _expert_bw(self, moe_tokens: int) -> float:
        """The rate a step's routed experts stream at with ``moe_tokens`` through the MoE: TensorRT-LLM's fused
        MoE's (``rank.trtllm_moe_bw``) where the engine runs it (``moe_trtllm``, fact 37), AITER's fused MoE's
        (``rank.aiter_moe_bw``, ``aiter``, fact 38), DeepGEMM's (``rank.deep_gemm_bw``) once the engine runs them
        in its grouped GEMMs (``moe_deep_gemm_min_tokens``, fact 36), else ``rank.expert_bw`` (DeepGEMM's under
        DeepEP, the fitted bw otherwise)."""
        if self.moe_trtllm:
            return self.rank.trtllm_moe_bw
        if self.aiter:
            return self.rank.aiter_moe_bw
        if self.moe_deep_gemm_min_tokens and moe_tokens >= self.moe_deep_gemm_min_tokens:
            return self.rank.deep_gemm_bw
        return self.rank.expert_bw

    def _moe_seconds(self, flops, weight_bytes, tokens: int, layers: int, extend: bool, larger) -> tuple:
        """(seconds, activation bytes, padding FLOPs) of the routed experts with ``tokens`` through ``layers`` MoE
        layers: the grouped GEMMs' roofline, their FLOPs at the MoE rate against their weights at ``_expert_bw``'s rate
        plus their activations at the fitted HBM rate, then the kernels around them at that rate (fact 43). The
        activations are the step's kind's (``rank.moe_act``): vLLM's DeepGEMM experts' where ``_expert_bw`` takes them,
        DeepEP's normal mode's on an ``extend`` step, else the decode step's; a kind that pads each local expert's rows
        (DeepGEMM's contiguous layout) adds its expected padding rows' FLOPs and bytes (``figures.alignment_rows``)."""
        r = self.rank
        acts = r.moe_act
        use_deep_gemm = self.moe_deep_gemm_min_tokens and tokens >= self.moe_deep_gemm_min_tokens
        act = acts.deep_gemm if use_deep_gemm else acts.extend if extend else acts.decode
        gemm_act, kernel_act = tokens * layers * act.gemm, tokens * layers * act.kernels
        pad_flops = 0.0
        if act.align:  # every padding row computed: its FLOPs, its GEMM tensors, the kernels between the GEMMs
            pad = layers * alignment_rows(tokens, r.experts, r.topk_experts, acts.local_experts, act.align)
            pad_flops = pad * acts.row_flops
            flops = flops + pad_flops
            gemm_act, kernel_act = gemm_act + pad * act.align_gemm, kernel_act + pad * act.align_kernels
        seconds = (
            larger(flops / r.moe_rate, weight_bytes / self._expert_bw(tokens) + gemm_act / r.bw) + kernel_act / r.bw
        )
        return seconds, gemm_act + kernel_act, pad_flops

    def _draft_seconds(self, n_dec: int, rows: int, dec_sum, dec_topk, larger) -> float | np.ndarray:
        """The draft steps: ``num_speculative_tokens - 1`` passes of the MTP layer over the decodes (SGLang's EAGLE
        ``draft_forward`` stops before its last step; vLLM's proposer runs k - 1 more after its first); the k-th
        forward, the draft extend over the step's rows (q a decode, every prefill token), is the decoder's MTP cache
        layer (``rank.layers``). Each pass is priced as one decoder layer of the target is, at the batch's context
        (docs/steptime.md, MTP draft): the MTP layer's own weights (``weight_parts`` with one MTP layer less none;
        experts where ``rows``, every DP group's decodes, touch them) and the lm_head; its attention projections,
        sparse MLA (``dec_topk`` pairs) and indexer (``dec_sum`` keys) on this group's ``n_dec``; its MLP / experts on
        ``rows``; one cache row of the MTP layer written per decode; its two collectives; at least ``layer_min_s``,
        plus one layer floor and one indexer floor. With ``mtp_index_share`` the draft steps reuse the draft extend's
        top-k and drop the indexer term. ``dec_sum`` / ``dec_topk`` may be a run's arrays (``larger``:
        ``np.maximum`` then)."""
        steps = self.num_speculative_tokens - 1
        if steps == 0:  # one draft: the draft extend (the decoder's MTP layer) proposes it
            return 0.0
        r = self.rank
        bw = r.bw
        lin_flops = n_dec * r.mtp.attn_flops + rows * r.mtp.mlp_flops + n_dec * r.linear.lm_head_flops_per_row
        linear_s = max(lin_flops / r.gemm_rate, r.mtp_lin_bytes_s)
        expert_bytes = r.mtp.expert_bytes * self._touched(rows)
        moe_s = 0.0
        if r.mtp.expert_bytes:  # one MoE layer over the draft's rows
            moe_s = self._moe_seconds(rows * r.mtp.expert_flops_per_token, expert_bytes, rows, 1, False, max)[0]
        padded = self.mla_padded_topk and self.has_indexer  # padded: every top-k slot computed (sparse kernels)
        mla_pairs = n_dec * r.topk if padded else dec_topk
        if self.runs_tilelang:  # one layer's decode call at TileLang's line (fact 40)
            mla_s = r.tilelang_decode_fixed_s + dec_topk * r.mla_row_bytes / r.tilelang_decode_bw
        else:
            mla_s = larger(mla_pairs * r.mla_decode_flops_per_pair / r.draft_mla_rate, dec_topk * r.mla_row_bytes / bw)
            if self.mla_prefill_kernel_all and self.has_indexer:  # one query a decode in the prefill kernel (fact 44)
                mla_s = mla_s * prefill_kernel_waves(n_dec * r.prefill_kernel_row_sms, self.gpu.sm_count)
        idx_s = 0.0
        # the MTP layer has its own full indexer, every context key scored; with index_share_for_mtp_iteration the
        # draft steps attend the draft extend's top-k instead (the new token's indexer key is still written, the
        # floors stay)
        if r.idx_layers and not self.mtp_index_share:
            pairs = dec_sum / r.kpool if r.kpool != 1 else dec_sum  # one score per indexer state
            idx_bytes = dec_sum * r.idx_key_bytes + pairs * 8  # keys read, scores written and read (fp32)
            idx_s = larger(pairs * r.idx_flops_per_pair / r.idx_rate, idx_bytes / bw)
        coll_bytes, coll_count = self._collectives(n_dec, rows, 1, 0, extend=False)
        coll_s = coll_bytes / r.link_bw + coll_count * self.gpu.link_latency_s
        write_s = n_dec * r.mtp_cell_bytes / bw
        one = linear_s + moe_s + mla_s + idx_s + write_s + coll_s
        return steps * (larger(one, self.terms.layer_min_s) + r.mtp_floor_s)  # fact 14: one layer; its launch floors

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
            "mtp_index_share", "spec_overlap", "prefill_graph", "mla_prefill_kernel_all", "mla_padded_topk", "mla_dense_short_prefill",
            "mla_decode_trtllm_gen", "mla_tilelang", "moe_deep_gemm_min_tokens", "moe_trtllm", "aiter",
            "batch1_at_reference", "has_indexer",
            "gemm_eff", "moe_eff", "bw_eff", "link_eff",
        ):  # fmt: skip
            out[name] = getattr(self, name)
        for name in (
            "mla_prefill_eff",
            "mla_decode_eff",
            "indexer_eff",
            "layer_floor_s",
            "indexer_floor_s",
            "layer_min_s",
            "overhead_s",
            "spec_host_s",
            "eager_layer_s",
        ):
            out[name] = getattr(self.terms, name)  # the values priced with, derived or given
        out.update(
            peak_bf16_flops=self.gpu.bf16_flops,
            peak_fp8_flops=self.gpu.fp8_flops,
            hbm_bytes_per_s=self.gpu.hbm_bytes_per_s,
            link_bytes_per_s=self.gpu.link_bytes_per_s,
            link_latency_s=self.gpu.link_latency_s,
            mla_head_pad=self.gpu.mla_head_pad,
            kernel_node_s=self.gpu.kernel_node_s,
        )
        return out
