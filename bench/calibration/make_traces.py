"""Write ``traces/<id>.jsonl`` beside an anchors-format CSV, one trace per row, from its n / isl / osl / rate.

    python bench/calibration/make_traces.py bench/calibration/heldout.csv

The format and the replay rules are those of ``../shared/data/calibration`` (its README): Mooncake JSON lines,
fixed input and output lengths, fresh hash ids (one per 512-token block, so no request hits another's prefix),
every request at t = 0 when ``rate`` is empty, else one every 1/rate s (``fixed`` True) or Poisson arrivals
(seeded). Closed-loop rows (``conc``) take the same burst: calibrate.py's replay starts request k when request
k - C finishes. Existing trace files are rewritten; the output is deterministic.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
from pathlib import Path

HASH_BLOCK = 512  # tokens per hash id in the Mooncake format


def trace_lines(row: dict, seed: int = 0) -> list[str]:
    """The JSON lines of one row's benchmark."""
    n, isl, osl = int(row["n"]), int(row["isl"]), int(row["osl"])
    rate = float(row["rate"]) if (row.get("rate") or "").strip() else None
    fixed = (row.get("fixed") or "").strip().lower() == "true"
    rng = random.Random(seed)
    blocks = math.ceil(isl / HASH_BLOCK)
    lines, t = [], 0.0
    for k in range(n):
        if rate is not None and k:
            t += 1.0 / rate if fixed else rng.expovariate(rate)
        ids = list(range(k * blocks, (k + 1) * blocks))
        record = {"timestamp": round(t * 1000.0, 3), "input_length": isl, "output_length": osl, "hash_ids": ids}
        lines.append(json.dumps(record))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="anchors-format CSV; traces/ is written beside it")
    args = ap.parse_args(argv)
    path = Path(args.csv)
    out = path.parent / "traces"
    out.mkdir(exist_ok=True)
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        (out / f"{row['id']}.jsonl").write_text("\n".join(trace_lines(row)) + "\n")
    print(f"{len(rows)} traces written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
