"""Plain helpers of the PD tests (a module of its own name: a spawned child re-imports the test module, and a
bare ``conftest`` there could resolve to another folder's conftest)."""

from __future__ import annotations

import random

from dsakv.engine.engine import EngineConfig
from dsakv.spec.model_spec import ModelSpec

PAGE = 16
INSTALL = "apt-get install -y libibverbs1 libnuma1 && pip install 'dsakv[pd]'"


def pd_config(**kw) -> EngineConfig:
    return EngineConfig(**{"num_pages": 48, "page_size": PAGE, "capture_cache": True, **kw})


def long_prompt(seed: int, n: int = 150) -> list[int]:
    """``n`` random ids; ``n`` > the tiny preset's ``index_topk`` (64), so the indexer really selects."""
    assert n > ModelSpec.preset("tiny").index_topk
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(n)]
