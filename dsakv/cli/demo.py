"""``dsakv demo``: a shared-prefix multi-turn chat through the engine on CPU, under memory pressure.

Conversations share a few system prompts; each turn's prompt is the whole history (system prompt, earlier
turns and the model's answers) plus a new user message, so later turns hit the prefix cache. The pool is
small enough to force eviction and preemption. The same workload then runs with the prefix cache off and a
pool large enough for everything at once; the demo confirms every generated token and every finished
request's cache read-back (both caches, bit for bit) match.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass

from dsakv.errors import DsakvError
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.policies import PREEMPTION_MODES


@dataclass(frozen=True)
class ChatWorkload:
    """``system[i]``: token ids; ``conversations[c] = (system index, [user message of each turn])``."""

    system: tuple[tuple[int, ...], ...]
    conversations: tuple[tuple[int, tuple[tuple[int, ...], ...]], ...]
    max_new_tokens: int

    @property
    def num_requests(self) -> int:
        return sum(len(turns) for _, turns in self.conversations)


def chat_workload(
    *,
    conversations: int = 6,
    turns: int = 2,
    system_prompts: int = 2,
    system_tokens: int = 80,
    user_tokens: tuple[int, int] = (8, 24),
    max_new_tokens: int = 8,
    vocab_size: int = 512,
    seed: int = 0,
) -> ChatWorkload:
    """A seeded shared-prefix multi-turn workload (token ids drawn uniformly from the vocabulary)."""
    rng = random.Random(seed)
    lo, hi = user_tokens

    def draw(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(vocab_size) for _ in range(n))

    system = tuple(draw(system_tokens) for _ in range(system_prompts))
    convs = tuple(
        (c % system_prompts, tuple(draw(rng.randint(lo, hi)) for _ in range(turns))) for c in range(conversations)
    )
    return ChatWorkload(system, convs, max_new_tokens)


def run_workload(engine, workload: ChatWorkload) -> list:
    """Run turn by turn (all conversations of a turn together); returns every ``GenerationResult``."""
    history = [list(workload.system[s]) for s, _ in workload.conversations]
    results = []
    for turn in range(max(len(t) for _, t in workload.conversations)):
        active = [c for c, (_, turns) in enumerate(workload.conversations) if turn < len(turns)]
        prompts = [history[c] + list(workload.conversations[c][1][turn]) for c in active]
        outs = engine.generate(prompts, workload.max_new_tokens)
        for c, prompt, out in zip(active, prompts, outs):
            history[c] = prompt + out.output_tokens
        results += outs
    return results


def compare(results_a: list, results_b: list) -> tuple[bool, bool]:
    """(every output token equal, every finished request's cache read-back bit-identical)."""
    tokens = len(results_a) == len(results_b) and all(
        a.output_tokens == b.output_tokens for a, b in zip(results_a, results_b)
    )
    caches = tokens and all(
        (a.cache is None) == (b.cache is None) and (a.cache is None or a.cache.equals(b.cache))
        for a, b in zip(results_a, results_b)
    )
    return tokens, caches


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="shared-prefix multi-turn chat through the engine, under memory pressure")
    p.add_argument("--conversations", type=int, default=6)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--system-tokens", type=int, default=80)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--pages", type=int, default=12, help="pages of the small pool (default 12)")
    p.add_argument("--page-size", type=int, default=16, help="tokens per page (64 on CUDA; any size on CPU)")
    p.add_argument("--preemption", choices=sorted(PREEMPTION_MODES), default="offload")
    p.add_argument("--new-token-ratio", type=float, default=0.0)
    p.add_argument("--pool-kind", choices=("slot", "packed"), default="slot")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def _longest_request(workload: ChatWorkload) -> int:
    turns = max(len(t) for _, t in workload.conversations)
    longest_user = max(sum(len(m) for m in t) for _, t in workload.conversations)
    return max(len(s) for s in workload.system) + longest_user + turns * workload.max_new_tokens


def demo_summary(args) -> dict:
    """Run the workload under pressure and as the reference; every figure the table and ``--json`` show."""
    from dsakv.engine.engine import Engine, EngineConfig
    from dsakv.scheduler.pages import pages_for

    ps = args.page_size
    workload = chat_workload(
        conversations=args.conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    longest = pages_for(_longest_request(workload), ps)
    if args.pages < longest:
        raise DsakvError(f"--pages = {args.pages}: the longest request of this workload needs {longest} pages")
    small = EngineConfig(
        num_pages=args.pages,
        page_size=ps,
        pool_kind=args.pool_kind,
        capture_cache=True,
        scheduler=SchedulerConfig(
            max_batched_tokens=4 * ps,
            chunk_tokens=2 * ps,
            new_token_ratio=args.new_token_ratio,
            preemption=args.preemption,
        ),
    )
    roomy = longest * workload.num_requests
    reference = EngineConfig(
        num_pages=roomy,
        page_size=ps,
        prefix_cache=False,
        capture_cache=True,
        scheduler=SchedulerConfig(max_batched_tokens=roomy * ps, chunk_tokens=roomy * ps, new_token_ratio=1.0),
    )
    engine, ref_engine = Engine(small), Engine(reference)
    results = run_workload(engine, workload)
    ref_results = run_workload(ref_engine, workload)
    tokens_match, caches_match = compare(results, ref_results)
    engine.check_integrity()
    lay, st, totals = engine.layout, engine.scheduler.stats, engine.totals
    written = sum(r.stats.pages_written for r in results)
    ref_written = sum(r.stats.pages_written for r in ref_results)
    return {
        "requests": len(results),
        "prompt_tokens": sum(r.stats.prompt_tokens for r in results),
        "output_tokens": sum(len(r.output_tokens) for r in results),
        "hit_tokens": sum(r.stats.hit_tokens + r.stats.resume_hit_tokens for r in results),
        "pool_pages": args.pages,
        "page_size": ps,
        "pages_written": written,
        "pages_written_reference": ref_written,
        "pages_saved": ref_written - written,
        "evicted_tokens": st.evicted_tokens,
        "preemptions": st.preemptions,
        "preemption": args.preemption,
        "offloaded_pages": st.offloaded_pages,
        "offloaded_bytes_main": totals.offloaded_bytes_main,
        "offloaded_bytes_indexer": totals.offloaded_bytes_indexer,
        "main_page_bytes": lay.main_page_bytes,
        "indexer_page_bytes": lay.indexer_page_bytes,
        "rejected": st.rejected,
        "steps": st.steps,
        "outputs_match": tokens_match,
        "caches_match": caches_match,
    }


def print_table(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="dsakv demo: shared-prefix multi-turn chat (tiny DSA model, CPU)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, bool):
            value = "yes" if value else "NO"
        elif "bytes" in key:
            value = f"{value:,} B"
        elif isinstance(value, int):
            value = f"{value:,}"
        table.add_row(key.replace("_", " "), str(value))
    Console().print(table)


def run(args) -> int:
    if args.threads < 1:
        raise DsakvError(f"--threads = {args.threads}: must be >= 1")
    for name in ("conversations", "turns", "system_tokens", "max_new_tokens", "pages", "page_size"):
        if getattr(args, name) < 1:
            raise DsakvError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be >= 1")
    import torch

    torch.set_num_threads(args.threads)
    summary = demo_summary(args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    return 0 if summary["outputs_match"] and summary["caches_match"] else 1
