"""Production cache mode vs exact mode on a tiny random GLM-MoE-DSA / DeepSeek-V3.2 checkpoint.

Builds the checkpoint with transformers (``save_pretrained`` into a temp folder; no download), then greedy-
decodes the same prompt through the paged engine twice: exact mode (fp32 main KV, fp32 indexer K) and
production mode (fp8_ds_mla main KV, fp8 + scale indexer K, Hadamard-rotated fp8 indexer queries/keys).
Reports, teacher-forced on the exact mode's tokens: top-k overlap per full indexer layer (|A n B| / |A|
averaged over rows), max |logit error| and the share of positions whose argmax agrees; and free-running
greedy token agreement (length of the common prefix, share of equal tokens).

    python bench/dsa_agreement.py [--model-type glm_moe_dsa] [--prompt 256] [--new 256]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "model"))

from hf_checkpoints import hf_model  # noqa: E402

from dsakv.engine.pool import TwinPool  # noqa: E402
from dsakv.model.dsa_model import DsaModel  # noqa: E402
from dsakv.model.inputs import SeqInput, request_slots  # noqa: E402
from dsakv.spec.layout import CacheLayout  # noqa: E402

SIZES = dict(kv_lora_rank=128, index_head_dim=64, index_n_heads=16, qk_rope_head_dim=32, index_topk=64,
             hidden_size=128, num_hidden_layers=4, q_lora_rank=64, vocab_size=512)  # fmt: skip


def teacher_forced(model: DsaModel, ids: list[int], exact: bool):
    lay = CacheLayout(model.spec, kv_dtype="fp32" if exact else "fp8_ds_mla", page_size=16,
                      allow_any_page_size=True, indexer_dtype="fp32" if exact else "fp8")  # fmt: skip
    pool = TwinPool.for_pages(lay, math.ceil(len(ids) / 16) + 1, padding_slots=16)
    pages = pool.allocator.alloc(math.ceil(len(ids) / 16))
    slots = request_slots(pages, len(ids), 16)
    seq = SeqInput(token_ids=ids, positions=range(len(ids)), slots=slots, context_slots=slots)
    return model.forward_paged(pool, [seq], all_logits=True)


def greedy(model: DsaModel, prompt: list[int], new: int, exact: bool) -> list[int]:
    from dsakv.engine.engine import Engine, EngineConfig

    dtypes = dict(kv_dtype="fp32", indexer_dtype="fp32") if exact else {}
    eng = Engine(EngineConfig(num_pages=64, page_size=16, **dtypes), model=model)
    return eng.generate([prompt], new)[0].output_tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-type", default="glm_moe_dsa", choices=["glm_moe_dsa", "deepseek_v32"])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    extra = dict(index_topk_freq=2) if args.model_type == "glm_moe_dsa" else {}
    with tempfile.TemporaryDirectory() as tmp:
        hf_model(args.model_type, **SIZES, **extra).save_pretrained(tmp)
        model = DsaModel.from_checkpoint(tmp)
    prompt = torch.randint(0, SIZES["vocab_size"], (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    exact_tokens = greedy(model, prompt, args.new, exact=True)
    prod_tokens = greedy(model, prompt, args.new, exact=False)
    ids = prompt + exact_tokens
    ex, pr = teacher_forced(model, ids, True), teacher_forced(model, ids, False)
    print(f"model_type {args.model_type}, prompt {args.prompt}, generated {args.new}, index_topk {SIZES['index_topk']}")
    print("| layer | top-k overlap |")
    print("|---|---|")
    for layer in model.spec.full_indexer_layers:
        a, b = ex.selections[layer][0], pr.selections[layer][0]
        overlap = [
            len(set(ra[ra >= 0].tolist()) & set(rb[rb >= 0].tolist())) / max(int((ra >= 0).sum()), 1)
            for ra, rb in zip(a, b)
        ]
        print(f"| {layer} | {sum(overlap) / len(overlap):.4f} |")
    err = (ex.logits - pr.logits).abs()
    argmax = (ex.logits.argmax(-1) == pr.logits.argmax(-1)).float().mean().item()
    same = sum(a == b for a, b in zip(exact_tokens, prod_tokens))
    prefix = next((i for i, (a, b) in enumerate(zip(exact_tokens, prod_tokens)) if a != b), len(exact_tokens))
    print(
        f"max |logit error| {err.max().item():.4f}, mean {err.mean().item():.5f} (logit std {ex.logits.std().item():.3f})"
    )
    print(f"teacher-forced argmax agreement {argmax:.4f}")
    print(f"free-running greedy tokens equal {same}/{len(exact_tokens)}, common prefix {prefix}")


if __name__ == "__main__":
    main()
