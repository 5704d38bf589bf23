"""``dsakv demo``: a shared-prefix multi-turn chat through the engine on CPU, under memory pressure.

The workload and the two runs (a small pool that evicts and preempts, and an unpressured reference) are
``dsakv.workloads.chat``; this module parses the flags and renders the figures (a table, or ``--json``).
The exit status is 0 when every generated token and every finished request's cache read-back match.
``--kv-events-endpoint`` publishes the pressured engine's KV events in vLLM's wire format, ``--metrics-port``
serves its Prometheus metrics, and ``--linger`` keeps both up after the summary is printed. Flags
out of range (``_check_limits``: pools above 1 GiB of CPU memory, more threads than CPUs, prompts beyond
the tiny model's context) are one-line errors naming the limit, before torch is loaded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dsakv.cli.aliases import add_hidden_alias
from dsakv.cli.gpu_args import ascii_int, parse_bytes
from dsakv.cli.output import dumps
from dsakv.engine.config import POOL_KINDS
from dsakv.errors import INT64_MAX, DsakvError, short_repr
from dsakv.kvevents.endpoint import check_endpoint
from dsakv.planner.budget import RankCell
from dsakv.scheduler.policies import PREEMPTION_MODES
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from dsakv.store.config import parse_store_url

DEMO_POOL_BYTES = 2**30  # each of the demo's two pools lives in CPU memory (torch tensors): at most 1 GiB
MAX_CONVERSATIONS, MAX_TURNS, MAX_DCP = 1000, 100, 16
MAX_LINGER_S = 3600.0  # --linger: an hour at most  # the tiny model runs on the CPU: larger workloads take hours


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="shared-prefix multi-turn chat through the engine, under memory pressure")
    p.add_argument("--conversations", type=ascii_int, default=6)
    p.add_argument("--turns", type=ascii_int, default=2)
    p.add_argument("--system-tokens", type=ascii_int, default=80)
    p.add_argument("--max-new-tokens", type=ascii_int, default=8)
    p.add_argument("--pages", type=ascii_int, default=12, help="pages of the small pool (default 12)")
    p.add_argument("--page-size", type=ascii_int, default=16, help="tokens per page (64 on CUDA; any size on CPU)")
    p.add_argument("--preemption", choices=sorted(PREEMPTION_MODES), default="offload")
    p.add_argument("--new-token-ratio", type=float, default=0.0)
    p.add_argument("--pool-kind", choices=POOL_KINDS, default="slot")
    p.add_argument(
        "--dcp", type=ascii_int, default=1, help="DCP ranks of the small pool (emulated; pages of page-size x dcp)"
    )
    p.add_argument("--seed", type=ascii_int, default=0)
    p.add_argument("--threads", type=ascii_int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--checkpoint", help="a GLM-MoE-DSA / DeepSeek-V3.2 checkpoint folder (default: the tiny model)")
    p.add_argument("--exact", action="store_true", help="exact cache mode (fp32 main KV and indexer K)")
    p.add_argument(
        "--num-speculative-tokens",
        type=ascii_int,
        metavar="K",
        help="MTP speculative decoding: K speculative tokens a step (0: the MTP layer only)",
    )
    add_hidden_alias(p, "--mtp", "num_speculative_tokens", type=ascii_int)
    p.add_argument("--host-bytes", help="host tier below the small pool: bytes of both caches (e.g. 64MiB)")
    p.add_argument("--store", metavar="URL", help="shared page store below the small pool: redis://HOST:PORT/DB")
    d = p.add_argument_group("PD disaggregation (the pd extra)")
    d.add_argument(
        "--pd", action="store_true", help="prefill in this process, decode in another; hand-offs of both caches"
    )
    d.add_argument(
        "--pd-transport", choices=("mooncake", "store"), default="mooncake", help="Mooncake TE + ZMQ, or --store"
    )
    w = p.add_argument_group("KV events and metrics (the events / metrics extras)")
    w.add_argument(
        "--kv-events-endpoint", metavar="ENDPOINT", help="publish KV events in vLLM's format: bind a PUB socket here"
    )
    add_hidden_alias(w, "--kv-events", "kv_events_endpoint")
    w.add_argument("--kv-events-replay-endpoint", metavar="ENDPOINT", help="bind the replay (ROUTER) socket here")
    add_hidden_alias(w, "--kv-events-replay", "kv_events_replay_endpoint")
    w.add_argument(
        "--kv-events-topic",
        default="",
        help="topic frame of every KV-event message (default none; vLLM's example subscriber expects kv-events)",
    )
    w.add_argument("--metrics-port", type=ascii_int, help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics")
    w.add_argument(
        "--linger",
        type=float,
        default=0.0,
        help="seconds to stay up after the summary, serving metrics and replay (default 0)",
    )
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


def print_table(summary: dict, title: str = "dsakv demo: shared-prefix multi-turn chat (tiny DSA model, CPU)") -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key.replace("_", " "), format_value(key, value))
    Console().print(table)


def _check_limits(args) -> int:
    """One ``DsakvError`` line, naming the limit, for a flag out of range; returns the bytes of one pool page."""
    context = ModelSpec.preset("tiny").max_position_embeddings
    limits = {  # flag: (smallest, largest, why)
        "threads": (1, os.cpu_count() or 1, "the CPUs of this machine"),
        "conversations": (1, MAX_CONVERSATIONS, "a demo on the CPU"),
        "turns": (1, MAX_TURNS, "a demo on the CPU"),
        "system_tokens": (1, context, "the tiny model's context"),
        "max_new_tokens": (1, context, "the tiny model's context"),
        "page_size": (1, context, "the tiny model's context"),
        "pages": (1, INT64_MAX, ""),
        "dcp": (1, MAX_DCP, "ranks emulated in one process"),
        "seed": (0, INT64_MAX, ""),
    }
    for name, (low, high, why) in limits.items():
        value = getattr(args, name)
        if not low <= value <= high:
            raise DsakvError(
                f"--{name.replace('_', '-')} = {short_repr(value)}: must be an integer in {low}..{high:,}"
                + (f" ({why})" if why else "")
            )
    _check_wire_flags(args)
    page_bytes = CacheLayout(ModelSpec.preset("tiny"), page_size=args.page_size, allow_any_page_size=True).page_bytes
    group_page_bytes = (
        args.dcp
        * RankCell(  # every rank's share of one page id
            CacheLayout(ModelSpec.preset("tiny"), page_size=args.page_size, allow_any_page_size=True), args.dcp
        ).page_bytes
    )
    if args.pages * group_page_bytes > DEMO_POOL_BYTES:
        raise DsakvError(
            f"--pages = {args.pages:,}: {args.pages:,} pages of {group_page_bytes:,} B exceed the demo's "
            f"{DEMO_POOL_BYTES:,} B (1 GiB) of CPU memory per pool: at most {DEMO_POOL_BYTES // group_page_bytes:,} "
            f"pages at --page-size {args.page_size}" + (f" --dcp {args.dcp}" if args.dcp > 1 else "")
        )
    return page_bytes


def _check_wire_flags(args) -> None:
    if args.kv_events_endpoint is not None:
        check_endpoint("--kv-events-endpoint", args.kv_events_endpoint)
    if args.kv_events_replay_endpoint is not None:
        check_endpoint("--kv-events-replay-endpoint", args.kv_events_replay_endpoint)
        if args.kv_events_endpoint is None:
            raise DsakvError(
                "--kv-events-replay-endpoint: needs --kv-events-endpoint (replay serves what the PUB socket sent)"
            )
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise DsakvError(f"--metrics-port = {short_repr(args.metrics_port)}: must be an integer in 0..65535")
    if not 0.0 <= args.linger <= MAX_LINGER_S:
        raise DsakvError(f"--linger = {short_repr(args.linger)}: must be a number of seconds in 0..{MAX_LINGER_S:,}")


def _engine_options(args) -> dict:
    """The pressured engine's KV-event and metrics options from the flags."""
    return {
        "kv_events_endpoint": args.kv_events_endpoint,
        "kv_events_replay_endpoint": args.kv_events_replay_endpoint,
        "kv_events_topic": args.kv_events_topic,
        "metrics": args.metrics_port is not None,
        "dcp": args.dcp,
    } | _mtp_options(args, args.num_speculative_tokens)


def _mtp_options(args, k: int | None) -> dict:
    n = args.num_speculative_tokens
    if n is not None and n < 0:  # the upper bound is EngineConfig's (the step's token budget)
        raise DsakvError(f"--num-speculative-tokens = {n}: must be an integer >= 0 (speculative tokens a step)")
    return {} if n is None else {"speculative": "mtp", "num_speculative_tokens": k}


def run(args) -> int:
    page_bytes = _check_limits(args)
    if args.pd:
        return _run_pd(args)
    host_bytes = parse_bytes("--host-bytes", args.host_bytes)
    if host_bytes is not None and host_bytes < page_bytes:
        raise DsakvError(f"--host-bytes = {args.host_bytes}: below one page of both caches ({page_bytes:,} B)")
    if host_bytes is not None and host_bytes > DEMO_POOL_BYTES:
        raise DsakvError(
            f"--host-bytes = {args.host_bytes}: above the demo's {DEMO_POOL_BYTES:,} B (1 GiB) of CPU memory"
        )
    if args.store is not None:
        parse_store_url(args.store)
    import torch

    from dsakv.workloads.chat import chat_workload

    model = None
    if args.checkpoint:
        from dsakv.model.dsa_model import DsaModel

        model = DsaModel.from_checkpoint(args.checkpoint, mtp=args.num_speculative_tokens is not None)
    workload = chat_workload(
        vocab_size=model.cfg.vocab_size if model is not None else 512,
        conversations=args.conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    need = workload.pages_needed(args.page_size * args.dcp)  # a DCP group's page holds page_size x dcp tokens
    if args.pages < need:
        raise DsakvError(f"--pages = {args.pages}: the longest request of this workload needs {need} pages")
    reference = (
        workload.pages_needed(args.page_size) * workload.num_requests
    )  # the roomy pool of the reference run (pressure_summary)
    if reference * page_bytes > DEMO_POOL_BYTES:
        raise DsakvError(
            f"--conversations {args.conversations} x --turns {args.turns}: the reference run's pool of {reference:,} "
            f"pages of {page_bytes:,} B exceeds the demo's {DEMO_POOL_BYTES:,} B (1 GiB) of CPU memory per pool"
        )
    torch.set_num_threads(args.threads)
    engines = []  # the pressured engine: its metrics are served from the start, its sockets closed at the end

    def on_engine(engine) -> None:
        engines.append(engine)
        if args.metrics_port is not None:
            from dsakv.telemetry.prometheus import serve

            servers.append(serve(engine.metrics_registry, args.metrics_port))

    servers: list = []
    try:
        summary = _run_pressured(args, workload, model, host_bytes, on_engine)
    finally:
        if args.linger and engines:
            sys.stdout.flush()
            time.sleep(args.linger)
        for engine in engines:
            engine.close()
        for server in servers:
            server.shutdown()
    # An fp32 checkpoint model is not bit-invariant to chunk sizes, so its cache bytes may differ in the last
    # bit between the pressured and the reference run; its check is the generated tokens.
    return 0 if summary["outputs_match"] and (summary["caches_match"] or model is not None) else 1


def _run_pd(args) -> int:
    from dsakv.cli.demo_pd import run_pd

    summary = run_pd(args)
    if args.json:
        print(dumps(summary, indent=2))
    else:
        print_table(summary, "dsakv demo --pd: prefill here, decode in another process (tiny DSA model, CPU)")
    return 0 if summary["outputs_match"] and summary["caches_match"] and summary["integrity_ok"] else 1


def _mtp_figures(engine) -> dict:
    totals = engine.speculator.totals
    rate = totals.accepted_tokens / totals.draft_tokens if totals.draft_tokens else 0.0
    return {
        "mtp_steps": engine.config.num_speculative_tokens,
        "draft_tokens": totals.draft_tokens,
        "accepted_tokens": totals.accepted_tokens,
        "acceptance_rate": round(rate, 4),
    }


def _run_pressured(args, workload, model, host_bytes, on_engine) -> dict:
    """Run the demo and print its summary (before any linger, so a scraper or subscriber can read it)."""
    from dsakv.workloads.chat import pressure_summary

    seen = []  # the pressured engine, for its MTP figures

    def hook(engine) -> None:
        seen.append(engine)
        on_engine(engine)

    summary = pressure_summary(
        workload,
        pages=args.pages,
        page_size=args.page_size,
        pool_kind=args.pool_kind,
        preemption=args.preemption,
        new_token_ratio=args.new_token_ratio,
        model=model,
        exact=args.exact,
        host_bytes=host_bytes,
        store_url=args.store,
        engine_options=_engine_options(args),
        on_engine=hook,
        reference_options=_mtp_options(args, 0),  # the reference runs the MTP layer too, drafting nothing
    )
    if args.num_speculative_tokens is not None:
        summary |= _mtp_figures(seen[-1])
    summary["dcp"] = args.dcp  # the pressured run's DCP ranks; the reference is one rank
    if args.json:
        print(dumps(summary, indent=2))
    else:
        print_table(summary)
    return summary
