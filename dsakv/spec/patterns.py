"""IndexCache layer patterns: ``--indexer-pattern`` as an F/S string or a named pattern from a pattern file.

The pattern file is the shared data checkout's ``indexcache/indexer_patterns.json`` when it sits beside the
repository; a plain install has none, and only literal F/S strings (or ``--indexer-patterns-file``) apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dsakv.errors import DsakvError
from dsakv.spec.indexer_schedule import load_indexcache_patterns
from dsakv.spec.model_spec import ModelSpec

# The shared data checkout beside the repository (absent in a plain install: patterns are then skipped).
DEFAULT_PATTERNS_FILE = Path(__file__).resolve().parents[3] / "shared" / "data" / "indexcache" / "indexer_patterns.json"


def indexer_patterns(path: str | Path | None = None) -> dict[str, str]:
    """IndexCache F/S patterns from ``path``, or from the shared data file when it exists (else none)."""
    if path is None:
        return load_indexcache_patterns(DEFAULT_PATTERNS_FILE) if DEFAULT_PATTERNS_FILE.is_file() else {}
    return load_indexcache_patterns(path)


def apply_indexer_pattern(spec: ModelSpec, pattern: str, patterns: Mapping[str, str]) -> ModelSpec:
    """``--indexer-pattern``: an F/S string, or the name of a pattern in the IndexCache file."""
    if pattern in patterns:
        return spec.with_indexer_pattern(patterns[pattern], source=pattern)
    if set(pattern) <= {"F", "S"}:
        return spec.with_indexer_pattern(pattern)
    names = ", ".join(patterns) or "none loaded"
    raise DsakvError(f"indexer pattern {pattern!r}: give an F/S string or a pattern name ({names})")
