"""Weights per rank: fp8 block scales, published parameter counts, TP / DP-attention sharding (docs/planner.md §3)."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.planner.weights import absorbed_mla_part, matrix_bytes, shard_divisors, weight_parts, weights_per_rank
from dsakv.spec.model_spec import ModelSpec


def test_fp8_matrix_adds_one_fp32_scale_per_128_block():
    assert matrix_bytes(256, 256, "fp8") == 256 * 256 + 4 * 4
    assert matrix_bytes(256, 256, "bfloat16") == 2 * 256 * 256


def test_glm5_parameter_count_is_about_744_billion():
    params = sum(p.params for p in weight_parts(ModelSpec.preset("glm-5"), mtp_layers=0))
    assert 740e9 < params < 748e9  # GLM-5 is published as 744B parameters


def test_deepseek_v32_parameter_count_is_about_671_billion():
    params = sum(p.params for p in weight_parts(ModelSpec.preset("deepseek-v3.2"), mtp_layers=0))
    assert 668e9 < params < 675e9


def test_weights_per_rank_shard_over_tp_and_replicate_the_rest(glm53):
    one = weights_per_rank(glm53, tp=1)
    eight = weights_per_rank(glm53, tp=8)
    replicated = sum(p.bytes for p in eight.parts if p.shard == "replicated")
    (absorbed,) = one.runtime_parts  # derived after loading: on the rank, not in the checkpoint
    assert one.rank_bytes == one.total_bytes + absorbed.bytes
    sharded = one.total_bytes - replicated + absorbed.bytes
    assert replicated + sharded / 8 <= eight.rank_bytes < replicated + sharded / 8 + 16
    dp = weights_per_rank(glm53, tp=8, dp_attention=8)
    assert dp.rank_bytes > eight.rank_bytes  # attention projections replicated under full DP-attention
    assert weights_per_rank(glm53, tp=8, mtp_layers=1).rank_bytes > eight.rank_bytes


def test_bf16_weights_are_about_twice_fp8(glm53):
    fp8 = weights_per_rank(glm53, tp=8).total_bytes
    bf16 = weights_per_rank(glm53, tp=8, dtype="bfloat16").total_bytes
    assert 1.9 < bf16 / fp8 < 2.0


def test_tensor_parallel_size_that_splits_a_head_is_refused():
    # 64 heads cannot be split over 3 ranks; engines shard whole heads, so the planner refuses the setting.
    glm = ModelSpec.preset("glm-5.3")
    with pytest.raises(DsakvError, match="must divide num_attention_heads = 64"):
        weights_per_rank(glm, tp=3)
    assert weights_per_rank(glm, tp=8).attn_tp == 8
    assert weights_per_rank(glm, tp=16, dp_attention=2).attn_tp == 8


def test_the_embedding_is_whole_on_every_rank_under_dp_attention():
    # SGLang: VocabParallelEmbedding(..., enable_tp=not is_dp_attention_enabled()). DeepSeek-V3.2's embedding is
    # 129,280 x 7,168 bf16 values: 1/8 of it per rank at TP8, all of it under DP attention (2 or 8 groups).
    ds = ModelSpec.preset("deepseek-v3.2")
    emb = 129_280 * 7_168 * 2
    part = {p.name: p for p in weight_parts(ds, 0, "fp8")}["embedding"]
    assert part.bytes == emb and part.shard == "vocab"
    tp8 = weights_per_rank(ds, tp=8)
    for dp in (2, 8):
        parts = tp8.parts + tp8.runtime_parts
        others = sum(-(-p.bytes // shard_divisors(8, dp)[p.shard]) for p in parts if p.name != "embedding")
        assert weights_per_rank(ds, tp=8, dp_attention=dp).rank_bytes == others + emb
    assert tp8.rank_bytes == sum(-(-p.bytes // shard_divisors(8, 1)[p.shard]) for p in tp8.parts + tp8.runtime_parts)
    assert shard_divisors(8, 1)["vocab"] == 8


def test_the_absorbed_mla_copies_of_kv_b_count_on_the_rank_not_in_the_checkpoint():
    # SGLang's post_load_weights splits kv_b_proj into w_kc (H x dn x kr) and w_vc (H x kr x dv), bf16 copies kept
    # beside kv_b_proj. GLM-5.2: 64 heads x (192 + 256) x 512 per layer over 78 layers, 2 B a value; sharded over
    # the attention TP ranks like kv_b itself: 1/8 at TP8, all of it on every rank under DP8 attention.
    glm = ModelSpec.preset("glm-5.2")
    part = absorbed_mla_part(glm, 0)
    assert part.params == 64 * (192 + 256) * 512 * 78 and part.bytes == 2 * part.params and part.shard == "attn_tp"
    assert absorbed_mla_part(glm, 1).params == 64 * (192 + 256) * 512 * 79  # the MTP layer's attention too
    tp8, dp8 = weights_per_rank(glm, tp=8), weights_per_rank(glm, tp=8, dp_attention=8)
    assert tp8.total_params == sum(p.params for p in weight_parts(glm, 0)) and tp8.runtime_parts == (part,)
    without = sum(-(-p.bytes // shard_divisors(8, 8)[p.shard]) for p in dp8.parts)
    assert dp8.rank_bytes - without == part.bytes == 2_290_089_984
    assert tp8.rank_bytes - sum(-(-p.bytes // shard_divisors(8, 1)[p.shard]) for p in tp8.parts) == part.bytes // 8
    assert dp8.to_dict()["runtime_parts"][part.name]["bytes"] == part.bytes


def test_deepep_keeps_the_whole_shared_experts_on_every_rank():
    # SGLang builds the shared experts with tp_size=1 under --moe-a2a-backend deepep (DeepseekV2MoE.__init__,
    # _shared_expert_use_tp1) and does not fuse them into the routed experts there. GLM-5.2: one shared expert of
    # gate / up / down 2,048 x 6,144 on each of its 75 MoE layers (78 less 3 dense), fp8 with a 4-byte scale per
    # 128 x 128 block: whole on every rank instead of an eighth at TP8.
    glm = ModelSpec.preset("glm-5.2")
    per_matrix = 2_048 * 6_144 + (2_048 // 128) * (6_144 // 128) * 4
    none = {p.name: p for p in weight_parts(glm, 0, "fp8")}["shared experts"]
    deepep = {p.name: p for p in weight_parts(glm, 0, "fp8", "deepep")}["shared experts"]
    assert none.bytes == deepep.bytes == 75 * 3 * per_matrix == 2_831_846_400
    assert (none.shard, deepep.shard) == ("tp", "replicated")
    for dp in (1, 8):
        tp = weights_per_rank(glm, tp=8, dp_attention=dp, dtype="fp8")
        a2a = weights_per_rank(glm, tp=8, dp_attention=dp, dtype="fp8", moe_a2a="deepep")
        assert a2a.rank_bytes - tp.rank_bytes == none.bytes - none.bytes // 8 == 2_477_865_600
        assert a2a.total_bytes == tp.total_bytes  # the same checkpoint, placed differently
    # the MTP layer is a MoE layer too: its shared expert follows the same rule
    mtp = {p.name: p for p in weight_parts(glm, 1, "fp8", "deepep")}["shared experts"]
    assert mtp.bytes == 76 * 3 * per_matrix and mtp.shard == "replicated"
    with pytest.raises(DsakvError, match=r"^moe_a2a = 'nccl': must be one of none, deepep$"):
        weights_per_rank(glm, tp=8, moe_a2a="nccl")
