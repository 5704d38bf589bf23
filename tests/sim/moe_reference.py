"""An independent count of SGLang's fused-MoE activation traffic (docs/steptime.md, fact 43), tensor by tensor, for
the tests that re-derive the roofline's MoE term."""

from __future__ import annotations

from dsakv.sim.steptime import RooflineStepTime


def fused_moe_activation_bytes(model: RooflineStepTime, tokens: float, layers: int) -> tuple[float, float]:
    """(the grouped GEMMs' activation bytes, the elementwise kernels' bytes) of ``tokens`` tokens through ``layers``
    MoE layers on one rank of ``model``: each tensor ``fused_experts_impl`` reads or writes, with its element count
    and size. AITER's fused MoE (priced from its measured lines) moves none here."""
    if model.aiter:
        return 0.0, 0.0
    a = model.layout.spec.arch_value
    hidden, fp8 = a("hidden_size"), (model.weight_dtype or model.layout.spec.weight_dtype) == "fp8"
    width = a("moe_intermediate_size") // (model.tp // model.ep)  # the rank's slice of one expert
    pairs = tokens * a("num_experts_per_tok") / model.ep  # (token, expert) pairs on this rank's experts
    x = 1 if fp8 else 2  # the GEMMs' input rows: fp8 after the per-token-group quantisation, else bf16
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


def moe_layers(model: RooflineStepTime) -> int:
    """The decoder's layers with routed experts, its MTP cache layers included."""
    spec = model.layout.spec
    dense = min(spec.arch_value("first_k_dense_replace"), spec.num_hidden_layers)
    return spec.num_hidden_layers + model.layout.mtp_layers - dense
