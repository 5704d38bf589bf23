"""``simulate --kpool``: the cell, the pool and the step time all count one indexer state per kpool tokens."""

from __future__ import annotations

from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.steptime import RooflineStepTime
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


def test_kpool_halves_indexer_bytes_and_scored_pairs_per_state():
    one, two = build_setup(SimConfig()), build_setup(SimConfig(kpool=2))
    assert (two.layout.page_size, two.layout.index_kpool, two.layout.indexer_physical_page) == (128, 2, 64)
    assert two.layout.indexer_bytes_per_token * 2 == one.layout.indexer_bytes_per_token
    glm = CacheLayout(ModelSpec.preset("glm-5.3"))
    a, b = RooflineStepTime(glm).cost([], [10_000]), RooflineStepTime(glm.with_index_kpool(2)).cost([], [10_000])
    assert b.flops["indexer"] * 2 == a.flops["indexer"]  # scored pairs per state
    assert b.bytes["indexer"] < a.bytes["indexer"]  # key bytes per state
