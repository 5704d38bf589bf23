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

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dsakv.errors import DsakvError
from dsakv.model.checkpoint import iter_weights
from dsakv.model.decoder import PagedDecoder
from dsakv.model.dsa_config import DsaConfig
from dsakv.model.dsa_layers import (
    DenseMlp,
    Indexer,
    IndexerQuery,
    IndexerRounding,
    Mla,
    MlaProjection,
    Moe,
    Weights,
    rms_norm,
)
from dsakv.model.dsa_mtp import DsaMtpLayer
from dsakv.model.inputs import Batch, PagedCache
from dsakv.model.rope import RopeTables

__all__ = ["DsaModel"]


@dataclass(frozen=True)
class _Where:
    """What a checkpoint's projections take for one batch: its RoPE tables and the indexer rounding."""

    rope: RopeTables
    rounding: IndexerRounding


class DsaModel(PagedDecoder):
    """Checkpoint weights (fp32) and the paged forward (``PagedDecoder``'s loop)."""

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

    # ----- paged path: the loop is PagedDecoder.forward_paged (TinyDsaModel's contract) ---------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.cfg.rms_norm_eps)

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.embed)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head)

    def _where(self, pool: PagedCache, batch: Batch) -> _Where:
        rounding = self.indexer_rounding or IndexerRounding.for_production(pool.layout.indexer_dtype != "fp32")
        return _Where(RopeTables.at(self.cfg.rope, self.spec.qk_rope_head_dim, batch.positions), rounding)

    def _project(self, layer: int, xn: torch.Tensor, where: _Where) -> MlaProjection:
        return self.mla[layer].project(xn, where.rope)

    def _index_key(self, layer: int, xn: torch.Tensor, where: _Where) -> torch.Tensor:
        return self.indexer[layer].key(xn, where.rope, where.rounding)

    def _index_query(self, layer: int, xn: torch.Tensor, qr: torch.Tensor, where: _Where) -> IndexerQuery:
        return self.indexer[layer].query(xn, qr, where.rope, where.rounding)
