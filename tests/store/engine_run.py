"""One engine run over the store as a separate process: ``python tests/store/engine_run.py URL PROMPTS_JSON``.

Prints one JSON line: per prompt its generated tokens, hit tokens per tier and the xxh3 digest of both
caches of the finished request, plus the store's counters. The second-process test compares them with an
in-process reference, so the pages this process loads can only come from the server.
``tier_engine_config`` is the one engine configuration of the store's engine tests (they load this file).
"""

from __future__ import annotations

import json
import sys

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.scheduler import SchedulerConfig

PAGE = 16
MAX_NEW = 4


def tier_engine_config(**kw) -> EngineConfig:
    """A small device pool (a few prompts evict each other) with chunked prefill, read-back of both caches."""
    sched = SchedulerConfig(max_batched_tokens=4 * PAGE, chunk_tokens=2 * PAGE)
    return EngineConfig(**{"num_pages": 10, "page_size": PAGE, "capture_cache": True, "scheduler": sched, **kw})


def main() -> None:
    import torch

    url, prompts = sys.argv[1], json.loads(sys.argv[2])
    torch.set_num_threads(1)
    engine = Engine(tier_engine_config(store_url=url))
    runs = []
    for prompt in prompts:
        (r,) = engine.generate([prompt], MAX_NEW)
        runs.append(
            {
                "tokens": r.output_tokens,
                "hit_tokens": r.stats.hit_tokens,
                "hit_tokens_store": r.stats.hit_tokens_store,
                "cache_digest": r.cache.digest(),
            }
        )
    engine.check_integrity()
    print(json.dumps({"runs": runs, "counters": engine.tiers.store.store.counters.to_dict()}))


if __name__ == "__main__":
    main()
