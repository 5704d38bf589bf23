"""Each router's choice on hand-built cluster states: loads set by hand, caches filled through real radix
trees whose events feed the KV-aware index."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.key import RadixKey
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.planner.budget import RankCell
from dsakv.sim.routing import (
    Affinity,
    KvAware,
    LeastLoaded,
    Oracle,
    RoundRobin,
    least_loaded,
    make_router,
    request_key,
)
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_spec
from dsakv.workloads.traces import TraceRequest

PAGE = 64


@dataclass
class HandBuiltCluster:
    """Targets with a load each and a real radix tree each (the oracle's reference peeks at them; their
    events go to ``sinks``, the KV-aware router's or the oracle's index)."""

    loads: list[int]
    sinks: list = field(default_factory=list)
    speculative: bool = False  # bigram keys (MTP drafts)

    def __post_init__(self) -> None:
        self.trees = []
        for t in range(len(self.loads)):
            sink = self.sinks[t] if self.sinks else None
            self.trees.append(RadixCache(PageAllocator(4096, PAGE), event_sink=sink, speculative=self.speculative))

    @property
    def num_targets(self) -> int:
        return len(self.loads)

    def load_tokens(self, target: int) -> int:
        return self.loads[target]

    def least_loaded_target(self) -> int:
        return least_loaded(self, range(self.num_targets))

    def peek_hit_tokens(self, target: int, key: RadixKey) -> int:
        return self.trees[target].peek(key).matched_tokens

    def cache(self, target: int, req: TraceRequest, tokens: int) -> None:
        """Target ``target`` holds the first ``tokens`` tokens (whole pages) of ``req``'s prompt."""
        tree = self.trees[target]
        key = request_key(req).prefix(tokens)
        tree.insert(key, tree.allocator.alloc(tree.full_pages(tokens)))


@pytest.fixture(scope="module")
def cell():
    return RankCell(CacheLayout(load_spec("glm-5.3")), 1)


def conversation(turn_blocks: int, first: int = 0) -> TraceRequest:
    """A request whose prompt is ``turn_blocks`` 512-token blocks of one conversation."""
    return TraceRequest(0.0, turn_blocks * 512, 100, tuple(range(first, first + turn_blocks)))


def test_round_robin_cycles_through_every_target():
    view, rr = HandBuiltCluster([0, 0, 0]), RoundRobin()
    assert [rr.choose(conversation(1), view) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_takes_the_fewest_outstanding_tokens_ties_to_the_lowest():
    assert LeastLoaded().choose(conversation(1), HandBuiltCluster([900, 300, 500])) == 1
    assert LeastLoaded().choose(conversation(1), HandBuiltCluster([300, 300, 500])) == 0


def test_affinity_keeps_a_conversation_on_one_target_whatever_its_load():
    router = Affinity()
    first, later = conversation(2), conversation(6)  # the same first two blocks: the same conversation
    view = HandBuiltCluster([0] * 8)
    t = router.choose(first, view)
    view.loads[t] = 10**9
    assert router.choose(later, view) == t
    spread = {router.choose(conversation(2, first=1000 * k), view) for k in range(40)}
    assert len(spread) > 4  # distinct conversations spread over the targets
    salted = TraceRequest(0.0, 1024, 1, (0, 1), tenant="a")
    assert router.choose(salted, view) == router.session_hash(salted) % 8


def test_kv_aware_trades_bytes_of_both_caches_saved_against_the_load(cell):
    router = KvAware(cell, PAGE)
    view = HandBuiltCluster([0, 0, 0], sinks=[router.sink(t) for t in range(3)])
    req = conversation(8)  # 4,096 tokens
    view.cache(1, req, 2048)  # target 1 holds the first 2,048 tokens (32 pages)
    view.cache(2, req, 1024)
    assert router.index.match(router.page_hashes(request_key(req))) == {router.worker(1): 32, router.worker(2): 16}
    scores = router.scores(request_key(req), view)
    assert scores == [0.0, 32 * cell.page_bytes, 16 * cell.page_bytes]  # main KV + indexer K per page
    assert router.choose(req, view) == 1
    # a cached token is worth one token of queue (load_weight 1): target 1's extra 1,024 hit tokens beat
    # target 2 up to 1,024 tokens of extra load
    view.loads[1] = 1023
    assert router.choose(req, view) == 1
    view.loads[1] = 1025
    assert router.choose(req, view) == 2
    view.loads[1], view.loads[2] = 2049, 1025  # both hits outweighed: the idle target without one
    assert router.choose(req, view) == 0


def test_kv_aware_forgets_evicted_pages_and_cleared_trees(cell):
    router = KvAware(cell, PAGE)
    view = HandBuiltCluster([0, 0], sinks=[router.sink(t) for t in range(2)])
    req = conversation(4)
    view.cache(1, req, 2048)
    assert router.choose(req, view) == 1
    view.trees[1].evict(1024)  # the tail pages go: 16 pages are left
    assert router.index.match(router.page_hashes(request_key(req))) == {router.worker(1): 16}
    view.trees[1].reset()
    assert router.index.match(router.page_hashes(request_key(req))) == {}
    assert router.index.hashes_of(router.worker(1)) == frozenset() and router.choose(req, view) == 0


def test_oracle_takes_the_longest_hit_ignoring_load():
    oracle = Oracle()
    view = HandBuiltCluster([10**9, 0, 0], sinks=[oracle.sink(t) for t in range(3)])
    req = conversation(4)
    view.cache(0, req, 1536)
    view.cache(2, req, 512)
    assert oracle.choose(req, view) == oracle.choose_by_scan(req, view) == 0
    other = conversation(4, first=500)
    assert oracle.choose(other, view) == oracle.choose_by_scan(other, view) == 1  # no hit anywhere: least loaded
    view.cache(1, req, 1536)  # an equal hit on a less loaded target wins the tie
    assert oracle.choose(req, view) == oracle.choose_by_scan(req, view) == 1
    view.trees[1].evict(1024)  # its tail goes (the index follows the tree's events): the longest hit is 0's again
    assert oracle.choose(req, view) == oracle.choose_by_scan(req, view) == 0
    assert oracle.holders.hashes_of(1) == view.trees[1].page_hashes()
    view.trees[0].reset()  # a reset tree holds nothing
    assert oracle.holders.hashes_of(0) == set()
    assert oracle.choose(req, view) == oracle.choose_by_scan(req, view) == 1


def test_speculative_oracle_settles_the_bigram_page_by_peeking():
    """Bigram keys: a page matches only when the token after it does too, which its hash does not cover; a
    target holding a page twice (equal tokens, different next tokens) keeps it until both copies leave."""
    oracle = Oracle(speculative=True)
    view = HandBuiltCluster([0, 5, 0, 0], sinks=[oracle.sink(t) for t in range(4)], speculative=True)
    req = conversation(4)  # 2,048 tokens, hash ids 0..3
    fork = TraceRequest(0.0, 2048, 100, (0, 1, 77, 78))  # the same first 1,024 tokens (16 pages), then others
    view.cache(0, fork, 2047)  # req's pages 0-15 by hash, page 15 followed by fork's token: a bigram hit of 14
    view.cache(1, fork, 2047)
    view.cache(1, req, 1025)  # page 15 again, followed by req's token: a bigram hit of 15, though more loaded
    assert [view.peek_hit_tokens(t, request_key(req)) for t in range(4)] == [14 * PAGE, 15 * PAGE, 0, 0]
    for t in (0, 1):
        assert oracle.holders.hashes_of(t) == view.trees[t].page_hashes()
    assert oracle.choose(req, view) == oracle.choose_by_scan(req, view) == 1
    view.trees[1].evict(16 * PAGE)  # fork's older tail (pages 15-30) leaves; req's copy of page 15 stays
    assert oracle.holders.hashes_of(1) == view.trees[1].page_hashes()
    assert oracle.choose(req, view) == oracle.choose_by_scan(req, view) == 1
    view.trees[1].evict(PAGE)  # now page 15 leaves too: 0 and 1 both hit 14 pages, 0 is less loaded
    assert oracle.holders.hashes_of(1) == view.trees[1].page_hashes()
    assert oracle.choose(req, view) == oracle.choose_by_scan(req, view) == 0
    # a target holding one page less by hash may hit as much: a tie the least loaded wins
    oracle = Oracle(speculative=True)
    view = HandBuiltCluster([5, 0], sinks=[oracle.sink(t) for t in range(2)], speculative=True)
    view.cache(0, fork, 2047)  # pages 0-15 by hash, page 15 followed by fork's token: a bigram hit of 14
    view.cache(1, req, 961)  # pages 0-14 by hash, page 14 followed by req's token: a bigram hit of 14 too
    assert [view.peek_hit_tokens(t, request_key(req)) for t in range(2)] == [14 * PAGE, 14 * PAGE]
    assert oracle.choose(req, view) == oracle.choose_by_scan(req, view) == 1
    short = TraceRequest(0.0, 130, 1, (0,))  # two pages by hash at most: every bigram hit is 0
    assert oracle.choose(short, view) == oracle.choose_by_scan(short, view) == 1  # the least loaded


def test_kv_aware_learns_each_workers_page_bytes_from_its_events(cell):
    router = KvAware(cell, PAGE, instances=2)
    view = HandBuiltCluster([0, 0, 0, 0], sinks=[router.sink(t) for t in range(4)])
    view.cache(3, conversation(2), 1024)  # target 3: instance 1, DP rank 1
    assert router.worker(3) == (1, 1)
    assert router.index.page_bytes == {router.worker(3): cell.layout.main_page_bytes + cell.layout.indexer_page_bytes}


def test_unknown_router_is_one_error_naming_the_choices(cell):
    with pytest.raises(DsakvError, match="router = 'random'.*round-robin"):
        make_router("random", cell, PAGE, 1, False)
    with pytest.raises(DsakvError, match="load_weight"):
        KvAware(cell, PAGE, load_weight=-1.0)


def test_kv_aware_without_msgspec_is_one_error_naming_the_extra(cell, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "msgspec", None)  # as if the 'events' extra were not installed
    monkeypatch.delitem(sys.modules, "dsakv.kvevents.schema", raising=False)
    with pytest.raises(DsakvError, match=r"router = 'kv-aware': needs msgspec \(pip install 'dsakv\[events\]'\)"):
        make_router("kv-aware", cell, PAGE, 1, False)
    assert make_router("oracle", cell, PAGE, 1, False).name == "oracle"  # the others need no extra
