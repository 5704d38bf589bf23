"""``DsaModel``: a GLM-MoE-DSA or DeepSeek-V3.2 checkpoint running through the paged twin cache.

Same contract as ``TinyDsaModel.forward_paged`` (see ``dsakv.model.tiny_dsa``): one call writes the new
tokens' main rows (every layer) and indexer keys (full layers) through the ``PagedCache`` protocol, then per
sequence reads the whole context's indexer keys, selects top-k (``dsakv.model.indexer``; shared layers reuse
the previous full layer's choice) and reads only the selected main rows for sparse MLA.

The cache mode follows the pool's layout:

* exact (``kv_dtype="fp32"``, ``indexer_dtype="fp32"``): nothing is rounded; greedy tokens equal
  transformers' ``generate()`` (the tests prove it on tiny checkpoints);
* production (``fp8_ds_mla`` main KV, fp8 indexer): Hadamard-rotated fp8 indexer queries and keys, fp8
  latent with tile scales; its agreement with the exact mode is measured by ``bench/dsa_agreement.py``.

Compute runs in fp32 on the CPU. The model holds weights only; ``forward_paged`` mutates the pool only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from dsakv.errors import DsakvError
from dsakv.model.checkpoint import iter_weights
from dsakv.model.dsa_config import DsaConfig
from dsakv.model.dsa_layers import (
    DenseMlp,
    Indexer,
    IndexerRounding,
    Mla,
    Moe,
    Weights,
    rms_norm,
)
from dsakv.model.dsa_mtp import DsaMtpLayer
from dsakv.model.inputs import PagedCache, SeqInput, validate_batch
from dsakv.model.paged_attention import attend_layer
from dsakv.model.rope import RopeTables
from dsakv.model.tiny_dsa import PagedOutput

__all__ = ["DsaModel"]


class DsaModel:
    """Checkpoint weights (fp32) and the paged forward."""

    def __init__(self, cfg: DsaConfig, weights: Weights, *, mtp: bool = False) -> None:
        self.cfg, self.spec, self.dtype = cfg, cfg.spec, torch.float32
        # None: the pool decides (Hadamard + fp8 query iff its indexer K is fp8); set to isolate one rounding
        self.indexer_rounding: IndexerRounding | None = None
        w = weights
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = self.embed if cfg.tie_word_embeddings else w["lm_head.weight"]
        self.final_norm = w["model.norm.weight"]
        self.attn_norm, self.mlp_norm, self.mla, self.mlp = [], [], [], []
        self.indexer: dict[int, Indexer] = {}
        h = cfg.hidden_size
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            self.attn_norm.append(w[p + "input_layernorm.weight"])
            self.mlp_norm.append(w[p + "post_attention_layernorm.weight"])
            self.mla.append(Mla(cfg, w, p + "self_attn."))
            if i in self.spec.full_indexer_layers:
                self.indexer[i] = Indexer(cfg, w, p + "self_attn.indexer.")
            sparse = cfg.mlp_layer_types[i] == "sparse"
            self.mlp.append(Moe(cfg, w, p + "mlp.") if sparse else DenseMlp(w, p + "mlp.", h, cfg.intermediate_size))
        # the first MTP layer (dsakv.model.dsa_mtp), loaded only when asked for: plain decoding skips its weights
        self.mtp = DsaMtpLayer(cfg, w, self.embed, self.lm_head) if mtp else None

    @classmethod
    def from_checkpoint(cls, folder: str | Path, *, available_bytes: int | None = None, mtp: bool = False) -> DsaModel:
        """Load ``folder/config.json`` and its safetensors (see ``dsakv.model.checkpoint``); ``mtp`` loads the
        first MTP layer too (``num_nextn_predict_layers`` must be >= 1 and its tensors present)."""
        folder = Path(folder)
        cfg = DsaConfig.from_hf_config(folder / "config.json", name=folder.name)
        if mtp and cfg.spec.num_nextn_predict_layers < 1:
            raise DsakvError(
                f"checkpoint {str(folder)!r}: config field 'num_nextn_predict_layers' = "
                f"{cfg.spec.num_nextn_predict_layers}: speculative 'mtp' needs an MTP layer (>= 1)"
            )
        layers = cfg.num_hidden_layers + (1 if mtp else 0)
        weights = dict(iter_weights(folder, layers, torch.float32, available=available_bytes))
        return cls(cfg, weights, mtp=mtp)

    def forward_paged(
        self,
        pool: PagedCache,
        seqs: Sequence[SeqInput],
        *,
        all_logits: bool = False,
        budget_bytes: int | None = None,
    ) -> PagedOutput:
        """Write the new tokens into both caches and compute their logits from the pool (``TinyDsaModel``'s
        contract; bad input raises ``DsakvError`` before anything is written)."""
        batch = validate_batch(self.spec, pool, seqs)
        rounding = self.indexer_rounding or IndexerRounding.for_production(pool.layout.indexer_dtype != "fp32")
        cfg, spec = self.cfg, self.spec
        rope = RopeTables.at(cfg.rope, spec.qk_rope_head_dim, batch.positions)
        x = F.embedding(batch.token_ids, self.embed)
        sel_by_layer: list[tuple[torch.Tensor, ...]] = []
        main_read, index_read = [], []
        for layer in range(spec.num_hidden_layers):
            xn = rms_norm(x, self.attn_norm[layer], cfg.rms_norm_eps)
            proj = self.mla[layer].project(xn, rope)
            pool.store_main(layer, batch.slots, proj.latent, proj.k_rope)
            query = None
            if layer in self.indexer:
                idx = self.indexer[layer]
                pool.store_indexer(layer, batch.slots, idx.key(xn, rope, rounding))
                query = idx.query(xn, proj.qr, rope, rounding)
            reused = None if query is not None else sel_by_layer[self.spec.indexer_source_layer[layer]]
            att = attend_layer(
                pool, layer, batch, proj.q_latent, proj.q_rope, query, reused,
                self.spec.index_topk, self.mla[layer].sm_scale, budget_bytes,
            )  # fmt: skip
            sel_by_layer.append(att.chosen)
            main_read.append(att.main_rows)
            index_read.append(att.indexer_rows)
            x = x + self.mla[layer].output(att.out)
            x = x + self.mlp[layer](rms_norm(x, self.mlp_norm[layer], cfg.rms_norm_eps))
        if not all_logits:
            x = x[batch.last_rows]
        hidden = rms_norm(x, self.final_norm, cfg.rms_norm_eps)
        logits = F.linear(hidden, self.lm_head)
        return PagedOutput(logits, tuple(sel_by_layer), tuple(main_read), tuple(index_read), hidden)
