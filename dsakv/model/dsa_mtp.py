"""The MTP layer of a GLM-MoE-DSA / DeepSeek-V3.2 checkpoint (``dsakv.model.mtp`` gives the dataflow).

Tensor names, as the published checkpoints store them under ``model.layers.{L}.`` with ``L =
num_hidden_layers`` (the layer after the last decoder layer; SGLang's ``deepseek_nextn`` / vLLM's
``deepseek_mtp`` read the same names)::

    enorm.weight, hnorm.weight             RMSNorms of the embedding and of the target's hidden state
    eh_proj.weight                         [hidden, 2 * hidden], input [enorm(embedding) ; hnorm(hidden)]
    input_layernorm.weight, self_attn.*    one decoder layer: MLA with q-LoRA and its lightning indexer
    post_attention_layernorm.weight, mlp.* MoE (``mlp.gate.weight`` present) or a dense SwiGLU MLP
    shared_head.norm.weight                the norm before the LM head
    shared_head.head.weight, embed_tokens.weight   optional: copies of the target's, used when present

Block-FP8 weights are dequantized on load like every other tensor (``dsakv.model.checkpoint``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from dsakv.model.dsa_config import DsaConfig
from dsakv.model.dsa_layers import DenseMlp, Indexer, IndexerRounding, Mla, Moe, Weights, _take, rms_norm
from dsakv.model.inputs import PagedCache, SeqInput
from dsakv.model.mtp import MtpOutput, check_mtp_inputs
from dsakv.model.paged_attention import attend_layer
from dsakv.model.rope import RopeTables

__all__ = ["DsaMtpLayer", "mtp_prefix"]


def mtp_prefix(cfg: DsaConfig) -> str:
    return f"model.layers.{cfg.num_hidden_layers}."


class DsaMtpLayer:
    """Checkpoint weights of the first MTP layer (fp32) and its paged forward."""

    def __init__(self, cfg: DsaConfig, w: Weights, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        p, h = mtp_prefix(cfg), cfg.hidden_size
        self.cfg, self.spec, self.layer = cfg, cfg.spec, cfg.num_hidden_layers
        self.embed = w.get(p + "embed_tokens.weight", embed)
        self.lm_head = w.get(p + "shared_head.head.weight", lm_head)
        self.enorm = _take(w, p + "enorm.weight", (h,))
        self.hnorm = _take(w, p + "hnorm.weight", (h,))
        self.eh_proj = _take(w, p + "eh_proj.weight", (h, 2 * h))
        self.attn_norm = _take(w, p + "input_layernorm.weight", (h,))
        self.mlp_norm = _take(w, p + "post_attention_layernorm.weight", (h,))
        self.head_norm = _take(w, p + "shared_head.norm.weight", (h,))
        self.mla = Mla(cfg, w, p + "self_attn.")
        self.indexer = Indexer(cfg, w, p + "self_attn.indexer.")
        sparse = p + "mlp.gate.weight" in w
        self.mlp = Moe(cfg, w, p + "mlp.") if sparse else DenseMlp(w, p + "mlp.", h, cfg.intermediate_size)

    def forward_paged(
        self,
        pool: PagedCache,
        seqs: Sequence[SeqInput],
        hidden: torch.Tensor,
        *,
        reuse: Sequence[torch.Tensor] | None = None,
        budget_bytes: int | None = None,
        rounding: IndexerRounding | None = None,
    ) -> MtpOutput:
        """``TinyMtpLayer.forward_paged``'s contract on the checkpoint's weights (exact or production cache,
        as the pool's indexer dtype says unless ``rounding`` is given)."""
        batch = check_mtp_inputs(self.spec, pool, seqs, hidden)
        rounding = rounding or IndexerRounding.for_production(pool.layout.indexer_dtype != "fp32")
        eps = self.cfg.rms_norm_eps
        rope = RopeTables.at(self.cfg.rope, self.spec.qk_rope_head_dim, batch.positions)
        emb = rms_norm(F.embedding(batch.token_ids, self.embed), self.enorm, eps)
        x = F.linear(torch.cat([emb, rms_norm(hidden.float(), self.hnorm, eps)], dim=-1), self.eh_proj)
        xn = rms_norm(x, self.attn_norm, eps)
        proj = self.mla.project(xn, rope)
        pool.store_main(self.layer, batch.slots, proj.latent, proj.k_rope)
        pool.store_indexer(self.layer, batch.slots, self.indexer.key(xn, rope, rounding))
        query = None if reuse is not None else self.indexer.query(xn, proj.qr, rope, rounding)
        att = attend_layer(
            pool, self.layer, batch, proj.q_latent, proj.q_rope, query, reuse,
            self.spec.index_topk, self.mla.sm_scale, budget_bytes,
        )  # fmt: skip
        x = x + self.mla.output(att.out)
        x = x + self.mlp(rms_norm(x, self.mlp_norm, eps))
        logits = F.linear(rms_norm(x, self.head_norm, eps), self.lm_head)
        return MtpOutput(logits, x, att.chosen, att.indexer_rows)
