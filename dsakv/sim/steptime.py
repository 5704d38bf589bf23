"""Step-time models: how long one scheduler step (one forward pass over a batch) takes on a GPU group.

A model sees only the shape of the step: the prefill chunks (new tokens, context before them) and the
decodes (context length each), and returns seconds. ``dsakv.sim.config.STEP_MODELS`` names the choices:

* ``roofline`` (default): an analytic roofline per component, from the spec, the cache layout, the
  planner's weight breakdown and the GPU's peak speeds (the planner's GPU catalogue,
  ``dsakv.planner.gpus``); every constant and assumption is in ``docs/steptime.md``. Per rank of one TP
  group::

      t = overhead + sum over components c of max(flops_c / (peak_c * compute_eff), bytes_c / (hbm_bw * bw_eff))
          + allreduce_bytes / (link_bw * link_eff)

  components: linear layers (weights read once per step; routed experts only where touched), sparse MLA
  (top-k latent rows read per query), the lightning indexer (every context key scored per query on the
  full layers, fp8), and the cache writes of both caches.
* ``constant``: a fixed time per step plus a time per token (tests, or calibrated engines).

Both offer ``step_seconds(prefill, decode)`` (``prefill``: ``(new_tokens, context_before)`` per chunk;
``decode``: the context length, including the new token, per decoding request) and ``to_dict()``.
Models hold no state between steps; ``step_seconds`` does not change the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dsakv.errors import DsakvError
from dsakv.planner.gpus import GpuKind, gpu_kind
from dsakv.planner.weights import weight_parts
from dsakv.spec.layout import CacheLayout


@dataclass(frozen=True)
class ConstantStepTime:
    """``seconds = per_step + per_token * tokens`` (tokens = prefill tokens + decodes)."""

    per_step_s: float = 0.02
    per_token_s: float = 0.0

    def __post_init__(self) -> None:
        if self.per_step_s < 0 or self.per_token_s < 0:
            raise DsakvError("constant step time: per_step_s and per_token_s must be >= 0")

    def step_seconds(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> float:
        return self.per_step_s + self.per_token_s * (sum(n for n, _ in prefill) + len(decode))

    def to_dict(self) -> dict:
        return {"model": "constant", "per_step_s": self.per_step_s, "per_token_s": self.per_token_s}


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes (per rank) of one step, per component, and the resulting seconds."""

    flops: dict[str, float]
    bytes: dict[str, float]
    seconds: dict[str, float]

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


@dataclass(frozen=True)
class RooflineStepTime:
    """Analytic roofline of one TP group (``tp`` GPUs) serving the batch; see ``docs/steptime.md``.

    ``dcp`` splits the main-KV reads of sparse MLA across the DCP group (the indexer K is replicated,
    so indexer work is not split). ``dp_attention`` groups split the TP ranks for attention: one group's
    batch runs its attention with heads over ``tp / dp_attention`` ranks. ``mtp_draft`` draft tokens per decode are verified each step (``1 +
    mtp_draft`` query rows); ``tokens_per_decode`` is the expected yield, for reports.
    """

    layout: CacheLayout
    gpu: GpuKind = field(default_factory=lambda: gpu_kind("H200"))
    tp: int = 8
    dp_attention: int = 1
    dcp: int = 1
    mtp_draft: int = 0
    mtp_accept: float = 0.8
    compute_eff: float = 0.5
    bw_eff: float = 0.8
    link_eff: float = 0.7
    overhead_s: float = 0.002

    def __post_init__(self) -> None:
        for name in ("tp", "dp_attention", "dcp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise DsakvError(f"step time {name} = {v!r}: must be a positive integer")
        for name in ("compute_eff", "bw_eff", "link_eff"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise DsakvError(f"step time {name} = {v!r}: must be in (0, 1]")
        if not 0 <= self.mtp_accept <= 1:
            raise DsakvError(f"step time mtp_accept = {self.mtp_accept!r}: must be in [0, 1]")
        arch = self.layout.spec.arch_value
        if not (arch("hidden_size") and arch("num_attention_heads")):
            raise DsakvError("the roofline step time needs hidden_size and num_attention_heads in the config")
        # Derived per-rank constants, computed once (frozen dataclass: set through object.__setattr__).
        object.__setattr__(self, "_const", self._constants())

    def _constants(self) -> dict[str, float]:
        spec, lay = self.layout.spec, self.layout
        a = spec.arch_value
        parts = weight_parts(spec, lay.mtp_layers)
        attn_tp = max(self.tp // self.dp_attention, 1)  # DP attention: heads split over tp / dp_attention
        div = {"tp": self.tp, "attn_tp": attn_tp, "ep": self.tp, "replicated": 1}
        c = {"dense_bytes": 0.0, "dense_flops_per_token": 0.0, "expert_bytes": 0.0, "lm_head_bytes": 0.0}
        for p in parts:
            per_rank_bytes, per_rank_params = p.bytes / div[p.shard], p.params / div[p.shard]
            if p.name == "embedding":
                continue  # a gather of the batch's rows, not a read of the matrix
            if p.name == "lm_head":
                c["lm_head_bytes"] = per_rank_bytes
                c["lm_head_flops_per_row"] = 2 * per_rank_params
            elif p.name == "routed experts":
                c["expert_bytes"] = per_rank_bytes
                c["expert_flops_per_token"] = (
                    2 * per_rank_params * a("num_experts_per_tok") / max(a("n_routed_experts"), 1)
                )
            else:
                c["dense_bytes"] += per_rank_bytes
                c["dense_flops_per_token"] += 2 * per_rank_params
        heads = a("num_attention_heads") / attn_tp
        # Absorbed MLA per (query, key) pair and layer: scores over latent+rope, values over the latent.
        c["mla_flops_per_pair"] = heads * 2 * (spec.kv_lora_rank + spec.qk_rope_head_dim + spec.kv_lora_rank)
        c["weight_bytes_per_param"] = 1.0 if spec.weight_dtype == "fp8" else 2.0
        c["hidden"] = a("hidden_size")
        c["experts"] = a("n_routed_experts")
        c["topk_experts"] = a("num_experts_per_tok")
        return c

    @property
    def tokens_per_decode(self) -> float:
        """Expected tokens one decode step yields per request (1 without MTP)."""
        return 1.0 + self.mtp_draft * self.mtp_accept

    def cost(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> StepCost:
        c = self._const
        lay, spec = self.layout, self.layout.spec
        q = 1 + self.mtp_draft  # query rows per decode (the token + its drafts)
        n_dec = len(decode)
        tokens = sum(n for n, _ in prefill) + n_dec * q
        rows = len(prefill) + n_dec * q  # rows that reach the lm_head
        layers, idx_layers, topk = lay.num_attention_layers, lay.num_indexer_layers, spec.index_topk
        # Linear layers: weights once per step; each routed expert read if at least one token picked it.
        experts = c["experts"]
        touched = 1.0 if not experts else 1.0 - (1.0 - c["topk_experts"] / experts) ** tokens
        lin_bytes = c["dense_bytes"] + c["expert_bytes"] * touched + c["lm_head_bytes"]
        lin_flops = tokens * (c["dense_flops_per_token"] + c.get("expert_flops_per_token", 0.0))
        lin_flops += rows * c.get("lm_head_flops_per_row", 0.0)
        # Indexer pairs (query, key) per full layer, causal; keys read once per chunk / per decode.
        idx_pairs = sum(n * ctx + n * (n + 1) // 2 for n, ctx in prefill) + sum(decode) * q
        idx_keys = sum(n + ctx for n, ctx in prefill) + sum(decode)
        idx_flops = idx_layers * idx_pairs * spec.indexer_flops_per_pair
        idx_bytes = idx_layers * (idx_keys * lay.indexer_row_bytes / lay.index_kpool + idx_pairs * 8)
        # Sparse MLA: each query attends to min(position, top-k) keys; rows read once per chunk.
        mla_pairs = sum(_sparse_pairs(n, ctx, topk) for n, ctx in prefill) + q * sum(min(d, topk) for d in decode)
        mla_rows = sum(min(n + ctx, n * topk) for n, ctx in prefill) + sum(min(d, q * topk) for d in decode)
        mla_flops = layers * mla_pairs * c["mla_flops_per_pair"]
        mla_bytes = layers * mla_rows * lay.main_row_bytes / self.dcp
        write_bytes = tokens * lay.cell_bytes
        ar_bytes = 2 * layers * tokens * c["hidden"] * 2 * 2 * (self.tp - 1) / self.tp  # 2 bf16 all-reduces/layer
        flops = {"linear": lin_flops, "sparse_mla": mla_flops, "indexer": idx_flops, "cache_write": 0.0}
        nbytes = {"linear": lin_bytes, "sparse_mla": mla_bytes, "indexer": idx_bytes, "cache_write": write_bytes}
        bw = self.gpu.hbm_bytes_per_s * self.bw_eff
        lin_peak = self.gpu.fp8_flops if c["weight_bytes_per_param"] == 1.0 else self.gpu.bf16_flops
        peak = {
            "linear": lin_peak,
            "sparse_mla": self.gpu.bf16_flops,
            "indexer": self.gpu.fp8_flops,
            "cache_write": 1.0,
        }
        secs = {k: max(flops[k] / (peak[k] * self.compute_eff), nbytes[k] / bw) for k in flops}
        secs["allreduce"] = ar_bytes / (self.gpu.link_bytes_per_s * self.link_eff) if self.tp > 1 else 0.0
        secs["overhead"] = self.overhead_s if tokens else 0.0
        return StepCost(flops, nbytes, secs)

    def step_seconds(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> float:
        return self.cost(prefill, decode).total_seconds

    def to_dict(self) -> dict:
        return {
            "model": "roofline",
            "gpu": self.gpu.name,
            "tp": self.tp,
            "dp_attention": self.dp_attention,
            "dcp": self.dcp,
            "mtp_draft": self.mtp_draft,
            "mtp_accept": self.mtp_accept,
            "compute_eff": self.compute_eff,
            "bw_eff": self.bw_eff,
            "link_eff": self.link_eff,
            "overhead_s": self.overhead_s,
            "peak_bf16_flops": self.gpu.bf16_flops,
            "peak_fp8_flops": self.gpu.fp8_flops,
            "hbm_bytes_per_s": self.gpu.hbm_bytes_per_s,
            "link_bytes_per_s": self.gpu.link_bytes_per_s,
        }


def _sparse_pairs(n: int, ctx: int, topk: int) -> int:
    """Sum over the chunk's queries at positions ctx..ctx+n-1 of min(position + 1, topk)."""
    lo, hi = ctx + 1, ctx + n  # keys visible to the first and last query
    if lo >= topk:
        return n * topk
    below = min(hi, topk - 1)  # queries seeing fewer than topk keys: lo..below
    ramp = (lo + below) * (below - lo + 1) // 2
    return ramp + (hi - below) * topk
