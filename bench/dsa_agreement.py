"""Production cache mode vs exact mode on a tiny random GLM-MoE-DSA / DeepSeek-V3.2 checkpoint, one rounding
at a time.

Builds the checkpoint with transformers (``save_pretrained`` into a temp folder; no download), then greedy-
decodes the same prompt through the paged engine in the exact mode (fp32 main KV, fp32 indexer K, no
Hadamard) and in each chosen *mode*, which turns on a subset of the production roundings:

    mode          main KV      indexer K      indexer q     Hadamard (q and k)
    main_fp8      fp8_ds_mla   fp32           fp32          no
    index_k_fp8   fp32         fp8 + scale    fp32          no
    index_q_fp8   fp32         fp32           fp8 + scale   no
    hadamard      fp32         fp32           fp32          yes   (orthogonal: exact up to float error)
    indexer       fp32         fp8 + scale    fp8 + scale   yes   (the whole production indexer)
    production    fp8_ds_mla   fp8 + scale    fp8 + scale   yes

``--noise`` adds, for each of main_fp8 / index_k_fp8 / index_q_fp8, a row ``<mode>~noise``: the same values
perturbed by independent random relative noise ``x * (1 + e)``, ``e ~ N(0, r)``, where ``r`` is the rms
relative error the fp8 rounding makes on that very tensor (measured per call). If a rounding moves top-k and
logits about as much as its noise twin, the rounding itself explains the disagreement (no bug); a rounding far
worse than its twin points at a bug (wrong scale, layout, dims). Teacher-forced metrics only.

Reports per mode, teacher-forced on the exact mode's tokens: top-k overlap per full indexer layer
(|A n B| / |A| averaged over rows), max / mean |logit error| and the share of positions whose argmax agrees;
and free-running greedy token agreement (tokens equal, common prefix).

``--lm-head-scale S`` multiplies the LM head (logit std ~S instead of ~1: a realistic top-1 margin);
``--branch-scale S`` multiplies every residual branch's output projection (``o_proj``, MLP and expert
``down_proj``) by S: each layer then adds a small update to the residual stream, as in a trained deep model,
instead of replacing it, so a perturbation in one layer's attention no longer rewrites the next layer's
input and the logits keep a margin (S = 1: the plain random model). ``--dense`` makes every layer a dense MLP (no MoE router whose expert choice flips on small input changes).

    python bench/dsa_agreement.py [--model-type glm_moe_dsa] [--modes production,main_fp8] [--prompt 256]
                                  [--new 256] [--lm-head-scale 1] [--branch-scale 1] [--hidden-size 128] [--dense] [--noise]
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
from dsakv.kernels.cache_ops import quantize_tiles  # noqa: E402
from dsakv.model.dsa_layers import IndexerQuery, IndexerRounding  # noqa: E402
from dsakv.model.dsa_model import DsaModel  # noqa: E402
from dsakv.model.inputs import SeqInput, request_slots  # noqa: E402
from dsakv.spec.layout import QUANT_TILE, CacheLayout  # noqa: E402

SIZES = dict(kv_lora_rank=128, index_head_dim=64, index_n_heads=16, qk_rope_head_dim=32, index_topk=64,
             hidden_size=128, num_hidden_layers=4, q_lora_rank=64, vocab_size=512)  # fmt: skip

# mode -> (kv_dtype, indexer_dtype, Hadamard, fp8 query)
MODES = {
    "exact": ("fp32", "fp32", False, False),
    "main_fp8": ("fp8_ds_mla", "fp32", False, False),
    "index_k_fp8": ("fp32", "fp8", False, False),
    "index_q_fp8": ("fp32", "fp32", False, True),
    "hadamard": ("fp32", "fp32", True, False),
    "indexer": ("fp32", "fp8", True, True),
    "production": ("fp8_ds_mla", "fp8", True, True),
}


def set_mode(model: DsaModel, mode: str) -> tuple[str, str]:
    kv_dtype, indexer_dtype, hadamard, fp8_query = MODES[mode]
    model.indexer_rounding = IndexerRounding(hadamard=hadamard, fp8_query=fp8_query)
    return kv_dtype, indexer_dtype


def teacher_forced(model: DsaModel, ids: list[int], mode: str):
    kv_dtype, indexer_dtype = set_mode(model, mode)
    lay = CacheLayout(model.spec, kv_dtype=kv_dtype, page_size=16, allow_any_page_size=True,
                      indexer_dtype=indexer_dtype)  # fmt: skip
    pool = TwinPool.for_pages(lay, math.ceil(len(ids) / 16) + 1, padding_slots=16)
    pages = pool.allocator.alloc(math.ceil(len(ids) / 16))
    slots = request_slots(pages, len(ids), 16)
    seq = SeqInput(token_ids=ids, positions=range(len(ids)), slots=slots, context_slots=slots)
    return model.forward_paged(pool, [seq], all_logits=True)


def greedy(model: DsaModel, prompt: list[int], new: int, mode: str) -> list[int]:
    from dsakv.engine.engine import Engine, EngineConfig

    kv_dtype, indexer_dtype = set_mode(model, mode)
    pages = math.ceil((len(prompt) + new) / 16) + 4
    eng = Engine(
        EngineConfig(num_pages=pages, page_size=16, kv_dtype=kv_dtype, indexer_dtype=indexer_dtype), model=model
    )
    return eng.generate([prompt], new)[0].output_tokens


def fp8_relative_rms(x: torch.Tensor, tile: int) -> float:
    """rms of (fp8 round trip - x) / x over the non-zero entries, rounding as the pool does (scale per tile)."""
    flat = x.float().reshape(-1, tile)
    q, scale = quantize_tiles(flat, tile)
    back = q.float() * scale
    nz = flat != 0
    return ((back - flat)[nz] / flat[nz]).pow(2).mean().sqrt().item()


def noisy(x: torch.Tensor, tile: int, gen: torch.Generator) -> torch.Tensor:
    r = fp8_relative_rms(x, tile)
    return x * (1 + r * torch.randn(x.shape, generator=gen))


class NoisyPool:
    """A fp32 (exact) ``TwinPool`` whose stored latents or indexer keys get fp8-sized random relative noise."""

    def __init__(self, pool: TwinPool, main: bool, key: bool, gen: torch.Generator) -> None:
        self._pool, self._main, self._key, self._gen = pool, main, key, gen

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def store_main(self, layer, slots, latent, rope):
        if self._main:
            latent = noisy(latent, QUANT_TILE, self._gen)
            rope = rope.to(torch.bfloat16).float()  # the rope part is bf16 in fp8_ds_mla: keep it identical
        self._pool.store_main(layer, slots, latent, rope)

    def store_indexer(self, layer, slots, key):
        self._pool.store_indexer(layer, slots, noisy(key, key.shape[1], self._gen) if self._key else key)


def teacher_forced_noise(model: DsaModel, ids: list[int], mode: str, seed: int):
    """``teacher_forced`` of the exact mode with ``mode``'s fp8 rounding replaced by its noise twin."""
    gen = torch.Generator().manual_seed(seed)
    set_mode(model, "exact")
    lay = CacheLayout(model.spec, kv_dtype="fp32", page_size=16, allow_any_page_size=True, indexer_dtype="fp32")
    base = TwinPool.for_pages(lay, math.ceil(len(ids) / 16) + 1, padding_slots=16)
    pool = NoisyPool(base, main=mode == "main_fp8", key=mode == "index_k_fp8", gen=gen)
    pages = base.allocator.alloc(math.ceil(len(ids) / 16))
    slots = request_slots(pages, len(ids), 16)
    seq = SeqInput(token_ids=ids, positions=range(len(ids)), slots=slots, context_slots=slots)
    patched = []
    if mode == "index_q_fp8":
        for idx in model.indexer.values():
            plain = idx.query

            def query(x, qr, rope, rounding, _plain=plain):
                out = _plain(x, qr, rope, rounding)
                return IndexerQuery(noisy(out.q, out.q.shape[-1], gen), out.weights)

            idx.query = query
            patched.append(idx)
    try:
        return model.forward_paged(pool, [seq], all_logits=True)
    finally:
        for idx in patched:
            del idx.query


def topk_overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    overlap = [
        len(set(ra[ra >= 0].tolist()) & set(rb[rb >= 0].tolist())) / max(int((ra >= 0).sum()), 1)
        for ra, rb in zip(a, b)
    ]
    return sum(overlap) / len(overlap)


def build_model(args) -> DsaModel:
    extra = dict(index_topk_freq=2) if args.model_type == "glm_moe_dsa" else {}
    sizes = {**SIZES, "hidden_size": args.hidden_size}
    if args.dense:
        extra["first_k_dense_replace"] = sizes["num_hidden_layers"]
    with tempfile.TemporaryDirectory() as tmp:
        hf_model(args.model_type, seed=args.seed, **sizes, **extra).save_pretrained(tmp)
        model = DsaModel.from_checkpoint(tmp)
    if args.lm_head_scale != 1.0:
        model.lm_head = model.lm_head * args.lm_head_scale
    if args.branch_scale != 1.0:
        for mla in model.mla:
            mla.o = mla.o * args.branch_scale
        for mlp in model.mlp:
            dense = getattr(mlp, "shared", mlp)  # Moe: its shared experts; DenseMlp: itself
            dense.down = dense.down * args.branch_scale
            if hasattr(mlp, "gate_up"):
                mlp.down = [d * args.branch_scale for d in mlp.down]
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-type", default="glm_moe_dsa", choices=["glm_moe_dsa", "deepseek_v32"])
    ap.add_argument("--modes", default=",".join(m for m in MODES if m != "exact"))
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-size", type=int, default=SIZES["hidden_size"])
    ap.add_argument("--lm-head-scale", type=float, default=1.0)
    ap.add_argument("--branch-scale", type=float, default=1.0, help="scale of o_proj and MLP down projections")
    ap.add_argument("--dense", action="store_true", help="dense MLP on every layer (no MoE)")
    ap.add_argument("--noise", action="store_true", help="add each fp8 rounding's random-noise twin")
    args = ap.parse_args()
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown {bad}; choose from {list(MODES)}")
    torch.set_num_threads(1)
    model = build_model(args)
    prompt = torch.randint(0, SIZES["vocab_size"], (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    exact_tokens = greedy(model, prompt, args.new, "exact")
    ids = prompt + exact_tokens
    ex = teacher_forced(model, ids, "exact")
    full = model.spec.full_indexer_layers
    print(
        f"model_type {args.model_type}, hidden {args.hidden_size}, {'dense' if args.dense else 'MoE'}, "
        f"lm_head x{args.lm_head_scale}, branches x{args.branch_scale}, prompt {args.prompt}, generated {args.new}, "
        f"index_topk {SIZES['index_topk']}, logit std {ex.logits.std().item():.3f}"
    )
    print(f"| mode | top-k overlap {' / '.join(f'L{i}' for i in full)} | max / mean |logit err| | argmax | tokens |")
    print("|---|---|---|---|---|")
    rows = [(m, False) for m in modes]
    if args.noise:
        rows += [(m, True) for m in ("main_fp8", "index_k_fp8", "index_q_fp8")]
    for mode, noise in rows:
        if noise:
            tf, toks = teacher_forced_noise(model, ids, mode, args.seed), None
        else:
            tf, toks = teacher_forced(model, ids, mode), greedy(model, prompt, args.new, mode)
        overlap = " / ".join(f"{topk_overlap(ex.selections[i][0], tf.selections[i][0]):.3f}" for i in full)
        err = (ex.logits - tf.logits).abs()
        argmax = (ex.logits.argmax(-1) == tf.logits.argmax(-1)).float().mean().item()
        tokens = "-"
        if toks is not None:
            same = sum(a == b for a, b in zip(exact_tokens, toks))
            prefix = next((i for i, (a, b) in enumerate(zip(exact_tokens, toks)) if a != b), len(exact_tokens))
            tokens = f"{same}/{len(exact_tokens)} (prefix {prefix})"
        name = f"{mode}~noise" if noise else mode
        print(f"| {name} | {overlap} | {err.max().item():.3g} / {err.mean().item():.3g} | {argmax:.3f} | {tokens} |")


if __name__ == "__main__":
    main()
