"""What the engines' kernels do, as the roofline needs it: which kernel serves which query (the engine-kernel
predicates), and the kernels' published rates the efficiencies come from. Each fact is cited here and in
docs/steptime.md; the roofline (``roofline.py``) only reads them.
"""

from __future__ import annotations

import math

from dsakv.spec.layout import CacheLayout

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
