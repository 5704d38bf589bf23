"""Cluster simulation at scale: the Mooncake conversation trace copied K times (copy c's hash ids offset by
c x (largest id + 1), so the copies are distinct users sharing nothing), over the same time span (the copies
of a request arrive together), served by N instances (default 16 x K: the load per instance stays that of
the x1 trace on 16 instances). Without the shared data, the embedded ``chat`` scenario stands in for the trace.

Prints one summary line with units (``--json``: ``requests``, ``wall_s``, ``requests_per_s``,
``peak_rss_bytes``, ``hit_tokens`` and the run's other figures). ``wall_s`` covers reading the trace, the
simulation and the summary; ``peak_rss_bytes`` is the process's peak resident set (``getrusage``).

    python bench/cluster.py --scale K [--instances N] [--router R] [--trace PATH] [--no-analytic]
        [--page-keys {digest,tokens}] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from dsakv.cache.radix import PAGE_KEYS
from dsakv.sim.cluster import run_simulation
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.routing import ROUTERS
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import MooncakeTrace, TraceRequest

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"
INSTANCES_PER_COPY = 16  # the x1 trace's cluster: 16 instances (docs/routing.md's router table)


def scaled(requests: list[TraceRequest], copies: int) -> Iterator[TraceRequest]:
    """``copies`` copies of each request, in arrival order, copy c with hash ids shifted by c x (top id + 1).
    (A copy is made directly, its ids by one ``map``: inside ``wall_s``, ≈ 3 µs a copy instead of ≈ 4.)"""
    top = max((max(r.hash_ids) for r in requests if r.hash_ids), default=-1) + 1
    offsets = [c * top for c in range(1, copies)]
    for r in requests:
        yield r
        ts, n_in, n_out, ids, line, tenant, salt = (
            r.timestamp_ms, r.input_length, r.output_length, r.hash_ids, r.line, r.tenant, r.cache_salt
        )  # fmt: skip
        for offset in offsets:
            yield TraceRequest(ts, n_in, n_out, tuple(map(offset.__add__, ids)), line, tenant, salt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=1, help="copies K of the trace (distinct users)")
    ap.add_argument("--instances", type=int, help=f"instances N (default {INSTANCES_PER_COPY} x K)")
    ap.add_argument("--router", default="round-robin", choices=ROUTERS)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE) if DEFAULT_TRACE.is_file() else None)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ap.add_argument(
        "--no-analytic",
        action="store_true",
        help="step every decode step one by one (the baseline; the default advances runs of them at once)",
    )
    ap.add_argument(
        "--page-keys",
        default=SimConfig.page_keys,
        choices=PAGE_KEYS,
        help="what the radix trees key a page on (SimConfig.page_keys; default: digests)",
    )
    args = ap.parse_args()
    if args.scale < 1 or (args.instances is not None and args.instances < 1):
        ap.error("--scale and --instances must be positive integers")
    instances = args.instances or INSTANCES_PER_COPY * args.scale
    cfg = SimConfig(instances=instances, router=args.router, page_keys=args.page_keys)
    t0 = time.perf_counter()
    if args.trace:
        base, what = list(MooncakeTrace(args.trace, hold=True)), f"trace {Path(args.trace).name}"
    else:
        base, what = generate_scenario("chat", seed=0), "generated chat scenario (shared trace absent)"
    analytic = not args.no_analytic
    result = run_simulation(cfg, scaled(base, args.scale), setup=build_setup(cfg), analytic_decode=analytic)
    wall = time.perf_counter() - t0
    s = result.summary
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    figures = {
        "requests": s["requests"],
        "wall_s": wall,
        "requests_per_s": s["requests"] / wall,
        "peak_rss_bytes": peak_rss,
        "hit_tokens": s["hit_tokens"],
        "scale": args.scale,
        "instances": instances,
        "router": args.router,
        "analytic_decode": analytic,
        "page_keys": args.page_keys,
        "source": what,
        "hit_rate_tokens": s["hit_rate_tokens"],
        "finished": s["finished"],
        "steps": s["steps"],
        "ttft_p50_s": s["ttft_s"]["p50"],
        "ttft_p99_s": s["ttft_s"]["p99"],
        "load_imbalance": s["load_imbalance"],
    }
    if args.json:
        json.dump(figures, sys.stdout)
        print()
        return
    print(
        f"cluster x{args.scale} of {what}, {instances} instances ({args.router}): {s['requests']:,} requests in "
        f"{wall:.1f} s wall ({s['requests'] / wall:,.0f} simulated requests/s), peak RSS {peak_rss / 2**20:,.0f} MiB; "
        f"hit rate {s['hit_rate_tokens']:.1%} by tokens ({s['hit_tokens']:,} hit tokens)"
    )


if __name__ == "__main__":
    main()
