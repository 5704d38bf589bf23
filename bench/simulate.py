"""Simulator speed and memory: the whole Mooncake conversation trace (or the embedded scenario when the
shared data is absent) at GLM-5.3 / 8 x H200 capacity, no plots. Prints one summary line with units.

    python bench/simulate.py [--trace PATH] [--time-scale X]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.source import Source, open_source

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", default=str(DEFAULT_TRACE) if DEFAULT_TRACE.is_file() else None)
    ap.add_argument("--time-scale", type=float, default=1.0)
    args = ap.parse_args()
    cfg = SimConfig(time_scale=args.time_scale)
    source = Source(trace=args.trace) if args.trace else Source()
    t0 = time.perf_counter()
    opened = open_source(source)
    result = simulate(cfg, opened.requests, setup=build_setup(cfg), counters=opened.counters)
    wall = time.perf_counter() - t0
    s = result.summary
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        f"simulate {source.name}: {s['requests']:,} requests, {s['input_tokens'] / 1e6:.1f} M input tokens, "
        f"{s['steps']:,} steps in {wall:.1f} s wall ({s['requests'] / wall:,.0f} requests/s, "
        f"{s['steps'] / wall:,.0f} steps/s), peak RSS {rss:,.0f} MiB; hit rate {s['hit_rate_tokens']:.1%} by tokens"
    )


if __name__ == "__main__":
    main()
