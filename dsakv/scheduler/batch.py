"""What one scheduler step asks an executor to do (``BatchPlan``), how a request's work in a step is cut
(``next_item``), and the check of what the executor reports back (``check_sampled``).

The scheduler has already moved page ids between the allocator, the radix tree and the requests when it
returns a plan; the executor (the tiny-model engine, or the simulator's cost model) carries out the data
side, in this order:

1. ``offloads``: both caches of each listed page go to host. The pages are already free in the allocator
   and may be handed to another request in this very plan, so a data executor copies them in the
   scheduler's ``on_offload`` hook, called while they are still allocated; the list here is the record
   (a cost model prices the copies from it);
2. ``write_backs`` (lower tiers, ``dsakv.scheduler.tiers``), in list order: both caches of device pages or
   host slots go down to host or store. They may read pages that eviction freed in this very plan, so
   they run before anything below writes a page; a host write-back may reuse the slot of an entry that
   an earlier write-back of the list read out to the store;
3. ``restores``: copy host bytes back, bit-exact, into the listed (newly allocated) pages; then
   ``load_backs``: host or store pages into the listed new pages, both caches. A host entry a load-back
   reads is pinned, so no write-back overwrites it. The executor reports each finished load-back with
   ``Scheduler.load_backs_done`` (the engine right after its copies; the simulator once the transfer time
   has passed); until then its request is LOADING and in no item;
4. ``items``: one forward pass over every item (mixed prefill chunks and decodes), writing both caches of
   positions ``[start, end + num_draft)`` into the slots ``page * page_size + offset`` of
   ``request.pages``, and sampling where ``sample`` is set. An item may read pages that an earlier item of
   the same plan writes (cache at allocation: a request admitted later in the step hits pages planned
   before it), never pages of a later item: carry the items out in plan order, and inside one forward
   write a layer's cache rows for every item before any item reads that layer (the tiny model does both);
5. report the sampled tokens back with ``Scheduler.update(plan, sampled)``.

A plan is valid until ``update`` is called; the page tables it references may change afterwards.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from dsakv.cache.key import MAX_TOKEN_ID
from dsakv.errors import DsakvError
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.request import Request
from dsakv.scheduler.tiers import LoadBack, WriteBack


@dataclass(slots=True)
class BatchItem:
    """One request's work this step: compute positions ``[start, end)`` of its tokens.

    ``num_draft`` extra positions after ``end`` hold draft tokens the executor proposes (speculative
    decoding); their slots are reserved in ``request.pages``. With ``sample`` set, the executor reports
    ``1 + accepted drafts`` new tokens: the accepted draft tokens followed by the model's own next token.
    """

    request: Request
    start: int
    end: int
    num_draft: int = 0
    sample: bool = True

    @property
    def num_tokens(self) -> int:
        return self.end - self.start + self.num_draft

    @property
    def is_prefill(self) -> bool:
        return self.end - self.start > 1


@dataclass(slots=True)
class HostCopy:
    """Pages of both caches to copy to host (offload) or back from host (restore) for one request."""

    request_id: Hashable
    pages: list[int]
    num_tokens: int


@dataclass(slots=True)
class BatchPlan:
    """Everything one ``Scheduler.step`` decided; see the module docstring for the executor's order.

    ``freed_pages`` lists every page id handed back to the allocator in this step, in the order freed: by
    ``abort`` / ``preempt`` since the last step, by ``step`` (evictions, which ``evicted_tokens`` also counts,
    and preemptions) and by ``update`` (rolled-back drafts, duplicate pages an insert at allocation replaced
    with the tree's copies, finished requests' pages). A store or executor that tracks page ids sees every
    freed page there once ``update`` has returned; ``allocated_pages`` counts the pages handed out.
    """

    step: int
    items: list[BatchItem] = field(default_factory=list)
    offloads: list[HostCopy] = field(default_factory=list)
    restores: list[HostCopy] = field(default_factory=list)
    write_backs: list[WriteBack] = field(default_factory=list)
    load_backs: list[LoadBack] = field(default_factory=list)
    allocated_pages: int = 0
    freed_pages: list[int] = field(default_factory=list)
    evicted_tokens: int = 0
    admitted: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(item.end - item.start + item.num_draft for item in self.items)


def work_end(start: int, total: int, budget: int, config: SchedulerConfig, page_size: int) -> int:
    """Where a request that has computed ``start`` of its ``total`` tokens gets to in a step with ``budget``
    tokens left (drafts aside): ``total`` for a decode, the end of the next prefill chunk (at most
    ``chunk_tokens``, on a page boundary unless it is the last chunk), or ``start`` when nothing fits."""
    if total - start == 1:
        return total if budget >= 1 else start
    end = min(total, start + config.chunk_tokens, start + budget)
    if end < total:
        end -= end % page_size
    return max(end, start)


def next_item(req: Request, budget: int, config: SchedulerConfig, page_size: int) -> BatchItem | None:
    """The request's work this step within ``budget`` tokens, or None if nothing fits (``work_end``).

    One token left to compute: a decode of it plus up to ``num_speculative_tokens`` drafts (never more drafts
    than outputs still allowed). More: the next prefill chunk, which samples if it is the last one.
    """
    start, total = req.num_computed, req.prompt_len + len(req.outputs)
    end = work_end(start, total, budget, config, page_size)
    if end == start:
        return None
    if total - start == 1:
        remaining_outputs = req.max_new_tokens - len(req.outputs)
        drafts = max(0, min(config.num_speculative_tokens, remaining_outputs - 1, budget - 1))
        return BatchItem(req, start, total, drafts, True)
    return BatchItem(req, start, end, 0, end == total)


def check_sampled(plan: BatchPlan, sampled: Sequence[Sequence[int]]) -> None:
    """One token list per item: ``1 .. 1 + num_draft`` token ids where sampled, none elsewhere; every id an
    integer in ``0 .. MAX_TOKEN_ID`` (the prefix cache's key encoding). Raises ``DsakvError`` naming the first
    bad list or id; reads only (``update`` calls it before it changes anything)."""
    items = plan.items
    if isinstance(sampled, str | bytes) or not isinstance(sampled, Sequence):
        raise DsakvError(f"update: sampled is {type(sampled).__name__}: must be a list with one token list per item")
    if len(sampled) != len(items):
        raise DsakvError(f"update: {len(sampled)} token lists for {len(items)} plan items")
    for item, new in zip(items, sampled):
        kind = type(new)
        if kind is not list and kind is not tuple and not _is_id_sequence(new):
            raise DsakvError(
                f"update: request {item.request.id!r} reported a {kind.__name__}: must be a list of token ids"
            )
        n = len(new)
        if (n < 1 or n > 1 + item.num_draft) if item.sample else n:
            raise DsakvError(
                f"update: request {item.request.id!r} reported {n} tokens; expected "
                + (f"1..{1 + item.num_draft}" if item.sample else "0 (prefill chunk)")
            )
        for t in new:
            if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:  # fast path: plain ints in range pass here
                if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t <= MAX_TOKEN_ID:
                    raise DsakvError(
                        f"update: request {item.request.id!r} reported token id {t!r}: token ids must be "
                        f"integers in 0..{MAX_TOKEN_ID}"
                    )


def _is_id_sequence(value: object) -> bool:
    """A list-like of token ids: a sequence other than str/bytes, or a 1-D numpy array."""
    if isinstance(value, np.ndarray):
        return value.ndim == 1
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)
