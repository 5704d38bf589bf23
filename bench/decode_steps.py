"""Where an anchor's decode time goes: replay rows as ``bench/calibrate.py`` does and print, per row, the step mix,
the per-component seconds of its typical decode step (the median batch among decode-only steps; mixed steps if it
has none) and the token-weighted median inter-token latency (docs/steptime.md, "Decode steps against the published
ITL"); then one summary line.

    python bench/decode_steps.py --anchors ../shared/data/calibration/anchors.csv [--only ID,ID]

The median ITL is taken over the emitted tokens: a token from a step with decodes waited since the previous step
with decodes (prefill-only steps in between included), as a benchmark client's inter-token latency does.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
from pathlib import Path

from dsakv.sim import run as simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402


class RecordingStepTime:
    """The replay's step-time model, recording every step's shape and seconds (``steps``)."""

    def __init__(self, model) -> None:
        self.model = model
        self.steps: list[tuple[tuple, tuple, float]] = []

    def step_seconds(self, prefill, decode, dp_tokens=None, dp_decodes=None) -> float:
        seconds = self.model.step_seconds(prefill, decode, dp_tokens, dp_decodes)
        self.steps.append((tuple(prefill), tuple(decode), seconds))
        return seconds

    def __getattr__(self, name):
        return getattr(self.model, name)


def weighted_median(pairs: list[tuple[float, int]]) -> float:
    """Median of values repeated by their weights."""
    pairs = sorted(pairs)
    half, seen = sum(w for _, w in pairs) / 2, 0
    for value, weight in pairs:
        seen += weight
        if seen >= half:
            return value
    raise ValueError("no weighted values")


def decode_steps(anchor: dict, traces: Path) -> str:
    cfg, setup, requests, counters = calibrate.replay_inputs(anchor, traces)
    model = setup.step_time
    recorder = RecordingStepTime(model)
    # step by step (no run advanced at once), so the recorder sees every step: the same records either way
    setup = dataclasses.replace(setup, step_time=recorder)
    simulate(cfg, requests, setup=setup, counters=counters, analytic_decode=False)
    steps = recorder.steps
    kinds = {
        "decode-only": [s for s in steps if s[1] and not s[0]],
        "mixed": [s for s in steps if s[1] and s[0]],
        "prefill-only": [s for s in steps if s[0] and not s[1]],
    }
    mix = ", ".join(f"{k} {len(v)} ({sum(s[2] for s in v):.1f} s)" for k, v in kinds.items())
    itl, since, started = [], 0.0, False
    for _, decode, seconds in steps:
        since += seconds
        if decode:
            if started:
                itl.append((since, len(decode)))
            since, started = 0.0, True
    pool = sorted(kinds["decode-only"] or kinds["mixed"], key=lambda s: len(s[1]))
    prefill, decode, seconds = pool[len(pool) // 2]
    parts = model.cost(list(prefill), list(decode)).seconds
    shape = f"{len(decode)} decodes at mean context {statistics.fmean(decode):,.0f}"
    if prefill:
        shape += f" + {sum(n for n, _ in prefill):,} prefill tokens"
    return (
        f"{anchor['id']}: {mix}; typical decode step ({shape}) {1000 * seconds:.1f} ms = "
        + ", ".join(f"{k} {1000 * v:.2f}" for k, v in parts.items() if v)
        + f" ms; median ITL {1000 * weighted_median(itl):.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchors", required=True, help="anchors.csv (traces/<id>.jsonl beside it)")
    ap.add_argument("--only", help="comma-separated anchor ids")
    args = ap.parse_args(argv)
    path = Path(args.anchors)
    with path.open(newline="") as f:
        anchors = [a for a in csv.DictReader(f) if not args.only or a["id"] in args.only.split(",")]
    for anchor in anchors:
        print(decode_steps(anchor, path.parent / "traces"))
    print(f"decode steps: {len(anchors)} rows replayed")
    return 0


if __name__ == "__main__":
    sys.exit(calibrate.run_cli(main))
