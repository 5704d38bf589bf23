"""Accepting a step's tokens, and rolling speculative drafts back at a token boundary.

A decode item with ``k`` drafts wrote ``1 + k`` positions of both caches::

    position   s      s+1    ...    s+k          (s = item.start, the last token's position)
    token      last   d1     ...    dk           drafts proposed by the executor
    verified          a accepted ----|rejected   executor reports [d1..da, next]

The request keeps ``num_computed = s + 1 + a``: the accepted drafts are real tokens now, their KV (both
caches) stays. The rejected positions are cut off at that token boundary: every page wholly past the new
end is freed (both caches at once; the allocator has no per-cache free), and stale bytes in the last kept
page lie past ``num_computed`` where nothing reads them until they are overwritten. Drafts never reach the
prefix cache, which only receives whole pages below ``num_computed`` (all verified tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from dsakv.cache.allocator import PageAllocator
from dsakv.scheduler.batch import BatchItem
from dsakv.scheduler.pages import pages_for
from dsakv.scheduler.request import Request


def accept_tokens(
    req: Request,
    item: BatchItem,
    new: Sequence[int],
    step: int,
    allocator: PageAllocator,
    freed: list[int] | None = None,
) -> bool:
    """Apply one item's reported tokens to ``req``; free pages past its new end (appended to ``freed``).
    True if it finished.

    ``new`` was validated by the caller (``1..1 + num_draft`` tokens if sampled, else none).
    """
    stats = req.stats
    stats.computed_tokens += item.end - item.start + item.num_draft
    if not item.sample:
        req.num_computed = item.end
        return False
    accepted = len(new) - 1
    stats.draft_tokens += item.num_draft
    stats.accepted_draft_tokens += accepted
    if stats.first_token_step is None:
        stats.first_token_step = step
    room = req.max_new_tokens - len(req.outputs)
    done = len(new) >= room
    take = list(new[:room])
    eos = req.eos_token_id
    if eos is not None and eos in take:
        take = take[: take.index(eos) + 1]
        done = True
    req.outputs.extend(take)
    req.num_computed = min(item.end + accepted, req.num_tokens)
    keep = max(pages_for(req.num_computed, allocator.page_size), req.num_shared_pages)
    if len(req.pages) > keep:
        allocator.free(req.pages[keep:])
        if freed is not None:
            freed += req.pages[keep:]
        del req.pages[keep:]
    return done
