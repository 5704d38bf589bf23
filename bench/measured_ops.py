"""dsakv's price of single operations against AIConfigurator's measurements of the same operations in SGLang.

For each calibration row, at that row's GPU kind, parallelism, model and cache (``bench/calibrate.py``'s replay
settings), print per operation dsakv's seconds, the measured seconds and their ratio (measured / dsakv: above 1
dsakv is too fast), one line per table version that has the shape; then one summary line.

    python bench/measured_ops.py --anchors ../shared/data/calibration/anchors.csv [--only ID,ID]
        [--tables bench/calibration/aiconfigurator]

The tables are NVIDIA AIConfigurator's measured SGLang kernel tables as ``bench/calibration/
from_aiconfigurator_tables.py`` extracts them (docs/calibration-data.md). The operations:

* ``all_reduce N``: one tensor-parallel all-reduce of N tokens' bf16 hidden rows over the row's TP ranks. dsakv:
  ``N x 2 hidden x 2 (TP - 1) / TP / link_bw + link_latency_s`` (``RooflineStepTime._collectives``); measured:
  SGLang's ``tensor_model_parallel_all_reduce`` replayed in a CUDA graph.
* ``moe N``: one MoE layer with N tokens through it. dsakv: the step's ``moe`` component over its MoE layers (an
  N-token prefill chunk, N / DP tokens on each of the DP groups); measured: SGLang's fused MoE layer (the kernel the
  table names), routed by AIConfigurator's ``power_law_1.01``. Rows whose experts run under an all-to-all are left
  out (the tables are MoE TP without expert parallelism).
* ``moe routed N``: the same layer with dsakv's price taken at the experts the table's own routing touched
  (``aic_routing.touched_experts``; fewer than uniform routing touches from 16 tokens on), so the ratio is the rate's
  alone; tables collected behind DeepSeek's grouped top-k (``aic_routing.GROUPED_TOPK_VERSIONS``) are left out.
* ``attention decode B x C`` and ``attention prefill N``: one DSA attention layer for B decodes at context C, or for
  one N-token prompt. dsakv: the step's sparse-MLA, indexer and cache-write components over its attention layers,
  plus the attention projections' share of the linear component (their FLOPs at the GEMM rate or their weight bytes
  at the HBM rate, the larger); a decode adds the fixed cost of the attention's kernels (those of
  ``kernels.LAYER_KERNEL_CHAIN`` from the q_a / kv_a projection to the o projection) and the indexer's chain, as
  the measured module is one CUDA-graph replay. Prefill is compared from 4,096 tokens on, where the work outweighs
  the eager launches the measured forward includes. Measured: the whole DSA attention module of the same model and
  heads per rank (the fastest kernel the table holds for the shape), averaged over the model's layers: GLM-5.2's
  full-indexer layers from GLM-5's rows (the same attention dimensions; its own name holds only the layers that reuse
  another layer's top-k), the rest from its skip-indexer rows.

Only SGLang rows are compared (the tables are SGLang's own kernels); other rows print one line saying so.

Interpolation is linear in the table's size axis between measured points, and no figure is extrapolated.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import dataclasses
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from dsakv.errors import DsakvError
from dsakv.sim.config import build_setup
from dsakv.sim.steptime import RooflineStepTime
from dsakv.sim.steptime.kernels import GEMM_FIXED_S, LAYER_KERNEL_CHAIN, chain_fixed_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402
from aic_routing import GROUPED_TOPK_VERSIONS, touched_experts  # noqa: E402

TABLES = Path(__file__).resolve().parent / "calibration" / "aiconfigurator"
REDUCE_TOKENS = (1, 16, 64, 256, 1024, 8192)
MOE_TOKENS = (8, 64, 256, 1024, 8192)
ROUTING_DRAWS = 32  # routings drawn per token count for the ``moe routed`` lines (aic_routing.touched_experts)
DECODE = ((1, 4096), (16, 4096), (64, 4096))  # decodes per rank x context
PREFILL = (4096, 8192, 16384)
DSA_MODEL = {"deepseek-v3.2": "deepseek-v3.2", "glm-5": "glm-5", "glm-5.1": "glm-5", "glm-5.2": "glm-5.2"}
FULL_INDEXER_MODEL = {"glm-5.2": "glm-5"}  # whose rows time a full-indexer layer of the model


def _read(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


class Curve:
    """Measured (size, seconds) points of one shape (repeats averaged); ``at(x)`` interpolates linearly, None
    outside the points. Points are added while the tables are read, then only looked up."""

    def __init__(self) -> None:
        self.points: dict[int, list[float]] = defaultdict(list)
        self._sorted: tuple[list[int], list[float]] | None = None

    def add(self, size: int, seconds: float) -> None:
        self.points[size].append(seconds)
        self._sorted = None

    def at(self, x: float) -> float | None:
        if self._sorted is None:
            xs = sorted(self.points)
            self._sorted = xs, [statistics.fmean(self.points[s]) for s in xs]
        xs, ys = self._sorted
        if not xs or x < xs[0] or x > xs[-1]:
            return None
        i = bisect.bisect_left(xs, x)
        if xs[i] == x:
            return ys[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])


def curves(rows: list[dict], key_fields: tuple[str, ...], size: str) -> dict[tuple, Curve]:
    out: dict[tuple, Curve] = defaultdict(Curve)
    for r in rows:
        out[tuple(r[k] for k in key_fields)].add(int(r[size]), float(r["latency_us"]) * 1e-6)
    return out


def _line(op: str, dsakv: float, version: str, measured: float, kernel: str = "") -> str:
    tail = f" ({kernel})" if kernel else ""
    return f"  {op:<28} dsakv {1e6 * dsakv:9.1f} us  {version:<14} {1e6 * measured:9.1f} us  ratio {measured / dsakv:5.2f}{tail}"


@dataclasses.dataclass
class Tables:
    """The three extracted tables as curves: collectives by (gpu, version, op, gpus) over message elements, MoE
    layers by (gpu, version, kernel, hidden, moe_tp) over tokens, DSA modules by (gpu, version, model, phase, kernel,
    kv_dtype, heads, batch, prefix) over context."""

    coll: dict[tuple, Curve]
    moe: dict[tuple, Curve]
    dsa: dict[tuple, Curve]

    @classmethod
    def read(cls, folder: Path) -> Tables:
        dsa_key = ("gpu", "version", "model", "phase", "kernel", "kv_dtype", "heads", "batch", "prefix")
        return cls(
            curves(_read(folder / "collectives.csv"), ("gpu", "version", "op", "gpus"), "message_elements"),
            curves(_read(folder / "moe.csv"), ("gpu", "version", "kernel", "hidden", "moe_tp"), "tokens"),
            curves(_read(folder / "dsa_module.csv"), dsa_key, "context"),
        )


@dataclasses.dataclass(frozen=True)
class TableRouted(RooflineStepTime):
    """dsakv's roofline with the routed experts a step touches counted as AIConfigurator's tables route their tokens
    (``aic_routing.touched_experts``: its power-law generator, seeded) instead of uniformly: set against the tables,
    its MoE layer differs from theirs by the rate alone, not by the routing's skew."""

    def _touched(self, tokens: float) -> float:
        experts = self.rank.experts
        return (
            1.0
            if not experts
            else touched_experts(round(tokens), experts, self.rank.topk_experts, ROUTING_DRAWS) / experts
        )


def _table_routed(model: RooflineStepTime) -> TableRouted:
    """``model`` rebuilt as a ``TableRouted`` (every init field kept)."""
    return TableRouted(**{f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.init})


def compare(anchor: dict, tables: Tables, ratios: dict[str, list[float]]) -> list[str]:
    """The row's lines (its header, then one line per operation and table version); ``ratios`` collects measured /
    dsakv per operation family."""
    engine = calibrate.engine_of(anchor)
    try:
        cfg = calibrate.sim_config(anchor)
        m = dataclasses.replace(build_setup(cfg).step_time, has_indexer=calibrate.has_indexer(anchor))
    except DsakvError as exc:  # a row the replay cannot build either (calibrate.py's error rows)
        return [f"{anchor['id']}: {anchor['model']}, {engine}", f"  error: {exc}"]
    r, gpu, tp, dp = m.rank, m.gpu.name, m.tp, m.dp_attention
    out = [f"{anchor['id']}: {anchor['model']} on {gpu}, TP {tp}, DP attention {dp}, {engine}"]
    if engine != "sglang":
        return [*out, "  no comparison: the tables are SGLang's kernels"]

    def emit(op: str, dsakv: float, found: list[tuple[str, float | None, str]]) -> None:
        for version, measured, kernel in found:
            if measured is not None:  # the shape outside that table's points
                out.append(_line(op, dsakv, version, measured, kernel))
                ratios[op.rstrip("0123456789x ")].append(measured / dsakv)

    coll = tables.coll
    if tp > 1:
        for n in REDUCE_TOKENS:
            price = n * r.hidden * 2 * 2 * (tp - 1) / tp / r.link_bw + m.gpu.link_latency_s
            found = [
                (k[1], c.at(n * r.hidden), "")
                for k, c in sorted(coll.items())
                if k[0] == gpu and k[2] == "all_reduce" and int(k[3]) == tp and k[1].startswith("sglang")
            ]
            emit(f"all_reduce {n}", price, found)

    moe_layers = r.attn_layers - r.dense_layers
    if r.experts and m.moe_a2a == "none" and moe_layers > 0:
        moe = tables.moe
        routed = _table_routed(m)
        for n in MOE_TOKENS:
            per_group = max(1, n // dp)
            price = m.cost([(per_group, 0)], []).seconds["moe"] / moe_layers
            found = [
                (k[1], c.at(per_group * dp), k[2])
                for k, c in sorted(moe.items())
                if k[0] == gpu and int(k[3]) == r.hidden and int(k[4]) == tp
            ]
            emit(f"moe {per_group * dp}", price, found)
            # the same layer with the experts the table's own routing touches (bench/moe_stream.py): the rate alone
            price = routed.cost([(per_group, 0)], []).seconds["moe"] / moe_layers
            emit(f"moe routed {per_group * dp}", price, [x for x in found if x[0] not in GROUPED_TOPK_VERSIONS])

    model = DSA_MODEL.get(anchor["model"])
    if model and r.idx_layers:
        heads = int(m.layout.spec.arch_value("num_attention_heads")) // r.attn_tp
        kv = "bfloat16" if cfg.kv_dtype == "bf16" else "fp8"  # fp8_ds_mla and the plain 576-byte fp8 cache alike
        dsa = tables.dsa
        attn = r.linear

        def projections(tokens: int) -> float:
            return max(tokens * attn.attn_flops / r.gemm_rate, attn.attn_bytes / r.bw) / r.attn_layers

        def own(parts: dict) -> float:
            return sum(parts.get(k, 0.0) for k in ("sparse_mla", "indexer", "cache_write")) / r.attn_layers

        def best(phase: str, batch: int, x: int, name: str, skip: bool) -> dict[str, tuple[float, str]]:
            """Per table version, the fastest kernel's figure for the shape (skip: the skip-indexer kernels)."""
            by_version: dict[str, tuple[float, str]] = {}
            for k, c in dsa.items():
                if (k[0], k[2], k[3], k[5], int(k[6]), int(k[7]), k[8]) != (gpu, name, phase, kv, heads, batch, "0"):
                    continue
                if ("skip_indexer" in k[4]) != skip:
                    continue
                v = c.at(x)
                if v is not None and (k[1] not in by_version or v < by_version[k[1]][0]):
                    by_version[k[1]] = (v, k[4])
            return by_version

        share = r.idx_layers / r.attn_layers  # layers with a full indexer (GLM-5.2: the others reuse a top-k)

        def measured(phase: str, batch: int, x: int) -> list[tuple[str, float | None, str]]:
            """The module's mean over the layers: full-indexer layers (GLM-5.2's under GLM-5's name, the same
            attention dimensions) and, where the model has them, the skip-indexer layers."""
            full = best(phase, batch, x, FULL_INDEXER_MODEL.get(model, model), skip=False)
            if share == 1:
                return [(ver, v, kern) for ver, (v, kern) in sorted(full.items())]
            part = best(phase, batch, x, model, skip=True)
            return [
                (ver, share * full[ver][0] + (1 - share) * part[ver][0], f"{full[ver][1]} + {part[ver][1]}")
                for ver in sorted(full.keys() & part.keys())
            ]

        first, last = 1, next(i for i, (name, _) in enumerate(LAYER_KERNEL_CHAIN) if name == "o projection")
        launches = chain_fixed_seconds(LAYER_KERNEL_CHAIN[first : last + 1], m.gpu.kernel_node_s, GEMM_FIXED_S)
        launches += m.terms.indexer_floor_s * share
        for b, ctx in DECODE:
            price = own(m.cost([], [ctx] * b).seconds) + projections(b) + launches
            emit(f"attention decode {b} x {ctx}", price, measured("generation", b, ctx))
        for n in PREFILL:
            price = own(m.cost([(n, 0)], []).seconds) + projections(n)
            emit(f"attention prefill {n}", price, measured("context", 1, n))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchors", required=True, help="a calibration file (anchors format)")
    ap.add_argument("--only", help="comma-separated row ids")
    ap.add_argument("--tables", type=Path, default=TABLES, help="the extracted tables (default: %(default)s)")
    args = ap.parse_args(argv)
    with Path(args.anchors).open(newline="") as f:
        rows = [a for a in csv.DictReader(f) if not args.only or a["id"] in args.only.split(",")]
    tables = Tables.read(args.tables)
    ratios: dict[str, list[float]] = defaultdict(list)
    for anchor in rows:
        print("\n".join(compare(anchor, tables, ratios)))
    families = ", ".join(
        f"{op} {statistics.geometric_mean(v):.2f} ({min(v):.2f}-{max(v):.2f}, {len(v)})" for op, v in ratios.items()
    )
    print(
        f"measured ops over {len(rows)} rows, measured / dsakv geometric mean (range, comparisons): {families or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(calibrate.run_cli(main))
