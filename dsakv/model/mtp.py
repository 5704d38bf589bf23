"""The MTP (multi-token prediction) draft layer of the tiny model, and what both MTP layers return.

DeepSeek-V3's MTP module, as the GLM-MoE-DSA / DeepSeek-V3.2 checkpoints ship it (one layer, cache layer
id ``num_hidden_layers``)::

    e = RMSNorm_e(embed(t[p + 1]))          the token after position p
    h = RMSNorm_h(hidden[p])                the target's final-normed hidden state at p (or, inside a draft
                                            chain, the previous MTP step's output)
    x = eh_proj([e ; h])                    [2 * hidden] -> [hidden], embedding first
    x = decoder layer(x)                    MLA + its own full lightning indexer + MLP, writing the MTP
                                            layer's own main-KV row and indexer key at position p
    logits = head(RMSNorm_shared(x))        predicts t[p + 2]; x goes on as the next chain step's hidden

So the MTP cache at position ``p`` pairs the target's state at ``p`` with the token at ``p + 1``: it is valid
for exactly the positions the target's cache is valid for, once the token after each is known.

``TinyMtpLayer`` holds seeded random weights drawn after the target's (a model built with ``mtp=True``
keeps every target weight of the same seed) and shares the target's embedding and LM head.
``forward_paged`` mutates the pool only, at the batch's slots of the MTP layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dsakv.errors import DsakvError
from dsakv.model.inputs import Batch, PagedCache, SeqInput, validate_batch
from dsakv.model.lightning import IndexerLayer
from dsakv.model.mla import MlaLayer
from dsakv.model.nn import init_linear, init_norm, rms_norm
from dsakv.model.paged_attention import attend_layer
from dsakv.spec.model_spec import ModelSpec

__all__ = ["MtpOutput", "TinyMtpLayer", "check_mtp_inputs"]


@dataclass(frozen=True)
class MtpOutput:
    """``logits [rows, vocab]`` (row r predicts the token two after its position), ``hidden [rows, hidden]``
    (the layer's output before the shared head's norm: the next chain step's input), ``selections[seq]``
    ``[n, width]`` the positions each row attended, ``indexer_rows`` indexer-K rows read (0 when reused)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    selections: tuple[torch.Tensor, ...]
    indexer_rows: int


def check_mtp_inputs(spec: ModelSpec, pool: PagedCache, seqs: Sequence[SeqInput], hidden: torch.Tensor) -> Batch:
    """The batch validated (``validate_batch``), the pool holding an MTP cache layer, ``hidden`` one row per
    token of the batch. Touches nothing."""
    batch = validate_batch(spec, pool, seqs)
    if pool.layout.num_attention_layers <= spec.num_hidden_layers:
        raise DsakvError(
            f"pool layout mtp_layers = {pool.layout.mtp_layers}: the MTP layer needs its own cache layer "
            f"(build the layout with mtp_layers=1)"
        )
    rows, width = batch.token_ids.numel(), spec.arch_value("hidden_size")
    if not isinstance(hidden, torch.Tensor) or tuple(hidden.shape) != (rows, width):
        shape = list(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
        raise DsakvError(f"MTP hidden: {shape}: must be [{rows}, {width}] (one target hidden state per token)")
    return batch


class TinyMtpLayer:
    """enorm / hnorm / eh_proj, one tiny decoder layer with a full indexer, the shared head's norm."""

    def __init__(
        self,
        spec: ModelSpec,
        gen: torch.Generator,
        dtype: torch.dtype,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        mlp: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        hidden = spec.arch_value("hidden_size")
        self.spec, self.dtype, self.layer = spec, dtype, spec.num_hidden_layers
        self.embed, self.lm_head, self.mlp = embed, lm_head, mlp
        self.enorm, self.hnorm = init_norm(gen, hidden, dtype), init_norm(gen, hidden, dtype)
        self.eh_proj = init_linear(gen, 2 * hidden, hidden, dtype)
        self.attn_norm, self.mlp_norm = init_norm(gen, hidden, dtype), init_norm(gen, hidden, dtype)
        self.mla = MlaLayer(spec, gen, dtype)
        self.indexer = IndexerLayer(spec, gen, dtype)
        self.head_norm = init_norm(gen, hidden, dtype)

    def forward_paged(
        self,
        pool: PagedCache,
        seqs: Sequence[SeqInput],
        hidden: torch.Tensor,
        *,
        reuse: Sequence[torch.Tensor] | None = None,
        budget_bytes: int | None = None,
    ) -> MtpOutput:
        """Write the MTP layer's main row and indexer key of every new token, attend, and predict.

        ``seqs[i].token_ids`` are the tokens *after* each position; ``hidden`` the matching hidden states.
        ``reuse``: per sequence a ``[n, width]`` selection to attend instead of scoring the indexer
        (``index_share_for_mtp_iteration``). Raises ``DsakvError`` before writing anything on bad input.
        """
        batch = check_mtp_inputs(self.spec, pool, seqs, hidden)
        emb = rms_norm(self.embed[batch.token_ids], self.enorm)
        x = torch.cat([emb, rms_norm(hidden.to(self.dtype), self.hnorm)], dim=-1) @ self.eh_proj
        xn = rms_norm(x, self.attn_norm)
        proj = self.mla.project(xn, batch.positions)
        pool.store_main(self.layer, batch.slots, proj.latent.float(), proj.k_rope.float())
        pool.store_indexer(self.layer, batch.slots, self.indexer.key(xn, batch.positions).float())
        query = None if reuse is not None else self.indexer.query(xn, proj.qr, batch.positions)
        att = attend_layer(
            pool, self.layer, batch, proj.q_latent, proj.q_rope, query, reuse,
            self.spec.index_topk, self.mla.sm_scale, budget_bytes,
        )  # fmt: skip
        x = x + self.mla.output(att.out.to(self.dtype))
        x = x + self.mlp(rms_norm(x, self.mlp_norm))
        return MtpOutput(rms_norm(x, self.head_norm) @ self.lm_head, x, att.chosen, att.indexer_rows)
