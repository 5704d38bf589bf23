"""Request workloads for the prefix-cache benchmark (the shared protocol, ``bench/prefix_cache.py``).

* ``synthetic(n, seed)``: multi-turn conversations on 8 shared system prompts. Draws the very same random
  numbers in the same order as the shared reference generator (``shared/bench/workloads.py``), so it
  yields the same requests and token ids: with the defaults, 2,000 requests and 5,088,042 tokens.
* ``mooncake(path, limit)``: the requests of a Mooncake trace as token-id arrays, streamed one request at
  a time (hash id ``h`` stands for tokens ``h*512 .. h*512+511``, cut at ``input_length``); the trace's
  144.8 M token ids are never held at once.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dsakv.errors import DsakvError
from dsakv.workloads.traces import MOONCAKE_BLOCK, mooncake_tokens, parse_mooncake_line

SYSTEM_PROMPTS = 8
SYSTEM_LENGTHS = (512, 2048, 4096)
RECENT_CONVERSATIONS = 64
CONTINUE_PROBABILITY = 0.6
VOCAB_END = 150000  # token ids are drawn from 1 .. VOCAB_END - 1
FIRST_TURN = (20, 1500)  # new conversation: system prompt + this many user tokens (inclusive)
NEXT_TURN = (50, 800)  # continuation: this many more tokens (inclusive)


def synthetic(n: int = 2000, seed: int = 0) -> list[list[int]]:
    """``n`` requests: 60% continue one of the 64 most recent conversations, the rest start a new one
    on a random system prompt. A continuation's list shares its prefix's int objects (as the reference)."""
    rng = random.Random(seed)
    draw = rng.randrange
    systems = [[draw(1, VOCAB_END) for _ in range(rng.choice(SYSTEM_LENGTHS))] for _ in range(SYSTEM_PROMPTS)]
    convs: list[list[int]] = []
    reqs: list[list[int]] = []
    for _ in range(n):
        if convs and rng.random() < CONTINUE_PROBABILITY:
            i = draw(len(convs))
            convs[i] = convs[i] + [draw(1, VOCAB_END) for _ in range(rng.randint(*NEXT_TURN))]
            reqs.append(convs[i])
        else:
            convs.append(rng.choice(systems) + [draw(1, VOCAB_END) for _ in range(rng.randint(*FIRST_TURN))])
            reqs.append(convs[-1])
        if len(convs) > RECENT_CONVERSATIONS:
            convs.pop(0)
    return reqs


def mooncake(path: str | Path, limit: int | None = None, block: int = MOONCAKE_BLOCK) -> Iterator[np.ndarray]:
    """Token ids of each request of a Mooncake trace, one int64 array at a time, in file order (as the
    shared reference replays it). One pass: each line is validated as it is read (``DsakvError`` naming the
    line); ``limit`` counts requests."""
    try:
        f = Path(path).open(encoding="utf-8")
    except OSError as exc:
        raise DsakvError(f"trace {str(path)!r}: cannot read ({exc.strerror or exc})") from None
    with f:
        served = 0
        for lineno, text in enumerate(f, start=1):
            if limit is not None and served >= limit:
                return
            if not text.strip():
                continue
            req = parse_mooncake_line(text, lineno, block)
            served += 1
            yield mooncake_tokens(req.hash_ids, req.input_length, block)
