"""Rows of NVIDIA AIConfigurator's measured ``silicon_sample.csv`` (Apache-2.0) in the anchors format, for fit.csv.

    python bench/calibration/from_aiconfigurator.py PATH/silicon_sample.csv > rows.csv

Keeps what dsakv can price: SGLang aggregated serving of GLM-5 (DSA) and DeepSeek-R1 / V3 (dense MLA: replayed on
the DeepSeek-V3.2 preset with ``indexer`` 0) in block-scaled FP8 on one H200 / B200 / B300 node, plain TP (attention
DP 1, MoE TP = TP, EP 1, PP 1). Each measurement appears once (the dump repeats some under two file dates, and some
DeepSeek ones under both R1 and V3).

What a row carries is what the dump states: engine and image, GPU kind and count (= TP), ISL / OSL, concurrency
(``conc``, a closed loop) and the measured TTFT / TPOT (``silicon_ttft_ms`` / ``silicon_tpot_ms``; the dump does not
say which statistic: recorded as means, the figure AIConfigurator predicts). It sets no memory fraction, KV dtype,
running cap or chunk: those cells stay empty (the engine's defaults). What AIConfigurator's own generator launches
SGLang aggregated serving with, a row measured after the rule was in, fills two more: ``budget`` (``--max-prefill-
tokens`` = ISL + 1,500) and ``mixed_chunk`` (``--enable-mixed-chunk``): ``AIC_SGLANG_AGG_RULES``; whether the dump's
measurements were launched from the generator is not stated. The request count is not in the dump:
``n`` = ``MULTI_ROUND`` x concurrency. AIConfigurator's own benchmark template sends 20 rounds (bench_run.sh.j2:
``--num-requests concurrency x BENCH_MULTI_ROUND``, default 20, after ``2 x concurrency`` warm-up requests it does
not count); 10 rounds keep the heaviest replay (1K/8K at concurrency 128) under a minute on one core, with the first
round (the one the warm-up would hide) a tenth of the requests.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys

SRC = (
    "https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/"
    "aic-core/src/aiconfigurator_core/systems/silicon_sample.csv"
)
MULTI_ROUND = 10
SYSTEMS = {"h200_sxm": "H200", "b200_sxm": "B200", "b300_sxm": "B300"}
MODELS = {  # model_path -> (dsakv preset, indexer, short name)
    "zhipuai/GLM-5": ("glm-5", "1", "glm5"),
    "deepseek-ai/DeepSeek-R1": ("deepseek-v3.2", "0", "r1"),
    "deepseek-ai/DeepSeek-V3": ("deepseek-v3.2", "0", "v3"),
}
COLUMNS = (
    "id,model,weight_dtype,gpu,gpus,dp,mtp,accept,kv,mem,n,isl,osl,rate,fixed,conc,cap,chunk,budget,"
    "engine,version,indexer,range_ratio,mixed_chunk,note,src,published"
).split(",")
# AIConfigurator's generator rules for SGLang aggregated serving (src/aiconfigurator/generator/rule_plugin/sglang.rule,
# and rule_plugin/benchmark/sglang.rule, its benchmark mode, from 71bb3d00e, 2026-01-30), with the day each came in:
# ``agg_prefill_decode max_prefill_tokens = SlaConfig.isl + 1500`` with the generator's SGLang support (95ddf241a,
# 2025-12-04), ``agg enable_mixed_chunk = true`` from fa895ffb1 / 07a377923 (2026-01-19). The other rules set nothing
# a replay here reads: a running cap and CUDA-graph sizes no smaller than the concurrency, and a KV dtype from a
# configuration the dump does not give.
AIC_PREFILL_TOKENS_OVER_ISL = 1500
AIC_SGLANG_AGG_RULES = {"budget": "2025-12-04", "mixed_chunk": "2026-01-19"}


def _source_fields(text: str) -> dict[str, str]:
    """The dump's ``silicon_data_source`` cell: ``key=value`` items separated by ``; ``."""
    return dict(item.split("=", 1) for item in text.split("; ") if "=" in item)


def keep(row: dict) -> bool:
    """Whether dsakv can price the measurement (see the module docstring)."""
    plain_tp = row["moe_tp_size"] == row["tp_size"] and row["moe_ep_size"] == "1" and row["pp_size"] == "1"
    return (
        row["backend"] == "sglang"
        and row["mode"] == "agg"
        and row["model_path"] in MODELS
        and row["system"] in SYSTEMS
        and (row["gemm_quant_mode"], row["moe_quant_mode"]) == ("fp8", "fp8_block")
        and row["attention_dp_size"] == "1"
        and plain_tp
        and int(row["tp_size"]) <= 8
    )


def anchor_row(row: dict) -> dict:
    """One measurement as an anchors-format row (id without its repeat suffix)."""
    preset, indexer, short = MODELS[row["model_path"]]
    source = _source_fields(row["silicon_data_source"])
    gpu, tp, conc = SYSTEMS[row["system"]], row["tp_size"], int(row["batch_size"])
    isl, osl = int(row["isl"]), int(row["osl"])
    image = source.get("image", "")
    version = row["backend_version"] or image
    flags = "; AIC marks it wip=True" if source.get("wip") == "True" else ""
    measured = source.get("measured", "")[:10]  # an ISO date sorts as text
    rules = {name: measured >= since for name, since in AIC_SGLANG_AGG_RULES.items()} if measured else {}
    launched = [
        text
        for name, text in (
            ("budget", f"--max-prefill-tokens {isl + AIC_PREFILL_TOKENS_OVER_ISL} (ISL + 1500)"),
            ("mixed_chunk", "--enable-mixed-chunk"),
        )
        if rules.get(name)
    ]
    generator = (
        f"; AIConfigurator's SGLang agg rules in force then (rule_plugin/sglang.rule): {', '.join(launched)}"
        if launched
        else "; measured before AIConfigurator's SGLang agg rules set --enable-mixed-chunk"
        if measured
        else "; no measured date: no AIConfigurator generator rule read into it"
    )
    note = (
        f"AIConfigurator silicon {row['id']} ({row['model_path']}, SGLang {version or 'version not stated'}, "
        f"measured {source.get('measured', '?')}{flags}); TP{tp}, MoE TP{tp} EP1; n = {MULTI_ROUND} x conc{generator}"
    )
    published = {"ttft_ms": [round(float(row["silicon_ttft_ms"]), 3), "mean"]}
    published["tpot_ms"] = [round(float(row["silicon_tpot_ms"]), 4), "mean"]
    out = dict.fromkeys(COLUMNS, "")
    out.update(
        id=f"aic-{short}-sgl-{gpu.lower()}-tp{tp}-{isl // 1024}k{osl // 1024}k-c{conc}",
        model=preset, weight_dtype="fp8", gpu=gpu, gpus=tp, dp="1", mtp="0", n=str(MULTI_ROUND * conc),
        isl=str(isl), osl=str(osl), fixed="False", conc=str(conc), engine="sglang", version=image or version,
        indexer=indexer, note=note, src=SRC, published=json.dumps(published),
        budget=str(isl + AIC_PREFILL_TOKENS_OVER_ISL) if rules.get("budget") else "",
        mixed_chunk="1" if rules.get("mixed_chunk") else "",
    )  # fmt: skip
    return out


def convert(rows: list[dict]) -> list[dict]:
    """The kept measurements, each once, in the dump's order; a second distinct measurement of the same
    configuration gets the id suffix ``-m2`` (then ``-m3`` ...)."""
    seen, ids, out = set(), {}, []
    for row in rows:
        if not keep(row):
            continue
        # DeepSeek-R1 and -V3 share one architecture and the dump files some measurements under both names.
        key = (MODELS[row["model_path"]][0],) + tuple(row[k] for k in ("system", "tp_size", "isl", "osl", "batch_size"))
        # The dumps carry one measurement with last-digit float differences (993.6923670582472 / ...473).
        measured = key + (round(float(row["silicon_ttft_ms"]), 6), round(float(row["silicon_tpot_ms"]), 6))
        if measured in seen:
            continue
        seen.add(measured)
        anchor = anchor_row(row)
        ids[anchor["id"]] = ids.get(anchor["id"], 0) + 1
        if ids[anchor["id"]] > 1:
            anchor["id"] += f"-m{ids[anchor['id']]}"
        out.append(anchor)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("silicon_sample", help="AIConfigurator's silicon_sample.csv")
    args = ap.parse_args(argv)
    with open(args.silicon_sample, newline="") as f:
        rows = convert(list(csv.DictReader(f)))
    w = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
