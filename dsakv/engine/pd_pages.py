"""Both caches of a request's pages as one hand-off unit: the prefill side's export, the decode side's import.

``PoolPages`` names every component of a pool page (``(cache, layer, role)`` from the manifest) with its
address and bytes, for any pool kind: a transport writes each named component to the peer's address of the
same name, and both sides digest the same bytes in the manifest's order. ``PdExporter`` (prefill side) pins a
finished request's cached pages (a radix lock) and digests them; ``PdImporter`` (decode side) checks the
offer, skips the prefix it already caches in the request's namespace (both caches: a page is one unit),
allocates the rest under a new epoch, and after the sender's reports verifies every page and enters the
prefix into its radix tree — or, on any error, frees the pages and unlocks, leaving the engine as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsakv.cache.radix import RadixCache
from dsakv.cache.tree import Node
from dsakv.engine.pool import TwinPool
from dsakv.errors import DsakvError, OutOfPagesError
from dsakv.transfer.manifest import Component, Manifest, TransferError
from dsakv.transfer.messages import Offer, PageReport
from dsakv.transfer.pages import check_same_count, page_count, page_digest
from dsakv.transfer.state import AbortAck, Transfer, TransferBook


class PoolPages:
    """Addresses and bytes of each named component of the pages of one ``TwinPool`` (CPU memory).

    A page's bytes are read as *runs*: components that lie back to back in memory, in the manifest's order,
    are one run (a packed pool's whole block is one), so digesting or copying a page costs one slice per run
    rather than one tensor view per component."""

    def __init__(self, pool: TwinPool, manifest: Manifest) -> None:
        self.pool = pool
        self.components: tuple[Component, ...] = manifest.components
        self.names = tuple(c.name for c in self.components)
        self._views = [
            pool.main_view(c.layer) if c.cache == "main" else pool.indexer_view(c.layer) for c in self.components
        ]
        for c, v in zip(self.components, self._views):
            if v[0].numel() != c.item_bytes:
                raise AssertionError(f"pool: component {c.name} holds {v[0].numel()} B a page, manifest {c.item_bytes}")
        self._buffers: dict[int, memoryview] = {}  # storage address -> a byte view of the whole storage
        self._runs: list[list[int]] = []  # [storage address, offset of page 0, bytes between pages, length]
        for c, v in zip(self.components, self._views):
            storage = v.untyped_storage()
            base = storage.data_ptr()
            if base not in self._buffers:
                whole = torch.empty(0, dtype=torch.uint8).set_(storage)
                self._buffers[base] = memoryview(whole.numpy()).cast("B")
            off, stride = v.data_ptr() - base, v.stride(0)
            last = self._runs[-1] if self._runs else None
            if last and last[0] == base and last[2] == stride and last[1] + last[3] == off:
                last[3] += c.item_bytes
            else:
                self._runs.append([base, off, stride, c.item_bytes])

    def regions(self) -> dict[str, tuple[int, int]]:
        """(address of page 0, bytes between pages) of every component, by name."""
        return {n: (v.data_ptr(), v.stride(0)) for n, v in zip(self.names, self._views)}

    def buffers(self) -> list[tuple[int, int]]:
        """(address, bytes) of each distinct buffer behind the pool (what a transfer engine registers)."""
        return sorted((base, mv.nbytes) for base, mv in self._buffers.items())

    def parts(self, page: int) -> list[memoryview]:
        """The bytes of every component of ``page`` in the manifest's order, as runs (views: no copy)."""
        if not 0 <= page < self.pool.num_physical_pages:
            raise DsakvError(f"page {page}: the pool has pages 0..{self.pool.num_physical_pages - 1}")
        return [self._buffers[b][o + page * s : o + page * s + n] for b, o, s, n in self._runs]

    def digest(self, index: int, valid: int, page: int) -> int:
        """``page_digest`` of ``page`` as page ``index`` of a hand-off with ``valid`` tokens in it."""
        return page_digest(index, valid, self.parts(page))

    def read_block(self, page: int) -> bytes:
        """Both caches of ``page`` as one value (the components concatenated in the manifest's order)."""
        return b"".join(self.parts(page))

    def write_block(self, page: int, value: memoryview | bytes) -> None:
        """The inverse of ``read_block``; ``value`` must be one page long (checked by the caller)."""
        view, off = memoryview(value).cast("B"), 0
        for part in self.parts(page):
            part[:] = view[off : off + len(part)]
            off += len(part)


@dataclass
class Export:
    """One request's pages pinned on the prefill side: ``pages[i]`` holds page ``i`` of ``offer``."""

    offer: Offer
    pages: list[int]
    reports: list[PageReport]
    node: Node


class PdExporter:
    """The prefill side: a finished prefill's cached prefix, pinned until ``release``."""

    def __init__(self, pool: TwinPool, radix: RadixCache, manifest: Manifest) -> None:
        if radix is None:
            raise DsakvError("prefix_cache: the prefill side exports from its radix tree; set prefix_cache=True")
        self.radix, self.pool_pages = radix, PoolPages(pool, manifest)
        self.page_size = pool.layout.page_size

    def export(
        self, handoff_id: str, tokens: Sequence[int], extra_key=None, cache_salt=None, policy="recompute"
    ) -> Export:
        """Pin the cached full pages of ``tokens`` in their namespace and digest them.

        Raises ``TransferError("page_count")`` when the tree holds none of them (nothing to hand over)."""
        tokens = [int(t) for t in tokens]
        key = self.radix.key(tokens, extra_key, cache_salt)
        match = self.radix.match(key, leave_one=False)
        count = page_count(len(match.pages) * self.page_size, self.page_size)  # raises on an empty hand-off
        self.radix.lock(match.node)
        offer = Offer(str(handoff_id), tuple(tokens[: count.length]), extra_key, cache_salt, count, policy)
        reports = [
            PageReport(i, self.pool_pages.names, self.pool_pages.digest(i, count.valid_tokens(i), p))
            for i, p in enumerate(match.pages)
        ]
        return Export(offer, list(match.pages), reports, match.node)

    def release(self, export: Export) -> None:
        self.radix.unlock(export.node)


@dataclass(frozen=True)
class Acceptance:
    """The decode side's answer to an offer: pages ``0 .. skip - 1`` it caches already; ``dest_pages[i]``
    receives page ``skip + i``; every report must name ``epoch``."""

    epoch: int
    skip: int
    dest_pages: tuple[int, ...]


@dataclass(frozen=True)
class ImportResult:
    handoff_id: str
    outcome: str  # success, fail, recompute
    reason: str | None  # the TransferError's tag when not a success
    error: str | None
    received_pages: int
    skipped_pages: int


class PdImporter:
    """The decode side of one engine's hand-offs (a transport calls offer → report → finish, or abort)."""

    def __init__(self, pool: TwinPool, radix: RadixCache, manifest: Manifest, book: TransferBook) -> None:
        if radix is None:
            raise DsakvError(
                "prefix_cache: the decode side enters hand-offs into its radix tree; set prefix_cache=True"
            )
        self.pool, self.radix, self.manifest, self.book = pool, radix, manifest, book
        self.pool_pages = PoolPages(pool, manifest)
        self._locks: dict[int, tuple[Node, Offer, list[int]]] = {}
        self.quarantined: dict[int, tuple[int, ...]] = {}  # aborted epoch -> pages kept until the sender acks

    def offer(self, offer: Offer) -> tuple[Transfer, Acceptance]:
        """Check the offer's page count against this side's, match the prefix it caches (in the offer's
        namespace), lock it and allocate the rest (evicting unlocked cached pages when the free list is short).
        Raises ``TransferError`` and holds nothing on refusal (``capacity`` when the pages cannot be found)."""
        if offer.count.page_size != self.pool.layout.page_size:
            raise TransferError(
                "page_count", f"offer page_size {offer.count.page_size}: this side's is {self.pool.layout.page_size}"
            )
        check_same_count(offer.own_count(), offer.count)
        transfer = self.book.offer(offer.handoff_id, offer.count, self.pool_pages.names, offer.policy)
        key = self.radix.key(list(offer.tokens[: offer.count.length]), offer.extra_key, offer.cache_salt)
        match = self.radix.match(key, leave_one=False)
        skip = min(len(match.pages), offer.count.pages)
        self.radix.lock(match.node)
        need, alloc = offer.count.pages - skip, self.pool.allocator
        if alloc.num_free < need:  # unlocked cached pages make room (both caches: an evicted page is one unit)
            self.radix.evict((need - alloc.num_free) * self.pool.layout.page_size)
        try:
            dest = alloc.alloc(need)
        except OutOfPagesError as exc:
            self.radix.unlock(match.node)
            raise TransferError("capacity", f"hand-off {offer.handoff_id}: {exc}") from None
        epoch = self.book.allocate(transfer, skip, dest)
        self._locks[epoch] = (match.node, offer, list(match.pages[:skip]))
        return transfer, Acceptance(epoch, skip, tuple(dest))

    def report(self, epoch: int, reports: Sequence[PageReport]) -> None:
        """Record the sender's reports (a stale epoch or a bad report raises, failing nothing else)."""
        transfer = self.book.get(epoch)
        for r in reports:
            transfer.report(epoch, r.index, r.components, r.digest)

    def finish(self, epoch: int) -> ImportResult:
        """Verify every page's bytes, commit and enter the prefix into the radix tree; on any error, end the
        transfer by its policy, free its pages and unlock. Raises only for an unknown or ended epoch."""
        transfer = self.book.get(epoch)
        try:
            gap = transfer.incomplete()
            if gap is not None:
                raise TransferError("missing", f"hand-off {transfer.handoff_id}: {gap}")
            for i, page in zip(transfer.pending, transfer.dest_pages):
                transfer.verify(i, self.pool_pages.digest(i, transfer.count.valid_tokens(i), page))
            transfer.commit()
        except TransferError as exc:
            transfer.fail(exc.reason)
            return self._end(transfer, exc)
        return self._end(transfer, None)

    def fail(self, epoch: int, exc: TransferError) -> ImportResult:
        """End a live transfer as failed (the sender reported an error, vanished, or timed out)."""
        transfer = self.book.get(epoch)
        transfer.fail(exc.reason)
        return self._end(transfer, exc)

    def abort(self, epoch: int, *, quarantine: bool = False) -> AbortAck:
        """Abort a live transfer: every later report of ``epoch`` is rejected and its pages are freed — or,
        with ``quarantine`` (an abort the decode side starts while the sender may still be writing), kept
        allocated until ``release_quarantine(epoch)``: a remote writer cannot be fenced, so the pages are
        reused only once the sender has acknowledged (its next message of that epoch)."""
        ack = self.book.abort(epoch)
        node, _, _ = self._locks.pop(epoch)
        self.radix.unlock(node)
        if quarantine:
            self.quarantined[epoch] = ack.freed_pages
        else:
            self.pool.allocator.free(ack.freed_pages)
        return ack

    def release_quarantine(self, epoch: int) -> int:
        """Free the pages an aborted ``epoch`` kept in quarantine; returns how many (0 if none)."""
        pages = self.quarantined.pop(epoch, ())
        if pages:
            self.pool.allocator.free(pages)
        return len(pages)

    def expire(self) -> list[ImportResult]:
        return [
            self._end(t, TransferError("timeout", f"hand-off {t.handoff_id}: timed out")) for t in self.book.expired()
        ]

    def _end(self, transfer: Transfer, exc: TransferError | None) -> ImportResult:
        node, offer, cached = self._locks.pop(transfer.epoch)
        to_free = list(self.book.end(transfer))
        if exc is None:  # committed: the tree takes the pages (any it holds by now come back as duplicates)
            key = self.radix.key(list(offer.tokens[: offer.count.length]), offer.extra_key, offer.cache_salt)
            full = self.radix.full_pages(offer.count.length)
            res = self.radix.insert(key, cached + list(transfer.dest_pages[: full - transfer.skip]))
            to_free += res.duplicate_pages
            to_free += list(
                transfer.dest_pages[full - transfer.skip :]
            )  # a partial last page: the tree keeps whole pages
        if to_free:
            self.pool.allocator.free(to_free)
        self.radix.unlock(node)
        return ImportResult(
            transfer.handoff_id,
            transfer.outcome,
            None if exc is None else exc.reason,
            None if exc is None else str(exc),
            len(transfer.pending),
            transfer.skip,
        )

    def held_pages(self) -> int:
        """Pages allocated for hand-offs and in no radix node or request: live transfers' and quarantined."""
        return self.book.held_pages() + sum(map(len, self.quarantined.values()))


__all__ = ["Acceptance", "Export", "ImportResult", "PdExporter", "PdImporter", "PoolPages"]
