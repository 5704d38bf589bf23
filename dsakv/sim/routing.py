"""Routers of a simulated cluster: which DP group of which instance a new request goes to (docs/routing.md).

A router chooses among *targets*, the ``instances x dp_attention`` DP groups of the cluster (each with its own
pool, radix tree and scheduler), numbered ``t = group x instances + instance`` so that consecutive targets lie
on different instances. It sees the cluster only through a ``ClusterView``:

* ``round-robin``: request ``k`` to target ``k mod targets`` (with one instance: SGLang's DP round-robin).
* ``least-loaded``: the target with the fewest outstanding tokens (prompt + output tokens of the requests it
  holds, queued or running); ties to the lowest target.
* ``affinity``: a stable hash of the request's session (its namespace when the trace names one, else its
  first ``AFFINITY_BLOCKS`` trace blocks: a conversation's opening) modulo the targets; load-blind.
* ``kv-aware``: a global ``PrefixIndex`` (``dsakv.kvevents.index``) fed only by the targets' KV events, in
  vLLM's wire format through the same msgpack codec a ZMQ subscriber uses (in process by default,
  ``dsakv.kvevents.feed.EventFeed``; over real ZMQ sockets when given ``kv_events_endpoint``,
  ``dsakv.kvevents.zmq_feed.ZmqEventFeed``; the radix trees are never read), says how many leading pages of
  the request each target holds; score = bytes of both caches the hit saves - load penalty (below), highest
  wins.
* ``oracle``: the longest hit of any radix tree, ignoring load (ties: least loaded); the upper bound of a
  per-request prefix match (not of a run's total hit: docs/routing.md shows why). It reads the trees' own
  events synchronously into an exact global index (``dsakv.sim.page_holders.PageHolders``), so its choice costs
  the request's hit pages, not a peek at every tree (``Oracle.choose_by_scan``, the reference it equals).

KV-aware score of target ``t`` for a request (``docs/routing.md`` derives and compares it)::

    score_t = hit_pages_t x page_bytes  -  load_weight x load_tokens_t x token_bytes

``page_bytes`` is a page of *both* caches (main latent rows + indexer K), as the target's ``BlockStored``
events announce it (their dsakv extras), and ``token_bytes = RankCell.page_bytes / group_page_tokens``; so a
cached token is worth one token of queue at ``load_weight = 1`` (the default, like Dynamo's overlap weight).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import xxhash

from dsakv.cache.events import CacheEvent, chain_hashes, chain_seed, get_hash
from dsakv.cache.key import TOKEN_BYTES, RadixKey
from dsakv.errors import DsakvError, check_choice
from dsakv.kvevents.index import PrefixIndex, WorkerId
from dsakv.planner.budget import RankCell
from dsakv.sim.page_holders import PageHolders
from dsakv.workloads.traces import MooncakePrompt, TraceRequest

if TYPE_CHECKING:
    from dsakv.kvevents.feed import EventFeed
    from dsakv.kvevents.zmq_feed import ZmqEventFeed

ROUTERS = ("round-robin", "least-loaded", "affinity", "kv-aware", "oracle")
# routers whose choice reads no instance state (only the request and the target count): a run under them can
# be split among worker processes by instance (dsakv.sim.shards)
SHARDABLE_ROUTERS = ("round-robin", "affinity")
AFFINITY_BLOCKS = 2  # trace blocks naming a session: a shared system prompt, then the conversation's first turn
HASH_NAME = "xxh3_64"  # the radix caches' event hash (RadixCache's default)


def request_key(req: TraceRequest, page_digest: int = 0) -> RadixKey:
    """The radix key the scheduler will build for ``req`` (its expanded prompt in its namespace), of the
    trees' kind ``page_digest`` (``RadixCache.page_digest``)."""
    prompt = np.asarray(MooncakePrompt(req.hash_ids, req.input_length))
    return RadixKey(prompt, req.tenant, req.cache_salt, page_digest=page_digest)


class ClusterView(Protocol):
    """What a router may ask of the cluster."""

    @property
    def num_targets(self) -> int: ...

    def load_tokens(self, target: int) -> int:
        """Prompt + output tokens of the requests the target holds (queued or running)."""
        ...

    def least_loaded_target(self) -> int:
        """The target with the fewest ``load_tokens``; ties to the lowest target (``least_loaded`` over every
        target, without scanning them: ``dsakv.sim.target_loads.TargetLoads``)."""
        ...

    def peek_hit_tokens(self, target: int, key: RadixKey) -> int:
        """Tokens of ``key`` the target's radix tree would hit now (only the oracle may ask)."""
        ...


def least_loaded(view: ClusterView, candidates: range | list[int]) -> int:
    """The candidate with the fewest outstanding tokens; ties to the lowest target (a scan of the candidates;
    over every target it is ``view.least_loaded_target()``, the reference that one is tested against)."""
    return min(candidates, key=lambda t: (view.load_tokens(t), t))


@dataclass
class RoundRobin:
    name: str = "round-robin"
    _next: int = 0

    def choose(self, req: TraceRequest, view: ClusterView) -> int:
        target = self._next % view.num_targets
        self._next += 1
        return target


@dataclass
class LeastLoaded:
    name: str = "least-loaded"

    def choose(self, req: TraceRequest, view: ClusterView) -> int:
        return view.least_loaded_target()


@dataclass
class Affinity:
    name: str = "affinity"
    blocks: int = AFFINITY_BLOCKS

    def session_hash(self, req: TraceRequest) -> int:
        """A hash every process computes alike (xxh3 of a fixed encoding, never Python's ``hash``)."""
        if req.tenant is not None or req.cache_salt is not None:
            data = repr((req.tenant, req.cache_salt)).encode()
        else:
            head = req.hash_ids[: self.blocks]
            data = struct.pack(f"<{len(head)}q", *head)
        return xxhash.xxh3_64_intdigest(data)

    def choose(self, req: TraceRequest, view: ClusterView) -> int:
        return self.session_hash(req) % view.num_targets


@dataclass
class KvAware:
    """Score = bytes of both caches a hit saves - ``load_weight`` x bytes of the target's outstanding tokens.

    ``instances`` maps a target to its ``WorkerId`` (target ``t``: instance ``t mod instances``, DP rank
    ``t // instances``); the page bytes of a hit are those the target's own events announced. The events
    reach the index in process, or, given ``kv_events_endpoint`` (a ZMQ address, and ``kv_events_replay_endpoint`` for the
    replay sockets), over real sockets: instance ``i`` publishes at that address's port + ``i`` (``feed``
    binds them here; ``close()`` releases them). Either way the index is made current (``feed.sync()``)
    before each score, so both give the same decisions."""

    cell: RankCell
    group_page_tokens: int
    instances: int = 1
    speculative: bool = False
    load_weight: float = 1.0
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    name: str = "kv-aware"
    index: PrefixIndex = field(default_factory=PrefixIndex)
    clock_s: float = 0.0  # the simulated time, stamped on event batches (the cluster sets it)

    def __post_init__(self) -> None:
        if not self.load_weight >= 0:
            raise DsakvError(f"load_weight = {self.load_weight!r}: must be a number >= 0")
        self._hash = get_hash(HASH_NAME)
        self._token_bytes = self.cell.page_bytes / self.group_page_tokens  # both caches' bytes of one token
        self.feed = self._open_feed()

    def _open_feed(self) -> EventFeed | ZmqEventFeed:
        try:  # msgspec (and pyzmq, on the wire) are the 'events' extra: only a KV-aware run needs them
            from dsakv.kvevents.schema import PageCost
        except ImportError:
            raise DsakvError("router = 'kv-aware': needs msgspec (pip install 'dsakv[events]')") from None
        from dsakv.kvevents.feed import EventFeed

        cost, clock = PageCost.of(self.cell.layout), lambda: self.clock_s
        if self.kv_events_endpoint is None:
            return EventFeed(self.index, cost, clock)
        try:
            from dsakv.kvevents.zmq_feed import ZmqEventFeed
        except ImportError:
            raise DsakvError("kv_events_endpoint: needs pyzmq (pip install 'dsakv[events]')") from None
        return ZmqEventFeed(
            self.index, self.instances, self.kv_events_endpoint, self.kv_events_replay_endpoint, cost=cost, clock=clock
        )

    def close(self) -> None:
        """Release the feed's sockets (none in process)."""
        self.feed.close()

    def worker(self, target: int) -> WorkerId:
        return WorkerId(target % self.instances, target // self.instances)

    def sink(self, target: int) -> Callable[[CacheEvent], None]:
        """The event sink to give target ``target``'s radix tree."""
        w = self.worker(target)
        return self.feed.sink(w.instance, w.dp_rank)

    def page_hashes(self, key: RadixKey) -> list[bytes]:
        """The chained hashes the tree would give the key's matchable pages (``leave_one``: at most
        ``(n - 1) // group_page_tokens``; in speculative mode one less, as a match gives the last page back)."""
        ps = self.group_page_tokens
        n = (key.num_tokens - 1) // ps
        if self.speculative:
            n -= 1
        if n <= 0:
            return []
        seed = chain_seed(self._hash, *key.namespace)
        return chain_hashes(self._hash, seed, key.token_data, 4 * ps, 4 * ps, n)

    def _hits(self, key: RadixKey) -> dict[Hashable, int]:
        """Per worker, the leading pages of ``key`` it holds (workers holding none are absent)."""
        self.feed.sync()
        return self.index.match(self.page_hashes(key))

    def _score(self, target: int, hits: dict[Hashable, int], view: ClusterView) -> float:
        w = self.worker(target)
        saved = hits.get(w, 0) * self.index.page_bytes.get(w, 0)
        return saved - self.load_weight * view.load_tokens(target) * self._token_bytes

    def scores(self, key: RadixKey, view: ClusterView) -> list[float]:
        """Every target's score (a scan of the targets: what ``choose`` avoids, and is tested against)."""
        hits = self._hits(key)
        return [self._score(t, hits, view) for t in range(view.num_targets)]

    def choose_by_scan(self, req: TraceRequest, view: ClusterView) -> int:
        """The highest score over every target, ties to the lowest: the reference ``choose`` equals."""
        scores = self.scores(request_key(req), view)
        return max(range(view.num_targets), key=lambda t: (scores[t], -t))

    def choose(self, req: TraceRequest, view: ClusterView) -> int:
        """``choose_by_scan``'s target, scoring only the targets that can win: those with a hit, and the best
        of the others. A target without a hit scores ``-load_weight x load x token_bytes``: with a load
        weight, the least-loaded target scores at least that (its hit saves >= 0 bytes; lower load, lower
        penalty) and wins ties (lowest target among the least loaded); without one, every target without a
        hit scores 0 and the lowest of them wins ties. So the cost grows with the hits, not the targets.
        (Exact while distinct loads get distinct float penalties, as they do for any load weight of ordinary
        size: neither near the smallest float nor so large that the penalty overflows.)"""
        hits = self._hits(request_key(req))
        n, instances = view.num_targets, self.instances
        candidates = {w.dp_rank * instances + w.instance for w in hits}
        candidates.intersection_update(range(n))
        if self.load_weight > 0:
            candidates.add(view.least_loaded_target())
        else:  # at most len(hits) + 1 steps
            lowest_without_hit = next((t for t in range(n) if t not in candidates), None)
            if lowest_without_hit is not None:
                candidates.add(lowest_without_hit)
        return max(candidates, key=lambda t: (self._score(t, hits, view), -t))


@dataclass
class Oracle:
    """The longest hit of any target's radix tree, ignoring load; ties to the least loaded (ties of load to the
    lowest target).

    It reads the trees' own events, synchronously (``sink(target)`` for each target's tree), into a global
    ``PageHolders`` index: a request's choice hashes its pages only while some target holds every page so
    far, then takes the least loaded of the targets holding the most, so it costs the request's hit pages +
    the targets holding its first page, not a tree walk per target (``choose_by_scan``, the peek at every
    tree it equals). In speculative mode a page matches only when the token after it does too (bigram keys),
    which the hashes do not cover: a target holding ``d`` leading pages by hash matches ``d`` or ``d - 1`` of
    them, so the oracle peeks at the trees of the targets holding the most, or one page less, to settle it."""

    group_page_tokens: int = 64
    speculative: bool = False
    page_digest: int = 0  # the trees' kind of key (RadixCache.page_digest), for the peeks
    name: str = "oracle"

    def __post_init__(self) -> None:
        self._hash = get_hash(HASH_NAME)
        self.holders = PageHolders(self._hash)

    def sink(self, target: int) -> Callable[[CacheEvent], None]:
        """The event sink to give target ``target``'s radix tree."""
        return self.holders.sink(target)

    def choose_by_scan(self, req: TraceRequest, view: ClusterView) -> int:
        """Peek at every tree, take the longest hit, ties to the least loaded: the reference ``choose`` equals."""
        key = request_key(req, self.page_digest)
        hits = [view.peek_hit_tokens(t, key) for t in range(view.num_targets)]
        best = max(hits)
        return least_loaded(view, [t for t, h in enumerate(hits) if h == best])

    def choose(self, req: TraceRequest, view: ClusterView) -> int:
        key = request_key(req)  # token keys: the hashes chain over tokens (a peek takes the trees' kind, below)
        ps = self.group_page_tokens
        seed = chain_seed(self._hash, *key.namespace)
        depth, holding, above = self.holders.match(seed, key.token_data, TOKEN_BYTES * ps, (key.num_tokens - 1) // ps)
        if not self.speculative:
            return view.least_loaded_target() if depth == 0 else least_loaded(view, holding)
        # speculative: a match gives its last page back, so a target holding d pages by hash hits d - 2 or d - 1
        if depth <= 1:
            return view.least_loaded_target()  # every target hits 0
        peek_key = request_key(req, self.page_digest) if self.page_digest else key
        for candidates, hit in ((holding, depth - 1), (above, depth - 2)):
            if hit == 0:
                return view.least_loaded_target()
            winners = [t for t in candidates if view.peek_hit_tokens(t, peek_key) == hit * ps]
            if winners:
                return least_loaded(view, winners)
        raise AssertionError("the targets holding depth - 1 pages by hash include one hitting depth - 2")


Router = RoundRobin | LeastLoaded | Affinity | KvAware | Oracle


def make_router(
    name: str,
    cell: RankCell,
    group_page_tokens: int,
    instances: int,
    speculative: bool,
    kv_events_endpoint: str | None = None,
    kv_events_replay_endpoint: str | None = None,
    page_digest: int = 0,
) -> Router:
    """A fresh router called ``name`` (one of ``ROUTERS``) for ``instances`` instances of pages of
    ``group_page_tokens`` tokens; a KV-aware one takes its events over ZMQ at ``kv_events_endpoint`` when given; the oracle,
    in speculative mode, peeks at trees that take keys of kind ``page_digest`` (``RadixCache.page_digest``)."""
    check_choice("router", name, ROUTERS)
    if name == "kv-aware":
        return KvAware(
            cell,
            group_page_tokens,
            instances,
            speculative,
            kv_events_endpoint=kv_events_endpoint,
            kv_events_replay_endpoint=kv_events_replay_endpoint,
        )
    if name == "oracle":
        return Oracle(group_page_tokens, speculative, page_digest)
    return {"round-robin": RoundRobin, "least-loaded": LeastLoaded, "affinity": Affinity}[name]()
