"""Where a closed-loop replay's TTFT goes: the first wave (the requests the client sends at its start, all at once)
against the rest, and what a published mean TTFT then asks of each (docs/steptime-log.md, 2026-12-07, eleventh
sitting).

    python bench/ttft_waves.py --anchors ../shared/data/calibration/anchors.csv [--only ID,ID]
        [--set frontend_s=0] [--p99 ID=MS ...]

Rows replay as ``bench/calibrate.py`` replays them (``--set`` as there). Per row: the replay's mean TTFT, split
into the first wave's mean and the rest's, and its P99 (linear interpolation, as the benchmark clients' NumPy
percentile). Where the row publishes a mean TTFT: the mean the first wave alone would need for the published mean
(the rest as replayed), and, for a row given its published P99 (``--p99``), the mean the rest would need were the
first wave to average that P99. Then one summary line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from dsakv.errors import DsakvError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402


def waves(records) -> tuple[list[float], list[float]]:
    """The finished requests' TTFTs in ms: (the first wave's: sent at the earliest send time, the rest's)."""
    done = [r for r in records if r.outcome == "finished"]
    if not done:
        raise DsakvError("no request finished in the replay")
    start = min(r.arrival_s for r in done)
    first = [1000 * r.ttft_s for r in done if r.arrival_s == start]
    rest = [1000 * r.ttft_s for r in done if r.arrival_s != start]
    return first, rest


def first_wave_needed(published_mean: float, share: float, rest_mean: float) -> float:
    """The first wave's mean TTFT that makes the whole mean ``published_mean`` when it holds ``share`` of the
    requests and the rest average ``rest_mean``."""
    return (published_mean - (1 - share) * rest_mean) / share


def rest_needed(published_mean: float, share: float, first_mean: float) -> float:
    """The rest's mean TTFT that makes the whole mean ``published_mean`` when the first wave (``share`` of the
    requests) averages ``first_mean``."""
    return (published_mean - share * first_mean) / (1 - share)


def published_mean_ttft(anchor: dict) -> float | None:
    """The row's published mean TTFT in ms, if it publishes one."""
    for metric, value, how in calibrate.published_of(anchor):
        if metric == "ttft_ms" and how == "mean":
            return value
    return None


def ttft_waves(anchor: dict, traces: Path, step_params: dict, p99: float | None) -> str:
    """One row's line: its replayed TTFT split by wave, and what its published mean (and ``p99``) ask of each."""
    _, result = calibrate.run_replay(anchor, traces, step_params)
    first, rest = waves(result.records)
    every = first + rest
    mean_all, p99_all = statistics.fmean(every), np.percentile(every, 99)
    line = f"{anchor['id']}: {len(every)} requests, first wave {len(first)}; replay TTFT mean {mean_all:,.1f} ms"
    line += f", P99 {p99_all:,.1f} ms"
    if not rest:
        return line + " (one wave: no rest to set against it)"
    share = len(first) / len(every)
    first_mean, rest_mean = statistics.fmean(first), statistics.fmean(rest)
    line += f"; first wave {first_mean:,.1f} ms, the rest {rest_mean:,.1f} ms"
    mean = published_mean_ttft(anchor)
    if mean is not None:
        alone = first_wave_needed(mean, share, rest_mean)
        line += f"; published mean {mean:,.1f} ms: the first wave alone would average {alone:,.0f} ms"
        if p99 is not None:
            needed = rest_needed(mean, share, p99)
            line += f"; with it at the published P99 {p99:,.1f} ms the rest would average {needed:,.1f} ms"
    return line


def p99_of(items: list[str]) -> dict[str, float]:
    """``--p99 ID=MS`` items as {id: ms}; a malformed one raises ``DsakvError``."""
    out = {}
    for item in items:
        anchor_id, sep, text = item.partition("=")
        try:
            if not sep or not anchor_id:
                raise ValueError
            out[anchor_id] = float(text)
        except ValueError:
            raise DsakvError(f"--p99 {item!r}: ID=MS with MS a number of milliseconds") from None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchors", required=True, help="anchors.csv (traces/<id>.jsonl beside it)")
    ap.add_argument("--only", help="comma-separated anchor ids")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="as bench/calibrate.py's")
    ap.add_argument("--p99", action="append", default=[], metavar="ID=MS", help="a row's published P99 TTFT")
    args = ap.parse_args(argv)
    try:
        step_params = calibrate.settings_of(args.set)
        p99 = p99_of(args.p99)
        anchors = calibrate.read_anchors(Path(args.anchors), args.only)
    except DsakvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    traces = Path(args.anchors).parent / "traces"
    loops = [a for a in anchors if calibrate._int(a.get("conc"))]
    for anchor in loops:
        print(ttft_waves(anchor, traces, step_params, p99.get(anchor["id"])))
    print(f"ttft waves: {len(loops)} closed-loop rows replayed, {len(anchors) - len(loops)} other rows left out")
    return 0


if __name__ == "__main__":
    sys.exit(calibrate.run_cli(main))
