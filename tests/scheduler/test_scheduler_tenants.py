"""Tenant isolation through the scheduler (issue 11, item 1): a request's ``(extra_key, cache_salt)`` is its
prefix-cache namespace; it matches, locks and inserts only there.

The state machine plays an executor that keeps, for every slot of the pool, what was written there (the
namespace, the position and the token). Every item of every plan reads its context before it writes,
in plan order, so the machine proves, over random tenants, prompts, steps, preemptions and aborts, in
both insert modes:

* no page is ever read (matched, locked, used as context) by a request of another namespace, and a read
  slot always holds the reader's own token at that position: no wrong hit;
* no slot is read before it is written, even when a request hits pages that an earlier item of the same
  step writes (cache at allocation shares within a step, item 4); no slot is written twice in a step, and
  a request writes only pages it was handed out (never a cached page another request wrote);
* every lock a running request holds lies in its own namespace.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.scheduler.batch import HostCopy
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.request import Status
from dsakv.scheduler.scheduler import Scheduler

PS = 4
PREFIXES = [[(5 * i + j) % 31 for j in range(24)] for i in range(2)]
TENANTS = [(None, None), (None, "salt-a"), ("lora-1", "salt-a")]


def namespace_of_node(node) -> tuple:
    while node.parent is not None:
        node = node.parent
    return node.namespace


class TenantExecutor:
    """The data side of a plan, on a dict of slots: ``slot -> (namespace, position, token)``."""

    def __init__(self, page_size: int) -> None:
        self.ps = page_size
        self.slots: dict[int, tuple] = {}
        self.host: dict[object, list[tuple]] = {}
        self.writer: dict[int, object] = {}  # page -> the request that writes it since it was handed out

    def handed_out(self, pages: list[int]) -> None:
        for page in pages:
            self.writer.pop(page, None)

    def write(self, req_id, page: int) -> None:
        writer = self.writer.setdefault(page, req_id)
        assert writer == req_id, f"request {req_id!r} writes page {page}, which request {writer!r} wrote"

    def slot(self, pages: list[int], position: int) -> int:
        return pages[position // self.ps] * self.ps + position % self.ps

    def offload(self, copy: HostCopy) -> None:  # the scheduler's on_offload: the pages are still allocated
        self.host[copy.request_id] = [self.slots.get(self.slot(copy.pages, p)) for p in range(copy.num_tokens)]

    def read(self, req, namespace: tuple, end: int, written: set[int] | None = None) -> None:
        tokens = list(req.tokens(min(end, req.num_tokens)))
        for p in range(end):
            s = self.slot(req.pages, p)
            got = self.slots.get(s)
            want = (namespace, p, tokens[p])
            assert got == want, f"{req} read slot of position {p}: holds {got}, expected {want}"
            if written is not None and s in written:
                event("read a page an earlier item of the same step wrote")
                written = None

    def run(self, plan, sched: Scheduler, draw_accepted, draw_token) -> list[list[int]]:
        for copy in plan.restores:
            req = sched.get(copy.request_id)
            for p, content in enumerate(self.host.pop(copy.request_id)):
                self.slots[self.slot(copy.pages, p)] = content
                self.write(copy.request_id, copy.pages[p // self.ps])
            assert len(copy.pages) * self.ps >= copy.num_tokens and req.status is Status.RUNNING
        written: set[int] = set()
        sampled = []
        for item in plan.items:
            req = item.request
            ns = (req.extra_key, req.cache_salt)
            self.read(req, ns, item.start, written)  # the context before this item's own writes
            tokens = list(req.tokens(item.end))
            drafts = [draw_token() for _ in range(item.num_draft)]
            for p in range(item.start, item.end + item.num_draft):
                s = self.slot(req.pages, p)
                assert s not in written, f"slot {s} written twice in step {plan.step}"
                written.add(s)
                self.write(req.id, req.pages[p // self.ps])  # only pages it was handed (or inserted itself)
                self.slots[s] = (ns, p, tokens[p] if p < item.end else drafts[p - item.end])
            if not item.sample:
                sampled.append([])
                continue
            accepted = draw_accepted(item.num_draft)
            sampled.append(drafts[:accepted] + [draw_token()])
        return sampled


class TenantMachine(RuleBasedStateMachine):
    @initialize(
        pages=st.integers(8, 28),
        mode=st.sampled_from(["finish", "allocate"]),
        speculative=st.booleans(),
        preemption=st.sampled_from(["recompute", "offload"]),
        drafts=st.integers(0, 2),
        chunk=st.sampled_from([4, 8, 16]),
        budget_extra=st.integers(0, 9),
    )
    def setup(self, pages, mode, speculative, preemption, drafts, chunk, budget_extra):
        self.alloc = PageAllocator(pages, PS)
        radix = RadixCache(self.alloc, insert_mode=mode, speculative=speculative, eviction_policy="lru")
        cfg = SchedulerConfig(
            max_batched_tokens=max(chunk, PS, 1 + drafts) + budget_extra,
            chunk_tokens=chunk,
            max_running=4,
            new_token_ratio=0.0,
            preemption=preemption,
            num_speculative_tokens=drafts,
        )
        self.executor = TenantExecutor(PS)
        alloc = self.alloc.alloc

        def handing_out(n: int) -> list[int]:
            pages = alloc(n)
            self.executor.handed_out(pages)
            return pages

        self.alloc.alloc = handing_out
        self.s = Scheduler(self.alloc, radix, cfg, on_offload=self.executor.offload)
        self.prompts: list[list[int]] = []

    @rule(
        tenant=st.sampled_from(TENANTS),
        prefix=st.integers(0, 1),
        cut=st.integers(4, 24),
        suffix=st.lists(st.integers(0, 30), max_size=10),
        max_new=st.integers(1, 12),
    )
    def arrive(self, tenant, prefix, cut, suffix, max_new):
        self._arrive(PREFIXES[prefix][:cut] + suffix, max_new, tenant)

    @precondition(lambda self: self.prompts)
    @rule(data=st.data(), tenant=st.sampled_from(TENANTS), max_new=st.integers(1, 12))
    def arrive_same_prompt(self, data, tenant, max_new):
        # The same prompt again, in the same or another namespace: only the same namespace may share.
        self._arrive(data.draw(st.sampled_from(self.prompts)), max_new, tenant)

    @rule(
        tenants=st.lists(st.sampled_from(TENANTS), min_size=2, max_size=3),
        prefix=st.integers(0, 1),
        cut=st.integers(8, 24),
        max_new=st.integers(1, 6),
    )
    def arrive_burst(self, tenants, prefix, cut, max_new):
        # Identical prompts arriving together, in one or several namespaces: admitted in one step.
        for tenant in tenants:
            self._arrive(PREFIXES[prefix][:cut], max_new, tenant)

    def _arrive(self, prompt, max_new, tenant):
        extra_key, salt = tenant
        req = self.s.add_request(prompt, max_new, extra_key=extra_key, cache_salt=salt)
        if req.status is not Status.REJECTED:
            self.prompts.append(list(prompt))

    @rule(data=st.data(), twice=st.booleans())
    def step(self, data, twice):
        self._step(data)
        if twice:
            self._step(data)

    def _step(self, data):
        plan = self.s.step()
        self.s.check_integrity()  # in flight too: pages inserted at planning are allowed past num_computed
        for req in plan.admitted:
            if req.num_computed and not req.stats.restored_pages:
                event("admitted with a hit")
            if self.s.radix.num_namespaces > 1:
                event("several namespaces cached")
        sampled = self.executor.run(
            plan,
            self.s,
            lambda k: data.draw(st.integers(0, k)),
            lambda: data.draw(st.integers(0, 30)),
        )
        for req in self.s.update(plan, sampled):
            assert req.status is Status.FINISHED

    @precondition(lambda self: self.s.running)
    @rule(data=st.data())
    def preempt(self, data):
        self.s.preempt(data.draw(st.sampled_from(self.s.running)).id)

    @precondition(lambda self: self.s.running or self.s.waiting)
    @rule(data=st.data())
    def abort(self, data):
        req = data.draw(st.sampled_from(self.s.running + list(self.s.waiting)))
        self.s.abort(req.id)
        self.executor.host.pop(req.id, None)

    @invariant()
    def isolation(self):
        if not hasattr(self, "s"):
            return
        self.s.check_integrity()
        for req in self.s.running:
            ns = (req.extra_key, req.cache_salt)
            if req.node is not None and req.node.parent is not None:
                assert namespace_of_node(req.node) == ns, f"{req} holds a lock in another namespace"
            # Its shared pages are read in its own namespace: they hold its own tokens (computed ones).
            shared_end = min(req.num_shared_pages * PS, req.num_computed)
            self.executor.read(req, ns, shared_end)

    def teardown(self):
        if not hasattr(self, "s"):
            return
        for _ in range(5000):  # a budget of 5 tokens a step with 20 requests waiting takes hundreds of steps
            if self.s.is_idle:
                break
            plan = self.s.step()
            sampled = self.executor.run(plan, self.s, lambda k: 0, lambda: 1)
            self.s.update(plan, sampled)
            self.s.check_integrity()
        assert self.s.is_idle and self.s.radix.protected_tokens == 0


TenantMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestTenantMachine = TenantMachine.TestCase


# ----- plain examples ---------------------------------------------------------------------------------


def make(mode: str = "finish", num_pages: int = 32, **cfg) -> Scheduler:
    alloc = PageAllocator(num_pages, PS)
    return Scheduler(alloc, RadixCache(alloc, insert_mode=mode), SchedulerConfig(**cfg))


def drive(s: Scheduler) -> None:
    while not s.is_idle:
        plan = s.step()
        s.update(plan, [[1] if it.sample else [] for it in plan.items])
        s.check_integrity()


@pytest.mark.parametrize("mode", ["finish", "allocate"])
@pytest.mark.parametrize("field", ["cache_salt", "extra_key"])
def test_identical_prompts_of_two_tenants_never_share_a_page(mode, field):
    s = make(mode, chunk_tokens=8, max_batched_tokens=64)
    prompt = list(range(30))
    a = s.add_request(prompt, 3, **{field: "tenant-a"})
    drive(s)
    b = s.add_request(prompt, 3, **{field: "tenant-b"})
    c = s.add_request(prompt, 3, **{field: "tenant-a"})
    plan = s.step()
    assert b.stats.hit_tokens == 0 and c.stats.hit_tokens == 28  # c: its tenant's pages (all but one token)
    assert not set(b.pages) & set(c.pages)
    s.update(plan, [[1] if it.sample else [] for it in plan.items])
    drive(s)
    assert a.stats.hit_tokens == 0 and s.radix.num_namespaces == 2


def test_same_step_identical_prompts_of_two_tenants_never_share(mode="allocate"):
    s = make(mode, chunk_tokens=32, max_batched_tokens=64)
    prompt = list(range(30))
    a = s.add_request(prompt, 2, cache_salt=1)
    b = s.add_request(prompt, 2, cache_salt=2)
    c = s.add_request(prompt, 2, cache_salt=1)
    plan = s.step()
    assert [it.request for it in plan.items] == [a, b, c]
    assert (a.stats.hit_tokens, b.stats.hit_tokens, c.stats.hit_tokens) == (0, 0, 28)
    assert not set(a.pages) & set(b.pages) and c.pages[:7] == a.pages[:7]


@pytest.mark.parametrize("bad", [[1], 2.5, True, 2**64, {"a": 1}])
def test_bad_namespace_values_queue_nothing(bad):
    s = make()
    for field in ("cache_salt", "extra_key"):
        with pytest.raises(DsakvError, match=field):
            s.add_request([1, 2, 3], 2, **{field: bad})
    assert s.is_idle and s.stats.arrived == 0
