"""Engine: bad input, and regressions for the engines' known bug classes (leaks under preemption and
speculative decoding, never-fit admissions, resumed requests reading another request's indexer entries)."""

from __future__ import annotations

import pytest
import torch

import dsakv
from dsakv.engine.config import SCRATCH_SEQS
from dsakv.engine.engine import Engine, EngineConfig
from dsakv.engine.readback import read_request_cache
from dsakv.errors import DsakvError
from dsakv.model.inputs import request_slots
from dsakv.planner.budget import scratch_pages
from dsakv.scheduler import SchedulerConfig
from dsakv.scheduler.request import Status

PAGE = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def engine(num_pages=32, **sched) -> Engine:
    cfg = EngineConfig(num_pages=num_pages, page_size=PAGE, capture_cache=True, scheduler=SchedulerConfig(**sched))
    return Engine(cfg)


def prompt(n, base=0):
    return [(base + 37 * i) % 512 for i in range(n)]


def assert_no_leak(e: Engine) -> None:
    e.check_integrity()
    assert e.scheduler.is_idle and e.radix.protected_tokens == 0 and not e.host_copies
    assert e.allocator.num_free + e.radix.total_tokens // PAGE == e.allocator.num_pages


def test_engine_and_scheduler_are_exported():
    assert dsakv.Engine is Engine and dsakv.Scheduler is not None


def test_out_of_vocab_token_raises_and_queues_nothing():
    e = engine()
    with pytest.raises(DsakvError, match=r"prompts\[1\].*0\.\.511"):
        e.generate([prompt(20), [1, 512]], 3)
    with pytest.raises(DsakvError, match="0..511"):
        e.add_request([-1, 3], 3)
    assert e.scheduler.is_idle and e.scheduler.stats.arrived == 0


@pytest.mark.parametrize("bad", [[[1, 2], [3, 4]], [1.5, 2.0], "abc", [True, False]])
def test_malformed_prompt_is_refused_before_any_prompt_is_queued(bad):
    e = engine()
    with pytest.raises(DsakvError, match=r"prompts\[1\]: prompt"):
        e.generate([prompt(20), bad], 3)
    assert e.scheduler.is_idle and e.scheduler.stats.arrived == 0


@pytest.mark.parametrize("page_size, min_rows", [(16, 16), (64, 16), (16, 3), (64, 100)])
def test_engine_keeps_the_scratch_pages_its_padding_needs(page_size, min_rows):
    # Up to SCRATCH_SEQS sequences padded to min_rows share one forward, each padding row in its own slot.
    e = Engine(EngineConfig(num_pages=8, page_size=page_size, min_rows=min_rows))
    need = scratch_pages(page_size, SCRATCH_SEQS * min_rows)
    assert e.allocator.first_page == need >= SCRATCH_SEQS * min_rows / page_size
    assert e.pool.num_physical_pages == need + 8 and e.allocator.num_pages == 8
    assert all(e.pool.page_is_writable(p) and not e.allocator.is_allocated(p) for p in range(need))


def test_negative_max_new_tokens_raises():
    with pytest.raises(DsakvError, match="max_new_tokens"):
        engine().generate([prompt(20)], -1)


def test_empty_and_never_fit_prompts_are_rejected_while_others_run():
    e = engine(num_pages=8)
    too_big = prompt(8 * PAGE + 1)
    beyond_context = prompt(4095)  # + 4 new tokens > max_position_embeddings 4096
    res = e.generate([prompt(40), [], too_big, beyond_context, prompt(30, base=5)], 4)
    assert [r.stats.outcome for r in res] == ["finished", "rejected", "rejected", "rejected", "finished"]
    assert "empty" in res[1].stats.reason
    assert "pool has 8" in res[2].stats.reason
    assert "context limit 4096" in res[3].stats.reason
    assert len(res[0].output_tokens) == len(res[4].output_tokens) == 4
    assert_no_leak(e)


def test_abort_unknown_finished_and_running_requests():
    e = engine()
    with pytest.raises(DsakvError, match="unknown"):
        e.abort(12345)
    done = e.generate([prompt(20)], 2)[0]
    with pytest.raises(DsakvError, match="already finished"):
        e.abort(done.request_id)
    a = e.add_request(prompt(50), 20)
    b = e.add_request(prompt(50, base=3), 5)
    e.step()
    e.abort(a.id)
    e.run_until_idle()
    assert a.status is Status.ABORTED and b.status is Status.FINISHED and len(b.outputs) == 5
    assert_no_leak(e)


@pytest.mark.parametrize("mode", ["recompute", "offload"])
def test_no_leak_under_preemption_and_speculative_decoding(mode):
    # Three requests of 2-3 pages on a 4-page pool with mostly wrong drafts: memory pressure preempts one
    # mid-speculation, rollbacks free draft pages; every step keeps the invariants and idle leaks nothing.
    def drafter(request, k):
        return [(len(request.outputs) * 7 + i) % 512 for i in range(k)]

    sched = dict(chunk_tokens=32, max_batched_tokens=64, new_token_ratio=0.0, preemption=mode, num_speculative_tokens=2)
    e = Engine(EngineConfig(num_pages=4, page_size=PAGE, scheduler=SchedulerConfig(**sched)), drafter=drafter)
    reqs = [e.add_request(prompt(24 + 4 * i, base=i), 10) for i in range(3)]
    while not e.scheduler.is_idle:
        e.step()
        e.check_integrity()
    st = e.scheduler.stats
    assert st.preemptions > 0 and (st.offloaded_pages > 0) == (mode == "offload")
    assert all(len(r.outputs) == 10 for r in reqs)
    assert sum(r.stats.accepted_draft_tokens for r in reqs) < sum(r.stats.draft_tokens for r in reqs)
    assert_no_leak(e)


def test_offloaded_request_resumes_with_its_own_indexer_entries():
    # A is offloaded mid-decode; B then takes A's old pages and writes its own keys there. A must come
    # back with its own bytes (restored into new pages), never read B's indexer entries.
    ref = engine(num_pages=32)
    ref_out = ref.generate([prompt(70)], 12)[0]
    e = engine(num_pages=32, preemption="offload")
    a = e.add_request(prompt(70), 12)
    for _ in range(4):
        e.step()
    old_pages = list(a.pages)
    e.scheduler.preempt(a.id)
    b = e.add_request(prompt(70, base=11), 3)
    e.scheduler.waiting.rotate(-1)  # B ahead of A in the queue: B is handed A's freed pages
    e.step()
    reused = sorted(set(b.pages) & set(old_pages))
    assert reused and a.stats.restored_pages == len(old_pages) and not set(a.pages) & set(b.pages)
    e.run_until_idle()
    assert a.status is Status.FINISHED and a.outputs == ref_out.output_tokens
    assert e.caches[a.id].equals(ref_out.cache)
    assert_no_leak(e)


def test_recomputed_request_resumes_from_its_own_cached_prefix():
    e = engine(num_pages=32)
    a = e.add_request(prompt(70), 12)
    for _ in range(4):
        e.step()
    e.scheduler.preempt(a.id)
    e.run_until_idle()
    assert a.stats.resume_hit_tokens == 64 and a.stats.preemptions == 1
    ref = engine(num_pages=32).generate([prompt(70)], 12)[0]
    assert a.outputs == ref.output_tokens and e.caches[a.id].equals(ref.cache)
    assert_no_leak(e)


def test_speculative_engine_requires_a_drafter():
    with pytest.raises(DsakvError, match="drafter"):
        Engine(EngineConfig(page_size=PAGE, scheduler=SchedulerConfig(num_speculative_tokens=2)))


def test_aborting_an_offloaded_request_drops_its_host_copy():
    e = engine(num_pages=32, preemption="offload")
    a = e.add_request(prompt(40), 10)
    b = e.add_request(prompt(40, base=9), 10)
    e.step()
    e.step()
    e.scheduler.preempt(a.id)
    assert a.status is Status.OFFLOADED and a.id in e.host_copies
    e.abort(a.id)
    assert a.id not in e.host_copies
    e.run_until_idle()
    assert b.status is Status.FINISHED
    assert_no_leak(e)


@pytest.mark.parametrize("field", ["pool_kind", "kv_dtype", "insert_mode", "eviction_policy"])
def test_engine_config_rejects_unknown_names_listing_the_valid_ones(field):
    with pytest.raises(DsakvError, match=rf"{field} = 'bogus': must be one of \w+, \w+"):
        EngineConfig(**{field: "bogus"})


def test_eos_token_outside_vocab_raises():
    with pytest.raises(DsakvError, match="eos_token_id"):
        engine().add_request(prompt(10), 3, eos_token_id=512)


@pytest.mark.parametrize("region", ["main_latent", "main_rope", "indexer_key", "indexer_scale"])
def test_cache_readback_sees_one_changed_byte_of_either_cache(region):
    # The equivalence proofs rest on this: a read-back differs if a single byte of a request's main row,
    # indexer key or indexer scale differs.
    e = engine()
    lay, pool = e.layout, e.pool
    pages = e.allocator.alloc(2)
    n = PAGE + 3
    slots = request_slots(pages, n, PAGE)
    gen = torch.Generator().manual_seed(0)
    for layer in range(lay.num_attention_layers):
        latent = torch.randn(n, e.spec.kv_lora_rank, generator=gen)
        pool.store_main(layer, slots, latent, torch.randn(n, e.spec.qk_rope_head_dim, generator=gen))
    for layer in lay.indexer_layers:
        pool.store_indexer(layer, slots, torch.randn(n, e.spec.index_head_dim, generator=gen))
    before = read_request_cache(pool, pages, n)
    assert before.equals(read_request_cache(pool, pages, n))
    page, offset = pages[1], 2  # position PAGE + 2
    layer = lay.indexer_layers[-1]
    if region == "main_latent":
        pool.main_view(layer)[page, offset, 0] ^= 1
    elif region == "main_rope":
        pool.main_view(layer)[page, offset, lay.main_row_bytes - 1] ^= 1
    elif region == "indexer_key":
        pool.indexer_view(layer)[page, offset * lay.indexer_key_bytes] ^= 1
    else:
        pool.indexer_view(layer)[page, lay.indexer_scale_offset_of(offset)] ^= 1
    assert not before.equals(read_request_cache(pool, pages, n))


def test_engine_allocates_the_top_k_index_buffer_the_planner_subtracts():
    from dsakv.planner.workspaces import topk_buffer_bytes

    engine = Engine(EngineConfig(scheduler=SchedulerConfig(max_batched_tokens=512)))
    buf = engine.topk_indices
    assert buf.dtype == torch.int32 and tuple(buf.shape) == (512, engine.spec.index_topk)
    assert buf.numel() * buf.element_size() == topk_buffer_bytes(512, engine.spec.index_topk)
