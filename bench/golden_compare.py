"""Golden outputs of ``dsakv simulate --json`` on six cases (issue 22's contract: one simulation kernel leaves
every figure unchanged): save them from one checkout, rerun them on another and compare every key (the
``config`` echo aside, and ``other_group_requests``, which the one kernel deletes).

    python bench/golden_compare.py --save DIR        # write DIR/<case>.json
    python bench/golden_compare.py --compare DIR     # rerun, compare; one line per case, exit 1 on a difference
    python bench/golden_compare.py --compare DIR --case default --case workers
    python bench/golden_compare.py --compare DIR --step-settings FILE   # every case with these step settings

Run it with the checkout to test first on ``PYTHONPATH``. Without the shared trace the trace cases use the
embedded ``chat`` scenario (and say so).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"
IGNORED = frozenset({"config", "other_group_requests"})


def _trace_args() -> list[str]:
    return ["--trace", str(TRACE)] if TRACE.exists() else ["--scenario", "chat"]


def cases() -> dict[str, list[str]]:
    """Case name -> the arguments after ``dsakv simulate`` (``--json`` added)."""
    return {
        "default": [],
        "trace": _trace_args(),
        "cluster16_three_routers": ["--instances", "16", "--router", "round-robin,kv-aware,affinity", "--workers", "1"],
        "host_store_tiers": ["--pool-tokens", "200000", "--host-bytes", "20GB", "--store-bytes", "2TB"],
        "dp_attention_closed_loop": ["--dp-attention", "8", "--max-concurrency", "64"],
        "workers": ["--instances", "4", "--router", "round-robin", "--workers", "2"],
    }


def run_case(args: list[str]) -> object:
    out = subprocess.run(
        [sys.executable, "-m", "dsakv", "simulate", *args, "--json"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"dsakv simulate {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def differences(old: object, new: object, path: str = "") -> list[str]:
    """Every key path whose value differs (ignored keys skipped at any depth), missing or added."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new)):
            if key in IGNORED:
                continue
            where = f"{path}.{key}" if path else key
            if key not in new:
                found.append(f"{where}: missing")
            elif key not in old:
                found.append(f"{where}: added")
            else:
                found += differences(old[key], new[key], where)
        return found
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: length {len(old)} != {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if old == new and type(old) is type(new) else [f"{path}: {old!r} != {new!r}"]


def count_keys(value: object) -> int:
    if isinstance(value, dict):
        return sum(1 + count_keys(v) for k, v in value.items() if k not in IGNORED)
    if isinstance(value, list):
        return sum(count_keys(v) for v in value)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", type=Path, help="directory to write the outputs to")
    mode.add_argument("--compare", type=Path, help="directory of saved outputs to compare against")
    ap.add_argument("--case", action="append", help="run only these cases (repeat)")
    ap.add_argument(
        "--step-settings", help="a step-settings file every case runs with (e.g. an earlier model's values)"
    )
    args = ap.parse_args()
    extra = ["--step-settings", args.step_settings] if args.step_settings else []
    chosen = {k: v for k, v in cases().items() if not args.case or k in args.case}
    if not TRACE.exists():
        print(f"note: {TRACE} absent: the trace case runs the chat scenario", file=sys.stderr)
    failed = 0
    for name, case_args in chosen.items():
        start = time.perf_counter()
        result = run_case([*case_args, *extra])
        wall = time.perf_counter() - start
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"{name}.json").write_text(json.dumps(result, indent=1))
            print(f"{name}: saved ({count_keys(result)} keys, {wall:.1f} s)")
            continue
        diffs = differences(json.loads((args.compare / f"{name}.json").read_text()), result)
        failed += bool(diffs)
        status = "every key equal" if not diffs else f"{len(diffs)} differences: " + "; ".join(diffs[:8])
        print(f"{name}: {count_keys(result)} keys, {status} ({wall:.1f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
