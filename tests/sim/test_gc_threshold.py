"""A run makes Python's young garbage collections rare and gives the caller its thresholds back."""

from __future__ import annotations

import gc

import pytest

from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig
from dsakv.sim.gc_threshold import YOUNG_THRESHOLD, rare_collections
from dsakv.workloads.scenarios import generate_scenario


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    gc.set_threshold(500, 7, 9)
    yield
    gc.set_threshold(*saved)


def test_the_thresholds_are_raised_inside_and_restored_after_even_on_error(thresholds):
    with rare_collections():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 7, 9)
    assert gc.get_threshold() == (500, 7, 9)
    with pytest.raises(RuntimeError), rare_collections():
        raise RuntimeError("a run that fails")
    assert gc.get_threshold() == (500, 7, 9)


def test_a_higher_threshold_of_the_callers_is_kept(thresholds):
    gc.set_threshold(YOUNG_THRESHOLD * 2, 7, 9)
    with rare_collections():
        assert gc.get_threshold() == (YOUNG_THRESHOLD * 2, 7, 9)


def test_a_simulation_runs_with_rare_collections_and_restores_them(thresholds):
    seen = []  # the thresholds while the run reports progress
    chat = generate_scenario("chat", seed=0, scale=0.05)
    cfg = SimConfig(step_model="constant", instances=2)
    simulate(cfg, chat, progress=lambda done: seen.append(gc.get_threshold()))
    assert seen and set(seen) == {(YOUNG_THRESHOLD, 7, 9)}
    assert gc.get_threshold() == (500, 7, 9)
