"""Scheduler in metadata-only mode under memory pressure and speculative decoding: preemption modes and
victim orders, recompute resume, draft rollback at a token boundary, drafts kept out of the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest
from test_scheduler import PS, drive, make, prompt  # the metadata-only driver beside this file

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.policies import PREEMPTION_MODES, VICTIM_ORDERS, pick_victim
from dsakv.scheduler.request import Status
from dsakv.scheduler.scheduler import Scheduler


def test_unknown_policy_names_are_rejected_with_the_valid_names():
    with pytest.raises(DsakvError, match="requeue = 'middle': must be one of front, back"):
        SchedulerConfig(requeue="middle")
    with pytest.raises(
        DsakvError, match=r"new_token_ratio_min = 0.8: must be None \(a constant ratio\) or a number in"
    ):
        SchedulerConfig(new_token_ratio=0.7, new_token_ratio_min=0.8)
    with pytest.raises(DsakvError, match="new_token_ratio_decay_steps = 0: must be a positive integer"):
        SchedulerConfig(new_token_ratio_min=0.1, new_token_ratio_decay_steps=0)
    with pytest.raises(DsakvError, match="new_token_clip = 0: must be a positive integer"):
        SchedulerConfig(new_token_clip=0)
    with pytest.raises(DsakvError, match="preemption = 'swap': must be one of " + ", ".join(PREEMPTION_MODES)):
        SchedulerConfig(preemption="swap")
    with pytest.raises(DsakvError, match="victim_order = 'oldest': must be one of " + ", ".join(VICTIM_ORDERS)):
        SchedulerConfig(victim_order="oldest")


def test_new_token_ratio_one_never_preempts():
    s = make(num_pages=12, new_token_ratio=1.0)
    for i in range(6):
        s.add_request(prompt(150, base=i * 11), 100)
    drive(s)
    assert s.stats.preemptions == 0 and s.stats.finished == 6


@pytest.mark.parametrize("mode", sorted(PREEMPTION_MODES))
def test_new_token_clip_admits_on_the_clipped_reserve_and_takes_the_rest_as_written(mode):
    # Two requests of 2-page prompts that may write 6 pages more, in a 12-page pool at ratio 1: unclipped each
    # is estimated at its 8-page peak, so the second waits for the first to finish and nothing is preempted.
    # Clipped at 2 pages of output (SGLang's CLIP_MAX_NEW_TOKENS_ESTIMATION) each is admitted for 4 pages, both
    # run at once, outgrow their estimates and one is preempted; both still write every token.
    def run(clip):
        s = make(num_pages=12, cache=False, new_token_ratio=1.0, new_token_clip=clip, preemption=mode)
        reqs = [s.add_request(prompt(2 * PS, base=i * 29), 6 * PS) for i in range(2)]
        first = s.step()
        estimates = [r.estimated_pages for r in first.admitted]
        s.update(first, [[7] if it.sample else [] for it in first.items])
        done = drive(s)
        assert len(done) == 2 and all(len(r.outputs) == 6 * PS for r in reqs)
        return first.admitted == reqs[: len(estimates)], estimates, s.stats.preemptions

    assert run(None) == (True, [8], 0)
    in_order, estimates, preemptions = run(2 * PS)
    assert in_order and estimates == [4, 4] and preemptions > 0


@pytest.mark.parametrize("mode", sorted(PREEMPTION_MODES))
@pytest.mark.parametrize("order", sorted(VICTIM_ORDERS))
def test_preemption_under_pressure_completes_every_request(mode, order):
    s = make(num_pages=10, new_token_ratio=0.0, preemption=mode, victim_order=order)
    for i in range(6):
        s.add_request(prompt(120 + 20 * i, base=i * 13), 150)
    done = drive(s)
    assert len(done) == 6 and all(len(r.outputs) == 150 for r in done)
    assert s.stats.preemptions > 0
    if mode == "offload":
        assert s.stats.offloaded_pages == s.stats.restored_pages > 0


@pytest.mark.parametrize("requeue, order", [("front", ["C", "D"]), ("back", ["D", "C"])])
def test_a_preempted_request_waits_at_the_configured_end_of_the_queue(requeue, order):
    # The victim-order set-up below (newest victim: C), with D waiting behind max_running = 3. vLLM prepends its
    # victim to the waiting queue, SGLang appends its retracted request behind those already waiting.
    s = make(num_pages=4, cache=False, new_token_ratio=0.0, max_running=3, requeue=requeue)
    reqs = [
        s.add_request(prompt(n, base=n), 100, request_id=rid)
        for rid, n in (("A", 60), ("B", 100), ("C", 10), ("D", 10))
    ]
    preempted = []
    while not preempted:
        plan = s.step()
        preempted = [r.id for r in plan.preempted]
        s.update(plan, [[1] if it.sample else [] for it in plan.items])
    assert preempted == ["C"] and [r.id for r in s.waiting] == order
    drive(s)
    assert all(len(r.outputs) == 100 for r in reqs)


def test_fewest_outputs_breaks_ties_by_the_most_recently_admitted():
    # SGLang's retract_decode sorts by (outputs, -prompt) descending and pops the last: among equals, the newest.
    s = make()
    reqs = [s.add_request(prompt(64, base=i), 10, request_id=str(i)) for i in range(3)]
    assert pick_victim("fewest_outputs", reqs, set()).id == "2"
    assert pick_victim("fewest_outputs", reqs, {id(reqs[2])}).id == "1"


@pytest.mark.parametrize("order, victim", [("newest", "C"), ("fewest_outputs", "B"), ("most_pages", "B")])
def test_victim_order_picks_the_documented_request(order, victim):
    # Pool of 4 pages: A (60-token prompt, 1 page), B (100, 2 pages), C (10, 1 page), admitted together.
    # A crosses a page boundary first and must take a victim: newest admitted = C; fewest outputs (all
    # equal), then longest prompt = B; most pages = B.
    s = make(num_pages=4, cache=False, new_token_ratio=0.0, victim_order=order)
    for rid, n in (("A", 60), ("B", 100), ("C", 10)):
        s.add_request(prompt(n, base=n), 100, request_id=rid)
    preempted = []
    while not preempted:
        plan = s.step()
        preempted = [r.id for r in plan.preempted]
        s.update(plan, [[1] if it.sample else [] for it in plan.items])
    assert preempted == [victim] and s.get("A").num_computed == 65


def test_recompute_resume_hits_its_own_cached_prefix():
    s = make(num_pages=32)
    r = s.add_request(prompt(300), 40)
    for _ in range(10):
        plan = s.step()
        s.update(plan, [[1] if it.sample else [] for it in plan.items])
    s.preempt(r.id)
    s.check_integrity()
    assert r.status is Status.WAITING and not r.pages
    drive(s)
    assert r.stats.resume_hit_tokens == (300 + 9) // PS * PS and r.stats.preemptions == 1


def test_speculative_rollback_frees_whole_pages_past_the_accepted_end():
    s = make(num_pages=16, cache=False, num_speculative_tokens=4)
    r = s.add_request(prompt(PS - 2), 20)
    s.update(s.step(), [[5]])  # prefill: positions 0..61 computed, one token out
    plan = s.step()  # decode: last token + 4 drafts -> positions 62..66 (two pages)
    (item,) = plan.items
    assert item.num_draft == 4 and len(r.pages) == 2
    s.update(plan, [[6]])  # every draft rejected
    assert r.num_computed == PS - 1 and len(r.pages) == 1 and r.outputs == [5, 6]
    s.check_integrity()
    plan = s.step()
    s.update(plan, [[1, 2, 3, 4, 9]])  # all four accepted + the model's own token
    assert r.num_computed == PS + 4 and r.outputs == [5, 6, 1, 2, 3, 4, 9]
    s.check_integrity()


@pytest.mark.parametrize("mode", ["finish", "allocate"])
def test_rejected_draft_positions_never_enter_the_prefix_cache(mode):
    # Prompt ends one token before a page boundary, so every decode's drafts spill into the next page.
    # All drafts are rejected: the tree may only ever hold pages of verified tokens (prompt + outputs).
    s = make(num_pages=16, mode=mode, num_speculative_tokens=3)
    r = s.add_request(prompt(2 * PS - 1), 6)
    drafted = 0
    while not s.is_idle:
        plan = s.step()
        for it in plan.items:
            drafted += it.num_draft
            if it.num_draft:
                assert it.end + it.num_draft > 2 * PS and len(r.pages) == 3  # drafts reach the third page
        s.update(plan, [[40 + len(r.outputs)] if it.sample else [] for it in plan.items])
        s.check_integrity()
        cached = s.radix.total_tokens
        verified = r.prompt_len + len(r.outputs) - (0 if r.is_done else 1)
        assert cached <= verified // PS * PS  # never a page holding an unverified position
    assert drafted > 0 and r.outputs == [40, 41, 42, 43, 44, 45]
    assert s.radix.total_tokens == 2 * PS  # prompt + first output: the only whole verified pages
    assert s.allocator.num_free == 16 - 2  # the draft-only page came back


def test_speculative_leaks_nothing_under_random_acceptance():
    rng = np.random.default_rng(0)
    s = make(num_pages=10, new_token_ratio=0.0, num_speculative_tokens=3, preemption="offload")
    for i in range(6):
        s.add_request(prompt(100 + 30 * i, base=i), 80)
    drive(s, accept=lambda item: int(rng.integers(0, item.num_draft + 1)))
    assert s.radix.protected_tokens == 0


@pytest.mark.parametrize("mode", ["finish", "allocate"])
def test_speculative_bigram_cache_keeps_every_page_accounted_at_finish(mode):
    # The bigram tree keys one page fewer than the whole pages of a request: the last page must stay the
    # request's and be freed, not handed to a tree that never stores it (a page leaked per finish).
    alloc = PageAllocator(8, 64, first_page=1)
    radix = RadixCache(alloc, speculative=True, insert_mode=mode)
    sched = Scheduler(alloc, radix, SchedulerConfig(max_batched_tokens=256, chunk_tokens=256, num_speculative_tokens=1))
    sched.add_request(list(range(128)), 2)
    while not sched.is_idle:
        plan = sched.step()
        sched.update(plan, [[7] if it.sample else [] for it in plan.items])
        sched.check_integrity()
    assert radix.total_tokens >= 64  # the prompt's pages were cached
    assert alloc.num_free + radix.total_tokens // 64 == alloc.num_pages  # and no page is lost


def test_the_ratio_tracker_decays_per_decode_step_and_resets_as_sglang_does():
    # SGLang's NewTokenRatioTracker: down by (init - min) / decay_steps each decode step, to (outputs + 20 x n) /
    # (max_new + 1) of the requests left after a retraction, back to init when idle.
    s = make(num_pages=6, cache=False, new_token_ratio=0.7, new_token_ratio_min=0.1, new_token_ratio_decay_steps=4)
    assert s.new_token_ratio == 0.7
    reqs = [s.add_request(prompt(60, base=i * 31), 3 * PS) for i in range(2)]
    plan = s.step()  # both prefills (one page each): no decode, no decay
    s.update(plan, [[7] for _ in plan.items])
    assert s.new_token_ratio == 0.7
    ratios = []
    while not s.stats.preemptions:
        plan = s.step()
        ratios.append(s.new_token_ratio)
        s.update(plan, [[7] if it.sample else [] for it in plan.items])
    assert ratios[:-1] == pytest.approx([0.55, 0.4, 0.25] + [0.1] * (len(ratios) - 4))
    (left,) = s.running
    # after the preemption, set when the step was planned: the one left had one output fewer than now
    assert ratios[-1] == pytest.approx((len(left.outputs) - 1 + 20) / (3 * PS + 1))
    drive(s)
    assert all(len(r.outputs) == 3 * PS for r in reqs)
    s.step()  # idle
    assert s.new_token_ratio == 0.7


def test_with_the_tracker_a_new_request_is_checked_at_its_whole_output():
    # At a decayed ratio a running request reserves little, but SGLang's add_one_req checks a new one at ratio 1:
    # a 1-page prompt that may write 4 pages waits in a pool with 4 free pages, admitted on a constant ratio 0.5.
    def admitted(**tracker):
        s = make(num_pages=6, cache=False, new_token_ratio=0.5, **tracker)
        s.add_request(prompt(2 * PS - 8, base=1), 8)  # 2 pages, its 8 outputs stay in them
        plan = s.step()
        s.update(plan, [[7] for _ in plan.items])
        late = s.add_request(prompt(PS, base=2), 4 * PS)  # 1 + ceil(r x 4 pages) of the 4 free
        plan = s.step()
        s.update(plan, [[7] if it.sample else [] for it in plan.items])
        return late in plan.admitted

    assert admitted()  # 1 + 2 pages at 0.5
    assert not admitted(new_token_ratio_min=0.1)  # 1 + 4 pages at 1
