"""Arguments shared by ``dsakv diagnose`` and ``dsakv calibrate``: the log, the model and the GPU setting (the
same flags as ``dsakv plan``: ``cli/gpu_args.py``), turned into the ``SimConfig`` / ``SimSetup`` whose planner
pool and step-time model the log is compared with. The engine (from the log) picks the step-time model's
kernels as ``dsakv simulate`` does: SGLang's ``prefill_first`` policy, vLLM's ``mixed``."""

from __future__ import annotations

import argparse

from dsakv.cli.aliases import add_hidden_alias
from dsakv.cli.gpu_args import add_gpu_arguments, available_bytes, gpu_setting, parse_int
from dsakv.errors import DsakvError
from dsakv.sim.config import SimConfig, SimSetup, build_setup
from dsakv.spec.layout import KV_DTYPES
from dsakv.spec.model_spec import PRESETS
from dsakv.telemetry.log_reader import LogFacts

POLICY_OF_ENGINE = {"sglang": "prefill_first", "vllm": "mixed"}


def add_log_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log", help="the engine's log (SGLang scheduler or vLLM server output); required")
    m = p.add_argument_group("model")
    m.add_argument("--model", help=f"preset: {', '.join(PRESETS)} (default glm-5.3)")
    m.add_argument("--config", help="path to a Hugging Face config.json")
    m.add_argument("--kv-dtype", default="fp8_ds_mla", help=f"main KV format: {', '.join(KV_DTYPES)}")
    m.add_argument(
        "--num-speculative-tokens",
        metavar="K",
        default="0",
        help="speculative (MTP draft) tokens per decode step the engine ran (0 = off)",
    )
    add_hidden_alias(m, "--mtp", "num_speculative_tokens")
    add_gpu_arguments(p)
    p.add_argument("--json", action="store_true", help="print every figure as JSON")


def log_path(args: argparse.Namespace) -> str:
    if not args.log:
        raise DsakvError(f"dsakv {args.command}: --log FILE is required (an SGLang or vLLM server log)")
    return args.log


def log_setup(args: argparse.Namespace, facts: LogFacts) -> tuple[SimConfig, SimSetup]:
    cfg = SimConfig(
        model=args.model,
        config=args.config,
        gpu=gpu_setting(args),
        available_bytes=available_bytes(args),
        kv_dtype=args.kv_dtype,
        num_speculative_tokens=parse_int("--num-speculative-tokens", args.num_speculative_tokens, 0),
        schedule_policy=POLICY_OF_ENGINE.get(facts.engine or "sglang", "prefill_first"),
    )
    return cfg, build_setup(cfg)


__all__ = ["add_log_arguments", "log_path", "log_setup"]
