"""Helpers of the CLI tests: the one-line error contract, a snapshot of what a run left on disk, and the command
in a child process that is memory-capped and time-boxed (for inputs that, should a bug come back, would take
the whole test run's memory, crash it, or hang it)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD_MEMORY_BYTES = 3 * 2**30  # address space of a child run: enough for numpy and a small simulation


def assert_one_line_error(code: int, err: str, *needles: str) -> str:
    """Exit status 1, exactly one line on stderr (``dsakv: error: ...``), no traceback; returns the line."""
    lines = err.strip().splitlines()
    assert code == 1, (code, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("dsakv: error: ") and "Traceback" not in err, err[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def files_under(folder: Path) -> list[str]:
    """Every path below ``folder``, hidden ones included, relative and sorted (what a run left behind)."""
    return sorted(
        str(Path(root, name).relative_to(folder)) for root, dirs, names in os.walk(folder) for name in dirs + names
    )


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))


def dsakv_child(*argv: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m dsakv ARGV`` from this checkout, with a capped address space and a time limit."""
    return subprocess.run(
        [sys.executable, "-m", "dsakv", *argv],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_cap_memory,
    )
