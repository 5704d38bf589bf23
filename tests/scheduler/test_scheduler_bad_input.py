"""Issue 11 on the scheduler: every entry point documented as raising ``DsakvError`` does so for wrong types
and out-of-range values and leaves ``check_integrity()`` passing, the free-page count and the queues unchanged
(``update``'s sampled ids are validated before any state changes); the plan lists every freed page; an event
sink that raises cannot break a running scheduler."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.key import MAX_TOKEN_ID
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.request import Status
from dsakv.scheduler.scheduler import Scheduler

PS = 4
BIG = 2**63


def make(mode: str = "finish", num_pages: int = 24, **cfg) -> Scheduler:
    alloc = PageAllocator(num_pages, PS)
    cfg = {"max_batched_tokens": 32, "chunk_tokens": 8, **cfg}
    return Scheduler(alloc, RadixCache(alloc, insert_mode=mode), SchedulerConfig(**cfg))


def busy(in_flight: bool) -> SimpleNamespace:
    """Two requests running mid-prefill/decode, one waiting; optionally a plan in flight."""
    s = make(max_running=2)
    s.add_request(list(range(1, 14)), 6, request_id="a")
    s.add_request(list(range(1, 10)) + [70, 71], 6, request_id="b")
    s.add_request(list(range(30, 40)), 6, request_id="w")
    for _ in range(2):
        plan = s.step()
        s.update(plan, [[5] if it.sample else [] for it in plan.items])
    assert [r.id for r in s.running] == ["a", "b"] and [r.id for r in s.waiting] == ["w"]
    plan = s.step() if in_flight else None
    return SimpleNamespace(s=s, plan=plan)


def state(s: Scheduler) -> tuple:
    reqs = [(r.id, r.status, tuple(r.pages), r.num_computed, tuple(r.outputs)) for r in [*s.running, *s.waiting]]
    radix = s.radix
    return (
        s.allocator.num_free,
        s.allocator.free_stack(),
        reqs,
        sorted(map(repr, s.live)),
        sorted(map(repr, s.done)),
        (radix.total_tokens, radix.protected_tokens, radix.outstanding_locks, len(radix._roots)),
        s.in_flight,
        len(s.pending.freed_pages),
    )


def sampled(plan, token=5) -> list:
    return [[token] if it.sample else [] for it in plan.items]


def with_token(plan, bad) -> list:
    """Good tokens for every item but the last sampled one, which reports ``bad``."""
    out = sampled(plan)
    last = max(i for i, it in enumerate(plan.items) if it.sample)
    out[last] = [bad]
    return out


WRONG = {"None": None, "float": 1.5, "bool": True, "str": "3", "big": BIG, "negative": -1}


def per_value(label: str, call, values: dict) -> dict:
    """One case per wrong value: ``{f"{label} {name}": c -> call(c, value)}``."""

    def bind(value):
        return lambda c: call(c, value)

    return {f"{label} {name}": bind(value) for name, value in values.items()}


def without(values: dict, name: str) -> dict:
    return {k: v for k, v in values.items() if k != name}


IDLE_CALLS = {
    **per_value("add_request prompt token", lambda c, v: c.s.add_request([1, v], 3), WRONG),
    "add_request prompt past uint32": lambda c: c.s.add_request([1, MAX_TOKEN_ID + 1], 3),
    "add_request prompt None": lambda c: c.s.add_request(None, 3),
    "add_request prompt int": lambda c: c.s.add_request(5, 3),
    "add_request prompt str": lambda c: c.s.add_request("abc", 3),
    "add_request prompt nested": lambda c: c.s.add_request([[1, 2]], 3),
    "add_request prompt float array": lambda c: c.s.add_request(np.array([1.0, 2.0]), 3),
    **per_value("add_request max_new_tokens", lambda c, v: c.s.add_request([1, 2], v), without(WRONG, "big")),
    **per_value("add_request eos", lambda c, v: c.s.add_request([1, 2], 3, eos_token_id=v), without(WRONG, "None")),
    "add_request eos past uint32": lambda c: c.s.add_request([1, 2], 3, eos_token_id=MAX_TOKEN_ID + 1),
    "add_request unhashable id": lambda c: c.s.add_request([1, 2], 3, request_id=["x"]),
    "add_request live id": lambda c: c.s.add_request([1, 2], 3, request_id="a"),
    "abort unknown": lambda c: c.s.abort("nope"),
    "abort unhashable": lambda c: c.s.abort(["a"]),
    "preempt unknown": lambda c: c.s.preempt("nope"),
    "preempt unhashable": lambda c: c.s.preempt({"a": 1}),
    "preempt waiting": lambda c: c.s.preempt("w"),
    "get unknown": lambda c: c.s.get("nope"),
    "get unhashable": lambda c: c.s.get(["a"]),
    "update with no plan in flight": lambda c: c.s.update(c.s.pending, []),
}

IN_FLIGHT_CALLS = {
    **per_value("update token", lambda c, v: c.s.update(c.plan, with_token(c.plan, v)), WRONG),
    "update token past uint32": lambda c: c.s.update(c.plan, with_token(c.plan, MAX_TOKEN_ID + 1)),
    "update token np.float64": lambda c: c.s.update(c.plan, with_token(c.plan, np.float64(5.0))),
    "update sampled None": lambda c: c.s.update(c.plan, None),
    "update sampled int": lambda c: c.s.update(c.plan, 5),
    "update sampled str": lambda c: c.s.update(c.plan, "ab"),
    "update a token list that is an int": lambda c: c.s.update(c.plan, [5] * len(c.plan.items)),
    "update a token list that is a str": lambda c: c.s.update(c.plan, ["5"] * len(c.plan.items)),
    "update too few lists": lambda c: c.s.update(c.plan, sampled(c.plan)[:-1]),
    "update too many tokens": lambda c: c.s.update(c.plan, [[5, 5] if it.sample else [] for it in c.plan.items]),
    "update another plan": lambda c: c.s.update(c.s.pending, []),
    "step while in flight": lambda c: c.s.step(),
    "abort while in flight": lambda c: c.s.abort("a"),
    "preempt while in flight": lambda c: c.s.preempt("a"),
}


@pytest.mark.parametrize("name", sorted(IDLE_CALLS) + sorted(IN_FLIGHT_CALLS))
def test_bad_input_raises_dsakv_error_and_changes_nothing(name: str) -> None:
    in_flight = name in IN_FLIGHT_CALLS
    c = busy(in_flight)
    before = state(c.s)
    with pytest.raises(DsakvError):
        (IN_FLIGHT_CALLS if in_flight else IDLE_CALLS)[name](c)
    assert state(c.s) == before
    c.s.check_integrity()
    if in_flight:  # the same plan is still in flight and completes with good tokens
        c.s.update(c.plan, sampled(c.plan))
    for _ in range(100):  # and everything still drains with no leak
        if c.s.is_idle:
            break
        plan = c.s.step()
        c.s.update(plan, sampled(plan))
        c.s.check_integrity()
    assert c.s.is_idle and c.s.radix.protected_tokens == 0
    assert c.s.allocator.num_free + c.s.radix.total_tokens // PS == c.s.allocator.num_pages


def test_a_bad_sampled_id_is_refused_before_the_request_changes() -> None:
    """Issue 11, defect 2: ``update(p, [[-1]])`` was accepted, failed later inside finish, orphaned the
    request and leaked its pages."""
    s = make(num_pages=8)
    req = s.add_request(list(range(6)), 12, request_id="x")
    p = s.step()
    free, pages, computed = s.allocator.num_free, list(req.pages), req.num_computed
    for bad in ([-1], [MAX_TOKEN_ID + 1], [1.5], [True], [None], ["7"]):
        with pytest.raises(DsakvError, match="token id"):
            s.update(p, [bad])
        assert (s.allocator.num_free, req.pages, req.num_computed, req.outputs) == (free, pages, computed, [])
        assert s.in_flight is p and req.status is Status.RUNNING
        s.check_integrity()
    s.update(p, [[7]])
    while not s.is_idle:
        plan = s.step()
        s.update(plan, sampled(plan))
        s.check_integrity()
    assert s.done["x"] is Status.FINISHED and len(req.outputs) == 12
    assert s.allocator.num_free + s.radix.total_tokens // PS == s.allocator.num_pages


def test_numpy_integer_tokens_are_accepted() -> None:
    s = make()
    s.add_request(list(range(6)), 2, request_id="x")
    p = s.step()
    s.update(p, [np.array([9], dtype=np.int64)])
    p = s.step()
    s.update(p, [[np.uint32(9)]])
    assert s.done["x"] is Status.FINISHED


@pytest.mark.parametrize(
    "build",
    [
        lambda a: Scheduler(a, RadixCache(PageAllocator(24, PS))),  # a prefix cache over another allocator
        lambda a: Scheduler("allocator"),
        lambda a: Scheduler(a, "radix"),
        lambda a: Scheduler(a, None, {"chunk_tokens": 8}),
        lambda a: Scheduler(a, None, None, on_finish=5),
        lambda a: Scheduler(a, None, None, on_offload="x"),
    ],
)
def test_a_scheduler_over_mismatched_or_wrong_parts_is_refused(build) -> None:
    alloc = PageAllocator(24, PS)
    with pytest.raises(DsakvError):
        build(alloc)
    alloc.check_integrity()
    assert alloc.num_free == 24


# ----- every freed page is in the plan (issue 11, contract gap 6) -----------------------------------
def recording(alloc: PageAllocator) -> list:
    freed: list = []
    free = alloc.free

    def recording_free(pages):
        pages = list(pages)
        free(pages)
        freed.extend(pages)

    alloc.free = recording_free
    return freed


def test_duplicate_pages_freed_at_allocation_are_in_the_steps_freed_pages() -> None:
    """Request b decodes exactly the tokens of a's cached page: in allocate mode its copy of the page is a
    duplicate the scheduler frees at once (the request reads the tree's copy); the plan lists it."""
    s = make("allocate", max_running=2)
    freed = recording(s.allocator)
    a = list(range(1, 10))  # pages (1..4), (5..8) and a tail
    s.add_request(a, 1, request_id="a")
    s.add_request(a[:7], 4, request_id="b")  # it will decode 8, 9, 10: page (5..8) again
    dups = []
    for token in (8, 9, 10, 11, 12):
        if s.is_idle:
            break
        plan = s.step()
        b_pages = list(s.live["b"].pages) if "b" in s.live else []
        s.update(plan, [[token if it.request.id == "b" else 5] if it.sample else [] for it in plan.items])
        dups += [p for p in b_pages if p in plan.freed_pages and "b" in s.live]
        assert plan.freed_pages == freed
        freed.clear()
        s.check_integrity()
    assert dups, "b's copy of page (5..8) was a duplicate, freed and listed in the plan"


def test_a_raising_event_sink_never_breaks_a_running_scheduler() -> None:
    """Issue 11, defect 4, end to end: with a sink that always raises, the scheduler still finishes every
    request with nothing leaked (the sink's errors are collected by the cache, not raised into ``update``)."""
    alloc = PageAllocator(10, PS)

    def sink(event) -> None:
        raise RuntimeError("sink down")

    radix = RadixCache(alloc, insert_mode="allocate", event_sink=sink)
    s = Scheduler(alloc, radix, SchedulerConfig(max_batched_tokens=32, chunk_tokens=8))
    for i in range(6):
        s.add_request(list(range(1, 12)) + [40 + i] * 5, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        while not s.is_idle:
            plan = s.step()
            s.update(plan, sampled(plan))
            s.check_integrity()
    assert radix.sink_failure_count > 0 and radix.metrics.evicted_tokens > 0
    assert alloc.num_free + radix.total_tokens // PS == alloc.num_pages
