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

from dsakv.kernels.sparse_mla_kernels import merge_partials, sparse_mla_partial_torch
from dsakv.model.indexer import indexer_topk
from dsakv.model.inputs import Batch, CheckedSlots, PagedCache
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
        selected = context.take(compact.positions)
        shards = pool.main_shards(layer)
        if shards == 1:
            latent, rope = pool.read_main(layer, selected)
            outs.append(sparse_mla(q_latent[rows], q_rope[rows], latent, rope, compact.local, sm_scale))
        else:
            outs.append(
                _dcp_attention(pool, layer, shards, selected, compact.local, q_latent[rows], q_rope[rows], sm_scale)
            )
        chosen_all.append(chosen)
        main_rows += compact.positions.numel()
    return LayerAttention(torch.cat(outs), tuple(chosen_all), main_rows, indexer_rows)


def _dcp_attention(
    pool: PagedCache,
    layer: int,
    shards: int,
    selected: CheckedSlots,
    local: torch.Tensor,
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Sparse MLA over a DCP group: each rank attends to the selected rows it holds (token ``t`` of a page on
    rank ``t % shards``), returning its output and log-sum-exp; the partials merge by their log-sum-exp.

    ``local [T, K]`` indexes ``selected``; per rank it is remapped to the rank's own rows (-1 elsewhere)."""
    rank_of = selected.tensor % shards  # slot offsets within a page keep the token's residue
    outs, lses = [], []
    for rank in range(shards):
        mine = (rank_of == rank).nonzero().flatten()
        remap = torch.full((len(selected) + 1,), -1, dtype=torch.int64)
        remap[mine] = torch.arange(len(mine))
        rank_local = remap[local]  # local == -1 reads remap[-1], the padding entry (-1)
        latent, rope = pool.read_main_rank(layer, rank, selected.take(mine))
        out, lse = sparse_mla_partial_torch(q_latent, q_rope, latent, rope, rank_local, sm_scale)
        outs.append(out)
        lses.append(lse)
    return merge_partials(outs, lses)
