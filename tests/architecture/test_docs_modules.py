"""The package map stays true: docs/structures.md lists every module under dsakv/ and names none that does not
exist; docs/structures.md and docs/architecture.md name only modules (and module members) that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dsakv"
STRUCTURES = ROOT / "docs" / "structures.md"
SECTION = re.compile(r"^### `dsakv/(\w+)/`", re.M)
ROW = re.compile(r"^\| ([^|]+) \|", re.M)  # a table row's first cell
NAME = re.compile(r"`([\w*]+\.(?:py|json))`")
DOTTED = re.compile(r"\bdsakv(?:\.\w+)+")
PATHS = re.compile(r"\bdsakv/[\w/]+\.py\b")


def _code_modules() -> dict[str, set[str]]:
    """Per package under dsakv/, its modules (``__init__.py`` aside)."""
    return {
        pkg.name: {p.name for p in pkg.glob("*.py") if p.name != "__init__.py"}
        for pkg in sorted(PACKAGE.iterdir())
        if (pkg / "__init__.py").exists()
    }


def _documented_modules(text: str) -> dict[str, set[str]]:
    """Per ``### `dsakv/PKG/``` section of the map, the module file names its table rows' first cells name."""
    heads = list(SECTION.finditer(text))
    out: dict[str, set[str]] = {}
    for head, nxt in zip(heads, [*heads[1:], None], strict=True):
        body = text[head.end() : nxt.start() if nxt else text.find("\n## ", head.end())]
        names = {n for cell in ROW.findall(body) for n in NAME.findall(cell)}
        out[head.group(1)] = {n for n in names if n.endswith(".py") and n != "__init__.py"}
    return out


def test_structures_md_lists_every_module_and_only_modules_that_exist():
    code, docs = _code_modules(), _documented_modules(STRUCTURES.read_text())
    assert sorted(docs) == sorted(code), "a package without its section in docs/structures.md, or a stale section"
    missing = {pkg: sorted(code[pkg] - docs[pkg]) for pkg in code if code[pkg] - docs[pkg]}
    stale = {pkg: sorted(docs[pkg] - code[pkg]) for pkg in docs if docs[pkg] - code.get(pkg, set())}
    assert not missing, f"modules missing from docs/structures.md: {missing}"
    assert not stale, f"docs/structures.md names modules that do not exist: {stale}"


def _resolves(dotted: str) -> bool:
    """``dsakv.a.b`` names a package or module, or a name defined in (or re-exported by) the module above it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:cut])
        found = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
        if found.exists():
            rest = parts[cut:]
            if not rest:
                return True
            return len(rest) <= 2 and re.search(rf"\b{re.escape(rest[0])}\b", found.read_text()) is not None
    return False


@pytest.mark.parametrize("doc", ["structures.md", "architecture.md"])
def test_the_maps_name_only_modules_that_exist(doc):
    text = (ROOT / "docs" / doc).read_text()
    unknown = sorted({d for d in DOTTED.findall(text) if not _resolves(d)})
    absent = sorted({p for p in PATHS.findall(text) if not (ROOT / p).exists()})
    assert not unknown and not absent, f"docs/{doc} names what does not exist: {unknown + absent}"


def test_the_check_sees_a_missing_and_a_stale_module():
    """The parser reads the map's real shape: a section's rows, several modules in one cell."""
    text = "### `dsakv/x/` — t\n\n| module | what |\n|---|---|\n| `a.py`, `b.py` | two |\n| `c.py` | one |\n\n## next\n"
    assert _documented_modules(text) == {"x": {"a.py", "b.py", "c.py"}}
    assert _resolves("dsakv.sim.cluster.Cluster") and not _resolves("dsakv.sim.loads")
