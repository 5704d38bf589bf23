"""The layer order of DESIGN §8 as a test: the import-linter contracts in ``pyproject.toml`` must hold.

Grimp reads every ``import`` statement of the package, including the ones under ``if TYPE_CHECKING:``
and the ones inside functions, so a type-only or late import that runs back up fails here too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
        *args,
    ]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_every_import_linter_contract_is_kept() -> None:
    result = _lint_imports("--no-cache")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout or "broken" not in result.stdout.lower()
