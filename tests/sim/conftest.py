"""Fixtures of the simulator's tests: ``calibrate``, ``bench/calibrate.py`` imported as a module."""

from __future__ import annotations

import pytest


@pytest.fixture
def calibrate(repo_dir, load_file_module):
    return load_file_module(repo_dir / "bench" / "calibrate.py")
