"""The engine's store tier: the scheduler's ``LowerTier`` protocol over a ``RedisPageStore``.

Fetch-and-verify at lookup. ``lookup_prefix`` GETs the values of the pages it is asked about and checks each
(magic, version, layout fingerprint, page size, payload length, checksum: ``dsakv.store.value``); the hit is
the run of leading pages that passed, and their verified bytes are staged in process memory. A load-back
then copies staged bytes into the device pool and cannot fail: the server's eviction, a restart or a
corrupted value after the lookup changes nothing, and a bad value is a counted miss whose tokens the request
computes. The price is that a lookup moves the bytes even when the request is not admitted in that step;
staged pages that no load-back pinned are dropped at the end of each engine step (``drop_unpinned``), so
staging never holds more than one step's lookups.

``pin`` keeps a staged page until ``unpin`` (the scheduler pins what a load-back reads and unpins it in
``load_backs_done``). The server itself cannot pin: it may drop any page at any time. ``reserve`` skips pages
the server already holds (EXISTS) and, while the server is unreachable, reserves nothing (the scheduler
counts the skipped writes); the engine then writes the reserved pages with ``put_pages``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from dsakv.cache.tiers import STORE, Reservation
from dsakv.errors import DsakvError
from dsakv.store.redis_store import RedisPageStore


class StoreTier:
    """``LowerTier`` named ``"store"`` over a page store; holds the verified bytes of staged pages."""

    name = STORE

    def __init__(self, store: RedisPageStore) -> None:
        self.store = store
        self._staged: dict[bytes, memoryview] = {}
        self._pins: Counter[bytes] = Counter()

    # ----- LowerTier ------------------------------------------------------------------------------
    def lookup_prefix(self, hashes: Sequence[bytes]) -> int:
        """Leading pages whose values the server holds *and* that pass every check; their bytes are staged."""
        payloads = self.store.fetch_prefix(hashes)
        for h, payload in zip(hashes, payloads):
            self._staged[h] = payload
        return len(payloads)

    def touch(self, hashes: Sequence[bytes]) -> None:
        """Nothing to do: the GET at lookup already refreshed the server's LRU clock of these pages."""

    def pin(self, hashes: Sequence[bytes]) -> None:
        missing = [h for h in hashes if h not in self._staged]
        if missing:
            raise DsakvError(f"pin: store page {missing[0].hex()} was not found by a lookup in this step")
        self._pins.update(hashes)

    def unpin(self, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            if self._pins[h] < 1:
                raise DsakvError(f"unpin: store page {h.hex()} is not pinned")
        self._pins.subtract(hashes)
        for h in hashes:
            if self._pins[h] == 0:
                del self._pins[h]
                self._staged.pop(h, None)

    def reserve(self, hashes: Sequence[bytes], depths: Sequence[int]) -> Reservation | None:
        if len(depths) != len(hashes):
            raise DsakvError(f"reserve: {len(depths)} depths for {len(hashes)} page hashes")
        present = self.store.present(hashes)
        if present is None:
            return None
        new = list(dict.fromkeys(h for h, there in zip(hashes, present) if not there))
        return Reservation(tuple(new), (None,) * len(new), (), ())

    def record_written(self, hashes: Sequence[bytes]) -> None:
        """Nothing to record: the server is the index (the engine writes the bytes)."""

    def slot_of(self, page_hash: bytes) -> None:
        return None

    # ----- bytes for the engine -------------------------------------------------------------------
    def staged_blocks(self, hashes: Sequence[bytes], page_bytes: int) -> torch.Tensor:
        """The staged (verified) bytes of ``hashes`` as uint8 ``[n, page_bytes]``, for a load-back."""
        out = torch.empty((len(hashes), page_bytes), dtype=torch.uint8)
        rows = out.numpy()
        for i, h in enumerate(hashes):
            payload = self._staged.get(h)
            if payload is None:
                raise DsakvError(f"load-back: store page {h.hex()} is not staged (pin it at lookup)")
            rows[i] = memoryview(payload).cast("B")
        return out

    def write(self, hashes: Sequence[bytes], blocks: torch.Tensor) -> int:
        """Write both caches of each page (row ``i`` of ``blocks`` under ``hashes[i]``); returns pages written
        (fewer on a server fault, which the store counts and logs)."""
        rows = blocks.contiguous().numpy()
        return self.store.put_pages([(h, rows[i].data) for i, h in enumerate(hashes)])

    def drop_unpinned(self) -> None:
        """Forget staged pages no load-back pinned (a lookup whose request was not admitted)."""
        self._staged = {h: p for h, p in self._staged.items() if self._pins[h] > 0}

    @property
    def staged_pages(self) -> int:
        return len(self._staged)


__all__ = ["StoreTier"]
