"""Hypothesis state machine over scheduler operations (arrive, step, preempt, resume, abort, finish):
every integrity invariant holds after every operation, in every mode, and a drained scheduler leaks nothing."""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.request import Status
from dsakv.scheduler.scheduler import Scheduler

PS = 8  # small pages: many page boundaries in few tokens
PREFIXES = [[(7 * i + j) % 97 for j in range(40)] for i in range(3)]


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        pages=st.integers(6, 24),
        cache=st.sampled_from(["none", "finish", "allocate"]),
        preemption=st.sampled_from(["recompute", "offload"]),
        victim_order=st.sampled_from(["newest", "fewest_outputs", "most_pages"]),
        requeue=st.sampled_from(["front", "back"]),
        drafts=st.integers(0, 3),
        ratio=st.sampled_from([0.0, 0.5, 1.0]),
        clip=st.sampled_from([None, 4, 16]),
        tracker=st.booleans(),  # SGLang's decaying ratio (decay over 3 decode steps, to 0.14 x the ratio)
        chunk=st.sampled_from([8, 16, 32]),
    )
    def setup(self, pages, cache, preemption, victim_order, requeue, drafts, ratio, clip, tracker, chunk):
        self.alloc = PageAllocator(pages, PS)
        radix = None if cache == "none" else RadixCache(self.alloc, insert_mode=cache)
        cfg = SchedulerConfig(
            max_batched_tokens=max(chunk, 1 + drafts, PS) + 8,
            chunk_tokens=chunk,
            max_running=4,
            max_context=80,  # prompts reach 70 tokens + 40 new: some exceed it
            new_token_ratio=ratio,
            new_token_clip=clip,
            new_token_ratio_min=0.14 * ratio if tracker else None,
            new_token_ratio_decay_steps=3,
            preemption=preemption,
            victim_order=victim_order,
            requeue=requeue,
            num_speculative_tokens=drafts,
        )
        self.s = Scheduler(self.alloc, radix, cfg)
        self.requests = []
        self.prompts = []
        self.freed = []  # every page the allocator freed since the last update, in order
        free = self.alloc.free

        def recording_free(pages):
            pages = list(pages)
            free(pages)
            self.freed += pages

        self.alloc.free = recording_free  # the scheduler and the radix tree free through this very object

    @rule(
        prefix=st.integers(0, 2),
        cut=st.integers(0, 40),
        suffix=st.lists(st.integers(0, 96), max_size=30),
        max_new=st.integers(0, 40),
        eos=st.sampled_from([None, 3]),
    )
    def arrive(self, prefix, cut, suffix, max_new, eos):
        self._arrive(PREFIXES[prefix][:cut] + suffix, max_new, eos)

    @precondition(lambda self: self.prompts)
    @rule(data=st.data(), max_new=st.integers(1, 40))
    def arrive_same_prompt(self, data, max_new):
        # Identical prompts prefilling side by side: their pages become duplicates in the tree.
        self._arrive(data.draw(st.sampled_from(self.prompts)), max_new, None)

    def _arrive(self, prompt, max_new, eos):
        req = self.s.add_request(prompt, max_new, eos_token_id=eos)
        self.requests.append(req)
        self.prompts.append(list(prompt))
        if req.status is Status.REJECTED:
            assert req.stats.reason and req.stats.admit_step is None
            event("rejected: " + ("context" if "context" in req.stats.reason else "pool or empty"))

    @rule(data=st.data())
    def step(self, data):
        plan = self.s.step()
        assert plan.num_tokens <= self.s.config.max_batched_tokens
        for kind, happened in (
            ("preempted for pages", plan.preempted),
            ("restored after offload", plan.restores),
            (
                "resumed after recompute",
                [r for r in plan.admitted if r.stats.preemptions and not r.stats.restored_pages],
            ),
            ("mixed prefill + decode", {it.is_prefill for it in plan.items} == {True, False}),
            ("evicted", plan.evicted_tokens),
        ):
            if happened:
                event(kind)
        out = []
        for item in plan.items:
            if not item.sample:
                out.append([])
                continue
            n = data.draw(st.integers(0, item.num_draft))
            if n < item.num_draft:
                event("drafts rolled back")
            out.append(data.draw(st.lists(st.integers(0, 96), min_size=1 + n, max_size=1 + n)))
        for req in self.s.update(plan, out):
            assert req.status is Status.FINISHED and not req.pages and req.prompt == ()
            event("finished")
        # the plan lists every page freed since the last update: abort/preempt, step, update (issue 11)
        assert plan.freed_pages == self.freed
        self.freed = []

    @precondition(lambda self: self.s.running)
    @rule(data=st.data())
    def preempt(self, data):
        req = data.draw(st.sampled_from(self.s.running))
        self.s.preempt(req.id)
        assert req.status in (Status.WAITING, Status.OFFLOADED) and not req.pages

    @precondition(lambda self: self.s.running or self.s.waiting)
    @rule(data=st.data())
    def abort(self, data):
        req = data.draw(st.sampled_from(self.s.running + list(self.s.waiting)))
        self.s.abort(req.id)
        assert req.status is Status.ABORTED and not req.pages

    @invariant()
    def integrity(self):
        if hasattr(self, "s"):
            self.s.check_integrity()

    def teardown(self):
        if not hasattr(self, "s"):
            return
        for _ in range(2000):  # drain: every admitted request finishes, nothing leaks
            if self.s.is_idle:
                break
            plan = self.s.step()
            if plan.evicted_tokens:
                event("evicted (drain)")
            self.s.update(plan, [[1] if it.sample else [] for it in plan.items])
            self.s.check_integrity()
            assert plan.freed_pages == self.freed
            self.freed = []
        assert self.s.is_idle
        radix = self.s.radix
        cached = radix.total_tokens // PS if radix is not None else 0
        assert self.alloc.num_free + cached == self.alloc.num_pages
        assert radix is None or radix.protected_tokens == 0
        for req in self.requests:
            assert req.is_done
            if req.status is Status.FINISHED:
                eos_stop = req.eos_token_id is not None and req.outputs and req.outputs[-1] == req.eos_token_id
                assert len(req.outputs) == req.max_new_tokens or eos_stop


SchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestSchedulerMachine = SchedulerMachine.TestCase
