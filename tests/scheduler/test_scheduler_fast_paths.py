"""The scheduler's plain-decode fast paths carry no rule of their own: ``Scheduler.step`` plans exactly what
``batch.next_item`` plans, and ``Scheduler.update`` applies exactly what ``rollback.accept_tokens`` applies
(EOS and ``max_new_tokens`` included), on random workloads with and without speculative drafts."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.scheduler.batch import next_item
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.request import Request, Status
from dsakv.scheduler.rollback import accept_tokens
from dsakv.scheduler.scheduler import Scheduler

PS = 8
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

workloads = st.fixed_dictionaries(
    {
        "pages": st.integers(6, 24),
        "cache": st.sampled_from(["none", "finish", "allocate"]),
        "drafts": st.integers(0, 2),
        "ratio": st.sampled_from([0.0, 0.5, 1.0]),
        "chunk": st.sampled_from([8, 16]),
        "budget": st.integers(8, 20),
        "prompts": st.lists(
            st.tuples(st.lists(st.integers(0, 20), min_size=1, max_size=40), st.integers(1, 30)),
            min_size=1,
            max_size=8,
        ),
        "eos": st.sampled_from([None, 3]),
        "seed": st.integers(0, 2**16),
    }
)
# A decode planned with exactly one token of budget left (after two prefill chunks), and EOS sampled.
TIGHT = {"pages": 6, "cache": "none", "drafts": 0, "ratio": 0.0, "chunk": 8, "budget": 14, "eos": 3, "seed": 0}
TIGHT["prompts"] = [([0] * 13, 1), ([0] * 8, 1), ([0], 2)]


def _scheduler(w: dict) -> Scheduler:
    alloc = PageAllocator(w["pages"], PS)
    radix = None if w["cache"] == "none" else RadixCache(alloc, insert_mode=w["cache"])
    cfg = SchedulerConfig(
        max_batched_tokens=max(w["budget"], 1 + w["drafts"], PS),
        chunk_tokens=w["chunk"],
        max_running=4,
        new_token_ratio=w["ratio"],
        num_speculative_tokens=w["drafts"],
    )
    sched = Scheduler(alloc, radix, cfg)
    for prompt, max_new in w["prompts"]:
        sched.add_request(prompt, max_new, eos_token_id=w["eos"])
    return sched


def _sampled(plan, rng_state: int) -> list[list[int]]:
    out = []
    for i, item in enumerate(plan.items):
        if not item.sample:
            out.append([])
            continue
        x = (rng_state * 31 + i * 17 + plan.step) % 97
        accepted = x % (item.num_draft + 1)
        out.append([(x + j) % 5 for j in range(1 + accepted)])  # token 3 (EOS) turns up now and then
    return out


class _FreeLog:
    """Stands in for the allocator in the reference ``accept_tokens``: records what it would free."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.freed: list[int] = []

    def free(self, pages) -> None:
        self.freed += list(pages)


RETIRE_FIELDS = ("outcome", "reason", "finish_step")  # set when a finished request retires, not by accepting


def _accounting(req: Request) -> dict:
    return {k: v for k, v in req.stats.to_dict().items() if k not in RETIRE_FIELDS}


def _snapshot(req: Request) -> tuple:
    return (req.outputs, req.num_computed, req.pages, _accounting(req))


@SETTINGS
@given(w=workloads)
@example(w=TIGHT)
def test_step_plans_exactly_what_next_item_plans(w):
    sched = _scheduler(w)
    cfg, ps = sched.config, sched.page_size
    for _ in range(300):
        if sched.is_idle:
            break
        running_before = list(sched.running)
        plan = sched.step()
        budget = cfg.max_batched_tokens
        items = list(plan.items)
        pos = 0
        for req in running_before:  # running requests are planned first, oldest first
            if pos < len(items) and items[pos].request is req:
                assert items[pos] == next_item(req, budget, cfg, ps)
                budget -= items[pos].num_tokens
                pos += 1
            elif req.status is Status.RUNNING and req not in plan.admitted:
                assert next_item(req, budget, cfg, ps) is None  # skipped only when nothing fits
        for item in items[pos:]:  # then the admitted ones' first chunks
            assert item.request in plan.admitted
            assert item == next_item(item.request, budget, cfg, ps)
            budget -= item.num_tokens
        sched.update(plan, _sampled(plan, w["seed"]))
    assert sched.is_idle


@SETTINGS
@given(w=workloads)
@example(w=TIGHT)
def test_update_applies_exactly_what_accept_tokens_applies(w):
    sched = _scheduler(w)
    plain_decodes = 0
    for _ in range(300):
        if sched.is_idle:
            break
        plan = sched.step()
        sampled = _sampled(plan, w["seed"])
        expected = {}
        for item, new in zip(plan.items, sampled):
            ref = copy.copy(item.request)  # the fields accept_tokens touches, copied
            ref.outputs, ref.pages, ref.stats = list(ref.outputs), list(ref.pages), copy.copy(ref.stats)
            log = _FreeLog(sched.page_size)
            done = accept_tokens(ref, copy.copy(item), new, plan.step, log)
            expected[id(item.request)] = (done, _snapshot(ref), log.freed)
            plain_decodes += item.sample and not item.num_draft and item.end - item.start == 1
        pages_before = {id(it.request): list(it.request.pages) for it in plan.items}
        finished = {id(r) for r in sched.update(plan, sampled)}
        for item in plan.items:
            req = item.request
            done, (outputs, num_computed, pages, stats), freed = expected[id(req)]
            assert (id(req) in finished) == done
            assert req.outputs == outputs and _accounting(req) == stats
            if not done:  # a finished request has released its pages; one still running kept what accept_tokens kept
                assert req.num_computed == num_computed
                if not sched.insert_as_written:  # (allocate mode may swap pages for the tree's copies)
                    assert req.pages == pages
                    assert sorted(set(pages_before[id(req)]) - set(req.pages)) == sorted(freed)
        sched.check_integrity()
    assert sched.is_idle
    event(f"plain decodes accepted: {'some' if plain_decodes else 'none'}")
