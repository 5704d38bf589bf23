"""An independent count of the fused MoE's activation traffic (docs/steptime.md, fact 43), tensor by tensor for each
kernel path, for the tests that re-derive the roofline's MoE term."""

from __future__ import annotations

from scipy.stats import binom

from dsakv.sim.steptime import RooflineStepTime

CONTIGUOUS_M_BLOCK = 128  # DeepGEMM's contiguous layout: rows per M block, each expert's segment a whole number of them


def fused_moe_activation_bytes(
    model: RooflineStepTime, tokens: float, layers: int, extend: bool = False
) -> tuple[float, float]:
    """(the grouped GEMMs' activation bytes, the other kernels' bytes) of ``tokens`` tokens (every DP group's)
    through ``layers`` MoE layers on one rank of ``model``, on a decode step or an ``extend`` step: each tensor the
    step's MoE path reads or writes, with its element count and size (fp32 scales and indices left out). DeepGEMM's
    contiguous layout (vLLM's DeepGemmExperts, DeepEP's normal mode) runs its GEMMs and the kernels between them over
    each expert's segment, padding rows included (``segment_padding_rows``). AITER's fused MoE (priced from its
    measured lines) moves none here."""
    if model.aiter:
        return 0.0, 0.0
    a = model.layout.spec.arch_value
    hidden, fp8 = a("hidden_size"), (model.weight_dtype or model.layout.spec.weight_dtype) == "fp8"
    width = a("moe_intermediate_size") // (model.tp // model.ep)  # the rank's slice of one expert
    pairs = tokens * a("num_experts_per_tok") / model.ep  # (token, expert) pairs on this rank's experts
    x = 1 if fp8 else 2  # the GEMMs' input rows: fp8 after the per-token-group quantisation, else bf16
    if model.moe_trtllm:  # FlashInfer's TensorRT-LLM fp8 block-scale MoE
        tensors_gemm = [
            ("gemm1 gathers the fp8 input rows", pairs * hidden),
            ("gemm1 writes the gate / up outputs (fp8)", pairs * 2 * width),
            ("gemm2 reads the fp8 product", pairs * width),
            ("gemm2 writes its outputs (bf16)", pairs * hidden * 2),
        ]
        tensors_kernels = [
            ("activationDeepSeekKernel reads the gate / up outputs", pairs * 2 * width),
            ("activationDeepSeekKernel writes the fp8 product", pairs * width),
            ("finalizeKernel reads gemm2's outputs", pairs * hidden * 2),
            ("finalizeKernel writes the token's row (bf16)", tokens * hidden * 2),
            ("quantise the input rows: read bf16", tokens * hidden * 2),
            ("quantise the input rows: write fp8", tokens * hidden),
        ]
    elif model.moe_deep_gemm_min_tokens and tokens >= model.moe_deep_gemm_min_tokens:  # vLLM's DeepGemmExperts
        rows = pairs + segment_padding_rows(model, tokens)
        tensors_gemm = _deep_gemm_tensors(rows, hidden, width, x)
        tensors_kernels = [
            ("quantise the input rows: read bf16", tokens * hidden * 2),
            ("quantise the input rows: write fp8", tokens * hidden),
            ("ep_scatter reads each token's row", tokens * hidden),
            ("ep_scatter writes each pair's copy", pairs * hidden),
            ("silu_mul_per_token_group_quant reads the gate / up outputs", rows * 2 * width * 2),
            ("silu_mul_per_token_group_quant writes the fp8 product", rows * width),
            ("ep_gather reads gemm2's outputs", pairs * hidden * 2),
            ("ep_gather writes the token's sum (bf16)", tokens * hidden * 2),
        ]
    elif model.moe_a2a == "deepep":  # DeepGEMM between DeepEP's dispatch and combine (a bf16 checkpoint: bf16 rows,
        # no quantisation)
        rows = pairs + (segment_padding_rows(model, tokens) if extend else 0.0)  # normal mode's contiguous layout
        tensors_gemm = _deep_gemm_tensors(rows, hidden, width, x)
        if not extend:  # low-latency mode: one fused SiLU-and-mul(-quantise) kernel; DeepEP's combine sums
            tensors_kernels = [
                ("silu_and_mul (+ quantise) reads the gate / up outputs", pairs * 2 * width * 2),
                ("silu_and_mul (+ quantise) writes the product", pairs * width * x),
            ]
        else:  # normal mode: ep_scatter into the contiguous layout, two kernels, ep_gather
            received = tokens * model.rank.dispatch_copies * model.ep / (model.ep - 1) / model.ep
            tensors_kernels = [
                ("ep_scatter reads each received row", received * hidden * x),
                ("ep_scatter writes each pair's row", pairs * hidden * x),
                ("silu_and_mul reads the gate / up outputs", rows * 2 * width * 2),
                ("silu_and_mul writes the product (bf16)", rows * width * 2),
                ("ep_gather reads gemm2's outputs", pairs * hidden * 2),
                ("ep_gather writes each received row's sum (bf16)", received * hidden * 2),
            ]
            if fp8:
                tensors_kernels += [
                    ("quantise the own rows before the dispatch: read bf16", tokens / model.ep * hidden * 2),
                    ("quantise the own rows before the dispatch: write fp8", tokens / model.ep * hidden),
                    ("quantise the product: read bf16", rows * width * 2),
                    ("quantise the product: write fp8", rows * width),
                ]
    else:  # SGLang's Triton fused_experts_impl
        tensors_gemm = [
            ("w13 GEMM reads the gathered input rows", pairs * hidden * x),
            ("w13 GEMM writes intermediate_cache1 (bf16)", pairs * 2 * width * 2),
            ("w2 GEMM reads intermediate_cache2", pairs * width * x),
            ("w2 GEMM writes intermediate_cache3 (bf16)", pairs * hidden * 2),
        ]
        tensors_kernels = [
            ("silu_and_mul reads intermediate_cache1", pairs * 2 * width * 2),
            ("silu_and_mul writes intermediate_cache2 (bf16)", pairs * width * 2),
            ("moe_sum_reduce reads intermediate_cache3", pairs * hidden * 2),
            ("moe_sum_reduce writes the output rows (bf16)", tokens * hidden * 2),
        ]
        if fp8:
            tensors_kernels += [
                ("quantise the input rows: read bf16", tokens * hidden * 2),
                ("quantise the input rows: write fp8", tokens * hidden),
                ("quantise intermediate_cache2: read bf16", pairs * width * 2),
                ("quantise intermediate_cache2: write fp8", pairs * width),
            ]
    return layers * sum(b for _, b in tensors_gemm), layers * sum(b for _, b in tensors_kernels)


def segment_padding_rows(model: RooflineStepTime, tokens: float) -> float:
    """Expected rows that pad the rank's experts' segments in DeepGEMM's contiguous layout to whole M blocks, with
    ``tokens`` tokens routed uniformly: an expert's rows are Binomial(tokens, top-k / experts); its segment is
    ``ceil(rows / 128)`` blocks. Summed exactly over every row count (scipy's binomial)."""
    a = model.layout.spec.arch_value
    experts, topk, n = a("n_routed_experts"), a("num_experts_per_tok"), int(tokens)
    local = experts // model.ep
    counts = list(range(n + 1))
    pmf = binom.pmf(counts, n, topk / experts)
    blocks = [-(-c // CONTIGUOUS_M_BLOCK) * CONTIGUOUS_M_BLOCK - c for c in counts]
    return local * float(sum(p * b for p, b in zip(pmf, blocks, strict=True)))


def _deep_gemm_tensors(pairs: float, hidden: int, width: int, x: int) -> list[tuple[str, float]]:
    """DeepGEMM's two grouped GEMMs' activations (vLLM's experts and SGLang's under DeepEP alike): each pair's input
    row (fp8, ``x`` = 1, after the quantisation or the dispatch), its bf16 gate / up outputs, the product it reads,
    its bf16 outputs."""
    return [
        ("gemm1 reads each pair's input row", pairs * hidden * x),
        ("gemm1 writes the gate / up outputs (bf16)", pairs * 2 * width * 2),
        ("gemm2 reads the product", pairs * width * x),
        ("gemm2 writes its outputs (bf16)", pairs * hidden * 2),
    ]


def moe_layers(model: RooflineStepTime) -> int:
    """The decoder's layers with routed experts, its MTP cache layers included."""
    spec = model.layout.spec
    dense = min(spec.arch_value("first_k_dense_replace"), spec.num_hidden_layers)
    return spec.num_hidden_layers + model.layout.mtp_layers - dense
