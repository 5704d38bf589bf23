"""Scheduling policies: ``prefill_first`` (SGLang) never runs a prefill chunk and a decode in one step;
``mixed`` (vLLM, the default) does. Random arrivals, integrity checked after every step."""

from __future__ import annotations

import random

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.scheduler import Scheduler


def _run(policy: str, seed: int) -> list[tuple[bool, bool]]:
    rng = random.Random(seed)
    alloc = PageAllocator(64, 4)
    sched = Scheduler(
        alloc, RadixCache(alloc), SchedulerConfig(max_batched_tokens=16, chunk_tokens=8, schedule_policy=policy)
    )
    kinds, n = [], 0
    for _ in range(200):
        if n < 12 and rng.random() < 0.3:
            sched.add_request([rng.randrange(50) for _ in range(rng.randrange(1, 30))], rng.randrange(1, 8))
            n += 1
        if sched.is_idle:
            continue
        plan = sched.step()
        admitted = {id(r) for r in plan.admitted}
        prefill = [i.is_prefill or id(i.request) in admitted for i in plan.items]
        prefill, decode = any(prefill), not all(prefill)
        kinds.append((prefill, decode))
        sched.update(plan, [[rng.randrange(50)] if i.sample else [] for i in plan.items])
        sched.check_integrity()
    return kinds


@pytest.mark.parametrize("seed", range(5))
def test_prefill_first_never_mixes_prefill_and_decode(seed):
    kinds = _run("prefill_first", seed)
    assert kinds and not any(p and d for p, d in kinds)
    assert any(d for _, d in kinds)


def test_mixed_policy_mixes_prefill_and_decode():
    assert any(p and d for seed in range(5) for p, d in _run("mixed", seed))


def test_unknown_policy_is_rejected_with_the_list():
    with pytest.raises(DsakvError, match="schedule_policy = 'fcfs': must be one of mixed, prefill_first"):
        SchedulerConfig(schedule_policy="fcfs")
