"""``dsakv plan``: the capacity planner (cell bytes, pool size, context table, workspaces, what-ifs).

Numbers are taken as strings and parsed here so that bad input is one ``DsakvError`` line (exit 1)
rather than an argparse usage dump. Byte sizes accept plain integers (``1,048,576`` or ``1_048_576``)
or a unit: ``GB``/``MB`` (10^9, 10^6) and ``GiB``/``MiB`` (2^30, 2^20).
"""

from __future__ import annotations

import argparse
import re
import sys

from rich.console import Console

from dsakv.budget import DEFAULT_ACTIVATION_BYTES, DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MEM_FRACTION, GpuSetting
from dsakv.cli.plan_render import render
from dsakv.errors import DsakvError
from dsakv.gpus import GPU_KINDS
from dsakv.layout import KV_DTYPES, CacheLayout
from dsakv.planner import Plan, apply_indexer_pattern, indexer_patterns, plan
from dsakv.spec import PRESETS, load_spec

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30}
UNITS["tib"] = 2**40
CAPTION = "B = exact bytes; GB = 10^9 B; GiB = 2^30 B; MiB = 2^20 B"


def parse_int(flag: str, text: str | None, minimum: int = 1) -> int | None:
    if text is None:
        return None
    try:
        value = int(str(text).replace(",", "").replace("_", ""))
    except ValueError:
        raise DsakvError(f"{flag} = {text!r}: must be an integer >= {minimum}") from None
    if value < minimum:
        raise DsakvError(f"{flag} = {value}: must be an integer >= {minimum}")
    return value


def parse_bytes(flag: str, text: str | None, minimum: int = 1) -> int | None:
    """An integer byte count, optionally with a unit (GB = 10^9, GiB = 2^30)."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9][0-9_,]*(?:\.[0-9]+)?|-[0-9][0-9_,]*(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in UNITS:
        raise DsakvError(
            f"{flag} = {text!r}: must be a byte count (an integer, or with a unit: {', '.join(UNITS)[4:]})"
        )
    number = (
        float(m.group(1).replace(",", "").replace("_", ""))
        if "." in m.group(1)
        else int(m.group(1).replace(",", "").replace("_", ""))
    )
    value = int(number * UNITS[m.group(2).lower()])
    if value < minimum:
        raise DsakvError(f"{flag} = {text!r}: must be at least {minimum} bytes")
    return value


def parse_fraction(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DsakvError(f"{flag} = {text!r}: must be a number in (0, 1]") from None
    if not 0 < value <= 1:
        raise DsakvError(f"{flag} = {value}: must be in (0, 1]")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("plan", help="capacity planner: cell bytes, pool size, context table, what-ifs")
    m = p.add_argument_group("model")
    m.add_argument("--model", help=f"preset: {', '.join(PRESETS)} (default glm-5.3)")
    m.add_argument("--config", help="path to a Hugging Face config.json")
    m.add_argument("--indexer-pattern", help="F/S string, or a pattern name from the IndexCache file")
    m.add_argument("--indexer-patterns-file", help="IndexCache pattern JSON (default: ../shared/data/indexcache/)")
    m.add_argument("--indexer-all-layers", action="store_true", help="keep indexer K on every layer")
    c = p.add_argument_group("cache layout")
    c.add_argument("--kv-dtype", default="fp8_ds_mla", help=f"main KV format: {', '.join(KV_DTYPES)}")
    c.add_argument("--mtp-layers", default="0", help="MTP/draft cache layers (each: main row + full indexer)")
    c.add_argument("--kpool", default="1", help="index_kpool: one indexer state per N tokens")
    c.add_argument("--dcp", default="1", help="decode-context-parallel size (indexer K replicated)")
    c.add_argument("--page-size", default="64", help="tokens per page (64 for CUDA kernels)")
    c.add_argument("--allow-non-cuda-page-size", action="store_true", help="permit page sizes CUDA kernels cannot read")
    g = p.add_argument_group("GPU setting (per rank)")
    g.add_argument("--gpu", default="H200", help=f"GPU kind: {', '.join(GPU_KINDS)} (default H200)")
    g.add_argument("--gpu-memory", help="bytes per GPU (overrides --gpu); units GB/GiB accepted")
    g.add_argument("--gpus", default="8", help="number of GPUs (default 8)")
    g.add_argument("--tp", help="tensor-parallel size (default: --gpus)")
    g.add_argument("--dp-attention", default="1", help="attention data-parallel groups (divides --tp)")
    g.add_argument("--mem-fraction-static", default=str(DEFAULT_MEM_FRACTION), help="fraction in (0, 1]")
    g.add_argument("--weights-bytes", help="weights per rank (default: computed from the config)")
    g.add_argument("--weight-dtype", help="weight dtype for the computed weights (default: the config's)")
    g.add_argument(
        "--activation-bytes", default=str(DEFAULT_ACTIVATION_BYTES), help="reserve inside the static fraction"
    )
    g.add_argument("--max-batched-tokens", default=str(DEFAULT_MAX_BATCHED_TOKENS), help="sizes the top-k buffer")
    g.add_argument("--available-bytes", help="bytes for the pool on one rank (skips the memory split)")
    r = p.add_argument_group("request and diagnostics")
    r.add_argument("--context", help="request length in tokens: pages, bytes, fit, concurrency")
    r.add_argument("--cached", help="prefix-cache hit of the request, tokens (needs --context)")
    r.add_argument("--explain-tokens", help="pool size (tokens) an engine logged: which knob explains the gap")
    p.add_argument("--json", action="store_true", help="print every figure as JSON")
    return p


def build_plan(args: argparse.Namespace) -> Plan:
    spec = load_spec(args.model, args.config)
    patterns = indexer_patterns(args.indexer_patterns_file)
    if args.indexer_pattern:
        spec = apply_indexer_pattern(spec, args.indexer_pattern, patterns)
    if args.indexer_all_layers:
        spec = spec.with_all_indexers_full()
    layout = CacheLayout(
        spec,
        kv_dtype=args.kv_dtype,
        page_size=parse_int("--page-size", args.page_size),
        index_kpool=parse_int("--kpool", args.kpool),
        mtp_layers=parse_int("--mtp-layers", args.mtp_layers, 0),
        allow_any_page_size=args.allow_non_cuda_page_size,
    )
    setting = GpuSetting(
        gpu=args.gpu,
        gpu_memory_bytes=parse_bytes("--gpu-memory", args.gpu_memory),
        num_gpus=parse_int("--gpus", args.gpus),
        tp=parse_int("--tp", args.tp),
        dp_attention=parse_int("--dp-attention", args.dp_attention),
        dcp=parse_int("--dcp", args.dcp),
        mem_fraction_static=parse_fraction("--mem-fraction-static", args.mem_fraction_static),
        weights_bytes=parse_bytes("--weights-bytes", args.weights_bytes, 0),
        weight_dtype=args.weight_dtype,
        activation_bytes=parse_bytes("--activation-bytes", args.activation_bytes, 0),
        max_batched_tokens=parse_int("--max-batched-tokens", args.max_batched_tokens),
    )
    return plan(
        spec,
        layout,
        setting,
        available_bytes=parse_bytes("--available-bytes", args.available_bytes),
        context=parse_int("--context", args.context),
        cached=parse_int("--cached", args.cached, 0),
        explain=parse_int("--explain-tokens", args.explain_tokens),
        patterns=patterns,
    )


def run(args: argparse.Namespace) -> int:
    result = build_plan(args)
    if args.json:
        print(result.to_json())
        return 0
    console = Console(width=None if sys.stdout.isatty() else 160)
    render(result, console, CAPTION)
    return 0
