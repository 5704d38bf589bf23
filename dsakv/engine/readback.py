"""Reading a request's two caches back from the pool, to prove that no scheduling path changed a byte.

``read_request_cache(pool, pages, num_tokens)`` gathers, for positions ``0 .. num_tokens - 1`` of a
request whose page table is ``pages``, every layer's main row (dequantized latent and RoPE) and every full
layer's raw indexer key (fp8 bytes) and scale. Two read-backs are equal when every tensor is bit-identical
(``CacheReadback.equals``); ``digest()`` is an xxh3-64 of all bytes in a fixed order, for reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import xxhash

from dsakv.model.inputs import PagedCache, request_slots


@dataclass(frozen=True)
class CacheReadback:
    num_tokens: int
    main: tuple[torch.Tensor, ...]  # per attention layer: [n, kv_lora_rank + rope] fp32
    indexer_keys: tuple[torch.Tensor, ...]  # per indexer layer: [n, index_head_dim] uint8 (fp8 bytes)
    indexer_scales: tuple[torch.Tensor, ...]  # per indexer layer: [n] fp32

    def equals(self, other: CacheReadback) -> bool:
        mine = (self.main, self.indexer_keys, self.indexer_scales)
        theirs = (other.main, other.indexer_keys, other.indexer_scales)
        return self.num_tokens == other.num_tokens and all(
            len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)) for a, b in zip(mine, theirs)
        )

    def digest(self) -> str:
        h = xxhash.xxh3_64()
        for t in (*self.main, *self.indexer_keys, *self.indexer_scales):
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


def read_request_cache(pool: PagedCache, pages: Sequence[int], num_tokens: int) -> CacheReadback:
    """Both caches of the first ``num_tokens`` positions of a page table. Does not modify the pool.

    The slots are a plain tensor, so the pool checks them (allocated or scratch pages).
    """
    layout = pool.layout
    slots = request_slots(pages, num_tokens, layout.page_size)
    main = []
    for layer in range(layout.num_attention_layers):
        latent, rope = pool.read_main(layer, slots)
        main.append(torch.cat([latent, rope], dim=1))
    keys, scales = [], []
    for layer in layout.indexer_layers:
        key, scale = pool.read_indexer(layer, slots)
        keys.append(key.view(torch.uint8).clone())
        scales.append(scale.clone())
    return CacheReadback(num_tokens, tuple(main), tuple(keys), tuple(scales))
