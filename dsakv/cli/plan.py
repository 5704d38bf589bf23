"""``dsakv plan``: the capacity planner (cell bytes, pool size, context table, workspaces, what-ifs).

The GPU-setting flags and the number parsing are shared with ``dsakv simulate`` (``dsakv.cli.gpu_args``):
bad input is one ``DsakvError`` line (exit 1); byte sizes accept units (GB = 10^9, GiB = 2^30).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from rich.console import Console

from dsakv.cli.gpu_args import add_gpu_arguments, available_bytes, gpu_setting, parse_bytes, parse_float, parse_int
from dsakv.cli.output import dumps
from dsakv.cli.plan_render import render
from dsakv.errors import DsakvError
from dsakv.planner.pd import PdPlan, pd_plan
from dsakv.planner.plan import Plan, plan
from dsakv.spec.layout import CUDA_PAGE_SIZE, KV_DTYPES, CacheLayout
from dsakv.spec.model_spec import PRESETS, load_spec
from dsakv.spec.patterns import apply_indexer_pattern, indexer_patterns

CAPTION = "B = exact bytes; GB = 10^9 B; GiB = 2^30 B; MiB = 2^20 B"
LAYOUT_DEFAULTS = {f.name: f.default for f in fields(CacheLayout) if f.name != "spec"}  # the flags' defaults


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("plan", help="capacity planner: cell bytes, pool size, context table, what-ifs")
    m = p.add_argument_group("model")
    m.add_argument("--model", help=f"preset: {', '.join(PRESETS)} (default glm-5.3)")
    m.add_argument("--config", help="path to a Hugging Face config.json")
    m.add_argument("--indexer-pattern", help="F/S string, or a pattern name from the IndexCache file")
    m.add_argument("--indexer-patterns-file", help="IndexCache pattern JSON (default: ../shared/data/indexcache/)")
    m.add_argument("--indexer-all-layers", action="store_true", help="keep indexer K on every layer")
    c = p.add_argument_group("cache layout")
    c.add_argument("--kv-dtype", default=LAYOUT_DEFAULTS["kv_dtype"], help=f"main KV format: {', '.join(KV_DTYPES)}")
    c.add_argument(
        "--mtp-layers",
        default=str(LAYOUT_DEFAULTS["mtp_layers"]),
        help="MTP cache layers (not speculative tokens: simulate's --num-speculative-tokens; each: main row + full "
        "indexer)",
    )
    c.add_argument(
        "--kpool", default=str(LAYOUT_DEFAULTS["index_kpool"]), help="index_kpool: one indexer state per N tokens"
    )
    c.add_argument(
        "--page-size",
        help=f"tokens per page (default {CUDA_PAGE_SIZE} x kpool: the indexer's physical page is {CUDA_PAGE_SIZE})",
    )
    c.add_argument("--allow-non-cuda-page-size", action="store_true", help="permit page sizes CUDA kernels cannot read")
    add_gpu_arguments(p)
    r = p.add_argument_group("request and diagnostics")
    r.add_argument("--context", help="request length in tokens: pages, bytes, fit, concurrency")
    r.add_argument("--cached", help="prefix-cache hit of the request, tokens (needs --context)")
    r.add_argument("--explain-tokens", help="pool size (tokens) an engine logged: which knob explains the gap")
    t = p.add_argument_group("lower tiers")
    t.add_argument("--host-bytes", help="host memory per node for the KV host tier (e.g. 2TB, 500GB, 1.5TiB)")
    t.add_argument("--store-bytes", help="shared store size (e.g. 20TB)")
    h = p.add_argument_group("PD hand-off")
    h.add_argument(
        "--pd", action="store_true", help="bytes a prefill engine hands a decode engine, per cache, and seconds"
    )
    h.add_argument("--link-gbps", help="another link for the hand-off, Gb/s (besides IB 400G, NVLink, PCIe)")
    p.add_argument("--json", action="store_true", help="print every figure as JSON")
    return p


def build_plan(args: argparse.Namespace) -> Plan:
    spec = load_spec(args.model, args.config)
    patterns = indexer_patterns(args.indexer_patterns_file)
    if args.indexer_pattern:
        spec = apply_indexer_pattern(spec, args.indexer_pattern, patterns)
    if args.indexer_all_layers:
        spec = spec.with_all_indexers_full()
    kpool = parse_int("--kpool", args.kpool)
    page_size = parse_int("--page-size", args.page_size)
    layout = CacheLayout(
        spec,
        kv_dtype=args.kv_dtype,
        page_size=CUDA_PAGE_SIZE * kpool if page_size is None else page_size,
        index_kpool=kpool,
        mtp_layers=parse_int("--mtp-layers", args.mtp_layers, 0),
        allow_any_page_size=args.allow_non_cuda_page_size,
    )
    setting = gpu_setting(args)
    return plan(
        spec,
        layout,
        setting,
        available_bytes=available_bytes(args),
        context=parse_int("--context", args.context),
        cached=parse_int("--cached", args.cached, 0),
        explain=parse_int("--explain-tokens", args.explain_tokens),
        patterns=patterns,
        host_bytes=parse_bytes("--host-bytes", args.host_bytes, 0),
        store_bytes=parse_bytes("--store-bytes", args.store_bytes, 0),
    )


def build_pd(args: argparse.Namespace, result: Plan) -> PdPlan | None:
    if not args.pd:
        if args.link_gbps is not None:
            raise DsakvError("--link-gbps: needs --pd (it prices the PD hand-off)")
        return None
    gbps = parse_float("--link-gbps", args.link_gbps) if args.link_gbps is not None else None
    return pd_plan(result.layout, result.setting.gpu, link_gbps=gbps, context=parse_int("--context", args.context))


def run(args: argparse.Namespace) -> int:
    result = build_plan(args)
    pd = build_pd(args, result)
    if args.json:
        out = result.to_dict() | ({} if pd is None else {"pd": pd.to_dict()})
        print(dumps(out, indent=2))  # Plan.to_json's text, with no NaN or Infinity
        return 0
    console = Console(width=None if sys.stdout.isatty() else 160)
    render(result, console, CAPTION, pd)
    return 0
