"""Weight bytes per rank, computed from the config's parameter count (formula in docs/planner.md).

Parameters are counted per component of a DSA decoder (MLA attention with q/kv LoRA, the lightning
indexer, dense MLP, MoE experts + shared experts + router, norms, embedding, lm_head, MTP layers).
Bytes: linear matrices of attention, indexer (``wq_b``, ``wk``) and MLP/experts use the weight dtype;
in ``fp8`` that is 1 B per value plus one fp32 scale per 128 x 128 block (DeepSeek/GLM FP8
checkpoints). Embedding, lm_head, router, indexer ``weights_proj``, MTP ``eh_proj`` and every norm
stay bf16 (2 B) in those checkpoints, so they are always priced at 2 B (4 B under float32).

Sharding (SGLang's DeepSeek/GLM path): lm_head, dense MLP and shared experts split over TP; the embedding
over TP, except under DP attention, where every rank holds all of it (SGLang builds it as
``VocabParallelEmbedding(..., enable_tp=not is_dp_attention_enabled())``); routed experts over EP = TP; the head-sharded attention projections (``q_b``, ``kv_b``, ``o``)
over the attention TP size, ``tp // dp_attention``; ``q_a``, ``kv_a``, the indexer, the router and
the norms are replicated. Under an all-to-all MoE backend (``moe_a2a`` ``deepep``: SGLang's
``--moe-a2a-backend deepep``) the shared experts are whole on every rank (``shared_experts_shard``).

Beside the checkpoint's tensors a rank holds the absorbed-MLA matrices the engines build once loaded
(``absorbed_mla_part``): ``kv_b_proj`` split per head into ``w_kc`` (the key up-projection, absorbed into the
query) and ``w_vc`` (the value up-projection, applied after attention), as bf16 copies beside ``kv_b_proj``,
which the prefill's dense MHA path keeps using. They count in a rank's bytes, never in the checkpoint's
parameters. Pure functions; nothing here touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsakv.errors import DsakvError, check_choice
from dsakv.spec.layout import ceil_div
from dsakv.spec.model_spec import ModelSpec

WEIGHT_DTYPE_BYTES = {"fp8": 1, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4}
FP8_BLOCK = 128  # one fp32 scale per 128 x 128 block of an fp8 matrix
SHARDS = ("tp", "attn_tp", "ep", "replicated", "vocab")
# The MoE layer's token exchange: ``none``, an all-reduce over TP (every rank holds a TP slice of every expert), or
# ``deepep``, DeepEP's all-to-all over the EP ranks (each rank holds whole experts of its own).
MOE_A2A = ("none", "deepep")


def shared_experts_shard(moe_a2a: str = "none") -> str:
    """How the shared experts split: over TP with the all-reduce MoE; whole on every rank under an all-to-all
    backend. SGLang builds them as ``DeepseekV2MLP(..., tp_rank=0, tp_size=1)`` when ``get_moe_a2a_backend()`` is
    DeepEP (``DeepseekV2MoE.__init__``, ``_shared_expert_use_tp1`` at 06ad7b2b0; in this form since
    sgl-project/sglang#6324, 2025-05-17, a branch of its own before), and does not fuse them into the routed
    experts under DeepEP (``shared_experts_fusion_disable_reason``: "DeepEP: fusion off by default", earlier "can
    not use shared experts fusion optimization under deepep"); ``forward_deepep`` runs them on the rank's own
    tokens beside the dispatch."""
    check_choice("moe_a2a", moe_a2a, MOE_A2A)
    return "tp" if moe_a2a == "none" else "replicated"


def shard_divisors(tp: int, dp_attention: int) -> dict[str, int]:
    """How many ranks share each shard kind: ``vocab`` (the embedding) splits over TP without DP attention and
    is whole on every rank with it."""
    return {"tp": tp, "attn_tp": tp // dp_attention, "ep": tp, "replicated": 1, "vocab": tp if dp_attention == 1 else 1}


@dataclass(frozen=True)
class WeightPart:
    """One component summed over the layers that carry it."""

    name: str
    params: int
    bytes: int
    shard: str  # one of SHARDS


@dataclass(frozen=True)
class WeightPlan:
    """Weights of the whole checkpoint and of one rank under a TP / DP-attention setting. ``parts`` are the
    checkpoint's (``total_params`` / ``total_bytes`` sum them); ``runtime_parts`` the tensors the engine derives
    from them once loaded (``absorbed_mla_part``), which ``rank_bytes`` counts too."""

    parts: tuple[WeightPart, ...]
    dtype: str
    tp: int
    attn_tp: int
    ep: int
    total_params: int
    total_bytes: int
    rank_bytes: int
    runtime_parts: tuple[WeightPart, ...] = ()

    def to_dict(self) -> dict:
        return {
            "dtype": self.dtype,
            "tp": self.tp,
            "attn_tp": self.attn_tp,
            "ep": self.ep,
            "total_params": self.total_params,
            "total_bytes": self.total_bytes,
            "rank_bytes": self.rank_bytes,
            "parts": {p.name: {"params": p.params, "bytes": p.bytes, "shard": p.shard} for p in self.parts},
            "runtime_parts": {
                p.name: {"params": p.params, "bytes": p.bytes, "shard": p.shard} for p in self.runtime_parts
            },
        }


def _dtype_bytes(dtype: str) -> int:
    if dtype not in WEIGHT_DTYPE_BYTES:
        raise DsakvError(f"weight dtype {dtype!r}: allowed values are {', '.join(WEIGHT_DTYPE_BYTES)}")
    return WEIGHT_DTYPE_BYTES[dtype]


def matrix_bytes(out_dim: int, in_dim: int, dtype: str) -> int:
    """Bytes of one ``[out, in]`` linear weight in ``dtype`` (fp8 adds its 128 x 128 block scales)."""
    size = out_dim * in_dim * _dtype_bytes(dtype)
    if dtype == "fp8" and size:
        size += ceil_div(out_dim, FP8_BLOCK) * ceil_div(in_dim, FP8_BLOCK) * 4
    return size


def _high(dtype: str) -> str:
    """Precision of the tensors fp8 checkpoints keep unquantized."""
    return "float32" if dtype == "float32" else "bfloat16"


def weight_parts(
    spec: ModelSpec, mtp_layers: int, dtype: str | None = None, moe_a2a: str = "none"
) -> tuple[WeightPart, ...]:
    """Parameter count and bytes per component for the decoder plus ``mtp_layers`` MTP layers; ``moe_a2a`` sets
    the shared experts' shard (``shared_experts_shard``)."""
    dtype = dtype or spec.weight_dtype
    shared_shard = shared_experts_shard(moe_a2a)
    hi = _high(dtype)
    hb = _dtype_bytes(hi)
    a = spec.arch_value
    h, vocab, heads = a("hidden_size"), a("vocab_size"), a("num_attention_heads")
    q_lora, nope, v_dim = a("q_lora_rank"), a("qk_nope_head_dim"), a("v_head_dim")
    rope, kv_lora = spec.qk_rope_head_dim, spec.kv_lora_rank
    if not (h and vocab and heads):
        raise DsakvError("config lacks hidden_size / vocab_size / num_attention_heads: give --weights-bytes instead")
    n_layers = spec.num_hidden_layers
    attn_layers = n_layers + mtp_layers
    indexer_layers = spec.num_full_indexer_layers + mtp_layers
    dense_layers = min(a("first_k_dense_replace"), n_layers) if a("n_routed_experts") else n_layers
    moe_layers = attn_layers - dense_layers
    parts: list[WeightPart] = []

    def add(name: str, shard: str, mats: list[tuple[int, int, str]], count: int, extra_params: int = 0) -> None:
        params = sum(o * i for o, i, _ in mats) + extra_params
        size = sum(matrix_bytes(o, i, d) for o, i, d in mats) + extra_params * hb
        parts.append(WeightPart(name, params * count, size * count, shard))

    add("embedding", "vocab", [(vocab, h, hi)], 1)
    if not spec.tie_word_embeddings:
        add("lm_head", "tp", [(vocab, h, hi)], 1)
    q_in = q_lora or h
    q_a = [(q_lora, h, dtype)] if q_lora else []
    add("attention q_a/kv_a + norms", "replicated", q_a + [(kv_lora + rope, h, dtype)], attn_layers, q_lora + kv_lora)
    sharded = [
        (heads * (nope + rope), q_in, dtype),
        (heads * (nope + v_dim), kv_lora, dtype),
        (h, heads * v_dim, dtype),
    ]
    add("attention q_b/kv_b/o", "attn_tp", sharded, attn_layers)
    ih, idim = spec.index_n_heads, spec.index_head_dim
    indexer = [(ih * idim, q_in, dtype), (idim, h, dtype), (ih, h, hi)]
    add("indexer wq_b/wk/weights_proj + k_norm", "replicated", indexer, indexer_layers, 2 * idim)
    add("dense MLP", "tp", [(a("intermediate_size"), h, dtype)] * 3, dense_layers)
    if moe_layers and a("n_routed_experts"):
        moe_i = a("moe_intermediate_size")
        add("routed experts", "ep", [(moe_i, h, dtype)] * 3 * a("n_routed_experts"), moe_layers)
        add("shared experts", shared_shard, [(moe_i * a("n_shared_experts"), h, dtype)] * 3, moe_layers)
        add("router", "replicated", [(a("n_routed_experts"), h, hi)], moe_layers, a("n_routed_experts"))
    add("layer norms", "replicated", [], attn_layers, 2 * h)
    add("final norm", "replicated", [], 1, h)
    if mtp_layers:
        add("MTP eh_proj + norms", "replicated", [(h, 2 * h, hi)], mtp_layers, 3 * h)
    return tuple(p for p in parts if p.params)


def absorbed_mla_part(spec: ModelSpec, mtp_layers: int, dtype: str | None = None) -> WeightPart | None:
    """The absorbed-MLA matrices of the decoder's and ``mtp_layers`` MTP layers' attention: ``w_kc``
    (H x dn x kr) and ``w_vc`` (H x kr x dv), the per-head split of ``kv_b_proj`` in bf16, sharded like it over
    the attention TP ranks. SGLang builds both as contiguous bf16 tensors in ``post_load_weights``
    (``deepseek_weight_loader.py``: a 128 x 128 block-fp8 ``kv_b_proj`` is dequantized with
    ``block_quant_dequant(..., torch.bfloat16)`` unless ``SGL_USE_DEEPGEMM_BMM`` is set; ``w_kc`` / ``w_vc`` are
    ``.contiguous()`` copies) and keeps ``kv_b_proj`` for the MHA prefill; vLLM's MLA backends dequantize a
    quantized ``kv_b_proj`` into ``W_UK_T`` / ``W_UV`` the same way. 2 B a value (4 B for a float32 ``dtype``); None for a
    model without MLA LoRA dims."""
    a = spec.arch_value
    heads, nope, v_dim = a("num_attention_heads"), a("qk_nope_head_dim"), a("v_head_dim")
    if not (heads and nope and v_dim and spec.kv_lora_rank):
        return None
    params = heads * (nope + v_dim) * spec.kv_lora_rank * (spec.num_hidden_layers + mtp_layers)
    hb = _dtype_bytes(_high(dtype or spec.weight_dtype))
    return WeightPart("absorbed MLA w_kc/w_vc (copies of kv_b)", params, params * hb, "attn_tp")


def weights_per_rank(
    spec: ModelSpec,
    *,
    tp: int,
    dp_attention: int = 1,
    mtp_layers: int = 0,
    dtype: str | None = None,
    moe_a2a: str = "none",
) -> WeightPlan:
    """Weight bytes one rank holds: each part divided by its shard group size (rounded up); ``moe_a2a`` as in
    ``weight_parts``."""
    if tp < 1 or dp_attention < 1 or tp % dp_attention:
        raise DsakvError(f"dp_attention = {dp_attention}: must be a positive divisor of tp = {tp}")
    heads = spec.arch_value("num_attention_heads")
    if heads and heads % (tp // dp_attention):
        raise DsakvError(
            f"tp = {tp} (attention TP tp/dp_attention = {tp // dp_attention}): must divide "
            f"num_attention_heads = {heads}, as engines shard whole heads"
        )
    dtype = dtype or spec.weight_dtype
    parts = weight_parts(spec, mtp_layers, dtype, moe_a2a)
    divisor = shard_divisors(tp, dp_attention)
    absorbed = absorbed_mla_part(spec, mtp_layers, dtype)
    runtime = () if absorbed is None else (absorbed,)
    rank = sum(ceil_div(p.bytes, divisor[p.shard]) for p in parts + runtime)
    return WeightPlan(
        parts=parts,
        dtype=dtype,
        tp=tp,
        attn_tp=tp // dp_attention,
        ep=tp,
        total_params=sum(p.params for p in parts),
        total_bytes=sum(p.bytes for p in parts),
        rank_bytes=rank,
        runtime_parts=runtime,
    )


__all__ = [
    "MOE_A2A",
    "WEIGHT_DTYPE_BYTES",
    "WeightPart",
    "WeightPlan",
    "absorbed_mla_part",
    "matrix_bytes",
    "shard_divisors",
    "shared_experts_shard",
    "weight_parts",
    "weights_per_rank",
]
