"""The paged layer loop both models run (``TinyDsaModel`` and ``DsaModel``), once.

``PagedDecoder.forward_paged`` validates the batch, embeds its tokens, then per decoder layer::

    xn = norm(x)                               attention RMSNorm
    proj = project(layer, xn)                  MLA: q (latent + rope), the latent KV row, the q-LoRA rank
    pool.store_main(layer, slots, proj)        every layer writes its main rows
    full layer: pool.store_indexer(layer, slots, index_key(layer, xn)); query = index_query(layer, xn, qr)
    shared layer: reuse the selection of its source full layer (spec.indexer_source_layer)
    att = attend_layer(...)                    indexer top-k over the context, sparse MLA on the selected rows
    x = x + mla.output(att.out);  x = x + mlp(norm(x))

and returns the final-normed hidden state and logits of the last token of each sequence (every token with
``all_logits``) as a ``PagedOutput``. A model supplies its weights (``attn_norm``, ``mlp_norm``, ``mla``,
``indexer`` keyed by full layer, ``mlp``) and the hooks that differ between the two: the norm (eps), the
embedding and LM head, and what positions the projections take (positions for the tiny model, RoPE tables
and the indexer rounding for a checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsakv.model.inputs import Batch, PagedCache, SeqInput, validate_batch
from dsakv.model.mla import MlaProjection
from dsakv.model.paged_attention import attend_layer
from dsakv.spec.model_spec import ModelSpec

__all__ = ["PagedDecoder", "PagedOutput"]


@dataclass(frozen=True)
class PagedOutput:
    """``logits``: ``[num_seqs, vocab]`` (or ``[sum n, vocab]``); ``selections[layer][seq]``: ``[n, width]``
    selected context positions (-1 padded); ``main_rows_read`` / ``indexer_rows_read``: rows read from each
    cache per layer in this call (0 indexer rows on shared layers); ``hidden``: the final-normed hidden
    state of each returned row (what the MTP layer reads)."""

    logits: torch.Tensor
    selections: tuple[tuple[torch.Tensor, ...], ...]
    main_rows_read: tuple[int, ...]
    indexer_rows_read: tuple[int, ...]
    hidden: torch.Tensor | None = None


class PagedDecoder:
    """The layer loop over the twin pool; subclasses hold the weights and implement the hooks below."""

    spec: ModelSpec
    dtype: torch.dtype
    attn_norm: Sequence[torch.Tensor]
    mlp_norm: Sequence[torch.Tensor]
    mla: Sequence[Any]
    indexer: Mapping[int, Any]
    mlp: Sequence[Callable[[torch.Tensor], torch.Tensor]]
    final_norm: torch.Tensor

    # ----- hooks ----------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _where(self, pool: PagedCache, batch: Batch) -> Any:
        """What the projections take for this batch's positions (read by the three hooks below)."""
        raise NotImplementedError

    def _project(self, layer: int, xn: torch.Tensor, where: Any) -> MlaProjection:
        raise NotImplementedError

    def _index_key(self, layer: int, xn: torch.Tensor, where: Any) -> torch.Tensor:
        raise NotImplementedError

    def _index_query(self, layer: int, xn: torch.Tensor, qr: torch.Tensor, where: Any) -> Any:
        raise NotImplementedError

    # ----- the loop -------------------------------------------------------------------------------
    def forward_paged(
        self,
        pool: PagedCache,
        seqs: Sequence[SeqInput],
        *,
        all_logits: bool = False,
        budget_bytes: int | None = None,
    ) -> PagedOutput:
        """Write the new tokens into both caches of ``pool`` and compute their logits from the pool.

        ``budget_bytes`` overrides the indexer logits budget (row chunking). Raises ``DsakvError`` before
        writing anything on bad input (see ``dsakv.model.tiny_dsa``). The batch is checked once, here; every
        layer then hands the pool the same ``CheckedSlots``, which it does not check again.
        """
        batch = validate_batch(self.spec, pool, seqs)
        spec, where = self.spec, self._where(pool, batch)
        x = self._embed(batch.token_ids)
        sel_by_layer: list[tuple[torch.Tensor, ...]] = []
        main_read, index_read = [], []
        for layer in range(spec.num_hidden_layers):
            xn = self._norm(x, self.attn_norm[layer])
            proj = self._project(layer, xn, where)
            pool.store_main(layer, batch.slots, proj.latent.float(), proj.k_rope.float())
            query = None
            if layer in self.indexer:
                pool.store_indexer(layer, batch.slots, self._index_key(layer, xn, where).float())
                query = self._index_query(layer, xn, proj.qr, where)
            reused = None if query is not None else sel_by_layer[spec.indexer_source_layer[layer]]
            att = attend_layer(
                pool, layer, batch, proj.q_latent, proj.q_rope, query, reused,
                spec.index_topk, self.mla[layer].sm_scale, budget_bytes,
            )  # fmt: skip
            sel_by_layer.append(att.chosen)
            main_read.append(att.main_rows)
            index_read.append(att.indexer_rows)
            x = x + self.mla[layer].output(att.out.to(self.dtype))
            x = x + self.mlp[layer](self._norm(x, self.mlp_norm[layer]))
        if not all_logits:
            x = x[batch.last_rows]
        hidden = self._norm(x, self.final_norm)
        return PagedOutput(self._logits(hidden), tuple(sel_by_layer), tuple(main_read), tuple(index_read), hidden)
