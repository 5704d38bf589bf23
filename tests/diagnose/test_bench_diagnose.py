"""bench/diagnose.py runs and prints its one summary line (MB/s per CPU second, peak RSS)."""

from __future__ import annotations

import re
import sys


def test_bench_prints_one_summary_line(load_file_module, repo_dir, monkeypatch, capsys):
    bench = load_file_module(repo_dir / "bench" / "diagnose.py")
    monkeypatch.setattr(sys, "argv", ["diagnose.py", "--mb", "0.2"])
    bench.main()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and re.search(r"MB/s per CPU second, peak RSS [\d,]+ MB$", out[0])
