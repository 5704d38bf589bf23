"""Tiny random GlmMoeDsa / DeepseekV32 checkpoints written by transformers' ``save_pretrained`` (no download).

Weights are re-drawn at a scale where logits and indexer scores are well separated (transformers' 0.02 init
gives near-uniform logits), norms and biases are random (a wrong norm or a dropped bias must show), and
the router's ``e_score_correction_bias`` is non-zero.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, kv_lora_rank=32,
    q_lora_rank=48, qk_rope_head_dim=16, v_head_dim=24, qk_nope_head_dim=32, n_group=2, topk_group=1,
    num_experts_per_tok=2, index_topk=48, index_head_dim=32, index_n_heads=16, first_k_dense_replace=1,
    max_position_embeddings=2048,
)  # fmt: skip


def hf_model(model_type: str, seed: int = 0, **overrides):
    """A transformers model (eval, fp32) of ``model_type`` with TINY sizes and ``overrides``."""
    import transformers

    cls_cfg, cls_model = {
        "glm_moe_dsa": (transformers.GlmMoeDsaConfig, transformers.GlmMoeDsaForCausalLM),
        "deepseek_v32": (transformers.DeepseekV32Config, transformers.DeepseekV32ForCausalLM),
    }[model_type]
    cfg = cls_cfg(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = cls_model(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))
    return model


def save_checkpoint(model, folder: Path, **kwargs) -> Path:
    model.save_pretrained(folder, **kwargs)
    return folder


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' ``generate()`` greedy continuation (attention mask passed)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()
