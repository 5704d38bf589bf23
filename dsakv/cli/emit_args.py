"""``dsakv simulate`` flags of the log round trip: ``--emit-log FILE --log-format sglang|vllm [--log-interval N]``
(the run's log in an engine's format, ``dsakv.sim.emitlog``) and ``--step-settings FILE`` (the roofline's
efficiencies from ``dsakv calibrate --log``, ``dsakv.sim.step_settings``). Kept apart from ``cli/simulate.py``:
that module calls ``add_emit_arguments``, ``step_settings``, ``check_emit_args`` and ``emit_run`` and nothing else of
this one."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from dsakv.cli.gpu_args import parse_float
from dsakv.errors import DsakvError
from dsakv.sim import run as sim_run
from dsakv.sim.config import SimConfig
from dsakv.sim.emitlog import LOG_FORMATS, LogEmitter
from dsakv.sim.report import SimResult
from dsakv.sim.step_settings import Settings, load_step_settings


def add_emit_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine log (dsakv diagnose / calibrate round trip)")
    g.add_argument("--emit-log", metavar="FILE", help="write the run's log in an engine's format (--log-format)")
    g.add_argument(
        "--log-format", default="sglang", help=f"engine whose log --emit-log writes: {', '.join(LOG_FORMATS)}"
    )
    g.add_argument(
        "--log-interval",
        help="sglang: decode steps per Decode batch line (default 40, SGLang's --decode-log-interval); "
        "vllm: seconds between stats lines (default 10)",
    )
    g.add_argument("--step-settings", metavar="FILE", help="roofline efficiencies from dsakv calibrate --log --out")


def check_emit_args(args: argparse.Namespace, runs: int) -> None:
    """``--emit-log`` writes one run's log: not with a sweep or a router comparison (``runs`` > 1)."""
    if args.emit_log and (args.sweep or runs > 1):
        raise DsakvError("--emit-log writes one run's log: give it without --sweep or a comma list of --router")
    if not args.emit_log and (args.log_interval is not None or args.log_format != "sglang"):
        raise DsakvError("--log-format / --log-interval shape the log --emit-log FILE writes: give --emit-log")


def step_settings(args: argparse.Namespace) -> Settings:
    return () if args.step_settings is None else load_step_settings(args.step_settings)


def emit_run(args: argparse.Namespace, cfg: SimConfig, requests: Iterable, run: dict) -> SimResult:
    """The one-group run stepped one step at a time, its log written to ``--emit-log`` as it goes."""
    if cfg.instances > 1 or cfg.gpu.dp_attention > 1 or cfg.workers > 1 or cfg.kv_events_endpoint is not None:
        raise DsakvError("--emit-log writes one engine's log: give it with one instance, one DP group, one worker")
    if args.log_format not in LOG_FORMATS:
        raise DsakvError(f"--log-format = {args.log_format!r}: must be one of {', '.join(LOG_FORMATS)}")
    interval = None if args.log_interval is None else parse_float("--log-interval", args.log_interval)
    try:
        out = open(args.emit_log, "w", encoding="ascii")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise DsakvError(f"--emit-log {args.emit_log}: cannot write ({exc.strerror})") from None
    with out:
        emitter = LogEmitter(out, args.log_format, run["setup"], interval)
        kwargs = {k: v for k, v in run.items() if k != "analytic_decode"}
        return sim_run(cfg, requests, analytic_decode=False, observer=emitter, **kwargs)


__all__ = ["add_emit_arguments", "check_emit_args", "emit_run", "step_settings"]
