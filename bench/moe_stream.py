"""The fraction of HBM bandwidth at which SGLang's fused MoE moves its bytes, read from AIConfigurator's measured
MoE tables under the tables' own routing: the source of ``kernels.TRITON_MOE_STREAM_BY_SLICE`` (docs/steptime.md,
fact 51) and a measured check of the fitted ``bw_eff`` where dsakv prices the routed experts at it (SGLang's Triton
fused MoE on Hopper).

    python bench/moe_stream.py [--tables bench/calibration/aiconfigurator] [--draws 64]

AIConfigurator times one MoE layer (``moe.csv``: GPU, SGLang version, kernel, hidden width, MoE TP, tokens) with its
tokens routed by a power law (``power_law_1.01``), not uniformly as dsakv routes them, so the table's times cannot
be set against dsakv's price directly (``bench/measured_ops.py`` does, and reads the routing's skew as speed). Here
the experts the table's tokens touched are counted under that routing (``aic_routing.aic_expert_counts``, the
collector's generator replayed, seeded), and the layer's bytes are dsakv's own for that many experts: each touched expert's
weights on the rank (``LinearShare.expert_bytes`` per MoE layer) and the kernels' activations per token (fact 43).
Measured fraction = bytes / (measured seconds x the GPU's HBM bandwidth). The kernel's fixed costs (routing,
alignment, launches) are inside the measured time, so the fraction is a lower bound of the streaming rate. One line
per table curve (token counts 8 to 512), then one summary line: the H200 Triton curves of DeepSeek's shape in SGLang
0.5.6.post2 (the anchors' era), the median over 32 to 256 tokens by the rank's expert slice, beside the fitted
``bw_eff``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from dsakv.planner.gpus import gpu_kind
from dsakv.sim.steptime import RooflineStepTime
from dsakv.sim.steptime.fitted import BW_EFF
from dsakv.sim.steptime.kernels import TRITON_MOE_REFERENCE_SLICE
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402
from aic_routing import GROUPED_TOPK_VERSIONS, touched_experts  # noqa: E402
from measured_ops import TABLES, Tables  # noqa: E402

# The hidden widths of the tables' shapes, by the preset whose routed experts have them (256 experts, top 8, width
# 2,048): DeepSeek-V3 / R1 / V3.2 and GLM-5.
MODEL_BY_HIDDEN = {7168: "deepseek-v3.2", 6144: "glm-5"}
TOKENS = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
SUMMARY = ("H200", "sglang 0.5.6.post2", "sglang_fused_moe_triton", 7168)
SUMMARY_TOKENS = (32, 256)


def rank_model(gpu: str, hidden: int, moe_tp: int) -> RooflineStepTime:
    """dsakv's roofline of the table curve's rank: the preset with that hidden width, fp8 weights, TP = MoE TP
    (one MoE layer: no pool is sized, so a shard too large for a whole model on the GPU is still priced)."""
    return RooflineStepTime(
        CacheLayout(load_spec(MODEL_BY_HIDDEN[hidden])), gpu_kind(gpu), tp=moe_tp, weight_dtype="fp8"
    )


def stream_fraction(model, tokens: int, touched: float, seconds: float) -> float:
    """The bytes dsakv counts for one MoE layer of ``model``'s rank with ``touched`` experts and ``tokens`` tokens
    (the touched experts' weights, the decode kernels' activations) over ``seconds`` at the GPU's HBM bandwidth."""
    r = model.rank
    weights = r.linear.expert_bytes / r.moe_act.layers * touched / r.experts
    act = r.moe_act.decode
    return (weights + tokens * (act.gemm + act.kernels)) / (seconds * model.gpu.hbm_bytes_per_s)


def slice_fractions(
    curves: dict,
    gpu: str = SUMMARY[0],
    version: str = SUMMARY[1],
    kernel: str = SUMMARY[2],
    hidden: int = SUMMARY[3],
    tokens: tuple[int, int] = SUMMARY_TOKENS,
    draws: int = 64,
) -> dict[int, float]:
    """{rank's expert slice in columns: the median measured fraction over the table's token counts in ``tokens``} for
    every MoE TP of one GPU, version, kernel and hidden width (``kernels.TRITON_MOE_STREAM_BY_SLICE`` is this for
    the defaults, rounded to two places)."""
    out = {}
    for key, curve in curves.items():
        if (key[0], key[1], key[2], int(key[3])) != (gpu, version, kernel, hidden):
            continue
        model = rank_model(gpu, hidden, int(key[4]))
        r = model.rank
        fractions = [
            stream_fraction(model, n, touched_experts(n, r.experts, r.topk_experts, draws), curve.at(n))
            for n in sorted(curve.points)
            if tokens[0] <= n <= tokens[1]
        ]
        width = model.layout.spec.arch_value("moe_intermediate_size") // int(key[4])
        out[width] = statistics.median(fractions)
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", type=Path, default=TABLES, help="the extracted tables (default: %(default)s)")
    ap.add_argument("--draws", type=int, default=64, help="routings drawn per token count (default: %(default)s)")
    args = ap.parse_args(argv)
    curves = Tables.read(args.tables).moe
    for key, curve in sorted(curves.items()):
        gpu, version, kernel, hidden, moe_tp = key[0], key[1], key[2], int(key[3]), int(key[4])
        if hidden not in MODEL_BY_HIDDEN:
            continue
        note = " (DeepSeek's grouped top-k: routing not replayed)" if version in GROUPED_TOPK_VERSIONS else ""
        model = rank_model(gpu, hidden, moe_tp)
        cells = []
        for n in TOKENS:
            if n not in curve.points:
                continue
            touched = touched_experts(n, model.rank.experts, model.rank.topk_experts, args.draws)
            cells.append(f"{n} {stream_fraction(model, n, touched, curve.at(n)):.2f}")
        print(f"{gpu:<6} {version:<20} {kernel:<30} hidden {hidden} MoE TP {moe_tp}{note}: " + ", ".join(cells))
    medians = slice_fractions(curves, draws=args.draws)
    by_slice = ", ".join(f"{cols} {frac:.2f}" for cols, frac in medians.items())
    print(
        f"moe stream: SGLang's Triton fused MoE on H200 ({SUMMARY[1]}, hidden {SUMMARY[3]}), median fraction of HBM "
        f"over {SUMMARY_TOKENS[0]}-{SUMMARY_TOKENS[1]} tokens by the rank's expert slice (columns): {by_slice}; "
        f"fitted bw_eff {BW_EFF:.2f} at slice {TRITON_MOE_REFERENCE_SLICE}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(calibrate.run_cli(main))
