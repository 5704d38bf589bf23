"""Fixtures of the simulator's tests: ``calibrate``, ``bench/calibrate.py`` imported as a module."""

from __future__ import annotations

import importlib.util
import sys

import pytest


@pytest.fixture
def calibrate(repo_dir, monkeypatch):
    spec = importlib.util.spec_from_file_location("calibrate", repo_dir / "bench" / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "calibrate", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod
