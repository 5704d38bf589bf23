"""``dsakv simulate``: replay a trace (or the embedded synthetic scenario) through the real scheduler,
allocator and radix tree at the planner's pool capacity; print the summary (``--json``: every figure).

``--out DIR`` writes ``config.json`` (resolved configuration), ``summary.json``, ``requests.jsonl`` (one
record per request in id order, appended as requests leave the run: ``dsakv.sim.rowstream``), ``metrics.csv`` (the metrics as time series, ``dsakv.sim.timeseries``) and the PNG
plots, all or nothing (``dsakv.cli.output.OutputDir``: checked before the run, renamed into place when
complete). ``--sweep`` runs several configurations in worker processes and
prints one comparison table; a sweep whose every point fails exits 1. Without a sweep, ``--workers W``
splits one cluster run's instances among W processes (``dsakv.sim.shards``: round-robin or affinity; the
same figures). Figures are defined in ``docs/metrics.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import fields
from functools import partial

from rich.console import Console

from dsakv.cache.eviction import POLICIES
from dsakv.cache.radix import INSERT_MODES, PAGE_KEYS
from dsakv.cache.tiers import WRITE_POLICIES
from dsakv.cli.aliases import add_hidden_alias
from dsakv.cli.emit_args import add_emit_arguments, check_emit_args, emit_run, step_settings
from dsakv.cli.gpu_args import (
    add_gpu_arguments,
    available_bytes,
    gpu_setting,
    parse_float,
    parse_fraction,
    parse_indexer,
    parse_int,
    parse_share,
    parse_tier_bytes,
)
from dsakv.cli.output import OutputDir, dumps
from dsakv.cli.simulate_render import render_summary, render_sweep
from dsakv.cli.sweep_args import SWEEP_KEYS, parse_sweep
from dsakv.errors import DsakvError, check_choice
from dsakv.kvevents.endpoint import check_instance_endpoints
from dsakv.scheduler.config import SCHEDULE_POLICIES
from dsakv.scheduler.policies import PREEMPTION_MODES, REQUEUE_POSITIONS, VICTIM_ORDERS
from dsakv.sim import run as sim_run
from dsakv.sim.config import STEP_MODELS, UNBOUNDED, SimConfig, build_setup
from dsakv.sim.group import arrival_seconds
from dsakv.sim.pd import check_pd_config, parse_pd, run_pd
from dsakv.sim.plots import PLOT_FILES
from dsakv.sim.report import RequestRecord
from dsakv.sim.routing import ROUTERS
from dsakv.sim.rowstream import RowStream
from dsakv.sim.source import OpenedSource, Source, check_rereadable, open_source, source_requests
from dsakv.sim.sweep import SweepRow, run_sweep
from dsakv.sim.timeseries import write_metrics_csv
from dsakv.spec.layout import KV_DTYPES
from dsakv.spec.model_spec import PRESETS
from dsakv.workloads.scenarios import DEFAULT_SCENARIO, SCENARIOS

DEFAULT, DEFAULT_SOURCE = SimConfig(), Source()  # the flags' defaults
OUT_FILES = ("config.json", "summary.json", "requests.jsonl", "metrics.csv", "sweep.json", *PLOT_FILES)  # --out


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("simulate", help="trace-driven simulation of the twin cache at GLM-5.3 scale")
    _workload_flags(p)
    _model_flags(p)
    add_gpu_arguments(p, batched_help="the scheduler's budget per step; sizes the top-k buffer")
    _cache_flags(p)
    _engine_flags(p)
    _tier_flags(p)
    _cluster_flags(p)
    _output_flags(p)
    return p


def _workload_flags(p: argparse.ArgumentParser) -> None:
    w = p.add_argument_group("workload")
    w.add_argument("--trace", help="Mooncake JSON-lines trace (timestamp ms, input_length, output_length, hash_ids)")
    w.add_argument(
        "--scenario", help=f"synthetic scenario: {', '.join(SCENARIOS)} (default: {DEFAULT_SCENARIO}, embedded)"
    )
    w.add_argument("--scale", default=f"{DEFAULT_SOURCE.scale:g}", help="scenario size multiplier (sessions)")
    w.add_argument("--seed", default=str(DEFAULT.seed), help="seed of the scenario and of MTP draft acceptance")
    w.add_argument("--skip-bad", action="store_true", help="skip malformed trace lines (counted in the summary)")
    w.add_argument(
        "--time-scale", default=f"{DEFAULT.time_scale:g}", help="multiply arrival times (2 = replay twice as slowly)"
    )


def _model_flags(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model and cache layout")
    m.add_argument("--model", help=f"preset: {', '.join(PRESETS)} (default glm-5.3)")
    m.add_argument("--config", help="path to a Hugging Face config.json")
    m.add_argument(
        "--indexer-pattern", help="indexer schedule: full-layer count, 'all', an F/S string or IndexCache name"
    )
    add_hidden_alias(m, "--indexer", "indexer_pattern")
    m.add_argument("--kv-dtype", default=DEFAULT.kv_dtype, help=f"main KV format: {', '.join(KV_DTYPES)}")
    m.add_argument(
        "--num-speculative-tokens",
        metavar="K",
        default=str(DEFAULT.num_speculative_tokens),
        help="speculative tokens: k MTP drafts proposed and verified per decode step (0 = off; on, one MTP cache "
        "layer)",
    )
    add_hidden_alias(m, "--mtp", "num_speculative_tokens")
    m.add_argument("--kpool", default="1", help="index_kpool: one indexer state per N tokens (page 64 x N)")
    m.add_argument("--page-size", help="tokens per page (default 64 x kpool: the indexer's physical page is 64)")
    m.add_argument(
        "--mtp-accept",
        default=str(DEFAULT.mtp_accept),
        help="acceptance probability of each draft token, or a comma list of one per draft position "
        "(position i accepted only if 1 .. i-1 were)",
    )
    m.add_argument(
        "--mtp-accept-shared",
        action="store_true",
        help="one acceptance draw per step for the whole batch, as SGLang's SGLANG_SIMULATE_ACC_LEN (default: each "
        "request draws its own)",
    )
    m.add_argument(
        "--mtp-index-share",
        action="store_true",
        help="index_share_for_mtp_iteration: the draft steps reuse the draft extend's top-k (no MTP-layer "
        "indexer scoring; step time)",
    )
    m.add_argument(
        "--no-spec-overlap",
        action="store_true",
        help="speculative steps without the overlap scheduler, as SGLang's EAGLE V1 (its default) runs them: each "
        "step with decodes pays the host time it exposes (step time, docs/steptime.md)",
    )
    m.add_argument(
        "--no-prefill-graph",
        action="store_true",
        help="eager prefill forwards, as SGLang runs a DSA model's: a step with prefill tokens takes at least the "
        "host's kernel launches (step time, docs/steptime.md)",
    )
    m.add_argument(
        "--no-dense-short-prefill",
        action="store_true",
        help="keep a prefill whose sequences hold at most top-k keys in the sparse kernels instead of dense MHA, as "
        "SGLang did for GLM-5 on Blackwell from 2026-02-10 to 2026-06-03 (step time, docs/steptime.md fact 24)",
    )
    m.add_argument(
        "--moe-deep-gemm",
        action="store_true",
        help="run vLLM's routed experts in DeepGEMM's grouped GEMMs at every step size, as vLLM on Hopper launched "
        "with VLLM_MOE_USE_DEEP_GEMM=1 does (by default its tensor-parallel fp8 experts stay in Triton's fused MoE; "
        "step time, docs/steptime.md fact 36)",
    )
    add_hidden_alias(m, "--no-moe-deep-gemm", "moe_deep_gemm", action="store_false")  # before fact 36's correction
    m.add_argument(
        "--no-moe-trtllm",
        action="store_true",
        help="keep the routed experts out of TensorRT-LLM's fused MoE, as SGLang with another --moe-runner-backend "
        "than flashinfer_trtllm does (by default SGLang on Blackwell runs fp8 experts in it when there is no "
        "all-to-all; step time, docs/steptime.md fact 37)",
    )
    m.add_argument(
        "--no-aiter",
        action="store_true",
        help="price SGLang on CDNA 4 without AITER's kernels, as SGLANG_USE_AITER=0 runs it (by default an fp8 "
        "checkpoint's experts run AITER's fused MoE and its linear layers AITER's fp8 GEMMs when there is no "
        "all-to-all; step time, docs/steptime.md facts 38-39)",
    )


def _cache_flags(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("cache and scheduler")
    s.add_argument(
        "--overlap-schedule",
        action="store_true",
        help="the scheduler plans each step while the one before it runs, as SGLang's overlap scheduler does: a "
        "request that reaches a busy engine joins the second step after, not the next (docs/steptime.md, closed-loop "
        "replay)",
    )
    s.add_argument(
        "--mixed-chunk",
        action="store_true",
        help="SGLang's --enable-mixed-chunk (with --schedule-policy prefill_first): a step with prefill work also "
        "carries every running decode, the prompt tokens cut by their count",
    )
    s.add_argument(
        "--scheduler-recv-interval",
        help="receive new requests as SGLang's --scheduler-recv-interval N does: after a prefill step the next loop "
        "turn receives, in a stretch of decode steps every N-th (default 1: every turn; dsakv.sim.cluster)",
    )
    s.add_argument("--pool-tokens", help="pool size in tokens (overrides the planner's capacity)")
    s.add_argument(
        "--eviction-policy", "--policy", default=DEFAULT.eviction_policy, help=f"eviction policy: {', '.join(POLICIES)}"
    )
    s.add_argument(
        "--insert-mode",
        "--mode",
        default=DEFAULT.insert_mode,
        choices=INSERT_MODES,
        help="insert into the prefix cache at finish or allocation",
    )
    s.add_argument("--no-prefix-cache", action="store_true", help="run without a prefix cache")
    s.add_argument(
        "--page-keys",
        default=DEFAULT.page_keys,
        choices=PAGE_KEYS,
        help="what the radix trees key a page on: a 16-byte digest of its tokens (less memory) or the exact "
        "token ids; the figures are the same",
    )
    s.add_argument("--preemption", default=DEFAULT.preemption, help=f"preemption mode: {', '.join(PREEMPTION_MODES)}")
    s.add_argument(
        "--victim-order",
        default=DEFAULT.victim_order,
        help=f"who is preempted first: {', '.join(VICTIM_ORDERS)} (vLLM: newest, SGLang: fewest_outputs)",
    )
    s.add_argument(
        "--requeue",
        default=DEFAULT.requeue,
        help=f"where a preempted request waits again: {', '.join(REQUEUE_POSITIONS)} (vLLM: front, SGLang: back)",
    )
    s.add_argument(
        "--chunk-tokens", default=str(DEFAULT.chunk_tokens), help="largest prefill chunk of one request per step"
    )
    s.add_argument("--max-running", default=str(DEFAULT.max_running), help="requests holding pages at once")
    s.add_argument(
        "--new-token-ratio",
        default=str(DEFAULT.new_token_ratio),
        help="share of a running request's remaining output the admission reserves (SGLang: 0.7, 0.21 with DP attention)",
    )
    s.add_argument(
        "--new-token-ratio-min",
        help="the floor the ratio decays to, one step each decode step, reset by a preemption or an idle "
        "step (SGLang's tracker: 0.14 x the ratio); default: a constant ratio",
    )
    s.add_argument(
        "--new-token-ratio-decay-steps",
        default=str(DEFAULT.new_token_ratio_decay_steps),
        help="decode steps over which the ratio decays to --new-token-ratio-min (SGLang: 600)",
    )
    s.add_argument(
        "--new-token-clip",
        help="most remaining output tokens a request's reserve counts before the ratio (SGLang: 4096); default: all",
    )
    s.add_argument(
        "--step-model", default=DEFAULT.step_model, choices=STEP_MODELS, help="step-time model (docs/steptime.md)"
    )


def _engine_flags(p: argparse.ArgumentParser) -> None:
    e = p.add_argument_group("engine (step time and scheduling policy, docs/steptime.md)")
    e.add_argument("--ep", default=str(DEFAULT.ep), help="expert-parallel ranks (divides the TP size; 1 = TP experts)")
    e.add_argument(
        "--schedule-policy",
        default=DEFAULT.schedule_policy,
        help=f"scheduling: {', '.join(SCHEDULE_POLICIES)} (mixed = vLLM-like, prefill_first = SGLang-like)",
    )
    e.add_argument(
        "--max-concurrency",
        help="closed loop: request k starts when request k - C finishes (one client of C requests in flight "
        "across every instance and DP group; a finish anywhere starts the next)",
    )
    e.add_argument(
        "--frontend-s", help="seconds from a client's send to the scheduler's queue (HTTP, tokenizer), in TTFT"
    )
    e.add_argument(
        "--frontend-request-s",
        help="service seconds per request of the one front-end process requests pass in send order (a queue)",
    )
    e.add_argument("--frontend-token-s", help="service seconds per prompt token of that front-end process")


def _tier_flags(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("lower tiers (host memory and a shared store, docs/tiers.md)")
    t.add_argument("--host-bytes", help="host memory per node for the KV host tier: 2TB, 500GB, 1.5TiB or unbounded")
    t.add_argument("--host-tokens", help="host tier size in tokens instead of bytes")
    t.add_argument("--store-bytes", help="shared store size: 20TB ... or unbounded")
    t.add_argument("--store-tokens", help="store size in tokens instead of bytes")
    t.add_argument(
        "--store",
        metavar="URL",
        help="redis://HOST:PORT/DB: check the store size against that server's maxmemory (its size when no "
        "--store-bytes / --store-tokens is given; no maxmemory: unbounded)",
    )
    t.add_argument(
        "--store-gbps",
        default=f"{DEFAULT.store_gbps:g}",
        help=f"host <-> store network, GB/s (default {DEFAULT.store_gbps:g}: one 100 Gb/s link)",
    )
    t.add_argument(
        "--write-policy", default=DEFAULT.write_policy, help=f"when pages go down a tier: {', '.join(WRITE_POLICIES)}"
    )
    t.add_argument(
        "--hit-threshold",
        default=str(DEFAULT.hit_threshold),
        help="write_through_selective: device hits before a page is written down",
    )
    add_hidden_alias(t, "--write-threshold", "hit_threshold")


def _cluster_flags(p: argparse.ArgumentParser) -> None:
    c = p.add_argument_group("cluster (docs/routing.md)")
    c.add_argument("--instances", default=str(DEFAULT.instances), help="engine instances, each of the GPU setting")
    c.add_argument(
        "--router",
        default=DEFAULT.router,
        help=f"which DP group of which instance a request goes to: {', '.join(ROUTERS)}; a comma list compares them",
    )
    c.add_argument(
        "--kv-events-endpoint",
        metavar="ENDPOINT",
        help="with --router kv-aware: the instances publish their KV events over ZMQ, in vLLM's wire format, from "
        "tcp://HOST:PORT (instance i at PORT + i) to the router's subscribers, instead of in process",
    )
    add_hidden_alias(c, "--kv-events", "kv_events_endpoint")
    c.add_argument(
        "--kv-events-replay-endpoint",
        metavar="ENDPOINT",
        help="the instances' replay sockets (instance i at PORT + i): the subscribers ask them for dropped batches",
    )
    add_hidden_alias(c, "--kv-events-replay", "kv_events_replay_endpoint")
    c.add_argument(
        "--pd",
        metavar="xPyD",
        help="prefill/decode disaggregation: x prefill and y decode instances, each of the GPU setting (docs/pd.md)",
    )
    c.add_argument("--link-gbps", help="with --pd: the hand-off's link, Gb/s per GPU (default 400 Gb/s InfiniBand NDR)")
    c.add_argument(
        "--no-analytic-decode",
        action="store_true",
        help="step every decode step one by one (same figures, slower; by default runs of plain decode steps are "
        "advanced at once)",
    )


def _output_flags(p: argparse.ArgumentParser) -> None:
    o = p.add_argument_group("output")
    o.add_argument(
        "--sweep", action="append", help=f"KEY=V1,V2 (repeat for a product) or 'what-if'; keys: {', '.join(SWEEP_KEYS)}"
    )
    o.add_argument(
        "--workers",
        help="worker processes: a sweep's points run on them (default: CPU count); one cluster run under the "
        "round-robin or affinity router splits its instances among them (default 1; the same figures; "
        "docs/routing.md, Workers)",
    )
    o.add_argument("--ray", action="store_true", help="run sweep points (or compared routers) on a local Ray")
    o.add_argument("--ray-address", help="run sweep points on the Ray cluster at this address (pip install dsakv[ray])")
    o.add_argument("--out", help="directory for config.json, summary.json, requests.jsonl and PNG plots")
    o.add_argument("--no-plots", action="store_true", help="with --out: skip the PNG plots")
    o.add_argument("--json", action="store_true", help="print every figure as JSON")
    add_emit_arguments(p)


def parse_routers(text: str) -> list[str]:
    """``--router a,b``: the routers to compare, each checked (one-line error naming the allowed ones)."""
    names = [name.strip() for name in text.split(",")]
    for name in names:
        check_choice("--router", name, ROUTERS)
    if len(set(names)) != len(names):
        raise DsakvError(f"--router {text!r}: names a router twice")
    return names


def _store_bytes(args: argparse.Namespace) -> int | str | None:
    """``--store-bytes``, checked against (or, when no size is given, read from) the ``--store`` server's
    ``maxmemory``: a simulated store larger than the real one would promise hits the server cannot keep."""
    size = parse_tier_bytes("--store-bytes", args.store_bytes)
    if getattr(args, "store", None) is None:
        return size
    from dsakv.store.config import StoreConfig
    from dsakv.store.redis_store import read_server_memory

    limit = read_server_memory(StoreConfig(args.store)).max_bytes  # 0: the server sets no limit
    if size is None and args.store_tokens is None:
        return limit if limit else UNBOUNDED
    if limit and (size == UNBOUNDED or (isinstance(size, int) and size > limit)):
        raise DsakvError(
            f"--store-bytes = {args.store_bytes}: the server at {args.store} holds at most {limit:,} B (maxmemory)"
        )
    return size


def _kv_events(args: argparse.Namespace, routers: list[str]) -> None:
    """``--kv-events-endpoint`` / ``--kv-events-replay-endpoint`` checked under their flag names: one kv-aware run
    publishes there."""
    pub, replay = "--kv-events-endpoint", "--kv-events-replay-endpoint"
    if args.kv_events_replay_endpoint is not None and args.kv_events_endpoint is None:
        raise DsakvError(f"{replay}: needs {pub} (replay serves what PUB sent)")
    if args.kv_events_endpoint is None:
        return
    if args.sweep or len(routers) > 1:
        raise DsakvError(f"{pub}: one run publishes there; a sweep or router comparison runs several at once")
    if routers != ["kv-aware"]:
        raise DsakvError(f"{pub}: feeds the kv-aware router's index; --router {routers[0]} reads no events")
    instances = parse_int("--instances", args.instances)
    check_instance_endpoints(pub, args.kv_events_endpoint, replay, args.kv_events_replay_endpoint, instances)


def parse_accept(flag: str, text: str) -> float | tuple[float, ...]:
    """``--mtp-accept``: one acceptance probability in (0, 1] for every draft position, or a comma list of one per
    position (position i accepted only if 1 .. i-1 were; SimConfig checks the count against
    ``--num-speculative-tokens``)."""
    parts = text.split(",")
    if len(parts) == 1:
        return parse_fraction(flag, text)
    return tuple(parse_fraction(f"{flag} position {i}", part.strip()) for i, part in enumerate(parts, 1))


# How a flag becomes its SimConfig field: by the field's type (``--chunk-tokens`` -> ``chunk_tokens: int``), except
# these parsers, the integers that may be 0, and the fields ``build_config`` derives from several flags.
_PARSERS = {
    "mtp_accept": parse_accept,
    "new_token_ratio": parse_share,
    "new_token_ratio_min": parse_share,
    "host_bytes": parse_tier_bytes,
    "indexer_pattern": parse_indexer,  # a full-layer count in ASCII digits only
}
_FROM_ZERO = frozenset({"num_speculative_tokens", "pool_tokens", "seed", "host_tokens", "store_tokens"})
_DERIVED = frozenset(
    {
        "gpu",
        "available_bytes",
        "prefix_cache",
        "store_bytes",
        "router",
        "workers",
        "step_settings",
        "spec_overlap",
        "prefill_graph",
        "dense_short_prefill",
    }
)


def flag_fields(args: argparse.Namespace) -> dict:
    """Every ``SimConfig`` field a flag of the same name sets (``--kv-dtype`` -> ``kv_dtype``), parsed by the
    field's type under the flag's name; a flag not given leaves its field's default."""
    out = {}
    for f in fields(SimConfig):
        if f.name in _DERIVED or not hasattr(args, f.name):
            continue
        text, flag = getattr(args, f.name), "--" + f.name.replace("_", "-")
        if text is None:
            continue
        if f.name in _PARSERS:
            out[f.name] = _PARSERS[f.name](flag, text)
        elif f.type.startswith("int"):
            out[f.name] = parse_int(flag, text, 0 if f.name in _FROM_ZERO else 1)
        elif f.type.startswith("float"):
            out[f.name] = parse_float(flag, text)
        else:
            out[f.name] = text
    return out


def build_config(args: argparse.Namespace) -> tuple[SimConfig, Source]:
    routers = parse_routers(args.router)
    _kv_events(args, routers)
    cfg = SimConfig(
        **flag_fields(args),
        gpu=gpu_setting(args),  # the same flags and checks as dsakv plan
        available_bytes=available_bytes(args),
        prefix_cache=not args.no_prefix_cache,
        spec_overlap=not args.no_spec_overlap,
        prefill_graph=not args.no_prefill_graph,
        dense_short_prefill=not args.no_dense_short_prefill,
        moe_trtllm=not args.no_moe_trtllm,
        aiter=not args.no_aiter,
        store_bytes=_store_bytes(args),
        router=routers[0],
        # one run's processes; a sweep's (or a router comparison's) --workers are its points' (run_sweep)
        step_settings=step_settings(args),
        workers=1 if args.sweep or len(routers) > 1 or args.workers is None else parse_int("--workers", args.workers),
    )
    source = Source(
        trace=args.trace,
        scenario=args.scenario,
        scale=parse_float("--scale", args.scale),
        seed=cfg.seed,
        skip_bad=args.skip_bad,
    )
    return cfg, source


def _progress(enabled: bool, total: int, what: str):
    """A rich progress bar on stderr (only on a TTY and without --json); returns (bar or None, callback)."""
    if not enabled:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(what, total=total)
    return bar, lambda done: bar.update(task, completed=done)


def run(args: argparse.Namespace) -> int:
    cfg, source = build_config(args)
    setup = build_setup(cfg)  # impossible settings are reported here, before any trace is read
    show_bar = sys.stderr.isatty() and not args.json
    routers = parse_routers(args.router)
    check_emit_args(args, len(routers))
    if (args.ray or args.ray_address) and not (args.sweep or len(routers) > 1):
        raise DsakvError("--ray / --ray-address: run sweep points; give --sweep or a comma list of --router")
    if args.ray and args.ray_address:
        raise DsakvError("give either --ray (a local Ray) or --ray-address ADDR (a running cluster), not both")
    if args.no_analytic_decode and (args.sweep or len(routers) > 1):
        raise DsakvError("--no-analytic-decode applies to one run: give it without --sweep or a comma list of --router")
    if len(routers) > 1:
        if args.sweep:
            raise DsakvError("--router with a comma list compares routers: give it without --sweep")
        return _run_sweep(args, cfg, source, show_bar, [{"router": name} for name in routers])
    if args.sweep:
        return _run_sweep(args, cfg, source, show_bar)
    if args.pd is not None or args.link_gbps is not None:
        return run_pd_cli(args, cfg, setup, source)
    # a bad --out is reported here, before the run; its requests.jsonl is written as requests leave
    if cfg.workers > 1:
        check_rereadable(source)  # every worker reads the source again: a pipe could be read only once
    with _output_dir(args.out) as out, contextlib.ExitStack() as files:
        opened = _open(source, cfg.time_scale)
        rows = None if out is None else _row_stream(out, files)
        total = opened.num_requests
        bar, tick = _progress(show_bar and total >= 200, total, "requests")
        if bar:
            bar.start()
        run = dict(
            setup=setup,
            counters=opened.counters,
            progress=tick,
            analytic_decode=not args.no_analytic_decode,
            record_sink=None if rows is None else rows.add,
        )
        try:
            if args.emit_log:  # one group, step by step, its log written as it runs (cli/emit_args.py)
                result = emit_run(args, cfg, opened.requests, run)
            else:  # with workers, each reads the source again
                requests = partial(source_requests, source) if cfg.workers > 1 else opened.requests
                result = sim_run(cfg, requests, **run)
        finally:
            if bar:
                bar.stop()
        resolved = {"source": source.to_dict(), "config": cfg.to_dict(), "setup": setup.to_dict()}
        if out is not None:
            rows.close()
            files.close()
            _write_out(out, result, resolved, plots=not args.no_plots)
            out.commit()
    if args.json:
        print(dumps({**result.summary, "config": resolved, "notes": list(opened.warnings)}))
    else:
        render_summary(result, setup, source, Console(width=None if sys.stdout.isatty() else 160))
    return 0


def run_pd_cli(args: argparse.Namespace, cfg: SimConfig, setup, source: Source) -> int:
    """``--pd xPyD``: one PD run (``dsakv.sim.pd``), its summary with the hand-off's ``pd_*`` figures."""
    if args.pd is None:
        raise DsakvError("--link-gbps: needs --pd (it prices the PD hand-off)")
    for flag, given in (("--out", args.out), ("--emit-log", args.emit_log), ("--sweep", args.sweep)):
        if given:
            raise DsakvError(f"{flag} with --pd: not supported in a PD run; give --json for its figures")
    gbps = parse_float("--link-gbps", args.link_gbps) if args.link_gbps is not None else None
    pd = parse_pd(args.pd, cfg.gpu.gpu, gbps)
    check_pd_config(cfg, setup)
    opened = _open(source, cfg.time_scale)
    result = run_pd(cfg, pd, opened.requests, setup=setup, counters=opened.counters,
                    analytic_decode=not args.no_analytic_decode)  # fmt: skip
    resolved = {"source": source.to_dict(), "config": result.config, "setup": setup.to_dict()}
    if args.json:
        print(dumps({**result.summary, "config": resolved, "notes": list(opened.warnings)}))
    else:
        console = Console(width=None if sys.stdout.isatty() else 160)
        render_summary(result, setup, source, console)
        figures = result.pd.to_dict().items()
        console.print(
            "hand-off: " + ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures)
        )
    return 0


def _output_dir(out: str | None) -> OutputDir | contextlib.nullcontext:
    return contextlib.nullcontext() if out is None else OutputDir(out, OUT_FILES)


def _open(source: Source, time_scale: float | None) -> OpenedSource:
    """Open (and validate) the source, print its notes, and check that its last arrival fits the clock at
    ``time_scale`` (None: each sweep point checks its own)."""
    opened = open_source(source)
    for note in opened.warnings:
        print(f"dsakv: warning: {note}", file=sys.stderr)
    if time_scale is not None:
        arrival_seconds(opened.last_timestamp_ms, time_scale, opened.last_line)
    return opened


def _run_sweep(
    args: argparse.Namespace, cfg: SimConfig, source: Source, show_bar: bool, points: list[dict] | None = None
) -> int:
    """Sweep points (or one cluster run per compared router): a table, ``--json`` rows (for routers: one
    object per router with the comparison figures first)."""
    compare = points is not None
    points = points if compare else parse_sweep(args.sweep, cfg)
    ray_address = "local" if args.ray else args.ray_address
    workers = parse_int("--workers", args.workers)
    with _output_dir(args.out) as out:
        check_rereadable(source)  # every worker reads the source again: a pipe could be read only once
        _open(source, None)  # a bad trace is one error here, not the same error in every row
        bar, tick = _progress(show_bar, len(points), "sweep points")
        done = []
        if bar:
            bar.start()
        try:
            rows = run_sweep(
                cfg, points, source, workers, lambda r: (done.append(r), tick and tick(len(done))), ray_address
            )
        finally:
            if bar:
                bar.stop()
        failed = [r for r in rows if r.summary is None]
        if out is not None and len(failed) < len(rows):
            out.write_text("sweep.json", dumps([r.to_dict() for r in rows], indent=1))
            out.commit()
    if args.json and compare:
        print(dumps([router_row(r) for r in rows]))
    elif args.json:
        print(dumps({"source": source.to_dict(), "base": cfg.to_dict(), "rows": [r.to_dict() for r in rows]}))
    else:
        render_sweep(rows, source, Console(width=None if sys.stdout.isatty() else 200))
    if rows and len(failed) == len(rows):
        raise DsakvError(f"every sweep point failed (the first: {failed[0].label}: {failed[0].error})")
    return 0


def router_row(row: SweepRow) -> dict:
    """One compared router: ``router``, ``hit_tokens``, ``ttft_p50_s``, ``ttft_p99_s``, ``load_imbalance`` (the
    interface scripts rely on), then ``hit_rate_tokens``, ``instances`` and the whole summary (or ``error``)."""
    s = row.summary
    if s is None:
        return {"router": row.config.router, "error": row.error}
    return {
        "router": s["router"],
        "hit_tokens": s["hit_tokens"],
        "ttft_p50_s": s["ttft_s"]["p50"],
        "ttft_p99_s": s["ttft_s"]["p99"],
        "load_imbalance": s["load_imbalance"],
        "hit_rate_tokens": s["hit_rate_tokens"],
        "instances": s["instances"],
        "summary": s,
    }


def _row_stream(out: OutputDir, files: contextlib.ExitStack) -> RowStream:
    """``requests.jsonl`` in the partial ``--out`` folder, fed one JSON line per request as it leaves the run
    (``dsakv.sim.rowstream``: in request-id order, the same bytes as writing the sorted records at the end)."""
    name = "requests.jsonl"
    try:
        file = files.enter_context((out.path / name).open("w"))
    except OSError as exc:
        raise DsakvError(f"{out.flag}: cannot write {name} ({exc.strerror or exc})") from None
    return RowStream(file, _jsonl_row, f"{out.flag}: {name}")


def _jsonl_row(record: RequestRecord) -> str:
    return dumps(record.to_dict()) + "\n"


def _write_out(out: OutputDir, result, resolved: dict, plots: bool) -> None:
    """The files of ``--out`` besides ``requests.jsonl`` (written during the run: ``_row_stream``)."""
    out.write_text("config.json", dumps(resolved, indent=1))
    out.write_text("summary.json", dumps(result.summary, indent=1))
    try:
        write_metrics_csv(out.path / "metrics.csv", result)
        if plots:
            from dsakv.sim.plots import write_plots

            write_plots(out.path, result)
    except OSError as exc:
        raise DsakvError(f"{out.flag}: cannot write ({exc.strerror or exc})") from None


__all__ = ["add_parser", "build_config", "run"]
