"""Decode cost per token versus context (DeepSeek-V3.2, 8 x H800 TP8, batch 32) under the step-time model,
beside the dense-attention counterfactual (the same model without its indexer: every key attended). Writes a PNG
and prints one line.

    python bench/decode_cost_plot.py [--out docs/decode_cost_vs_context.png]
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dsakv.planner.gpus import gpu_kind  # noqa: E402
from dsakv.sim.steptime import RooflineStepTime  # noqa: E402
from dsakv.spec.layout import CacheLayout  # noqa: E402
from dsakv.spec.model_spec import ModelSpec  # noqa: E402

BATCH = 32
CONTEXTS = [4096 * 2**i for i in range(6)]  # 4K .. 128K


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="docs/decode_cost_vs_context.png")
    args = ap.parse_args()
    spec = ModelSpec.preset("deepseek-v3.2")
    dsa = RooflineStepTime(CacheLayout(spec), gpu_kind("H800"))
    dense = RooflineStepTime(CacheLayout(spec), gpu_kind("H800"), has_indexer=False)
    rows = []
    for d in CONTEXTS:
        a, b = dsa.cost([], [d] * BATCH), dense.cost([], [d] * BATCH)
        rows.append(
            (d, 1e3 * a.total_seconds / BATCH, 1e3 * a.seconds["indexer"] / BATCH, 1e3 * b.total_seconds / BATCH)
        )
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [d // 1024 for d, *_ in rows]
    ax.plot(ks, [r[1] for r in rows], "o-", label="DSA (top-k 2048 + indexer)")
    ax.plot(ks, [r[2] for r in rows], ".--", label="  of which the indexer")
    ax.plot(ks, [r[3] for r in rows], "s-", label="dense MLA counterfactual")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (K tokens)")
    ax.set_ylabel("decode cost per token (ms, batch 32)")
    ax.set_title("DeepSeek-V3.2, 8 x H800 TP8 (dsakv step-time model)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    first, last = rows[0], rows[-1]
    print(
        f"decode ms/token 4K -> 128K: DSA {first[1]:.3f} -> {last[1]:.3f} (indexer {first[2]:.3f} -> {last[2]:.3f}), "
        f"dense {first[3]:.3f} -> {last[3]:.3f}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
