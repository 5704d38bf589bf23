"""``dsakv generate``: greedy decoding of one prompt through the paged engine on a checkpoint folder.

``--exact`` selects the exact cache mode (fp32 main KV and indexer K: the tokens equal transformers'
``generate()``); the default is the production mode (``fp8_ds_mla`` main KV, fp8 indexer K with Hadamard).
``--json`` prints one object: ``tokens`` (the generated ids), ``hit_tokens``, ``kv_dtype`` and the rest.
``--num-speculative-tokens K`` (old spelling ``--mtp K``) drafts K tokens a step with the checkpoint's MTP
layer (``EngineConfig(speculative="mtp", num_speculative_tokens=K)``): the tokens are the same, and the
object adds ``draft_tokens``, ``accepted_tokens`` and ``acceptance_rate`` (accepted / drafted).
"""

from __future__ import annotations

import argparse
import json

from dsakv.cli.aliases import add_hidden_alias
from dsakv.cli.gpu_args import ascii_int
from dsakv.errors import DsakvError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="greedy decoding through the paged engine on a checkpoint")
    p.add_argument("--checkpoint", help="GLM-MoE-DSA / DeepSeek-V3.2 folder (config.json + safetensors)")
    p.add_argument("--prompt-ids", help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--max-new-tokens", type=ascii_int, default=16)
    p.add_argument("--exact", action="store_true", help="exact cache mode (fp32 main KV and indexer K)")
    p.add_argument("--pages", type=ascii_int, default=256, help="pages of the pool (default 256)")
    p.add_argument("--page-size", type=ascii_int, default=64)
    p.add_argument("--threads", type=ascii_int, default=1, help="torch CPU threads (default 1)")
    p.add_argument(
        "--num-speculative-tokens",
        type=ascii_int,
        metavar="K",
        help="speculative decoding: K speculative tokens a step, drafted by the MTP layer",
    )
    add_hidden_alias(p, "--mtp", "num_speculative_tokens", type=ascii_int)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise DsakvError(f"--prompt-ids = {text!r}: must be comma-separated integers, e.g. 1,2,3") from None
    if not ids:
        raise DsakvError("--prompt-ids: empty; give at least one token id")
    return ids


def run(args) -> int:
    for flag in ("checkpoint", "prompt_ids"):
        if not getattr(args, flag):
            raise DsakvError(
                f"--{flag.replace('_', '-')} is required (dsakv generate --checkpoint DIR --prompt-ids 1,2,3)"
            )
    ids = parse_ids(args.prompt_ids)
    for name in ("max_new_tokens", "pages", "page_size", "threads"):
        if getattr(args, name) < 1:
            raise DsakvError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be >= 1")
    k = args.num_speculative_tokens
    if k is not None and k < 0:
        raise DsakvError(
            f"--num-speculative-tokens = {k}: must be >= 0 (draft tokens a step; 0 runs the MTP layer only)"
        )
    import torch

    from dsakv.engine.engine import Engine, EngineConfig

    torch.set_num_threads(args.threads)
    dtypes = dict(kv_dtype="fp32", indexer_dtype="fp32") if args.exact else {}
    spec = dict(speculative="mtp", num_speculative_tokens=k) if k is not None else {}
    cfg = EngineConfig(num_pages=args.pages, page_size=args.page_size, **dtypes, **spec)
    engine = Engine(cfg, checkpoint=args.checkpoint)
    result = engine.generate([ids], args.max_new_tokens)[0]
    if result.stats.outcome == "rejected":
        raise DsakvError(f"request rejected: {result.stats.reason}")
    out = {
        "tokens": result.output_tokens,
        "hit_tokens": result.stats.hit_tokens,
        "kv_dtype": engine.layout.kv_dtype,
        "indexer_dtype": engine.layout.indexer_dtype,
        "prompt_tokens": len(ids),
        "model_type": engine.model.cfg.model_type,
    }
    if k is not None:
        drafted, accepted = result.stats.draft_tokens, result.stats.accepted_draft_tokens
        out |= {
            "mtp_steps": k,
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
        }
    if args.json:
        print(json.dumps(out))
    else:
        width = max(map(len, out))
        for key, value in out.items():
            print(f"{key:>{width}}: {' '.join(map(str, value)) if isinstance(value, list) else value}")
    return 0
