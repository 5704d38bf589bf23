"""One layer's sparse attention over the paged cache, shared by the tiny and the real DSA models.

Per sequence of the batch: select (a full layer scores the pool's indexer K with the layer's indexer query;
a shared layer reuses its source layer's choice), read only the selected main rows, attend in absorbed form.
The caller has stored this layer's rows of both caches before (``PagedCache.store_*``), so a sequence sees
its own new tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from dsakv.model.indexer import indexer_topk
from dsakv.model.inputs import Batch, PagedCache
from dsakv.model.sparse_mla import compact_selection, sparse_mla


class IndexerQueryRows(Protocol):
    """What a full layer's indexer query carries (both models' query types have it)."""

    q: torch.Tensor  # [rows, index_heads, index_head_dim]
    weights: torch.Tensor  # [rows, index_heads]


@dataclass(frozen=True)
class LayerAttention:
    out: torch.Tensor  # [rows of the batch, heads, kv_lora_rank]
    chosen: tuple[torch.Tensor, ...]  # per sequence: [n, width] selected positions
    main_rows: int  # main-KV rows read
    indexer_rows: int  # indexer-K rows read


def attend_layer(
    pool: PagedCache,
    layer: int,
    batch: Batch,
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    query: IndexerQueryRows | None,
    reused: Sequence[torch.Tensor] | None,
    index_topk: int,
    sm_scale: float,
    budget_bytes: int | None,
) -> LayerAttention:
    """``query`` on a full layer (``reused`` None); ``reused``, the source layer's per-sequence choice, on a
    shared one (``query`` None)."""
    outs, chosen_all = [], []
    main_rows = indexer_rows = 0
    for i, (seq, context, rows) in enumerate(zip(batch.seqs, batch.context, batch.rows)):
        if query is not None:
            k, k_scale = pool.read_indexer(layer, context)
            indexer_rows += len(context)
            chosen = indexer_topk(
                query.q[rows], query.weights[rows], k, k_scale, seq.positions + 1, index_topk,
                budget_bytes=budget_bytes,
            ).indices  # fmt: skip
        else:
            chosen = reused[i]
        compact = compact_selection(chosen)
        latent, rope = pool.read_main(layer, context.take(compact.positions))
        outs.append(sparse_mla(q_latent[rows], q_rope[rows], latent, rope, compact.local, sm_scale))
        chosen_all.append(chosen)
        main_rows += compact.positions.numel()
    return LayerAttention(torch.cat(outs), tuple(chosen_all), main_rows, indexer_rows)
