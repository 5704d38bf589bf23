"""Prompts are validated once, at the scheduler's door (``Scheduler.add_request`` / ``add_requests``, with the
model's vocabulary): the engine does not check them again, and a bad prompt among good ones in one
``generate`` call fails before anything is queued or allocated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsakv.engine.engine as engine_module
import dsakv.scheduler.scheduler as scheduler_module
from dsakv.cache.allocator import PageAllocator
from dsakv.engine.engine import Engine, EngineConfig
from dsakv.errors import DsakvError
from dsakv.scheduler import Scheduler, SchedulerConfig
from dsakv.spec.model_spec import ModelSpec

PAGE = 16
CFG = EngineConfig(num_pages=16, page_size=PAGE, scheduler=SchedulerConfig(max_batched_tokens=64, chunk_tokens=32))
VOCAB = ModelSpec.preset("tiny").arch_value("vocab_size")  # the engine's default model
BAD_PROMPTS = {
    "past the vocabulary": [1, VOCAB],
    "negative": [-1, 2],
    "a bool": [3, True],
    "a float": [1, 2.5],
    "nested": [[1, 2], [3, 4]],
    "None": None,
    "a string": "abc",
}


def _untouched(e: Engine) -> bool:
    s = e.scheduler
    return (
        e.allocator.num_free == e.allocator.num_pages
        and not s.waiting
        and not s.running
        and not s.live
        and not s.done
        and s.stats.arrived == 0
    )


@settings(max_examples=25, deadline=None)
@given(
    good=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40), min_size=0, max_size=4),
    where=st.integers(0, 4),
    bad=st.sampled_from(sorted(BAD_PROMPTS)),
)
def test_a_bad_prompt_among_good_ones_allocates_and_queues_nothing(good, where, bad):
    e = Engine(CFG)
    prompts = [*good]
    prompts.insert(min(where, len(good)), BAD_PROMPTS[bad])
    with pytest.raises(DsakvError, match=rf"prompts\[{min(where, len(good))}\]: prompt"):
        e.generate(prompts, 3)
    assert _untouched(e)
    e.check_integrity()


def test_the_engine_does_not_check_prompts_the_scheduler_checks_them_once(monkeypatch):
    assert not hasattr(engine_module, "check_prompt") and not hasattr(engine_module.Engine, "_token_ids")
    seen = []
    real = scheduler_module.check_prompt
    monkeypatch.setattr(scheduler_module, "check_prompt", lambda p, m: seen.append(m) or real(p, m))
    e = Engine(CFG)
    e.generate([[1, 2, 3], np.array([4, 5], dtype=np.int64), (6, np.int32(7))], 2)
    e.add_request([8, 9], 1)
    assert seen == [VOCAB - 1] * 4


def test_the_scheduler_bounds_token_ids_by_the_vocabulary_it_is_given():
    s = Scheduler(
        PageAllocator(8, PAGE), config=SchedulerConfig(max_batched_tokens=64, chunk_tokens=32), vocab_size=100
    )
    with pytest.raises(DsakvError, match=r"prompt token ids 0\.\.100: must lie in 0\.\.99"):
        s.add_request([0, 100], 2)
    with pytest.raises(DsakvError, match=r"eos_token_id = 100: .*0\.\.99"):
        s.add_request([0, 1], 2, eos_token_id=100)
    with pytest.raises(DsakvError, match=r"prompts\[1\]: prompt token ids 100\.\.100"):
        s.add_requests([[1, 2], [100]], 2)
    with pytest.raises(DsakvError, match=r"cache_salt\[1\]"):
        s.add_requests([[1, 2], [3]], 2, cache_salt=["a", 1.5])
    assert s.stats.arrived == 0 and not s.waiting and not s.live
    reqs = s.add_requests([[1, 2], [99]], 2, cache_salt=["a", "b"])
    assert [r.id for r in s.waiting] == [r.id for r in reqs] and len(set(r.id for r in reqs)) == 2
    for bad in (0, True, 1.5, 2**32 + 1):
        with pytest.raises(DsakvError, match="vocab_size"):
            Scheduler(PageAllocator(8, PAGE), vocab_size=bad)
