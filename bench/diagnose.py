"""Read a generated SGLang log of ``--mb`` megabytes streaming (``dsakv.telemetry.log_reader.read_log``) and print
one line: MB/s and peak RSS. The log repeats a realistic mix (one prefill line per eight decode lines, a few
unrelated lines); memory must not grow with the size (the reader keeps bounded samples).

    python bench/diagnose.py --mb 50          # the issue's target: --mb 1000 in under a minute on one core
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dsakv.telemetry.log_reader import read_log  # noqa: E402

STAMP = "[2026-01-01 00:00:00 TP0] "


def _block() -> bytes:
    lines = [
        STAMP
        + "Prefill batch, #new-seq: 1, #new-token: 2048, #cached-token: 1024, token usage: 0.41, #running-req: 12, "
        "#queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 18234.11",
        'INFO:     127.0.0.1:53512 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    ]
    for i in range(8):
        lines.append(
            STAMP
            + f"Decode batch, #running-req: {12 + i}, #token: {240000 + 64 * i}, token usage: 0.41, cuda graph: True, "
            f"gen throughput (token/s): {812.5 + i:.2f}, #queue-req: 0, "
        )
    return ("\n".join(lines) + "\n").encode()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=50.0, help="log size in MB (10^6 bytes)")
    args = p.parse_args()
    block = _block()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "server.log")
        with open(path, "wb") as f:
            header = STAMP + "KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 580096, KV size: 29.14 GB\n"
            f.write(header.encode())
            for _ in range(int(args.mb * 1e6 // len(block))):
                f.write(block)
        size = os.path.getsize(path)
        start, cpu = time.perf_counter(), time.process_time()
        facts = read_log(path)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"diagnose log read: {size / 1e6:,.0f} MB, {facts.lines:,} lines in {seconds:.1f} s wall, {cpu:.1f} s CPU = "
        f"{size / 1e6 / cpu:,.1f} MB/s per CPU second, peak RSS {rss_mb:,.0f} MB"
    )


if __name__ == "__main__":
    main()
