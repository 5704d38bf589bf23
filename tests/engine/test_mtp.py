"""MTP speculative decoding on the tiny model: lossless, and every cache of every layer exact.

Reference runs: plain greedy decoding (the tokens), and ``num_speculative_tokens = 0`` (the MTP layer runs on every
computed token and drafts nothing: the MTP layer's cache a non-speculative run writes). A speculative run
must give the same tokens, and every finished request's caches -- both caches of every target layer and of
the MTP layer -- must read back bit-identical to the ``num_speculative_tokens = 0`` run's.

The tiny model's MTP layer has random weights, so its greedy drafts are almost never accepted; an *oracle*
draft choice (the reference's own next token, wrong at chosen indices) makes accepted prefixes, mid-page
rejects and multi-page jumps happen. Verification keeps the tokens whatever the drafts are.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.engine.readback import read_request_cache
from dsakv.errors import DsakvError
from dsakv.scheduler import SchedulerConfig
from dsakv.scheduler.pages import pages_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAGE = 16
NEW = 10
VOCAB = 512


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    shared = torch.randint(0, VOCAB, (40,), generator=g).tolist()  # 2.5 pages shared: prefix hits
    return [shared + torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (27, 9, 34)]


def make_engine(num_pages: int = 64, choice=None, **kw) -> Engine:
    sched = dict(chunk_tokens=32, max_batched_tokens=64) | kw.pop("scheduler", {})
    cfg = EngineConfig(
        num_pages=num_pages, page_size=PAGE, capture_cache=True, scheduler=SchedulerConfig(**sched), **kw
    )
    return Engine(cfg, draft_choice=choice)


def run(engine: Engine) -> list:
    """The first prompt alone, then the rest (their shared prefix hits the first one's pages)."""
    ps = prompts()
    out = engine.generate(ps[:1], NEW) + engine.generate(ps[1:], NEW)
    engine.check_integrity()
    return out


def oracle(reference: list, reject_every: int = 0):
    """Draft the reference's token at each index, a wrong one where ``index % reject_every == 0``."""
    full = {i: p + r.output_tokens for i, (p, r) in enumerate(zip(prompts(), reference))}
    by_prompt = {tuple(v[: len(p)]): v for v, p in zip(full.values(), prompts())}

    def choose(req, index: int, logits: torch.Tensor) -> int:
        seq = by_prompt[tuple(req.prompt)]
        if index >= len(seq):
            return int(logits.argmax())
        wrong = reject_every and index % reject_every == 0
        return (seq[index] + 1) % VOCAB if wrong else seq[index]

    return choose


@pytest.fixture(scope="module")
def plain():
    return run(make_engine())


@pytest.fixture(scope="module")
def mtp_reference(plain):
    res = run(make_engine(speculative="mtp", num_speculative_tokens=0))
    assert [r.output_tokens for r in res] == [r.output_tokens for r in plain]
    return res


def assert_same(res, plain, mtp_reference) -> None:
    assert [r.output_tokens for r in res] == [r.output_tokens for r in plain]
    for got, want in zip(res, mtp_reference):
        assert got.cache.num_tokens == want.cache.num_tokens
        assert got.cache.equals(want.cache), f"request {got.request_id}: a cache byte differs"


@pytest.mark.parametrize("k", [1, 3, 5])
def test_mtp_tokens_and_every_cache_equal_the_non_speculative_run(k, plain, mtp_reference):
    # 9 pages: the later two requests must evict the first one's cached tail; chunks of 32 tokens
    eng = make_engine(num_pages=9, choice=oracle(plain, reject_every=4), speculative="mtp", num_speculative_tokens=k)
    res = run(eng)
    assert_same(res, plain, mtp_reference)
    assert len(eng.layout.indexer_layers) == len(eng.spec.full_indexer_layers) + 1  # the MTP layer's own indexer
    assert sum(r.stats.accepted_draft_tokens for r in res) > 0
    assert sum(r.stats.draft_tokens for r in res) > sum(r.stats.accepted_draft_tokens for r in res)
    assert any(r.stats.hit_tokens > 0 for r in res)
    assert eng.radix.metrics.evicted_tokens > 0


@pytest.mark.parametrize("kw", [dict(pool_kind="packed"), dict(insert_mode="allocate")])
def test_mtp_in_the_packed_layout_and_with_insert_at_allocation(kw, plain, mtp_reference):
    eng = make_engine(
        num_pages=9, choice=oracle(plain, reject_every=4), speculative="mtp", num_speculative_tokens=3, **kw
    )
    assert_same(run(eng), plain, mtp_reference)


def test_greedy_mtp_drafts_are_verified_losslessly(plain, mtp_reference):
    eng = make_engine(speculative="mtp", num_speculative_tokens=2)
    res = run(eng)
    assert_same(res, plain, mtp_reference)
    assert all(r.stats.draft_tokens > 0 for r in res)


@pytest.mark.parametrize("mode", ["recompute", "offload"])
def test_preemption_during_mtp_decoding_keeps_tokens_and_caches(mode, plain, mtp_reference):
    ps = prompts()
    # prompts of 5 + 4 + 5 pages admitted optimistically into 14; decoding needs 15: a request is preempted
    # (greedy drafts: the oracle's accepted ones would finish the others first and leave room)
    sched = dict(new_token_ratio=0.0, preemption=mode)
    eng = make_engine(num_pages=14, speculative="mtp", num_speculative_tokens=3, prefix_cache=False, scheduler=sched)
    res = eng.generate(ps, NEW)
    eng.check_integrity()
    assert sum(r.stats.preemptions for r in res) > 0
    assert_same(res, plain, mtp_reference)  # the reference ran with prefix hits, this one with preemptions


def test_forced_mid_page_reject_invalidates_both_caches_tails_together():
    """Drafts cross into the next page and are rejected mid-page: that page is freed (every layer's main KV
    and indexer K, the MTP layer's included: one page id), and at every step each cache of each layer reads
    back exact up to the accepted end, so no rejected draft's row is ever read as valid."""
    new = 20
    prompt = prompts()[0]
    reference = make_engine(speculative="mtp", num_speculative_tokens=0, prefix_cache=False).generate([prompt], new)[0]
    ref, want = reference.output_tokens, reference.cache
    full = prompt + ref
    # prompt 67 tokens, a 5-step chain: step 1 accepts all (end 73); step 2 drafts 74..78, rejects 76 (end
    # 76); step 3 drafts 77..81 -- into page 5 -- and rejects 79: the accepted end 79 is mid-page 4
    reject = {76, 79}

    def choose(req, index, logits):
        return (full[index] + 1) % VOCAB if index in reject else full[index] if index < len(full) else 0

    eng = make_engine(choice=choose, speculative="mtp", num_speculative_tokens=5, prefix_cache=False)
    req = eng.add_request(prompt, new)
    plan_step, held = eng.scheduler.step, []

    def step():  # the pages the request holds while the step's drafts are written
        plan = plan_step()
        held.append(len(req.pages))
        return plan

    eng.scheduler.step = step
    seen_reject = False
    while not eng.scheduler.is_idle:  # inspect the request after each step
        eng.step()
        eng.check_integrity()
        if req.num_computed and not req.is_done:
            n = req.num_computed
            got = read_request_cache(eng.pool, req.pages, n)
            assert all(torch.equal(a, b[:n]) for a, b in zip(got.main, want.main))
            assert all(torch.equal(a, b[:n]) for a, b in zip(got.indexer_keys, want.indexer_keys))
            assert all(torch.equal(a, b[:n]) for a, b in zip(got.indexer_scales, want.indexer_scales))
            assert len(req.pages) == pages_for(n, PAGE)
            if n % PAGE and held[-1] > len(req.pages):
                seen_reject = True  # a draft page was freed with the accepted end mid-page
    assert seen_reject
    assert req.outputs == ref


def test_a_hit_after_a_speculative_run_drops_exactly_one_page():
    prompt = prompts()[0]  # 67 tokens: 4 whole pages
    hits = {}
    for spec in (None, "mtp"):
        kw = dict(speculative="mtp", num_speculative_tokens=2) if spec else {}
        eng = make_engine(**kw)
        first = eng.generate([prompt], NEW)[0]
        again = eng.generate([prompt], NEW)[0]
        assert again.output_tokens == first.output_tokens
        hits[spec] = again.stats.hit_tokens
    # plain: (67 - 1) // 16 = 4 pages; bigram keys match the same 4 and the speculative rule drops the last
    assert hits[None] == 4 * PAGE
    assert hits["mtp"] == hits[None] - PAGE


def test_a_one_token_prompt_decodes_with_mtp_from_its_first_step():
    plain = make_engine().generate([[5], [7, 9]], NEW)
    res = make_engine(speculative="mtp", num_speculative_tokens=3).generate([[5], [7, 9]], NEW)
    assert [r.output_tokens for r in res] == [r.output_tokens for r in plain]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(speculative="eagle", num_speculative_tokens=1), "speculative"),
        (dict(speculative="mtp", num_speculative_tokens=-1), "num_speculative_tokens"),
        (dict(speculative="mtp", num_speculative_tokens=True), "num_speculative_tokens"),
        (dict(speculative="mtp", num_speculative_tokens=3, eagle_topk=5), "eagle_topk"),
        (dict(num_speculative_tokens=3), "num_speculative_tokens"),
        (dict(index_share_for_mtp_iteration=True), "index_share_for_mtp_iteration"),
        (
            dict(speculative="mtp", num_speculative_tokens=3, scheduler=SchedulerConfig(num_speculative_tokens=2)),
            "num_speculative_tokens",
        ),
    ],
)
def test_bad_speculative_config_is_a_one_line_error_naming_the_field(kw, field):
    with pytest.raises(DsakvError) as err:
        EngineConfig(**kw)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_speculative_config_in_sglang_terms_is_accepted():
    cfg = EngineConfig(speculative="mtp", num_speculative_tokens=3, eagle_topk=1)
    assert cfg.num_speculative_tokens == 3 and cfg.mtp_layers == 1
    assert EngineConfig(speculative="mtp").num_speculative_tokens == 0  # the MTP layer runs, nothing is drafted


def test_index_share_keeps_tokens_and_caches_and_scores_fewer_indexer_rows(plain, mtp_reference):
    a = make_engine(choice=oracle(plain, 5), speculative="mtp", num_speculative_tokens=3)
    b = make_engine(
        choice=oracle(plain, 5), speculative="mtp", num_speculative_tokens=3, index_share_for_mtp_iteration=True
    )
    ra, rb = run(a), run(b)
    assert_same(rb, plain, mtp_reference)
    assert a.speculator.totals.chain_rows == b.speculator.totals.chain_rows > 0
    assert b.speculator.totals.indexer_rows_read < a.speculator.totals.indexer_rows_read
    del ra


def test_mtp_pages_go_down_to_the_host_tier_and_come_back_with_the_target_pages(plain, mtp_reference):
    """A page is one unit across tiers: the MTP layer's rows written back and loaded with the target's."""
    eng = make_engine(
        num_pages=9, speculative="mtp", num_speculative_tokens=3, host_bytes=32 * make_engine().layout.page_bytes
    )
    ps = prompts()
    first = eng.generate([ps[0]], NEW)[0]
    for p in ps[1:]:  # push the first request's pages out of the 9-page pool into host memory
        eng.generate([p], NEW)
    again = eng.generate([ps[0]], NEW)[0]
    eng.check_integrity()
    assert again.stats.hit_tokens_host > 0
    assert first.output_tokens == again.output_tokens == plain[0].output_tokens
    assert again.cache.equals(mtp_reference[0].cache)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(1, 6), rejects=st.sets(st.integers(40, 90), max_size=12), kind=st.sampled_from(["slot", "packed"]))
def test_any_accept_reject_pattern_keeps_tokens_and_every_cache(k, rejects, kind, plain, mtp_reference):
    """Random chain lengths and reject positions (a wrong draft at each index in ``rejects``)."""
    full = {tuple(p): p + r.output_tokens for p, r in zip(prompts(), plain)}

    def choose(req, index, logits):
        seq = full[tuple(req.prompt)]
        if index >= len(seq):
            return 0
        return (seq[index] + 1) % VOCAB if index in rejects else seq[index]

    eng = make_engine(num_pages=9, choice=choose, speculative="mtp", num_speculative_tokens=k, pool_kind=kind)
    assert_same(run(eng), plain, mtp_reference)


def test_an_accepted_eos_ends_the_request_with_every_cache_exact():
    prompt = prompts()[2]
    base = make_engine().generate([prompt], 20)[0].output_tokens
    eos, full = base[7], prompt + base
    plain = make_engine().generate([prompt], 20, eos_token_id=eos)[0]
    ref = make_engine(speculative="mtp", num_speculative_tokens=0).generate([prompt], 20, eos_token_id=eos)[0]
    eng = make_engine(
        speculative="mtp", num_speculative_tokens=3, choice=lambda req, i, logits: full[i] if i < len(full) else 0
    )
    got = eng.generate([prompt], 20, eos_token_id=eos)[0]
    assert got.output_tokens == plain.output_tokens and got.output_tokens[-1] == eos
    assert got.stats.accepted_draft_tokens > 0 and got.cache.equals(ref.cache)
