"""Host copies of pages of both caches (offload for preemption, restore into other pages).

A ``HostPages`` holds, for each offloaded page id, one block in the ``packed`` byte order of the layout
(every attention layer's main page, then every indexer layer's page) whatever the pool's own layout, so
a host copy taken from a ``slot`` pool restores bit-exact into a ``packed`` pool of the same layout and
vice versa. Both caches always travel together: there is no way to build or restore one without the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsakv.layout import CacheLayout


@dataclass(frozen=True)
class HostPages:
    """Bytes of both caches of ``len(source_pages)`` pages, on host (pinned when the pool is on CUDA).

    ``blocks`` is uint8 ``[num_pages, layout.page_bytes]``; ``layout`` is the layout they were taken
    with (a restore checks it matches). Immutable by convention: ``restore_pages`` only reads it.
    """

    layout: CacheLayout
    source_pages: tuple[int, ...]
    blocks: torch.Tensor

    @property
    def num_pages(self) -> int:
        return len(self.source_pages)

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()


def block_spans(layout: CacheLayout) -> list[tuple[str, int, int, int]]:
    """(cache, layer, byte offset, byte length) of every per-layer page inside one packed block."""
    spans = [
        ("main", layer, layout.packed_main_offset(layer), layout.main_page_bytes_per_layer)
        for layer in range(layout.num_attention_layers)
    ]
    spans += [
        ("indexer", layer, layout.packed_indexer_offset(layer), layout.indexer_page_bytes_per_layer)
        for layer in layout.indexer_layers
    ]
    return spans


def host_buffer(num_pages: int, page_bytes: int, device: torch.device) -> torch.Tensor:
    """Host uint8 buffer for offloaded blocks; pinned when the pool lives on CUDA (async DMA)."""
    return torch.empty((num_pages, page_bytes), dtype=torch.uint8, pin_memory=device.type == "cuda")
