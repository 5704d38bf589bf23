"""Step-time models: how long one scheduler step (one forward pass over a batch) takes on a GPU group.

A model sees only the shape of the step: the prefill chunks (new tokens, context before them) and the decodes
(context length each), and returns seconds. ``dsakv.sim.config.STEP_MODELS`` names the choices:

* ``roofline`` (default, ``RooflineStepTime``): an analytic roofline per component, from the spec, the cache
  layout, the planner's weight breakdown and the GPU's peak speeds (``dsakv.planner.gpus``). Per rank of one TP
  group::

      t = overhead + layers * floor + indexer_layers * indexer_floor + max(layers * layer_min, W) + MTP
      W = sum over components c of max(flops_c / (peak_c * eff_c), bytes_c / (hbm_bw * bw_eff))
          + collective_bytes / (link_bw * link_eff) + collectives * link_latency
      MTP = k x max(sum over the MTP layer's components of max(flops / (peak x eff), bytes / (hbm_bw x bw_eff))
                    + its collectives, layer_min) + its floors     (k draft passes; steps with decodes)

  components: linear layers (weights read once per step; routed experts only where touched), sparse MLA (top-k
  latent rows read per query), the lightning indexer (every context key scored per query on the full layers),
  the cache writes of both caches, collectives, MTP draft passes, the small kernels' floors, a per-layer minimum
  and a per-step overhead. docs/steptime.md gives every formula and constant with its source.
* ``constant`` (``ConstantStepTime``): a fixed time per step plus a time per token (tests, or calibrated engines).

Both offer ``step_seconds(prefill, decode, dp_tokens=None, dp_decodes=None)``, ``step_tokens(prefill, decode)``,
``run_seconds`` (each step of a run of decode steps, bit for bit ``step_seconds``) and ``to_dict()``.

The package, in reading order:

* ``kernels``: what the engines' kernels do (which kernel serves which query) and their published rates;
* ``figures``: the per-rank figures of one deployment (``RankFigures``, a typed table, computed once);
* ``sums``: one step's batch as integer aggregates (``StepSums``) and their exact sums;
* ``roofline``: ``RooflineStepTime``, the formulas that price the aggregates;
* ``runs``: the array fast path (a run of steps in one numpy pass, and the tables of saturated decode steps);
* ``acceptance``: MTP draft acceptance; ``constant``: ``ConstantStepTime``.
"""

from dsakv.planner.weights import MOE_A2A  # the MoE's token exchange: a deployment knob (GpuSetting.moe_a2a)
from dsakv.sim.steptime.acceptance import accept_positions, check_accept, tokens_per_decode
from dsakv.sim.steptime.constant import ConstantStepTime
from dsakv.sim.steptime.figures import LinearShare, RankFigures, rank_figures
from dsakv.sim.steptime.kernels import (
    DEEPGEMM_DENSE_EFF,
    DEEPGEMM_GROUPED_EFF,
    FA3_MHA_EFF,
    VLLM_MIN_HEADS_FOR_BF16_PREFILL,
    sglang_aiter,
    sglang_batch1_at_reference,
    sglang_dense_short_prefill,
    sglang_prefill_in_decode_kernel,
    sglang_tilelang,
    sglang_trtllm_gen_decode,
    sglang_trtllm_moe,
    tilelang_mla_heads,
    trtllm_gen_mla_heads,
    vllm_deep_gemm_moe_min_tokens,
    vllm_mixed_batch,
    vllm_padded_topk,
    vllm_prefill_kernel_all,
)
from dsakv.sim.steptime.roofline import RooflineStepTime, StepCost
from dsakv.sim.steptime.sums import StepSums

__all__ = [
    "DEEPGEMM_DENSE_EFF",
    "DEEPGEMM_GROUPED_EFF",
    "FA3_MHA_EFF",
    "MOE_A2A",
    "VLLM_MIN_HEADS_FOR_BF16_PREFILL",
    "ConstantStepTime",
    "LinearShare",
    "RankFigures",
    "RooflineStepTime",
    "StepCost",
    "StepSums",
    "accept_positions",
    "check_accept",
    "rank_figures",
    "sglang_aiter",
    "sglang_dense_short_prefill",
    "sglang_prefill_in_decode_kernel",
    "sglang_tilelang",
    "sglang_batch1_at_reference",
    "sglang_trtllm_gen_decode",
    "sglang_trtllm_moe",
    "tilelang_mla_heads",
    "tokens_per_decode",
    "trtllm_gen_mla_heads",
    "vllm_deep_gemm_moe_min_tokens",
    "vllm_mixed_batch",
    "vllm_padded_topk",
    "vllm_prefill_kernel_all",
]
