"""``dsakv demo``: a shared-prefix multi-turn chat through the engine on CPU, under memory pressure.

The workload and the two runs (a small pool that evicts and preempts, and an unpressured reference) are
``dsakv.workloads.chat``; this module parses the flags and renders the figures (a table, or ``--json``).
The exit status is 0 when every generated token and every finished request's cache read-back match.
"""

from __future__ import annotations

import argparse
import json

from dsakv.engine.config import POOL_KINDS
from dsakv.errors import DsakvError
from dsakv.scheduler.policies import PREEMPTION_MODES


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="shared-prefix multi-turn chat through the engine, under memory pressure")
    p.add_argument("--conversations", type=int, default=6)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--system-tokens", type=int, default=80)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--pages", type=int, default=12, help="pages of the small pool (default 12)")
    p.add_argument("--page-size", type=int, default=16, help="tokens per page (64 on CUDA; any size on CPU)")
    p.add_argument("--preemption", choices=sorted(PREEMPTION_MODES), default="offload")
    p.add_argument("--new-token-ratio", type=float, default=0.0)
    p.add_argument("--pool-kind", choices=POOL_KINDS, default="slot")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--checkpoint", help="a GLM-MoE-DSA / DeepSeek-V3.2 checkpoint folder (default: the tiny model)")
    p.add_argument("--exact", action="store_true", help="exact cache mode (fp32 main KV and indexer K)")
    return p


def format_value(key: str, value: object) -> str:
    """How the table prints one figure: yes/NO for checks, thousands separators, ``B`` for byte counts."""
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if "bytes" in key:
        return f"{value:,} B"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_table(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="dsakv demo: shared-prefix multi-turn chat (tiny DSA model, CPU)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key.replace("_", " "), format_value(key, value))
    Console().print(table)


def run(args) -> int:
    if args.threads < 1:
        raise DsakvError(f"--threads = {args.threads}: must be >= 1")
    for name in ("conversations", "turns", "system_tokens", "max_new_tokens", "pages", "page_size"):
        if getattr(args, name) < 1:
            raise DsakvError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be >= 1")
    import torch

    from dsakv.workloads.chat import chat_workload, pressure_summary

    model = None
    if args.checkpoint:
        from dsakv.model.dsa_model import DsaModel

        model = DsaModel.from_checkpoint(args.checkpoint)
    workload = chat_workload(
        vocab_size=model.cfg.vocab_size if model is not None else 512,
        conversations=args.conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    need = workload.pages_needed(args.page_size)
    if args.pages < need:
        raise DsakvError(f"--pages = {args.pages}: the longest request of this workload needs {need} pages")
    torch.set_num_threads(args.threads)
    summary = pressure_summary(
        workload,
        pages=args.pages,
        page_size=args.page_size,
        pool_kind=args.pool_kind,
        preemption=args.preemption,
        new_token_ratio=args.new_token_ratio,
        model=model,
        exact=args.exact,
    )
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    # An fp32 checkpoint model is not bit-invariant to chunk sizes, so its cache bytes may differ in the last
    # bit between the pressured and the reference run; its check is the generated tokens.
    return 0 if summary["outputs_match"] and (summary["caches_match"] or model is not None) else 1
