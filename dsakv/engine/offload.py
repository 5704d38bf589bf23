"""Host copies of pages of both caches (offload for preemption, restore into other pages).

A ``HostPages`` holds, for each offloaded page id, one block in the ``packed`` byte order of the layout
(every attention layer's main page, then every indexer layer's page) whatever the pool's own layout, so
a host copy taken from a ``slot`` pool restores bit-exact into a ``packed`` pool of the same layout and
vice versa. Both caches always travel together: there is no way to build or restore one without the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout


@dataclass(frozen=True)
class HostPages:
    """Bytes of both caches of ``len(source_pages)`` pages, on host (pinned when the pool is on CUDA).

    ``blocks`` is uint8 ``[num_pages, layout.page_bytes]``; ``layout`` and ``fp8_scales`` (the per-layer
    scales of a ``kv_dtype="fp8"`` pool) are what the bytes mean: a restore checks both match, since the
    same bytes read through another scale are other values. Immutable by convention: ``restore_pages``
    only reads it.
    """

    layout: CacheLayout
    source_pages: tuple[int, ...]
    blocks: torch.Tensor
    fp8_scales: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """``blocks`` must be host uint8 ``[num_pages, layout.page_bytes]`` (both caches of every page)."""
        want = (len(self.source_pages), self.layout.page_bytes)
        b = self.blocks
        if (
            not isinstance(b, torch.Tensor)
            or b.dtype != torch.uint8
            or tuple(b.shape) != want
            or b.device.type != "cpu"
        ):
            got = f"{b.dtype} {tuple(b.shape)} on {b.device}" if isinstance(b, torch.Tensor) else type(b).__name__
            raise DsakvError(f"HostPages.blocks: {got}; must be host uint8 {want} (both caches of every page)")

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
