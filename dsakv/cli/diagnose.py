"""``dsakv diagnose --log FILE [--metrics FILE] [--model NAME | --config FILE] [GPU setting]``: the four verdicts
of ``dsakv.sim.diagnose`` from an SGLang or vLLM log (and optionally a Prometheus scrape); docs/diagnose.md."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from dsakv.cli.log_args import add_log_arguments, log_path, log_setup
from dsakv.cli.output import dumps
from dsakv.sim.diagnose import diagnose
from dsakv.telemetry.log_reader import read_log
from dsakv.telemetry.metrics_text import read_metrics


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("diagnose", help="verdicts from an SGLang / vLLM log: pool size, admission, hits, decode")
    p.add_argument("--metrics", help="a Prometheus text scrape of the engine's /metrics (vllm: / sglang: names)")
    add_log_arguments(p)
    return p


def _figure(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return (
            ", ".join(str(v) for v in value[:3]) if value and not isinstance(value[0], dict) else f"{len(value)} rows"
        )
    return str(value)


def run(args: argparse.Namespace) -> int:
    facts = read_log(log_path(args))
    metrics = None if args.metrics is None else read_metrics(args.metrics)
    cfg, setup = log_setup(args, facts)
    verdicts = diagnose(facts, metrics, cfg, setup)
    out = {
        "log": facts.counts(),
        "metrics": None if metrics is None else metrics.to_dict(),
        "verdicts": [v.to_dict() for v in verdicts],
    }
    if args.json:
        print(dumps(out, indent=2))
        return 0
    console = Console(width=None if sys.stdout.isatty() else 160)
    c = facts.counts()
    console.print(
        f"{args.log}: {c['engine']} log, {c['lines']:,} lines ({c['ignored_lines']:,} ignored, "
        f"{c['malformed_lines']:,} malformed); {c['prefill_lines']:,} prefill, {c['decode_lines']:,} decode, "
        f"{c['stats_lines']:,} stats lines"
    )
    table = Table("verdict", "fires", "figures", "advice", show_lines=True)
    for v in verdicts:
        figs = "\n".join(f"{k}: {_figure(x)}" for k, x in v.figures.items() if k != "candidates")
        table.add_row(v.name, {True: "yes", False: "no", None: "n/a"}[v.fires], figs, v.advice)
    console.print(table)
    return 0
