"""Fixtures shared by every test folder.

* ``one_torch_thread``: tiny tensor shapes run one intra-op thread (a second one only adds barrier waits,
  10x slower on a loaded 2-core machine). Opt in per module with
  ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
* ``load_file_module``: import a script that is not a package module (``bench/*.py``, ``../shared/bench``).
* ``repo_dir`` / ``shared_dir``: the checkout and the shared data beside it (which may be absent).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _load(path: Path, name: str | None = None) -> ModuleType:
    if not path.is_file():
        pytest.skip(f"file absent: {path}")
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    # registered while it runs: a dataclass resolves its annotations through sys.modules[its module]
    before = sys.modules.get(spec.name)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        if before is None:
            del sys.modules[spec.name]
        else:
            sys.modules[spec.name] = before
    return mod


@pytest.fixture(scope="session")
def load_file_module() -> Callable[..., ModuleType]:
    return _load


@pytest.fixture(scope="session")
def repo_dir() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return SHARED
