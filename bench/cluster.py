"""Cluster simulation at scale: the Mooncake conversation trace copied K times (copy c's hash ids offset by
c x (largest id + 1), so the copies are distinct users sharing nothing), over the same time span (the copies
of a request arrive together), served by N instances (default 16 x K: the load per instance stays that of
the x1 trace on 16 instances). Without the shared data, the embedded ``chat`` scenario stands in for the trace.

``--workers W`` splits the instances among W worker processes (``dsakv.sim.shards``; round-robin or affinity;
the same figures): each worker reads the trace and makes the copies itself (``ScaledTrace``, a picklable
request factory) and keeps its instances' requests.

Prints one summary line with units (``--json``: ``requests``, ``wall_s``, ``cpu_s``, ``requests_per_s``,
``peak_rss_bytes``, ``hit_tokens`` and the run's other figures). ``wall_s`` covers reading the trace, the
simulation and the summary (with workers: their start, and the merge); ``cpu_s`` is the CPU time of this
process and its workers (user + system), ``worker_cpu_s`` each worker's, and ``critical_path_s`` this
process's CPU plus the slowest worker's: the run's wall time on W free cores (the 2 shared cores of a
loaded machine stretch ``wall_s``). ``peak_rss_bytes`` is this process's peak resident set (``getrusage``)
plus, with workers, the sum of each worker's own peak (each measures itself: spawned workers share no page
with this process, so the sum counts no page twice; an upper bound of the run's peak, as the workers'
peaks need not coincide).

    python bench/cluster.py --scale K [--instances N] [--router R] [--workers W] [--trace PATH] [--no-analytic]
        [--page-keys {digest,tokens}] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dsakv.cache.radix import PAGE_KEYS
from dsakv.errors import DsakvError
from dsakv.sim import run
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


@dataclass(frozen=True)
class ScaledTrace:
    """The request factory of a run (picklable: each worker calls it): the trace at ``path`` (None: the
    generated chat scenario) copied ``copies`` times, read when called."""

    path: str | None
    copies: int

    @property
    def what(self) -> str:
        return f"trace {Path(self.path).name}" if self.path else "generated chat scenario (shared trace absent)"

    def __call__(self) -> Iterator[TraceRequest]:
        base = list(MooncakeTrace(self.path, hold=True)) if self.path else generate_scenario("chat", seed=0)
        return scaled(base, self.copies)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=1, help="copies K of the trace (distinct users)")
    ap.add_argument("--instances", type=int, help=f"instances N (default {INSTANCES_PER_COPY} x K)")
    ap.add_argument("--router", default="round-robin", choices=ROUTERS)
    ap.add_argument("--workers", type=int, default=1, help="processes the instances are split among (default 1)")
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
    try:
        cfg = SimConfig(instances=instances, router=args.router, page_keys=args.page_keys, workers=args.workers)
    except DsakvError as exc:
        ap.error(str(exc))
    requests = ScaledTrace(args.trace, args.scale)
    t0, cpu0 = time.perf_counter(), _cpu_s()
    analytic = not args.no_analytic
    result = run(cfg, requests, setup=build_setup(cfg), analytic_decode=analytic)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    s = result.summary
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 + sum(result.worker_peak_rss_bytes)  # KiB
    what = requests.what
    workers_cpu = result.worker_cpu_s
    critical = cpu - sum(workers_cpu) + max(workers_cpu, default=0.0)  # this process's CPU + the slowest worker's
    figures = {
        "requests": s["requests"],
        "wall_s": wall,
        "cpu_s": cpu,
        "worker_cpu_s": list(result.worker_cpu_s),
        "critical_path_s": critical,
        "requests_per_s": s["requests"] / wall,
        "peak_rss_bytes": peak_rss,
        "workers": args.workers,
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
        f"{wall:.1f} s wall, {cpu:.1f} s CPU"
        + (f" on {args.workers} workers (critical path {critical:.1f} s)" if args.workers > 1 else "")
        + f" ({s['requests'] / wall:,.0f} simulated requests/s), peak RSS {peak_rss / 2**20:,.0f} MiB; "
        + f"hit rate {s['hit_rate_tokens']:.1%} by tokens ({s['hit_tokens']:,} hit tokens)"
    )


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended (the workers)."""
    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    main()
