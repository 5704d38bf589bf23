"""The host tier's bytes: one host buffer of ``num_pages`` pages of both caches, packed order.

The scheduler's host ``TierIndex`` (``dsakv.cache.tiers``, ``slots=True``) decides which page lives in which
slot; this buffer only holds the bytes, row ``slot`` = one page in the layout's ``packed`` order (every
attention layer's main page, then every full layer's indexer page), whatever the pool's own layout. A copy
is always a whole page of both caches (``TwinPool.offload_pages`` / ``restore_pages``): there is no call
that moves one cache without the other. On CUDA the buffer is pinned, so copies are DMA; on the CPU they
are memcpy.

One host copy serves every tensor-parallel rank (MLA's latent and indexer pages are the same on each), so
the buffer is sized per node, not per rank (``dsakv plan --host-bytes``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsakv.engine.offload import host_buffer
from dsakv.engine.pool import TwinPool
from dsakv.errors import DsakvError


class HostTierBuffer:
    """``num_pages`` x ``layout.page_bytes`` host bytes for the host tier of one pool."""

    def __init__(self, pool: TwinPool, num_pages: int) -> None:
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
            raise DsakvError(f"host num_pages = {num_pages!r}: must be a positive integer")
        self.pool = pool
        self.num_pages = num_pages
        self.blocks = host_buffer(num_pages, pool.layout.page_bytes, pool.device)

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def _rows(self, slots: Sequence[int | None], what: str) -> list[int]:
        if any(s is None or not 0 <= s < self.num_pages for s in slots):
            raise DsakvError(f"{what}: host slots {list(slots)} must lie in 0..{self.num_pages - 1}")
        return list(slots)

    def write_from_device(self, pages: Sequence[int], slots: Sequence[int | None]) -> None:
        """Both caches of device ``pages[i]`` into host slot ``slots[i]``. Does not modify the pool."""
        self.pool.copy_pages_to_host(pages, self.blocks, self._rows(slots, "write_from_device"))

    def load_to_device(self, slots: Sequence[int | None], pages: Sequence[int]) -> None:
        """Host slot ``slots[i]`` into device page ``pages[i]`` (allocated), both caches, bit-exact; returns
        once the copy is complete (the forward that follows reads the pages)."""
        self.pool.copy_pages_from_host(self.blocks, self._rows(slots, "load_to_device"), pages)

    def read_slots(self, slots: Sequence[int | None]) -> torch.Tensor:
        """A copy of the listed slots' bytes (``[n, page_bytes]`` uint8), e.g. to write them to the store."""
        return self.blocks[torch.tensor(self._rows(slots, "read_slots"), dtype=torch.long)]


__all__ = ["HostTierBuffer"]
