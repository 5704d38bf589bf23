"""End to end on the tiny DSA model (issue 11):

* item 1: two tenants with identical prompts never share a page, whether they run side by side or one
  after the other; a tenant still shares with itself; outputs and cache read-backs are those of the run
  without a prefix cache;
* item 4: identical prompts admitted in one step share pages in ``allocate`` mode (a request reads pages an
  earlier item of the same step writes, in the same forward or an earlier one), and every output token
  and every cache byte stays bit-identical to the runs without sharing.
"""

from __future__ import annotations

import pytest

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.errors import DsakvError
from dsakv.scheduler import SchedulerConfig
from dsakv.workloads.chat import compare

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAGE = 16
PROMPT = [(7 * i + 3) % 200 for i in range(2 * PAGE + 5)]  # 2 full pages and 5 tokens


def engine(mode: str | None, **sched) -> Engine:
    cfg = EngineConfig(
        num_pages=96,
        page_size=PAGE,
        capture_cache=True,
        prefix_cache=mode is not None,
        insert_mode=mode or "finish",
        scheduler=SchedulerConfig(**sched),
    )
    return Engine(cfg)


def record_pages(eng: Engine) -> list:
    """Wrap the scheduler's ``step``: per step, (request id, the pages its item reads or writes) per item."""
    steps: list = []
    plan_step = eng.scheduler.step

    def step():
        plan = plan_step()
        steps.append([(item.request.id, set(item.request.pages)) for item in plan.items])
        return plan

    eng.scheduler.step = step
    return steps


@pytest.mark.parametrize("mode", ["finish", "allocate"])
@pytest.mark.parametrize("field", ["cache_salt", "extra_key"])
def test_two_tenants_with_identical_prompts_never_share_a_page(mode, field):
    eng = engine(mode, chunk_tokens=PAGE, max_batched_tokens=4 * PAGE)
    steps = record_pages(eng)
    tenant = {"a": [], "b": [], "c": []}
    # Side by side: a, b and a again arrive together; then c (new) and a once more, after those finished.
    for name in ("a", "b", "a"):
        tenant[name].append(eng.add_request(PROMPT, 6, **{field: f"tenant-{name}"}))
    eng.run_until_idle()
    for name in ("c", "a", "b"):
        tenant[name].append(eng.add_request(PROMPT, 6, **{field: f"tenant-{name}"}))
    eng.run_until_idle()
    eng.check_integrity()
    ids = {name: {r.id for r in reqs} for name, reqs in tenant.items()}
    for step_items in steps:  # within a step, the tenants' pages are disjoint
        pages = [set().union(*[p for rid, p in step_items if rid in ids[name]]) for name in "abc"]
        assert not (pages[0] & pages[1] or pages[0] & pages[2] or pages[1] & pages[2])
    # b and c never hit another tenant's pages: not beside a, not after a cached the very same prompt.
    # Each tenant hits its own cached pages.
    assert [r.stats.hit_tokens for r in tenant["b"]] == [0, 2 * PAGE]
    assert [r.stats.hit_tokens for r in tenant["c"]] == [0]
    assert tenant["a"][-1].stats.hit_tokens == 2 * PAGE
    if mode == "allocate":  # the second a of the first batch shared a's pages within the step
        assert tenant["a"][1].stats.hit_tokens == PAGE
    # Isolation changes no result: every request's outputs and caches equal a run without a prefix cache.
    ref = engine(None).generate([PROMPT], 6)[0]
    for r in tenant["a"] + tenant["b"] + tenant["c"]:
        assert r.outputs == ref.output_tokens
        assert eng.caches[r.id].equals(ref.cache)


def test_generate_takes_one_namespace_per_prompt_or_one_for_all():
    eng = engine("finish")
    out = eng.generate([PROMPT, PROMPT], 4, cache_salt=["x", "y"])
    assert [r.stats.hit_tokens for r in out] == [0, 0]
    again = eng.generate([PROMPT, PROMPT], 4, cache_salt=("x", "y"))
    assert [r.stats.hit_tokens for r in again] == [2 * PAGE, 2 * PAGE]
    shared = eng.generate([PROMPT], 4, extra_key="lora-1", cache_salt="x")
    assert shared[0].stats.hit_tokens == 0  # (lora-1, x) is a namespace of its own
    assert eng.radix.num_namespaces == 3
    for kw, msg in (
        (dict(cache_salt=["x"]), "1 values for 2 prompts"),
        (dict(extra_key=[1.5, 2]), r"extra_key\[0\]"),
        (dict(cache_salt={"x"}), "cache_salt"),
    ):
        with pytest.raises(DsakvError, match=msg):
            eng.generate([PROMPT, PROMPT], 4, **kw)
    with pytest.raises(DsakvError, match="cache_salt"):
        eng.add_request(PROMPT, 4, cache_salt=[1])
    assert eng.scheduler.is_idle
    eng.check_integrity()


def test_identical_prompts_in_one_step_share_pages_and_stay_bit_identical():
    # 14 identical prompts in one step: in allocate mode the first writes its 2 full pages and the other 13
    # read them in that same step. Their 5-token items are padded to 16 rows and the padding rows of one
    # forward are capped, so they span two forwards: some read pages written in their own forward (each
    # layer writes every item's rows before any item reads), the others pages written in an earlier one.
    prompts = [PROMPT] * 14 + [PROMPT[:-3] + [1, 2, 3]]
    runs = {}
    for mode in (None, "finish", "allocate"):
        eng = engine(mode)
        runs[mode] = (eng, eng.generate(prompts, 5))
        eng.check_integrity()
    shared_eng, shared = runs["allocate"]
    assert [r.stats.admit_step for r in shared] == [0] * len(prompts)
    assert [r.stats.hit_tokens for r in shared] == [0] + [2 * PAGE] * (len(prompts) - 1)
    assert shared_eng.totals.forward_calls > shared_eng.totals.steps  # the first step took two forwards
    assert sum(r.stats.pages_written for r in shared) < sum(r.stats.pages_written for r in runs["finish"][1])
    assert [r.stats.hit_tokens for r in runs["finish"][1]] == [0] * len(prompts)
    for mode in ("finish", "allocate"):
        assert compare(runs[mode][1], runs[None][1]) == (True, True)


def test_a_request_never_writes_a_page_another_request_writes_in_the_same_step():
    # Page-aligned identical prompts: the second hits one page (the one-token rule leaves the last page to
    # compute), and the tree already holds that last page, which the first writes in this step. Adopting it
    # would make both write the same slots in one forward: the second keeps its own copy until the step is
    # done. Outputs and caches stay those of the run without a prefix cache.
    aligned = PROMPT[: 2 * PAGE]
    ref = engine(None).generate([aligned, aligned], 4)
    eng = engine("allocate")
    out = eng.generate([aligned, aligned], 4)
    eng.check_integrity()
    assert [r.stats.hit_tokens for r in out] == [0, PAGE] and [r.stats.admit_step for r in out] == [0, 0]
    assert compare(out, ref) == (True, True)
