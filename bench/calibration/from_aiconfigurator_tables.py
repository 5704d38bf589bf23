"""NVIDIA AIConfigurator's measured SGLang kernel tables (Apache-2.0), the rows dsakv's step time prices, as CSV.

    pip install pyarrow pandas   # to read the tables' parquet files; nothing else in dsakv needs them
    python bench/calibration/from_aiconfigurator_tables.py PATH/aiconfigurator bench/calibration/aiconfigurator

AIConfigurator (``aic-core/src/aiconfigurator_core/systems/data/<system>/<op>/sglang/<version>/``) times single
operations inside an SGLang process on each GPU kind: a tensor-parallel all-reduce through SGLang's own
``tensor_model_parallel_all_reduce`` in a replayed CUDA graph (``custom_allreduce_perf``: the custom all-reduce, NCCL
above its size limit), nccl-tests' all-gather / reduce-scatter / all-reduce (``nccl_perf``), SGLang's fused MoE layer
(``moe_perf``) and the whole DSA attention module of DeepSeek-V3.2 / GLM-5 (projections, indexer, sparse MLA; the
``dsa_*_module_perf`` tables, decode in a CUDA graph as served). The files written here keep:

* ``collectives.csv``: bf16 collectives on 2, 4 and 8 GPUs; ``message_elements`` is the message in elements
  (AIConfigurator's ``message_size``: the collector sizes its tensors in elements), ``latency_us`` one collective.
* ``moe.csv``: block-scaled fp8 MoE layers of DeepSeek-V3 shapes (hidden 7,168, expert width 2,048, 256 experts,
  top 8) and GLM-5 shapes (hidden 6,144), MoE TP 1-8 without expert parallelism, routed by AIConfigurator's default
  ``power_law_1.01`` distribution; ``latency_us`` one layer at ``num_tokens`` tokens.
* ``dsa_module.csv``: the DSA attention module of DeepSeek-V3.2 and GLM-5(.2)-FP8 with fp8 block-scaled linear layers:
  ``phase`` context (one sequence of ``tokens`` new tokens after ``prefix`` cached ones, ``context`` their sum; the
  prefixes of ``PREFIXES``) or
  generation (``batch`` decodes, each at context ``context``), ``heads`` per rank (``tp`` the attention TP the collector ran), ``kv_dtype``
  the cache, ``kernel`` the backend AIConfigurator names; ``latency_us`` one layer.

A row's table is ``DATA/<system>/<op>/sglang/<version>/<table>.parquet`` (``comm/nccl/<version>`` for nccl-tests) at
``COMMIT``: ``gpu`` and ``version`` name it.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
from pathlib import Path

COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
DATA = "aic-core/src/aiconfigurator_core/systems/data"
SYSTEMS = {
    "h100_sxm": "H100",
    "h200_sxm": "H200",
    "b200_sxm": "B200",
    "b300_sxm": "B300",
    "gb200": "GB200",
    "gb300": "GB300",
}
MOE_SHAPES = {(7168, 2048, 256, 8), (6144, 2048, 256, 8)}  # hidden, expert width, experts, top-k
PREFIXES = (0, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)  # cached tokens kept of a context row's many
DSA_MODELS = {
    "deepseek-ai/DeepSeek-V3.2": "deepseek-v3.2",
    "zai-org/GLM-5-FP8": "glm-5",
    "zai-org/GLM-5.2-FP8": "glm-5.2",
}


def _tables(repo: Path, op: str, name: str) -> list[tuple[str, str, str]]:
    """(GPU kind, version folder, path) of every ``name`` table of SGLang (or NCCL for ``comm/nccl``) at COMMIT."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", COMMIT, DATA],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for path in out:
        parts = path[len(DATA) + 1 :].split("/")
        if len(parts) == 5 and parts[0] in SYSTEMS and "/".join(parts[1:3]) == op and parts[4] == name:
            found.append((SYSTEMS[parts[0]], parts[3], path))
    return sorted(found)


def _read(repo: Path, path: str):
    import pandas as pd

    blob = subprocess.run(["git", "-C", str(repo), "show", f"{COMMIT}:{path}"], capture_output=True, check=True).stdout
    return pd.read_parquet(io.BytesIO(blob))


def collectives(repo: Path) -> list[dict]:
    rows = []
    for gpu, version, path in _tables(repo, "comm/sglang", "custom_allreduce_perf.parquet"):
        d = _read(repo, path)
        if "backend" not in d.columns:  # some folders hold TensorRT-LLM's table under SGLang's name
            continue
        d = d[(d.backend == "sglang_graph") & (d.allreduce_dtype == "bfloat16")]
        for r in d.itertuples():
            rows.append(_coll(gpu, f"sglang {version}", "all_reduce", "sglang custom all-reduce, CUDA graph", r))
    for gpu, version, path in _tables(repo, "comm/nccl", "nccl_perf.parquet"):
        d = _read(repo, path)
        d = d[d.nccl_dtype == "half"]
        for r in d.itertuples():
            rows.append(_coll(gpu, f"nccl {version}", r.op_name, "nccl-tests", r))
    return rows


def _coll(gpu: str, version: str, op: str, kernel: str, r) -> dict:
    return {
        "gpu": gpu,
        "version": version,
        "op": op,
        "kernel": kernel,
        "gpus": int(r.num_gpus),
        "message_elements": int(r.message_size),
        "latency_us": round(float(r.latency) * 1000, 3),
    }


def moe(repo: Path) -> list[dict]:
    rows = []
    for gpu, version, path in _tables(repo, "moe/sglang", "moe_perf.parquet"):
        d = _read(repo, path)
        d = d[(d.moe_dtype == "fp8_block") & (d.moe_ep_size == 1) & (d.distribution == "power_law_1.01")]
        for r in d.itertuples():
            if (r.hidden_size, r.inter_size, r.num_experts, r.topk) not in MOE_SHAPES:
                continue
            rows.append(
                {
                    "gpu": gpu,
                    "version": f"sglang {version}",
                    "kernel": r.kernel_source,
                    "hidden": int(r.hidden_size),
                    "expert_width": int(r.inter_size),
                    "experts": int(r.num_experts),
                    "topk": int(r.topk),
                    "moe_tp": int(r.moe_tp_size),
                    "tokens": int(r.num_tokens),
                    "latency_us": round(float(r.latency) * 1000, 3),
                }
            )
    return rows


def dsa_module(repo: Path) -> list[dict]:
    rows = []
    for phase in ("context", "generation"):
        for gpu, version, path in _tables(repo, "sparse_attention/sglang", f"dsa_{phase}_module_perf.parquet"):
            d = _read(repo, path)
            d = d[d.model.isin(list(DSA_MODELS)) & (d.gemm_type == "fp8_block")]
            if phase == "context":  # one sequence (``step``: the tokens cached before its ``isl`` new ones)
                d = d[(d.batch_size == 1) & d.step.isin(PREFIXES)]
            for r in d.itertuples():
                rows.append(
                    {
                        "gpu": gpu,
                        "version": f"sglang {version}",
                        "model": DSA_MODELS[r.model],
                        "phase": phase,
                        "kernel": r.kernel_source,
                        "kv_dtype": r.kv_cache_dtype,
                        "heads": int(r.num_heads),
                        "tp": int(r.tp_size),
                        "batch": int(r.batch_size),
                        "tokens": int(r.isl) if phase == "context" else 1,
                        "prefix": int(r.step) if phase == "context" else 0,
                        "context": int(r.step) if phase == "generation" else int(r.isl) + int(r.step),
                        "latency_us": round(float(r.latency) * 1000, 3),
                    }
                )
    return rows


def write(rows: list[dict], path: Path) -> None:
    rows = sorted(rows, key=lambda r: tuple(str(v).zfill(12) if isinstance(v, int) else str(v) for v in r.values()))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(f"{path}: {len(rows)} rows", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("repo", type=Path, help="a clone of ai-dynamo/aiconfigurator holding commit " + COMMIT)
    p.add_argument("out", type=Path, help="the folder to write collectives.csv, moe.csv and dsa_module.csv into")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    write(collectives(a.repo), a.out / "collectives.csv")
    write(moe(a.repo), a.out / "moe.csv")
    write(dsa_module(a.repo), a.out / "dsa_module.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
