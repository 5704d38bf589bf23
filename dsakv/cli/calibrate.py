"""``dsakv calibrate --log FILE [--out settings.json] [--model / --config] [GPU setting]``: the roofline step
time's efficiencies fitted to the steps an SGLang log measured (``dsakv.sim.calibrate``); ``--out`` writes the
settings file ``dsakv simulate --step-settings FILE`` reads (``dsakv.sim.step_settings``)."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from dsakv.cli.log_args import add_log_arguments, log_path, log_setup
from dsakv.cli.output import dumps
from dsakv.errors import DsakvError
from dsakv.sim.calibrate import calibrate
from dsakv.sim.step_settings import write_step_settings
from dsakv.telemetry.log_reader import read_log


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("calibrate", help="fit the step time's efficiencies to an SGLang log's batches")
    p.add_argument("--out", help="write the fitted settings here (for dsakv simulate --step-settings)")
    add_log_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    facts = read_log(log_path(args))
    if facts.engine == "vllm":
        raise DsakvError(
            f"--log {args.log}: a vLLM log states throughput averaged over its stats interval, not per step; "
            "calibrate needs SGLang 'Decode batch' / 'Prefill batch' lines"
        )
    _, setup = log_setup(args, facts)
    cal = calibrate(facts, setup.step_time, setup.group_page_tokens)
    out = {"log": facts.counts(), **cal.to_dict()}
    if args.out:
        write_step_settings(args.out, cal.settings, out)
    if args.json:
        print(dumps(out, indent=2))
        return 0
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(f"{args.log}: {cal.gaps:,} measured gaps fitted")
    t = Table("field", "unit", "start", "fitted", "determined", "influence")
    for f in cal.fields:
        t.add_row(
            f.name, f.unit, f"{f.start:.4g}", f"{f.value:.4g}", "yes" if f.determined else "no", f"{f.influence:.3f}"
        )
    console.print(t)
    e = Table("gaps of", "count", "median |error|", "rms error", "median |error| before")
    for k in cal.errors:
        e.add_row(
            k.kind, f"{k.gaps:,}", f"{k.median_abs_error:.2%}", f"{k.rms_error:.2%}", f"{k.median_abs_error_before:.2%}"
        )
    console.print(e)
    for note in cal.notes:
        console.print(f"note: {note}")
    if args.out:
        console.print(f"settings written to {args.out} (dsakv simulate --step-settings {args.out})")
    return 0
