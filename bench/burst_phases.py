"""How a burst row's time splits between waiting, prefill and decode, and how many requests decode at once: replay
rows as ``bench/calibrate.py`` does and print, per row, dsakv's mean phases against what the published figures
imply, and the peak output throughput both ways (docs/steptime.md, "Burst rows: the phases"); then one summary line.

    python bench/burst_phases.py --anchors ../shared/data/calibration/anchors.csv [--only ID,ID]
        [--peaks bench/calibration/peaks.csv] [--detail N] [--set NAME=VALUE ...]

Phases per request (means): queued (arrival -> admitted), prefill (admitted -> first token), decode span (first
token -> last), as dsakv's records have them; published: TTFT and decode span = TPOT x (output - 1), the
benchmark's own TPOT (vLLM ``bench serve``: per request (latency - ttft) / (output_tokens - 1), then the mean).

Peak output throughput is ``vllm bench serve``'s "Peak output token throughput": every output token (the first
included) lands in the one-second bucket ``int(t - first send)``; the fullest bucket. The peaks file (beside the
anchors' published figures on the source page) gives it with the median ITL; their product is the published decode
batch at the peak (tokens of one step), against dsakv's largest step (tokens emitted in one step, every DP group).

``--detail N``: under each row, N requests spread over the run (admitted, first token, finished, in s) and the
requests running at N points of the run (the simulated DP group's). ``--set NAME=VALUE``: as ``bench/calibrate.py --set`` (a roofline
field or ``frontend_s`` at that value).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path

from dsakv.errors import DsakvError
from dsakv.sim import run
from dsakv.sim.cluster import AppliedSteps

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402

PEAKS = Path(__file__).resolve().parent / "calibration" / "peaks.csv"


class TokenClock:
    """A step observer of the replay (``dsakv.sim.run(..., observer=)``) recording each step's end and the output
    tokens it emitted, every DP group's (``emitted``). The replay steps one step at a time (no run advanced at
    once: ``analytic_decode=False``), so every step is a plan: the same records either way."""

    def __init__(self) -> None:
        self.emitted: list[tuple[float, int]] = []

    def __call__(self, steps: AppliedSteps) -> None:
        end, tokens = steps.ends[-1], sum(1 for item in steps.plan.items if item.sample)
        if self.emitted and self.emitted[-1][0] == end:  # another DP group of the same lockstep step
            tokens += self.emitted.pop()[1]
        self.emitted.append((end, tokens))

    def run(self, cfg, setup, requests, counters=None):
        return run(cfg, requests, setup=setup, counters=counters, analytic_decode=False, observer=self)


def peak_tokens_per_second(emitted: list[tuple[float, int]], start: float, scale: int = 1) -> int:
    """``vllm bench serve``'s peak output throughput: tokens x ``scale`` summed per bucket ``int(t - start)``, the
    fullest bucket (``scale``: DP groups the simulated one stands for)."""
    buckets: Counter[int] = Counter()
    for end, tokens in emitted:
        buckets[int(end - start)] += tokens * scale
    return max(buckets.values(), default=0)


def phases(anchor: dict, traces: Path, settings: dict[str, float] | None = None) -> dict:
    """One row's replay: dsakv's mean phases (s), duration, peak output tok/s and largest step (tokens); its
    finished records and timeline under ``records`` / ``timeline``. ``settings``: ``calibrate.settings_of``'s
    overrides (roofline fields, ``frontend_s``)."""
    cfg, setup, requests, counters = calibrate.replay_inputs(anchor, traces, settings)
    sim = TokenClock()
    result = sim.run(cfg, setup, requests, counters)
    done = [r for r in result.records if r.outcome == "finished"]
    start = min(r.arrival_s for r in done)
    return {
        "queued": statistics.fmean(r.admit_s - r.arrival_s for r in done),
        "prefill": statistics.fmean(r.first_token_s - r.admit_s for r in done),
        "ttft": statistics.fmean(r.ttft_s for r in done),
        "span": statistics.fmean(r.finish_s - r.first_token_s for r in done),
        "duration": max(r.finish_s for r in done) - start,
        "peak": peak_tokens_per_second(sim.emitted, start),
        "batch": max(tokens for _, tokens in sim.emitted),
        "outputs": statistics.fmean(r.output_tokens for r in done),
        "records": sorted(done, key=lambda r: r.id),
        "timeline": result.timeline,
    }


def detail(ours: dict, n: int) -> list[str]:
    """``n`` requests spread over the run (admitted / first token / finished) and the running count at ``n`` points."""
    records, timeline = ours["records"], ours["timeline"]
    step = max(1, len(records) // n)
    lines = [
        f"    request {r.id:5d}: admitted {r.admit_s:8.2f}  first token {r.first_token_s:8.2f}  finished {r.finish_s:8.2f}"
        for r in records[::step][:n]
    ]
    times, running = list(timeline.time_s), list(timeline.running)
    marks = [ours["duration"] * k / max(n - 1, 1) for k in range(n)]
    at = [running[min(bisect.bisect_left(times, t), len(running) - 1)] for t in marks]
    lines.append("    running at " + ", ".join(f"{t:.1f} s: {c}" for t, c in zip(marks, at)))
    return lines


def published_phases(anchor: dict, outputs: float, peak: dict | None) -> dict:
    """What the row's published figures imply for requests of ``outputs`` output tokens (the replay's mean): mean TTFT
    and decode span (s), duration; peak tok/s and the decode batch at the peak (peak x median ITL) from the peaks
    file, when it has the row."""
    pub = json.loads(anchor["published"])
    out = {"ttft": pub["ttft_ms"][0] / 1000, "span": pub["tpot_ms"][0] * (outputs - 1) / 1000}
    out["duration"] = pub.get("duration_s", math.nan)
    out["peak"] = float(peak["peak_out_tok_s"]) if peak else math.nan
    out["batch"] = out["peak"] * float(peak["median_itl_ms"]) / 1000 if peak else math.nan
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchors", required=True, help="anchors.csv (traces/<id>.jsonl beside it)")
    ap.add_argument("--only", help="comma-separated anchor ids (default: every row with a TPOT and a TTFT)")
    ap.add_argument("--peaks", default=str(PEAKS), help="published peak output tok/s and median ITL per id")
    ap.add_argument("--detail", type=int, default=0, help="per row, N requests' times and N running counts")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="as bench/calibrate.py --set")
    args = ap.parse_args(argv)
    try:
        settings = calibrate.settings_of(args.set)
    except DsakvError as exc:
        print(f"burst_phases: {exc}", file=sys.stderr)
        return 2
    path = Path(args.anchors)
    with path.open(newline="") as f:
        anchors = [a for a in csv.DictReader(f) if {"tpot_ms", "ttft_ms"} <= json.loads(a["published"]).keys()]
    if args.only:
        keep = set(args.only.split(","))
        anchors = [a for a in anchors if a["id"] in keep]
    with open(args.peaks, newline="") as f:
        peaks = {p["id"]: p for p in csv.DictReader(f)}
    head = "queued prefill   TTFT  span(pub)    duration(pub)     peak tok/s (pub)   batch (pub)"
    print(f"{'id':<22} {head}")
    ratios = []
    for anchor in anchors:
        ours = phases(anchor, path.parent / "traces", settings)
        pub = published_phases(anchor, ours["outputs"], peaks.get(anchor["id"]))
        print(
            f"{anchor['id']:<22} {ours['queued']:6.1f} {ours['prefill']:7.2f} {ours['ttft']:6.1f}"
            f" {ours['span']:5.1f} ({pub['span']:5.1f}) {ours['duration']:7.1f} ({pub['duration']:6.1f})"
            f" {ours['peak']:8,} ({pub['peak']:7,.0f}) {ours['batch']:6,} ({pub['batch']:5.0f})"
        )
        if args.detail > 0:
            print("\n".join(detail(ours, args.detail)))
        if not math.isnan(pub["peak"]):
            ratios.append(ours["peak"] / pub["peak"])
    if ratios:
        mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
        print(f"peak output tok/s dsakv / published: geometric mean {mean:.2f} over {len(ratios)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(calibrate.run_cli(main))
