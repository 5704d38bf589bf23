"""What the engines' kernels do, as the roofline needs it: which kernel serves which query (the engine-kernel
predicates), and the kernels' published rates the efficiencies come from. Each fact is cited here and in
docs/steptime.md; the roofline (``roofline.py``) only reads them.
"""

from __future__ import annotations

import math
from statistics import geometric_mean

from dsakv.planner.gpus import GPU_KINDS, TERA
from dsakv.planner.weights import matrix_bytes
from dsakv.spec.layout import CacheLayout

# vLLM's FlashMLA-sparse backend runs prefill tokens through the fp8 decode kernel ("mixed batch" mode) when a
# rank has fewer query heads than this and the cache is fp8 (vllm/v1/attention/backends/mla/flashmla_sparse.py:
# MIN_HEADS_FOR_BF16_PREFILL); SGLang's NSA backend keeps a prefill kernel.
VLLM_MIN_HEADS_FOR_BF16_PREFILL = 32
# DeepGEMM's measured fp8 rates (TFLOP/s) of DeepSeek-V3's dense shapes at M = 4096 on H800 SXM (README of the
# 2025-02 release, "Normal GEMMs for dense models": N x K = 2112 x 7168, 24576 x 1536, 32768 x 512, 7168 x 16384,
# 4096 x 7168, 7168 x 2048), over H800's dense fp8 peak (1978.9 TFLOP/s): their geometric mean prices the
# linear layers of prefill-sized steps.
DEEPGEMM_DENSE_M4096_TFLOPS = (1058, 990, 590, 1358, 1304, 1025)
# The peaks the kernels were measured against come from the GPU catalogue (``dsakv.planner.gpus``), in TFLOP/s.
H800, H100, B200 = (GPU_KINDS[name] for name in ("H800", "H100", "B200"))
H800_FP8_TFLOPS = H800.fp8_flops / TERA
DEEPGEMM_DENSE_EFF = geometric_mean(DEEPGEMM_DENSE_M4096_TFLOPS) / H800_FP8_TFLOPS
# The grouped MoE GEMMs at prefill / large-batch shapes: DeepGEMM's masked-layout rows with 256 tokens per expert
# (4 groups x M 256: N x K = 4096 x 7168 and 7168 x 2048; a DP8 prefill of 8 x 1,024 tokens gives 8,192 x 8 / 256
# = 256 tokens per expert), over the same peak: 0.44.
DEEPGEMM_GROUPED_M256_TFLOPS = (932, 815)
DEEPGEMM_GROUPED_EFF = geometric_mean(DEEPGEMM_GROUPED_M256_TFLOPS) / H800_FP8_TFLOPS
# DeepGEMM's fp8 MQA logits, the lightning indexer's scoring of a prefill's rows (``fp8_mqa_logits``), as its own test
# prints them (``tests/test_attention.py`` at v2.1.1.post3, run by a user on a Hopper GPU and pasted in
# sgl-project/sglang#11989, 2026-01-21): 64 heads of dim 128, 2,048 query rows, each scoring the keys before it
# (``CP=0``: row i scores [0, SKV - 2,048 + i), a prefill chunk's windows after its prefix), FLOPs as the test counts
# them (2 x heads x dim per scored (row, key) pair): (SKV, TFLOP/s). The GPU is not named: rates near 1,100 TFLOP/s
# rule out the H20 (296 dense), and H100 / H800 / H200 SXM share the catalogue's 1,978.9 peak. Their geometric mean
# over it, 0.549, prices every indexer's logits (``indexer_eff``; the paged decode kernel's bytes bind it anyway). No
# rate is settled for the kernels Blackwell and CDNA parts run (docs/steptime.md, known gaps): they take Hopper's.
DEEPGEMM_MQA_LOGITS_S2048_TFLOPS = ((4096, 1004), (8192, 1081), (16384, 1126), (32768, 1144))
DEEPGEMM_MQA_LOGITS_EFF = geometric_mean(rate for _, rate in DEEPGEMM_MQA_LOGITS_S2048_TFLOPS) / H800_FP8_TFLOPS
# DeepGEMM's contiguous layout (``m_grouped_fp8_gemm_nt_contiguous``) stacks the experts' rows in segments whose
# lengths are multiples of its M alignment, ``get_mk_alignment_for_contiguous_layout()[0]`` = 128 rows (one M block of
# the kernel; deepseek-ai/DeepGEMM): SGLang's DeepEP normal mode has DeepEP's dispatch pad each local expert's received
# count to it (``expert_alignment``) and computes every row of the segments (``ep_scatter`` writes the expert's id over
# the whole segment), and vLLM's ``DeepGemmExperts`` runs every M block that holds one of an expert's rows. Each
# expert with ``n`` rows thus costs ``ceil(n / 128) x 128`` rows of the GEMMs and of the activation between them
# (``figures.alignment_rows``; docs/steptime.md fact 43).
DEEPGEMM_CONTIGUOUS_M_ALIGNMENT = 128
# SGLang's NSA backend runs a prefill batch whose every sequence holds at most top-k keys (prefix + new) as dense,
# un-absorbed MHA through FlashAttention-3's varlen kernel on Hopper (MHA_ONE_SHOT; sgl-project/sglang#11892, threshold
# SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = index_topk, docs/steptime.md fact 24). FA3's measured forward rate
# at head dim 128, sequence 1K and 2K, H100 SXM5 (pytorch/benchmark#2391, tritonbench flash_v3, the FA3 paper's sizes),
# over H100's dense bf16 peak: its geometric mean prices that kernel.
FA3_FWD_HDIM128_TFLOPS = (517.099, 565.544)
H100_BF16_TFLOPS = H100.bf16_flops / TERA
FA3_MHA_EFF = geometric_mean(FA3_FWD_HDIM128_TFLOPS) / H100_BF16_TFLOPS
# FlashMLA's published sparse-MLA rates per kernel generation (README at deepseek-ai/FlashMLA 9241ae3, the 2025-09-29
# release): "410 TFLOPS in compute-bound configuration on H800 SXM5 ... up to 350 TFlops on B200 (which is not really
# optimized yet)" for the fp8-cache decode kernel, "up to 640 TFlops ... on H800 SXM5 ... 1450 TFlops on B200" for the
# prefill kernel. Each over the dense bf16 peak of the GPU it was measured on: (TFLOP/s, peak TFLOP/s). AMD parts run
# other kernels (TileLang / Triton) with no published rate: they take Hopper's (docs/steptime.md, known gaps).
H800_BF16_TFLOPS = H800.bf16_flops / TERA
B200_BF16_TFLOPS = B200.bf16_flops / TERA
FLASHMLA_SPARSE_DECODE = {"hopper": (410.0, H800_BF16_TFLOPS), "blackwell": (350.0, B200_BF16_TFLOPS)}
FLASHMLA_SPARSE_PREFILL = {"hopper": (640.0, H800_BF16_TFLOPS), "blackwell": (1450.0, B200_BF16_TFLOPS)}

# FlashMLA's sparse prefill kernel (``flash_mla_sparse_fwd``; vLLM's every query with a bf16 cache, SGLang's sparse
# prefill chunks) gives each query row's heads to one CTA and loops that CTA over all of the row's top-k blocks: on
# SM90 ``q_h_idx = blockIdx.x % (h_q/B_H)``, ``s_q_idx = blockIdx.x / (h_q/B_H)`` with ``B_H = 64``
# (``csrc/kernels/sm90/prefill/sparse/phase1.cuh``); on SM100 ``B_H = 128 // For 2 CTAs`` (a CTA pair's 2x1SM MMA,
# ``csrc/cuda_kernels/sm100/prefill/sparse/fwd/head128/config.h``; deepseek-ai/FlashMLA). So a row's padded heads
# occupy ``padded / 64`` SMs and nothing splits its keys: a step with fewer such units than the GPU has SMs leaves the
# rest idle, and a partial last wave runs as long as a full one (``prefill_kernel_waves``; docs/steptime.md fact 44).
FLASHMLA_SPARSE_PREFILL_HEADS_PER_SM = 64


def prefill_kernel_waves(units: int, sms: int) -> float:
    """How much longer FlashMLA's sparse prefill kernel runs than its work at the whole GPU's rate: ``units`` CTAs of
    equal work (``FLASHMLA_SPARSE_PREFILL_HEADS_PER_SM`` heads of one query row each) in ``ceil(units / sms)`` waves of
    ``sms`` at once, so ``waves x sms / units`` (1 with no units; 132 on an H200 for one decode: one SM does it all)."""
    if units <= 0:
        return 1.0
    return -(-units // sms) * sms / units


def flashmla_efficiency(table: dict[str, tuple[float, float]], arch: str) -> float:
    """A FlashMLA kernel's published rate over its GPU's bf16 peak, for ``arch`` (Hopper's for a kind without one)."""
    rate, peak = table.get(arch, table["hopper"])
    return rate / peak


# DeepGEMM's fp8 GEMMs at decode sizes (M = 64 and 128) on H800 SXM, DeepSeek-V3's shapes (README at deepseek-ai/
# DeepGEMM 55ab91f, 2025-03-25, "Normal GEMMs for dense models"): (M, N, K, TFLOP/s). Each kernel's time is its FLOPs
# over its rate; its bytes are the fp8 weight N x K, the fp8 input M x K and the bf16 output 2 M N. A least-squares
# line time = fixed + bytes / (eff x 3.35 TB/s) through the twelve rows gives what a GEMM costs beyond its bytes at
# these sizes (``GEMM_FIXED_S``, 2.6 us: prologue, epilogue, the last wave) and the HBM fraction its bytes stream at
# (``GEMM_STREAM_EFF``, 0.84: an upper bound for the fitted ``bw_eff``, which also carries what a step reads at
# less than streaming rate).
DEEPGEMM_DECODE_GEMMS = (
    (64, 2112, 7168, 206), (64, 24576, 1536, 289), (64, 32768, 512, 219), (64, 7168, 16384, 336),
    (64, 4096, 7168, 287), (64, 7168, 2048, 295), (128, 2112, 7168, 352), (128, 24576, 1536, 535),
    (128, 32768, 512, 358), (128, 7168, 16384, 645), (128, 4096, 7168, 533), (128, 7168, 2048, 510),
)  # fmt: skip
H800_HBM_BYTES_PER_S = H800.hbm_bytes_per_s


def fixed_and_seconds_per_byte(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares line ``seconds = fixed + bytes x slope`` through ``points`` of (bytes, seconds): (fixed,
    slope), closed form (no fitting library)."""
    count = len(points)
    mean_b, mean_t = sum(b for b, _ in points) / count, sum(t for _, t in points) / count
    slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / sum((b - mean_b) ** 2 for b, _ in points)
    return mean_t - slope * mean_b, slope


def gemm_line(rows: list[tuple[int, int, int, float]], hbm_bytes_per_s: float) -> tuple[float, float]:
    """(seconds a GEMM costs beyond its bytes, fraction of ``hbm_bytes_per_s`` its bytes stream at): the least-squares
    line ``time = fixed + bytes / rate`` through measured fp8 GEMMs, ``rows`` of (M, N, K, seconds), each one's bytes
    the fp8 weight N x K, the fp8 input M x K and the bf16 output 2 M N."""
    fixed, slope = fixed_and_seconds_per_byte([(n * k + m * k + 2 * m * n, s) for m, n, k, s in rows])
    return fixed, 1 / slope / hbm_bytes_per_s


def gemm_fixed_and_stream() -> tuple[float, float]:
    """``gemm_line`` through ``DEEPGEMM_DECODE_GEMMS`` on H800."""
    rows = [(m, n, k, 2 * m * n * k / (tf * 1e12)) for m, n, k, tf in DEEPGEMM_DECODE_GEMMS]
    return gemm_line(rows, H800_HBM_BYTES_PER_S)


GEMM_FIXED_S, GEMM_STREAM_EFF = gemm_fixed_and_stream()

# TensorRT-LLM's fused fp8 MoE (FlashInfer's ``trtllm_fp8_block_scale_moe``: routing, the gate / up and down grouped
# GEMMs and the finalize in trtllm-gen kernels), the kernel SGLang runs a DeepSeek-family model's routed experts in on
# Blackwell without an all-to-all (``sglang_trtllm_moe``). Its measured latency on one B300 SXM6 (SM103, 148 SMs):
# DeepSeek's MoE (hidden 7168, expert intermediate 2048, 256 experts, top-8 of 4 of 8 groups) with the 32 experts of
# one EP 8 rank, MXFP8 weights and activations (one UE8M0 scale per 32 elements along K), routing from logits,
# activation quantisation and finalize timed, cold L2, the median of 100 iterations (flashinfer-ai/flashinfer#5301,
# 2026-09-17, ``benchmarks/bench_moe_deepseek.py``, the "TRTLLM MXFP8" column of one of its repeats; a second
# repeat's 1-512 rows agree within 0.3 % from 128 tokens up and 3 % below, a third's 1-token row is 9.5 % above):
# (tokens, ms). The same kernel runs
# DeepSeek's 128 x 128 block scales (``Fp8QuantizationType.DeepSeekFp8``); the weights' bytes are the same but for
# the scales.
TRTLLM_MOE_B300_MXFP8_MS = (
    (1, 0.037345), (2, 0.054448), (4, 0.081488), (8, 0.099169), (16, 0.119904), (32, 0.171458), (64, 0.226609),
    (128, 0.235218), (256, 0.251202), (512, 0.260034),
)  # fmt: skip
TRTLLM_MOE_BENCH_SHAPE = {
    "hidden": 7168, "intermediate": 2048, "experts": 256, "local_experts": 32, "topk": 8, "scale_block": 32,
}  # fmt: skip
B300_HBM_BYTES_PER_S = GPU_KINDS["B300"].hbm_bytes_per_s


def trtllm_moe_fixed_and_stream() -> tuple[float, float]:
    """(seconds the benchmarked MoE costs beyond its weights' bytes, fraction of HBM peak those bytes stream at): the
    least-squares line through ``TRTLLM_MOE_B300_MXFP8_MS``, each row's bytes the local experts its tokens touch
    under uniform routing (the roofline's own rule: each token picks a given expert with probability top-k /
    experts) times one expert's gate / up and down weights with their scales. The slope gives the rate;
    the fixed part (routing, quantisation, finalize, the launches; cold L2) is the layer floor's business
    (``LAYER_KERNEL_CHAIN``) and is not priced from here."""
    sh = TRTLLM_MOE_BENCH_SHAPE
    expert_bytes = 3 * sh["hidden"] * sh["intermediate"] * (1 + 1 / sh["scale_block"])
    miss = 1 - sh["topk"] / sh["experts"]
    pts = [
        (sh["local_experts"] * (1 - miss**tokens) * expert_bytes, ms / 1e3) for tokens, ms in TRTLLM_MOE_B300_MXFP8_MS
    ]
    fixed, slope = fixed_and_seconds_per_byte(pts)
    return fixed, 1 / slope / B300_HBM_BYTES_PER_S


TRTLLM_MOE_STREAM_EFF = trtllm_moe_fixed_and_stream()[1]

# AITER's fused fp8 MoE (``aiter.fused_moe``: fp8 experts with 128 x 128 weight-block scales, activations quantised
# per 1 x 128), the kernel SGLang runs a DeepSeek-family model's routed experts in on ROCm: its ROCm image sets
# ``SGLANG_USE_AITER=1`` (``docker/rocm.Dockerfile``) and the fp8 MoE method then runs the ``aiter`` MoE runner
# (``layers/quantization/fp8.py``, both at 0cb618343, 2026-06-16). AITER's tuner stores, per token count, the kernel
# it picked and that kernel's measured time (column ``us``), and AITER merges every ``model_configs/*tuned_fmoe*.csv``
# into its lookup by default (``aiter/jit/core.py``, ``get_config_file``). GLM-5's table on MI355X (``cu_num`` 256:
# 256 CUs, gfx950): hidden 6144, expert intermediate 256 (2,048 over TP 8), 257 experts at top-9 (the 256 routed at
# top-8 and the shared expert fused in as one more, always chosen), fp8 e4m3 weights and activations
# (ROCm/aiter ``aiter/configs/model_configs/a8w8_blockscale_tuned_fmoe_glm5.csv``, last changed 0f6aede14c,
# 2026-04-13, #2719, and so in 7d604afe5f, the AITER commit that SGLang's ROCm image of 2026-06-16 builds):
# (tokens, us).
AITER_FMOE_MI355X_GLM5_TP8_US = (
    (1, 30.2567), (2, 41.8507), (4, 56.1829), (8, 68.9083), (16, 92.8796), (32, 139.7967), (64, 188.0575),
    (128, 213.5816), (256, 244.5057), (512, 260.859), (1024, 333.3869), (2048, 386.3245), (4096, 581.2317),
    (8192, 1089.5555), (16384, 1941.8567), (32768, 3768.5665),
)  # fmt: skip
AITER_FMOE_BENCH_SHAPE = {"hidden": 6144, "intermediate": 256, "experts": 256, "fused_shared": 1, "topk": 8}
MI355X = GPU_KINDS["MI355X"]
# The rows each rate is read from. The stream rate: 1 to 512 tokens, the range fitted on TensorRT-LLM's table
# (above), where the bytes grow with the experts touched (all 257 from 128 tokens on). The compute rate: from 4,096
# tokens on, where each doubling of the tokens nearly doubles the time (x 1.87, 1.78, 1.94): the kernel is
# compute-bound there; below it the bytes and the fixed part weigh (2,048 -> 4,096: x 1.50).
AITER_MOE_STREAM_MAX_TOKENS = 512
AITER_MOE_COMPUTE_MIN_TOKENS = 4096


def aiter_moe_expert_bytes() -> int:
    """One expert's bytes in the benchmarked shape: gate, up and down projections in fp8 with their 128 x 128 block
    scales (``planner.weights.matrix_bytes``)."""
    sh = AITER_FMOE_BENCH_SHAPE
    h, i = sh["hidden"], sh["intermediate"]
    return 2 * matrix_bytes(i, h, "fp8") + matrix_bytes(h, i, "fp8")


def aiter_moe_stream_and_compute() -> tuple[float, float]:
    """(fraction of MI355X's HBM peak AITER's fused MoE streams its experts at, fraction of its fp8 peak it computes
    at): the least-squares slopes through ``AITER_FMOE_MI355X_GLM5_TP8_US``. Stream: each row's bytes are the experts
    its tokens touch under uniform routing (the roofline's rule) plus the fused shared expert, up to
    ``AITER_MOE_STREAM_MAX_TOKENS``. Compute: each row's FLOPs are its tokens x (top-k + the shared expert) x the
    three projections, from ``AITER_MOE_COMPUTE_MIN_TOKENS``. The fixed parts (routing, sorting, quantisation, the
    launches) are the layer floor's business and are not priced from here."""
    sh = AITER_FMOE_BENCH_SHAPE
    miss = 1 - sh["topk"] / sh["experts"]
    expert_bytes = aiter_moe_expert_bytes()
    stream = [
        ((sh["experts"] * (1 - miss**tokens) + sh["fused_shared"]) * expert_bytes, us / 1e6)
        for tokens, us in AITER_FMOE_MI355X_GLM5_TP8_US
        if tokens <= AITER_MOE_STREAM_MAX_TOKENS
    ]
    flops_per_token = (sh["topk"] + sh["fused_shared"]) * 3 * 2 * sh["hidden"] * sh["intermediate"]
    compute = [
        (tokens * flops_per_token, us / 1e6)
        for tokens, us in AITER_FMOE_MI355X_GLM5_TP8_US
        if tokens >= AITER_MOE_COMPUTE_MIN_TOKENS
    ]
    seconds_per_byte = fixed_and_seconds_per_byte(stream)[1]
    seconds_per_flop = fixed_and_seconds_per_byte(compute)[1]
    return 1 / seconds_per_byte / MI355X.hbm_bytes_per_s, 1 / seconds_per_flop / MI355X.fp8_flops


AITER_MOE_STREAM_EFF, AITER_MOE_COMPUTE_EFF = aiter_moe_stream_and_compute()

# SGLang's Triton fused MoE (``fused_experts_impl``, the tensor-parallel experts on Hopper) streams its experts' weights
# at a fraction of HBM that falls with the rank's slice of an expert (``moe_intermediate_size x ep / tp`` columns of
# the gate / up and down projections): measured in AIConfigurator's H200 tables of SGLang 0.5.6.post2 (ai-dynamo/
# aiconfigurator 095f58a51, ``bench/calibration/aiconfigurator/moe.csv``: DeepSeek's 256 experts of width 2,048, top 8,
# fp8 blocks, MoE TP 1 to 32), each layer's bytes counted as dsakv counts them for the experts the table's own routing
# touches (``python bench/moe_stream.py``, which recomputes these): the median over 32 to 256 tokens, (slice columns,
# fraction of HBM). The fitted ``bw_eff`` holds at the slice of every Hopper row it was fitted on
# (``TRITON_MOE_REFERENCE_SLICE``, MoE TP 8); another slice streams at ``bw_eff`` times its measured fraction over
# the reference's (``triton_moe_slice_factor``; docs/steptime.md fact 51).
TRITON_MOE_STREAM_BY_SLICE = ((64, 0.30), (128, 0.46), (256, 0.66), (512, 0.82), (1024, 0.88), (2048, 0.90))
TRITON_MOE_REFERENCE_SLICE = 256


def triton_moe_slice_factor(slice_columns: float) -> float:
    """The Triton fused MoE's streaming fraction at a rank's expert slice of ``slice_columns`` over its fraction at
    ``TRITON_MOE_REFERENCE_SLICE`` (1 there): interpolated linearly in log2 of the slice between the measured points
    of ``TRITON_MOE_STREAM_BY_SLICE``, held at the end points beyond them."""
    points = TRITON_MOE_STREAM_BY_SLICE
    reference = dict(points)[TRITON_MOE_REFERENCE_SLICE]
    x = math.log2(max(slice_columns, 1.0))
    xs = [math.log2(cols) for cols, _ in points]
    if x <= xs[0]:
        return points[0][1] / reference
    if x >= xs[-1]:
        return points[-1][1] / reference
    i = next(i for i in range(1, len(xs)) if x <= xs[i])
    frac = points[i - 1][1] + (points[i][1] - points[i - 1][1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return frac / reference


# AITER's fp8 block-scale GEMM with pre-shuffled weights (``gemm_a8w8_blockscale_bpreshuffle``, CK kernels), what
# SGLang runs an fp8 checkpoint's linear layers in on gfx950 with ROCm >= 7.2 (``_use_aiter_bpreshuffle_gfx95``,
# ``aiter_w8a8_block_fp8_linear``; AITER's Triton GEMMs only for the DeepSeek shapes that
# ``use_aiter_triton_gemm_w8a8_tuned_gfx950`` lists, none of GLM-5's; ``layers/quantization/fp8_utils.py`` at
# 0cb618343). Its tuned table for GLM-5 on MI355X holds the measured time of the kernel picked per M for GLM-5's
# TP 8 shapes (N x K): 128 x 6144 (the indexer's ``wk``), 2624 x 6144 (``q_a`` and ``kv_a`` fused), 3072 x 6144 and
# 6144 x 1536 (the dense MLP's gate / up and down), 3584 x 512 (``kv_b``) (ROCm/aiter
# ``aiter/configs/model_configs/glm5_a8w8_blockscale_bpreshuffle_tuned_gemm.csv`` as of 7d604afe5f, the AITER commit
# SGLang's ROCm image of 2026-06-16 builds; added by #2518, 2026-03-29): its decode rows (M 1 to 64) and M = 4,096,
# (M, us) per (N, K).
AITER_GEMM_MI355X_GLM5_TP8_US = {
    (128, 6144): (
        (1, 10.229), (2, 10.0576), (4, 10.1416), (8, 10.5937), (16, 10.2885), (32, 9.8484), (48, 9.7423),
        (64, 10.3252), (4096, 16.2952),
    ),
    (2624, 6144): (
        (1, 17.0117), (2, 16.8584), (4, 17.3416), (8, 17.3829), (16, 15.5025), (32, 15.5856), (48, 15.1016),
        (64, 15.0601), (4096, 83.0256),
    ),
    (3072, 6144): (
        (1, 16.977), (2, 17.362), (4, 17.4624), (8, 17.2502), (16, 15.612), (32, 15.6472), (48, 15.5615),
        (64, 15.5445), (4096, 100.7871),
    ),
    (3584, 512): (
        (1, 3.2478), (2, 3.0064), (4, 3.3027), (8, 3.5929), (16, 3.3578), (32, 3.4342), (48, 3.8924), (64, 3.3788),
        (4096, 21.0249),
    ),
    (6144, 1536): (
        (2, 6.7452), (4, 6.5478), (8, 6.5386), (16, 6.5494), (32, 6.4059), (48, 6.6653), (64, 6.7173),
        (4096, 62.9487),
    ),
}  # fmt: skip
AITER_GEMM_DECODE_MAX_M = 64  # the table's decode rows; M = 4,096 is its prefill-size row, as DeepGEMM's dense set
AITER_GEMM_DENSE_M = 4096


def aiter_gemm_fixed_and_stream() -> tuple[float, float]:
    """``gemm_line`` (bytes counted as for DeepGEMM's) through the decode rows of ``AITER_GEMM_MI355X_GLM5_TP8_US`` on
    MI355X."""
    rows = [
        (m, n, k, us / 1e6)
        for (n, k), shape in AITER_GEMM_MI355X_GLM5_TP8_US.items()
        for m, us in shape
        if m <= AITER_GEMM_DECODE_MAX_M
    ]
    return gemm_line(rows, MI355X.hbm_bytes_per_s)


def aiter_gemm_dense_eff() -> float:
    """AITER's fp8 GEMMs at prefill size: the geometric mean of the table's M = 4,096 rates over MI355X's fp8 peak,
    as ``DEEPGEMM_DENSE_EFF`` is DeepGEMM's at M = 4,096 over H800's."""
    rates = [
        2 * m * n * k / (us / 1e6)
        for (n, k), rows in AITER_GEMM_MI355X_GLM5_TP8_US.items()
        for m, us in rows
        if m == AITER_GEMM_DENSE_M
    ]
    return geometric_mean(rates) / MI355X.fp8_flops


AITER_GEMM_FIXED_S, AITER_GEMM_STREAM_EFF = aiter_gemm_fixed_and_stream()
AITER_GEMM_DENSE_EFF = aiter_gemm_dense_eff()

# TileLang's split-K sparse-MLA decode on CDNA 4, what SGLang's DSA attention runs on ROCm (``tilelang`` is its HIP
# default for both DSA backends, ``_set_default_dsa_backends`` in server_args.py at 7bd1a9d16, 0.5.13.post1's
# commit; the GLM-5.2 cookbook's MI355X cells also name it): ``tilelang_sparse_fwd`` launches a partial kernel, one
# block per query row and group of top-k slots (64 slots a tile, ``inner_iter`` tiles a block so that there are at
# least 2 blocks per CU of 256, 256 threads, a 16-row head tile: ``padded_H = max(next_power_of_2(heads), 16)``),
# then a combine kernel over the groups' partial outputs; the bf16 cache runs ``sparse_mla_fwd_decode_partial``, the
# plain fp8 e4m3 cache (576-byte rows: 512 latent + 64 rope, no scales) ``sparse_mla_fwd_decode_partial_fp8`` in the
# same grid and tiles (``dsa/tilelang_kernel.py`` at 7bd1a9d16; both partial kernels and the combine unchanged at
# 06ad7b2b0, 2026-08-20). Its one published timing: MI355X, GLM-5.2's TP 4 shape (16 heads, d_v 512, rows of 576,
# top-k 2,048, the fp8 cache), partial + combine captured in a graph, the median of 7 interleaved runs
# (sgl-project/sglang#39106, 2026-09-11, the "tilelang" column): (decode rows, us).
TILELANG_DECODE_MI355X_US = ((4, 24.02), (64, 41.87), (128, 64.54), (256, 109.72), (512, 199.96))
TILELANG_DECODE_BENCH_SHAPE = {"heads": 16, "row_bytes": 576, "topk": 2048}
# The kernels' head tile: 16 rows (the MFMA tile) up to 64 heads, a power of two at or above the rank's heads; above
# 64 heads whole tiles of 64 (``REPLICATE_H``). GLM-5.2 at TP 8 (8 heads a rank) and at TP 4 (16) both run 16 rows.
TILELANG_MLA_MIN_HEAD_TILE = 16
TILELANG_MLA_HEAD_TILE = 64


def tilelang_mla_heads(heads: float) -> int:
    """The query heads one token's sparse MLA computes in SGLang's TileLang kernels on ROCm, padding included: up to
    ``TILELANG_MLA_HEAD_TILE`` heads, the power of two at or above ``heads`` (at least 16); above, whole tiles of 64."""
    heads = math.ceil(heads)
    if heads <= TILELANG_MLA_HEAD_TILE:
        return max(TILELANG_MLA_MIN_HEAD_TILE, 1 << (heads - 1).bit_length())
    return -(-heads // TILELANG_MLA_HEAD_TILE) * TILELANG_MLA_HEAD_TILE


def tilelang_decode_fixed_and_stream() -> tuple[float, float]:
    """(seconds one layer's TileLang decode call costs beyond its rows' bytes, fraction of MI355X's HBM peak those
    bytes stream at): the least-squares line ``time = fixed + bytes / rate`` through ``TILELANG_DECODE_MI355X_US``,
    each row's bytes its decode rows x top-k x the rows' bytes (every slot of the benchmark is a key). The fixed part is
    the partial and combine kernels' latency at a handful of rows, their two graph nodes in."""
    sh = TILELANG_DECODE_BENCH_SHAPE
    fixed, slope = fixed_and_seconds_per_byte(
        [(rows * sh["topk"] * sh["row_bytes"], us / 1e6) for rows, us in TILELANG_DECODE_MI355X_US]
    )
    return fixed, 1 / slope / MI355X.hbm_bytes_per_s


TILELANG_DECODE_FIXED_S, TILELANG_DECODE_STREAM_EFF = tilelang_decode_fixed_and_stream()

# TileLang's sparse-MLA prefill on CDNA 4: ``tilelang_sparse_fwd`` prefills through the same partial kernel, one query
# row a token (at a prefill's thousands of rows ``inner_iter`` takes every tile: one group, the combine a copy), its
# grid every top-k slot of every row (a masked slot, -1 in the indices, loads row 0 and is computed, then masked). At a
# prefill's rows the kernel is bound by its blocks' vector work and coordination, not by its rows' bytes nor its
# matrix cores (the fp8 prefill profiled on gfx950: VALU busy 42 %, MFMA 12 %, occupancy 37 %; sgl-project/sglang#28975,
# 2026-06-23), so a chunk costs its slots. Its one published timing: MI355X, a chunk of 8,148 query rows, top-k 2,048,
# OCP e4m3 rows of 576 bytes (the plain fp8 partial kernel), d_v 512, at 4 / 8 / 12 / 16 heads, all one 16-row tile,
# 20 warm-up and 50 timed iterations (sgl-project/sglang#37847, 2026-09-03, its "TileLang" column beside the Triton
# prefill it compared): (heads, ms). The four are one kernel's work, within 3 % of their mean.
TILELANG_PREFILL_MI355X_MS = ((4, 2.2386), (8, 2.2522), (12, 2.3062), (16, 2.3035))
TILELANG_PREFILL_BENCH_SHAPE = {"rows": 8148, "topk": 2048}


def tilelang_prefill_slot_seconds() -> float:
    """Seconds TileLang's prefill spends on one (query row, top-k slot) on MI355X: the mean of
    ``TILELANG_PREFILL_MI355X_MS`` over the benchmark's rows x top-k. No fixed part: at a chunk's thousands of rows the
    call's latency is within the timing, and an eager prefill's launches are the eager floor's."""
    sh = TILELANG_PREFILL_BENCH_SHAPE
    seconds = sum(ms for _, ms in TILELANG_PREFILL_MI355X_MS) / len(TILELANG_PREFILL_MI355X_MS) / 1e3
    return seconds / (sh["rows"] * sh["topk"])


TILELANG_PREFILL_SLOT_S = tilelang_prefill_slot_seconds()

# The kernels of one decoder layer's step (SGLang / vLLM, DeepSeek-V3 / GLM-5 MoE layer, fused where they fuse;
# collectives are priced on their own, with their latency, and are not in the list), and whether each is a GEMM
# (it pays ``GEMM_FIXED_S`` on top of its kernel node). The layer floor is their fixed cost: every kernel one graph
# node (``GpuKind.kernel_node_s``), every GEMM its fixed cost too.
LAYER_KERNEL_CHAIN = (
    ("input RMSNorm (fused residual add)", False), ("fused q_a / kv_a projection", True), ("q_a RMSNorm", False),
    ("kv_a RMSNorm", False), ("q_b projection", True), ("q absorb (bmm with W_UK)", True), ("RoPE", False),
    ("latent cache store", False), ("sparse MLA", False), ("value absorb (bmm with W_UV)", True),
    ("o projection", True), ("post-attention RMSNorm", False), ("router gate", True), ("top-k expert selection", False),
    ("shared expert gate / up", True), ("SiLU and multiply", False), ("shared expert down", True),
    ("routed experts gate / up (grouped)", True), ("routed experts down (grouped)", True),
    ("expert outputs combine", False),
)  # fmt: skip
# The lightning indexer's chain on each full indexer layer (fact 12; sgl-project/sglang#15104: "many small CUDA kernels
# around the TopK path"), kernel by kernel as SGLang's decode path launches it (``Indexer.forward_cuda`` with
# ``_project_and_scale_head_gates``, ``_get_q_k_bf16``, ``act_quant``, ``set_index_k_scale_buffer`` and
# ``_get_topk_paged`` in python/sglang/srt/layers/attention/nsa/nsa_indexer.py at 947927bdb, the GLM-5 cookbook's
# commit): each fp8 projection quantises its input first; views (split, rearrange) launch nothing; the page table and
# the logits schedule are built once per step, outside the layers. Its three projections are GEMMs.
INDEXER_KERNEL_CHAIN = (
    ("weights_proj", True), ("head weights to fp32", False), ("head weights x n_heads^-1/2", False),
    ("wq_b input fp8 quantisation", False), ("wq_b projection", True),
    ("wk input fp8 quantisation", False), ("wk projection", True), ("k LayerNorm", False), ("RoPE", False),
    ("q rope copy", False), ("k rope copy", False), ("q Hadamard", False), ("k Hadamard", False),
    ("q fp8 quantisation", False), ("k fp8 quantisation", False), ("head weights x q scale", False),
    ("head weights x softmax scale", False), ("k quantise-and-store", False), ("fp8 MQA logits", False),
    ("top-k transform", False),
)  # fmt: skip
# The indexer's chain on a prefill whose sequences all hold at most top-k keys (SGLang's ``_forward_cuda_k_only``, taken
# by ``Indexer.forward_cuda`` for an extend batch without speculation whose ``max_kv_len <= index_topk``, at 947927bdb):
# the keys are projected, normed, rotated and stored; no query, head weight or logits kernel runs, and the top-k is
# taken over a zero logits buffer (every visible key selected).
INDEXER_SHORT_PREFILL_KERNEL_CHAIN = (
    ("wk input fp8 quantisation", False), ("wk projection", True), ("k LayerNorm", False), ("RoPE", False),
    ("k rope copy", False), ("k Hadamard", False), ("k fp8 quantisation", False), ("k quantise-and-store", False),
    ("zero logits", False), ("top-k transform", False),
)  # fmt: skip
# Once per step, outside the layers: the embedding gather, the final RMSNorm, the lm_head GEMM and the sampling kernel.
# The engines' CPU work per step (scheduling, batch metadata) overlaps the GPU's: SGLang's overlap scheduler "runs one
# batch ahead" with "no single idle time on the GPU" (SGLang v0.4 release blog, 2024-12-04), vLLM V1's async
# scheduling the same; so a step's overhead is these kernels' fixed cost (and the lm_head's vocabulary gather, one
# collective, under TP).
STEP_KERNEL_CHAIN = (("embedding", False), ("final RMSNorm", False), ("lm_head", True), ("sampling", False))


def chain_fixed_seconds(
    chain: tuple[tuple[str, bool], ...], kernel_node_s: float, gemm_fixed_s: float = GEMM_FIXED_S
) -> float:
    """The fixed cost of a kernel chain: one graph node per kernel, plus ``gemm_fixed_s`` per GEMM (DeepGEMM's
    ``GEMM_FIXED_S``; AITER's ``AITER_GEMM_FIXED_S`` where the engine runs AITER's kernels)."""
    return len(chain) * kernel_node_s + sum(gemm for _, gemm in chain) * gemm_fixed_s


# The shortest a layer's step takes at batch 1, from one published batch-1 decode of a DeepSeek-architecture model
# without the indexer, in no calibration file: Kimi-K2, SGLang TP8, concurrency 1, 1,024-token prompts, mean TPOT
# 11.376 ms (sgl-project/sglang#13466, bench_serving, max_concurrency 1), 61 layers. Per layer: TPOT / 61 (the
# step's own overhead is left in: it is microseconds). ``RooflineStepTime.layer_min_s`` subtracts the layer floor from
# it: what a batch-1 layer's big kernels take beyond their fixed cost (fact 14). The GPU kind is not printed; the
# log's cache line (8,050 tokens, 0.53 GB beside ~129 GB of fp8 weights a rank) fits only a ~141 GB Hopper part. One
# figure for every kind (docs/steptime.md, known gaps).
KIMI_K2_BATCH1_TPOT_S = 11.376e-3
KIMI_K2_LAYERS = 61
BATCH1_LAYER_S = KIMI_K2_BATCH1_TPOT_S / KIMI_K2_LAYERS
# That ~141 GB Hopper part streams HBM at 4.8 TB/s, as both candidates do (the H200 and the H20-3e share its HBM3e
# stacks, ``planner.gpus``). A batch-1 layer reads its weights at low occupancy, at one fraction of HBM on every
# kind, so another kind's minimum is BATCH1_LAYER_S x this bandwidth / its own (``figures.batch1_layer_seconds``;
# fact 14).
# Measured so: the GLM-5.2 cookbook's EAGLE steps at 1 (H200 17.7 ms, B200 11.3 ms: 1.57x against HBM's 1.67x) and
# InferenceX's DeepSeek-R1 runs of SGLang v0.5.12 (B200 / B300 TPOT at 1: 7.18 / 7.04 ms for 61 layers, 118 / 115
# us a layer against the reference's 186 us). The exception is ``sglang_batch1_at_reference``.
KIMI_K2_GPU = "H200"
# That layer's rank computes 8 attention heads: Kimi-K2's 64 (``num_attention_heads`` of moonshotai/Kimi-K2-Instruct,
# DeepSeek-V3's per-head dimensions) over TP 8. A batch-1 attention module takes longer the more heads a rank
# computes, by each head's q_b / kv_b / o_proj weight bytes at a rate: AIConfigurator's measured DSA module
# (ai-dynamo/aiconfigurator 095f58a51, ``systems/data/<system>/dsa_module``-family tables of SGLang 0.5.14, Apache-2.0;
# ``bench/calibration/aiconfigurator/dsa_module.csv``): one request at context 4,096 with SGLang's fp8 cache, the
# module's latency by the heads a rank computes, (heads, us), per GPU kind and model. ``figures.batch1_heads_seconds``
# prices a rank's head bytes beyond the reference at that rate (docs/steptime.md fact 14).
KIMI_K2_ATTENTION_HEADS = 64
KIMI_K2_TP = 8
DSA_MODULE_BATCH1_US = {
    ("H200", "deepseek-v3.2"): ((16, 93.4), (32, 109.1), (64, 118.3), (128, 145.8)),  # FlashMLA's fp8 decode
    ("H200", "glm-5"): ((8, 88.0), (16, 104.8), (32, 115.7), (64, 137.1)),
    ("B200", "deepseek-v3.2"): ((16, 74.5), (32, 77.9), (64, 93.6), (128, 115.4)),  # TensorRT-LLM's trtllm-gen
    ("B200", "glm-5"): ((8, 72.7), (16, 75.1), (32, 85.1), (64, 106.6)),
}

# SGLang's EAGLE / MTP without spec v2 (its default: ``SGLANG_ENABLE_SPEC_V2 = EnvBool(False)``) turns the overlap
# scheduler off ("Overlap scheduler is disabled when spec v2 is off", ``ServerArgs._handle_speculative_decoding`` at
# 947927bdb, the GLM-5 cookbook's commit): the host's work of a speculative step (scheduling, the verify's accepted
# tokens brought back and applied, the attention metadata of the verify, the draft extend and each draft pass) runs
# while the GPU waits. One published measurement sizes it: DeepSeek-V3.2, TP8, EAGLE V1 with the NSA backend at
# SGLang's default 3 steps / top-k 1 / 4 draft tokens (``auto_choose_speculative_params``), batch 1,
# ``sglang.test.send_one --max-new-tokens 1024``: 1,024 tokens in 7.922 s at accept length 2.960
# (sgl-project/sglang#15307, "In EAGLE V1, we had"), in no calibration file. Its prompt is send_one's default
# ("Human: Give me a fully functional FastAPI server. ...", about 20 tokens). ``figures.eagle_v1_host_seconds``
# subtracts the roofline's own price of that step (its GPU work) from the measured step: what the host adds per step.
# The GPU kind is not printed; H200 is taken (the batch-1 step is floor-bound: B200 prices it within 2 %).
EAGLE_V1_SEND_ONE_S = 7.922
EAGLE_V1_SEND_ONE_TOKENS = 1024
EAGLE_V1_SEND_ONE_ACCEPT_LENGTH = 2.960
EAGLE_V1_SEND_ONE_PROMPT_TOKENS = 20
EAGLE_V1_SEND_ONE_DRAFT_STEPS = 3
EAGLE_V1_STEP_S = EAGLE_V1_SEND_ONE_S / (EAGLE_V1_SEND_ONE_TOKENS / EAGLE_V1_SEND_ONE_ACCEPT_LENGTH)  # 22.9 ms

# SGLang runs a prefill (extend) forward eagerly, every kernel launched from Python, where it has no prefill CUDA
# graph: DSA models (``piecewise_cuda_graph_disabled_model_archs`` lists DeepseekV32ForCausalLM and
# GlmMoeDsaForCausalLM, and ``is_deepseek_nsa`` configs are excluded, at c64274c74 "Piecewise Cuda Graph set default",
# 2026-03-02; sgl-project/sglang#18148, DeepSeek-V3.2 prefill piecewise graphs, still open), and every model before
# that commit. The host's launch work then sets a floor under the step: the GPU cannot finish before its last kernel
# is launched. One published measurement sizes it: DeepSeek-V3 on SGLang, a prefill batch of one new token, "forward
# cost 82.64 ms" eager against 23.10 ms replayed as a graph (sgl-project/sglang#12160), 61 layers: 1.35 ms of
# launch work per layer. vLLM V1 replays piecewise CUDA graphs for every batch, prefill included: no such floor.
# Launch work grows with the kernels launched: DeepSeek-V3's layer is ``LAYER_KERNEL_CHAIN``, so one launch costs
# ``EAGER_LAYER_S / len(LAYER_KERNEL_CHAIN)`` (67.7 us), and a full indexer layer adds its own chain's launches
# (``INDEXER_KERNEL_CHAIN``, or ``INDEXER_SHORT_PREFILL_KERNEL_CHAIN`` where SGLang takes the keys-only path).
SGLANG_EAGER_FORWARD_S = 82.64e-3
SGLANG_EAGER_FORWARD_LAYERS = 61
EAGER_LAYER_S = SGLANG_EAGER_FORWARD_S / SGLANG_EAGER_FORWARD_LAYERS
EAGER_INDEXER_LAUNCHES = len(INDEXER_KERNEL_CHAIN) / len(LAYER_KERNEL_CHAIN)  # an indexer layer's, per layer's: 1.0
EAGER_INDEXER_SHORT_LAUNCHES = len(INDEXER_SHORT_PREFILL_KERNEL_CHAIN) / len(LAYER_KERNEL_CHAIN)  # 0.5


# TensorRT-LLM's trtllm-gen sparse-MLA generation kernels (FlashInfer's ``trtllm_batch_decode_with_kv_cache_mla``
# with ``sparse_mla_top_k``, SGLang's ``--dsa-decode-backend trtllm``) tile a token's query heads, not blocks of 64
# / 128 as FlashMLA does: up to 32 heads per rank a swapped-AB kernel whose head tile is the head count (the
# smallest tile 8; a head count that is not a power of two padded up to one), above 32 a 64-head tile
# (flashinfer-ai/flashinfer ``include/flashinfer/trtllm/fmha/fmhaKernels.cuh`` at 0232f787:
# ``selectSparseMlaGenerationKernel``, ``getPaddedMlaTileSizeQ``; the same 8 / 16 / 64 tiles in NVIDIA/TensorRT-LLM
# ``fmhaKernels.h`` at 01c84c67, ``hashFromRunnerParams``).
TRTLLM_GEN_MLA_MIN_HEAD_TILE = 8
TRTLLM_GEN_MLA_SWAPPED_MAX_HEADS = 32
TRTLLM_GEN_MLA_HEAD_TILE = 64


def trtllm_gen_mla_heads(heads: float) -> int:
    """The query heads one token's sparse MLA computes in a trtllm-gen generation kernel, padding included: at most
    ``TRTLLM_GEN_MLA_SWAPPED_MAX_HEADS`` heads, the power of two at or above ``heads`` (at least 8); above, whole
    tiles of ``TRTLLM_GEN_MLA_HEAD_TILE`` (8 heads: 8, GLM-5.2 at TP8; 16: 16, DeepSeek-V3.2 at TP8; 64: 64)."""
    heads = math.ceil(heads)
    if heads <= TRTLLM_GEN_MLA_SWAPPED_MAX_HEADS:
        return max(TRTLLM_GEN_MLA_MIN_HEAD_TILE, 1 << (heads - 1).bit_length())
    return -(-heads // TRTLLM_GEN_MLA_HEAD_TILE) * TRTLLM_GEN_MLA_HEAD_TILE


def vllm_deep_gemm_moe_min_tokens(arch: str, schedule_policy: str, weight_dtype: str, moe_deep_gemm: bool) -> int:
    """The step's MoE tokens at or above which the engine runs the routed experts in DeepGEMM's grouped GEMMs, their
    weights streaming at DeepGEMM's rate (``GEMM_STREAM_EFF``); 0: never (Triton's fused MoE, the fitted ``bw_eff``).
    vLLM (the ``mixed`` policy) on Hopper with fp8 block-quantised experts under tensor parallelism runs Triton's
    fused MoE at every step size unless its launch sets DeepGEMM's switch (``moe_deep_gemm``): v0.13.0's
    ``get_fp8_moe_backend`` (``quantization/fp8.py``) turns DeepGEMM's MoE off at TP 8 and more unless
    ``VLLM_MOE_USE_DEEP_GEMM`` is set, and from the MoE oracle on (v0.18.0 ``fused_moe/oracle/fp8.py``,
    ``_get_priority_backends``) Triton comes first on SM90 without expert parallelism unless ``VLLM_USE_DEEP_GEMM``
    or ``VLLM_MOE_USE_DEEP_GEMM`` is set. Set, DeepGEMM runs at every step size: ``is_deep_gemm_e8m0_used()`` holds
    on SM90 (its only check is DeepGEMM's support), which takes DeepGEMM before the ``M >= 128`` shape test; 1 then.
    SGLang's automatic MoE runner uses DeepGEMM only under an all-to-all backend (``is_deepgemm_moe_runner_backend_
    enabled`` at 06ad7b2b0: DeepEP, Mooncake, NIXL), which the step time prices by ``moe_a2a``. Blackwell (vLLM's
    FlashInfer / CUTLASS MoE choices) is not modelled: no vLLM Blackwell row is on file. docs/steptime.md, fact 36."""
    on = schedule_policy == "mixed" and arch == "hopper" and weight_dtype == "fp8" and moe_deep_gemm
    return 1 if on else 0


def sglang_trtllm_moe(arch: str, schedule_policy: str, weight_dtype: str, moe_a2a: str, moe_trtllm: bool) -> bool:
    """Whether the engine runs the routed experts in TensorRT-LLM's fused fp8 MoE, their weights streaming at
    ``TRTLLM_MOE_STREAM_EFF`` at every step size: SGLang (the ``prefill_first`` stand-in) on Blackwell with fp8
    experts and no all-to-all, its automatic MoE runner then ``flashinfer_trtllm`` for the DeepSeek family
    (``_deepseek_moe_quant_resolution`` in ``arg_groups/overrides.py`` at 06ad7b2b0: ``moe_a2a_backend == "none"``,
    ``moe_runner_backend == "auto"``, quantization fp8; on SM100 / SM103), the draft model's MoE the same
    (``_speculative_moe_runner_default``). Under DeepEP the experts run DeepGEMM (``moe_a2a``). ``moe_trtllm`` False
    stands for another ``--moe-runner-backend`` or a build before the rule (``bench/calibrate.py``
    ``engine_moe_trtllm`` dates it by model). docs/steptime.md, fact 37."""
    return (
        moe_trtllm
        and schedule_policy == "prefill_first"
        and arch == "blackwell"
        and weight_dtype == "fp8"
        and moe_a2a == "none"
    )


def sglang_aiter(arch: str, schedule_policy: str, weight_dtype: str, moe_a2a: str, aiter: bool) -> bool:
    """Whether the engine runs AITER's kernels at AITER's published rates: the routed experts in its fused fp8 MoE
    (``AITER_MOE_STREAM_EFF`` of HBM, ``AITER_MOE_COMPUTE_EFF`` of the fp8 peak; fact 38) and the linear layers in
    its fp8 block-scale GEMMs (``AITER_GEMM_STREAM_EFF``, ``AITER_GEMM_FIXED_S``, ``AITER_GEMM_DENSE_EFF``; fact 39):
    SGLang (the ``prefill_first`` stand-in) on CDNA 4 (MI355X, whose tables AITER publishes) with an fp8 checkpoint
    and no all-to-all. CDNA 3 (MI300X / MI325X, 304 CUs) is left out: GLM-5's tables hold no measured time for it
    (its MoE rows there read 0.0). ``aiter`` False stands for ``SGLANG_USE_AITER=0``. docs/steptime.md, facts 38-39."""
    return (
        aiter and schedule_policy == "prefill_first" and arch == "cdna4" and weight_dtype == "fp8" and moe_a2a == "none"
    )


def sglang_trtllm_gen_decode(layout: CacheLayout, arch: str, schedule_policy: str) -> bool:
    """Whether the engine's sparse-MLA decode runs TensorRT-LLM's trtllm-gen kernel: SGLang (the ``prefill_first``
    stand-in) on Blackwell with a bf16 cache (its DSA default decode backend ``trtllm`` for bf16 on SM >= 10 since
    sgl-project/sglang#16758, 2fb328109, 2026-01-23) or the plain 576-byte fp8 cache (``fp8``: the trtllm backend's
    own row format, sgl-project/sglang#21914); FlashMLA's 656-byte ``fp8_ds_mla`` rows decode in FlashMLA
    (``flashmla_kv``). ``arg_groups/overrides.py`` at 06ad7b2b0: "Blackwell FP8 defaults to trtllm"; bf16:
    ``dsa_decode_backend = "trtllm" if major >= 10``. docs/steptime.md, fact 29."""
    return schedule_policy == "prefill_first" and arch == "blackwell" and layout.kv_dtype in ("bf16", "fp8")


def sglang_batch1_at_reference(layout: CacheLayout, arch: str, schedule_policy: str) -> bool:
    """Whether a DSA model's batch-1 layer takes the Kimi-K2 part's time on this GPU, not scaled by HBM
    (``RooflineStepTime.batch1_at_reference``; it applies to a model with the indexer): SGLang (the ``prefill_first``
    stand-in) on Blackwell with FlashMLA's 656-byte ``fp8_ds_mla`` rows (its SM100 sparse kernels, ``flashmla_kv``)
    or a bf16 cache. Every such row on file ran at the H200's per-layer time at batch 1: the DeepSeek-V3.2
    cookbook's B200 runs (0.5.6), sgl-project/sglang#15025's DP 8 nightly of 2026-01-08, the GLM-5 B200 report
    (2026-02; B200 7.69 ms against H200 7.54 at the same flags) and AIConfigurator's GLM-5 B200 / B300 rows (a
    nightly of 2026-03-17, bf16). TensorRT-LLM's own fp8 rows (``fp8``, sgl-project/sglang#21914) and a dense-MLA
    model (``trtllm_mla``) scale. docs/steptime.md, fact 14."""
    return schedule_policy == "prefill_first" and arch == "blackwell" and layout.kv_dtype in ("fp8_ds_mla", "bf16")


def sglang_tilelang(layout: CacheLayout, arch: str, schedule_policy: str) -> bool:
    """Whether the engine's sparse MLA, prefill and decode, runs TileLang's split-K kernels at their published MI355X
    timings (``TILELANG_DECODE_FIXED_S``, ``TILELANG_DECODE_STREAM_EFF``, ``TILELANG_PREFILL_SLOT_S``; facts 40
    and 41): SGLang (the ``prefill_first`` stand-in) on CDNA 4 (its gfx950 tiles; CDNA 3 runs other tiles, 32-slot
    ones for bf16, with no published timing) with a bf16 cache (the ROCm default: ``ServerArgs`` picks fp8_e4m3 only
    on SM >= 10, and gfx950 reports 9.5) or the plain 576-byte fp8 one (``--kv-cache-dtype fp8_e4m3``,
    sgl-project/sglang#21511); SGLang has no FlashMLA 656-byte rows on ROCm. docs/steptime.md, facts 40 and 41."""
    return schedule_policy == "prefill_first" and arch == "cdna4" and layout.kv_dtype in ("bf16", "fp8")


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


def sglang_dense_short_prefill(layout: CacheLayout, arch: str, schedule_policy: str) -> bool:
    """Whether the engine runs a prefill batch whose sequences all hold at most top-k keys as dense MHA: SGLang (the
    ``prefill_first`` stand-in) since sgl-project/sglang#11892 (``MHA_ONE_SHOT``: an extend batch with ``max_kv_len <=
    index_topk``, FA3 varlen on Hopper) with a bf16 pool, and with an fp8 one (either row format, e4m3 in the pool)
    since #12964 (fa9244102, 2025-11-20: "MHA supports both BF16 and FP8 KV cache (FP8 will be dequantized
    on-demand)"), on NVIDIA's Hopper and Blackwell only (``set_dsa_prefill_impl`` requires SM 90 or 100-109 since #13544,
    5eed5fc0b, 2025-11-25, and ``handle_attention_nsa`` SM 90 or 100 before it; ROCm reports gfx942 / gfx950 as SM
    9.4 / 9.5, so on CDNA a short prefill stays in the sparse kernels); vLLM v0.13 runs every prefill through the
    absorbed sparse kernels (its dense path came with vllm-project/vllm#47327, 2026-07). ``SimConfig.dense_short_prefill``
    turns it off for the builds that did (GLM-5 on Blackwell from 2026-02-10 to 2026-06-03). docs/steptime.md, fact
    24."""
    nvidia = arch in ("hopper", "blackwell")
    return schedule_policy == "prefill_first" and nvidia and layout.kv_dtype in ("bf16", "fp8_ds_mla", "fp8")


def sglang_prefill_in_decode_kernel(layout: CacheLayout, arch: str, schedule_policy: str) -> bool:
    """Whether the engine prefills (beyond the dense short prefill) through FlashMLA's fp8 sparse decode kernel, one
    query row a token: SGLang on Hopper with FlashMLA's 656-byte ``fp8_ds_mla`` rows, whose ``flashmla_auto`` prefill
    takes ``flashmla_kv`` unconditionally on SM90 (sgl-project/sglang#11655, 81a632ace, 2025-10-27; the DSA docs at
    bcc0c65aa: "With FP8 KV cache: On Hopper (SM90), it unconditionally uses flashmla_kv"); Blackwell keeps the
    sparse prefill kernel where the batch's keys are few. Priced as vLLM's mixed-batch mode (``mla_mixed_batch``).
    docs/steptime.md, fact 30."""
    return schedule_policy == "prefill_first" and arch == "hopper" and layout.kv_dtype == "fp8_ds_mla"


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
