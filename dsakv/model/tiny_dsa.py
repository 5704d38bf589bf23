"""A tiny random-weight DSA model that reads back what the twin pool stored.

Layers: embedding -> per layer [RMSNorm -> MLA + lightning indexer -> residual -> RMSNorm -> SwiGLU MLP ->
residual] -> RMSNorm -> LM head. Sizes come from the spec (``ModelSpec.preset("tiny")``); full indexer
layers score and select, shared layers reuse the previous full layer's selection and store no indexer K.

Two execution paths with the same weights:

* :meth:`TinyDsaModel.forward_paged` -- the engine's path. For a batch of sequences it writes the new
  tokens' main rows (every layer) and indexer keys (full layers) into the pool, then per sequence reads the
  indexer keys of the whole context (``pool.read_indexer``), selects top-k, and reads **only the selected**
  main rows (``pool.read_main``) for sparse MLA. Prefill, chunked prefill over a cached prefix and decode
  are the same call::

      seqs = [SeqInput(token_ids=new_ids, positions=range(L - n, L), slots=new_slots, context_slots=all_L_slots)]
      out = model.forward_paged(pool, seqs)        # out.logits [num_seqs, vocab] (last token of each)
      out.main_rows_read[layer]                    # main rows read per layer in this step

  ``SeqInput``: ``token_ids`` [n] the tokens to compute; ``positions`` [n] their positions, which must be
  ``L-n .. L-1``; ``slots`` [n] where to write them; ``context_slots`` [L] the slots of positions
  ``0 .. L-1`` (cached prefix + the new tokens, so ``context_slots[L-n:] == slots``). Every slot must lie
  in an allocated page of ``pool.allocator`` and new slots must be distinct across the batch. The whole
  batch is validated before anything is written: bad input raises ``DsakvError`` and leaves the pool
  untouched. ``all_logits=True`` returns ``[sum n, vocab]`` (every new token, sequences concatenated).

* :meth:`TinyDsaModel.forward_dense` -- the reference: one sequence from position 0, no cache. Cached
  values are emulated with the pool's own quantizers (``encode_main_rows`` / ``decode_main_rows``,
  ``quantize_tiles``), attention computes full scores then applies an index mask built by the same
  selection rule (``dsakv.model.indexer``).

Compute dtype: fp64 by default. The caches still store fp8/bf16 and hand back fp32; computing around them
in fp64 makes the two paths agree to fp64 rounding, so a value never lands on different sides of an fp8
rounding step in the two paths and the paged-vs-dense comparison sees cache bugs, not fp32 noise (in fp32 a
one-ulp difference before a cache write is amplified to one fp8 step, about 6% of that element).
``dtype=torch.float32`` is available for speed.

The model holds weights only; ``forward_paged`` mutates the pool (writes at ``slots``) and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsakv.errors import DsakvError
from dsakv.kernels.cache_ops import decode_main_rows, encode_main_rows, quantize_tiles
from dsakv.model.decoder import PagedDecoder, PagedOutput
from dsakv.model.indexer import indexer_topk
from dsakv.model.inputs import Batch, PagedCache, SeqInput
from dsakv.model.lightning import IndexerLayer, IndexerQuery
from dsakv.model.mla import MlaLayer, MlaProjection
from dsakv.model.mtp import TinyMtpLayer
from dsakv.model.nn import init_linear, init_norm, rms_norm
from dsakv.spec.model_spec import ARCH_FIELDS, ModelSpec

__all__ = ["DENSE_ARCH_FIELDS", "DenseOutput", "PagedOutput", "SeqInput", "TinyDsaModel"]

# The tiny model is dense (one SwiGLU MLP of ``intermediate_size`` per layer): it reads every architecture
# field of the spec except the mixture-of-experts ones, and each of those must be positive.
MOE_ARCH_FIELDS = (
    "moe_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "first_k_dense_replace",
    "n_group",
    "topk_group",
)
DENSE_ARCH_FIELDS = tuple(f for f in ARCH_FIELDS if f not in MOE_ARCH_FIELDS)


@dataclass(frozen=True)
class DenseOutput:
    """``logits [T, vocab]`` for every position; ``selections[layer]``: ``[T, width]`` positions."""

    logits: torch.Tensor
    selections: tuple[torch.Tensor, ...]


class _Mlp:
    def __init__(self, hidden: int, inter: int, gen: torch.Generator, dtype: torch.dtype) -> None:
        self.w1, self.w3 = init_linear(gen, hidden, inter, dtype), init_linear(gen, hidden, inter, dtype)
        self.w2 = init_linear(gen, inter, hidden, dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.nn.functional.silu(x @ self.w1) * (x @ self.w3)) @ self.w2


class TinyDsaModel(PagedDecoder):
    """Seeded random weights (same seed -> same weights) and the paged and dense forward passes."""

    def __init__(
        self, spec: ModelSpec | None = None, seed: int = 0, dtype: torch.dtype = torch.float64, *, mtp: bool = False
    ) -> None:
        spec = spec or ModelSpec.preset("tiny")
        for key in DENSE_ARCH_FIELDS:
            if spec.arch_value(key) < 1:
                raise DsakvError(
                    f"spec arch field {key!r} = {spec.arch_value(key)}: the tiny model needs a positive value"
                )
        if dtype not in (torch.float32, torch.float64):
            raise DsakvError(f"model dtype {dtype}: allowed values are torch.float32, torch.float64")
        self.spec, self.dtype = spec, dtype
        gen = torch.Generator().manual_seed(seed)
        hidden, vocab = spec.arch_value("hidden_size"), spec.arch_value("vocab_size")
        layers = range(spec.num_hidden_layers)
        self.embed = torch.randn(vocab, hidden, generator=gen).to(dtype)
        self.attn_norm = [init_norm(gen, hidden, dtype) for _ in layers]
        self.mlp_norm = [init_norm(gen, hidden, dtype) for _ in layers]
        self.mla = [MlaLayer(spec, gen, dtype) for _ in layers]
        self.indexer = {layer: IndexerLayer(spec, gen, dtype) for layer in spec.full_indexer_layers}
        self.mlp = [_Mlp(hidden, spec.arch_value("intermediate_size"), gen, dtype) for _ in layers]
        self.final_norm = init_norm(gen, hidden, dtype)
        self.lm_head = init_linear(gen, hidden, vocab, dtype)
        # the MTP draft layer (dsakv.model.mtp), drawn after every target weight so those stay the seed's
        self.mtp = None
        if mtp:
            mlp = _Mlp(hidden, spec.arch_value("intermediate_size"), gen, dtype)
            self.mtp = TinyMtpLayer(spec, gen, dtype, self.embed, self.lm_head, mlp)

    def _finish_layer(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The dense reference's residuals (``PagedDecoder.forward_paged`` adds the same two)."""
        x = x + attn
        return x + self.mlp[layer](rms_norm(x, self.mlp_norm[layer]))

    # ----- paged path: the loop is PagedDecoder.forward_paged ------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight)

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed[token_ids]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.lm_head

    def _where(self, pool: PagedCache, batch: Batch) -> torch.Tensor:
        return batch.positions

    def _project(self, layer: int, xn: torch.Tensor, where: torch.Tensor) -> MlaProjection:
        return self.mla[layer].project(xn, where)

    def _index_key(self, layer: int, xn: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        return self.indexer[layer].key(xn, where)

    def _index_query(self, layer: int, xn: torch.Tensor, qr: torch.Tensor, where: torch.Tensor) -> IndexerQuery:
        return self.indexer[layer].query(xn, qr, where)

    # ----- dense reference -------------------------------------------------------------------------------
    def forward_dense(
        self, token_ids: Sequence[int] | torch.Tensor, *, kv_dtype: str = "fp8_ds_mla", fp8_scale: float = 1.0
    ) -> DenseOutput:
        """Logits for every position of one sequence starting at position 0, without any cache.

        ``kv_dtype`` / ``fp8_scale`` pick the main-KV quantization to emulate (the pool's layout and scale).
        """
        spec = self.spec
        ids = torch.as_tensor(token_ids)
        vocab = spec.arch_value("vocab_size")
        if ids.dim() != 1 or ids.numel() == 0 or ids.dtype.is_floating_point:
            raise DsakvError(
                f"token_ids: shape {list(ids.shape)} dtype {ids.dtype}: must be a non-empty 1-D integer sequence"
            )
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise DsakvError(f"token_ids: values {int(ids.min())}..{int(ids.max())}: must lie in 0..{vocab - 1}")
        if ids.numel() > spec.max_position_embeddings:
            raise DsakvError(
                f"token_ids: length {ids.numel()}: must be <= max_position_embeddings = {spec.max_position_embeddings}"
            )
        t = ids.numel()
        positions = torch.arange(t)
        x = self.embed[ids.long()]
        selections: list[torch.Tensor] = []
        for layer in range(spec.num_hidden_layers):
            xn = rms_norm(x, self.attn_norm[layer])
            m = self.mla[layer]
            proj = m.project(xn, positions)
            rows = encode_main_rows(proj.latent.float(), proj.k_rope.float(), kv_dtype, fp8_scale)
            latent, rope = (v.to(self.dtype) for v in decode_main_rows(rows, kv_dtype, m.rank, m.rope, fp8_scale))
            if layer in self.indexer:
                idx = self.indexer[layer]
                k8, k_scale = quantize_tiles(idx.key(xn, positions).float(), idx.dim)
                query = idx.query(xn, proj.qr, positions)
                chosen = indexer_topk(
                    query.q, query.weights, k8, k_scale.reshape(-1), positions + 1, spec.index_topk
                ).indices
            else:
                chosen = selections[spec.indexer_source_layer[layer]]
            allowed = torch.zeros(t, t, dtype=torch.bool)
            valid = chosen >= 0
            allowed[torch.arange(t).unsqueeze(1).expand_as(chosen)[valid], chosen[valid]] = True
            selections.append(chosen)
            x = self._finish_layer(layer, x, m.output(m.masked_attention(proj, latent, rope, allowed)))
        return DenseOutput(rms_norm(x, self.final_norm) @ self.lm_head, tuple(selections))
