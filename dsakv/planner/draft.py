"""What one MTP draft pass costs, derived from the spec: FLOPs and bytes of the MTP layer (one DSA decoder
layer with its own full indexer) plus the LM head, for a batch of draft rows at their contexts.

A pure function for the step-time model (issue 23, item 4: the draft passes priced from the MTP layer's own
work instead of a fitted per-step constant). Per draft row at context ``L`` (``sel = min(L, index_topk)``
positions attended), with ``h`` hidden, ``H`` heads, ``r`` kv_lora_rank, ``d_r`` RoPE dims::

    eh_proj              2 * 2h * h
    MLA projections      2 * (h * q_lora + q_lora * H * (nope + d_r) + h * (r + d_r)
                              + H * nope * r + H * r * v + H * v * h)          (absorbed W_uk / W_uv)
    sparse attention     2 * H * (r + d_r) * sel + 2 * H * r * sel             (QK over latent + RoPE, PV)
    indexer projections  2 * (q_lora * ih * idim + h * idim + h * ih)
    indexer scoring      2 * ih * idim * L   (0 on a chain step with index_share_for_mtp_iteration)
    MoE                  2 * h * E (router) + (k + shared) * 3 * 2 * h * moe_i  (dense: 3 * 2 * h * inter)
    LM head              2 * h * vocab

Bytes: the MTP layer's weights (``planner.weights.weight_parts`` with one MTP layer minus none; the routed
experts only as far as the batch's ``rows * k`` choices can touch them) and the LM head, once per pass; per
row the selected main rows and the context's indexer states read, one main row and one indexer state
written (``CacheLayout`` row bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dsakv.errors import DsakvError
from dsakv.planner.weights import weight_parts
from dsakv.spec.layout import CacheLayout

__all__ = ["DraftPassCost", "draft_pass_cost", "draft_row_flops"]


@dataclass(frozen=True)
class DraftPassCost:
    rows: int
    flops: int
    weight_bytes: int
    cache_read_bytes: int
    cache_write_bytes: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.cache_read_bytes + self.cache_write_bytes


def draft_row_flops(layout: CacheLayout, context: int, *, index_share: bool = False) -> int:
    """FLOPs of one draft row at ``context`` tokens (its own position included)."""
    spec = layout.spec
    a = spec.arch_value
    h, heads, q_lora = a("hidden_size"), a("num_attention_heads"), a("q_lora_rank") or a("hidden_size")
    nope, v, r, rope = a("qk_nope_head_dim"), a("v_head_dim"), spec.kv_lora_rank, spec.qk_rope_head_dim
    ih, idim = spec.index_n_heads, spec.index_head_dim
    sel = min(context, spec.index_topk)
    mla = h * q_lora + q_lora * heads * (nope + rope) + h * (r + rope) + heads * nope * r + heads * r * v
    mla += heads * v * h
    attn = heads * (r + rope) * sel + heads * r * sel
    indexer = q_lora * ih * idim + h * idim + h * ih + (0 if index_share else ih * idim * context)
    experts = a("n_routed_experts")
    if experts:
        mlp = h * experts + (a("num_experts_per_tok") + a("n_shared_experts")) * 3 * h * a("moe_intermediate_size")
    else:
        mlp = 3 * h * a("intermediate_size")
    return 2 * (2 * h * h + mla + attn + indexer + mlp + h * a("vocab_size"))


def draft_pass_cost(layout: CacheLayout, contexts: Sequence[int], *, index_share: bool = False) -> DraftPassCost:
    """One MTP forward over draft rows at ``contexts`` (one entry per row). ``index_share``: a chain step
    after the first with ``index_share_for_mtp_iteration`` (no indexer scoring, no indexer K read)."""
    if not contexts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in contexts):
        raise DsakvError(f"contexts = {list(contexts)!r}: must be a non-empty list of integers >= 1")
    spec = layout.spec
    a = spec.arch_value
    mtp = {p.name: p.bytes for p in weight_parts(spec, 1)}
    base = {p.name: p.bytes for p in weight_parts(spec, 0)}
    per_layer = {name: mtp[name] - base.get(name, 0) for name in mtp}
    experts = a("n_routed_experts")
    if experts:  # the MTP layer's routed experts are read only where the batch's choices land
        touched = min(experts, len(contexts) * a("num_experts_per_tok"))
        per_layer["routed experts"] = per_layer.get("routed experts", 0) * touched // experts
    head = base.get("lm_head", base["embedding"])
    flops = sum(draft_row_flops(layout, c, index_share=index_share) for c in contexts)
    read = 0
    for c in contexts:
        read += min(c, spec.index_topk) * layout.main_row_bytes
        read += 0 if index_share else c * layout.indexer_row_bytes
    write = len(contexts) * (layout.main_row_bytes + layout.indexer_row_bytes)
    return DraftPassCost(len(contexts), flops, sum(per_layer.values()) + head, read, write)
