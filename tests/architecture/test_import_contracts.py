"""The layer order of DESIGN §8 as a test: the import-linter contracts in ``pyproject.toml`` must hold.

Grimp reads every ``import`` statement of the package, including the ones under ``if TYPE_CHECKING:``
and the ones inside functions, so a type-only or late import that runs back up fails here too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package and ``pyproject.toml`` found in ``root`` (that copy first on the path)."""
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache", "--no-logo"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_import_linter_contract_is_kept() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " 0 broken" in result.stdout


@pytest.mark.parametrize(
    "where, line",
    [
        ("module level", "from dsakv.cli.gpu_args import parse_int\n"),
        (
            "type-only",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dsakv.sim.config import SimConfig\n",
        ),
        ("inside a function", "def _late():\n    from dsakv.engine.pool import TwinPool\n    return TwinPool\n"),
    ],
)
def test_an_upward_import_into_the_cache_breaks_the_layer_contract(tmp_path: Path, where: str, line: str) -> None:
    """The contract test can fail: an upward import planted in a copy of the package is reported."""
    shutil.copytree(REPO / "dsakv", tmp_path / "dsakv", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "dsakv" / "cache" / "allocator.py"
    target.write_text(target.read_text() + "\n\n" + line)
    result = lint_imports(tmp_path)
    assert result.returncode != 0, f"{where}: {result.stdout[-2000:]}"
    assert "dsakv.cache.allocator" in result.stdout and "BROKEN" in result.stdout
