"""Synthetic request traces with named scenarios, in the Mooncake form (hash ids of 512-token blocks).

Every scenario is a deterministic function of its seed. Prompts are built from a growing list of block
ids, so sharing is exact: a conversation's next turn re-sends the previous prompt (same ids, same offsets)
and appends new blocks; the partial last block keeps its id and is extended, which is exactly what
``mooncake_tokens`` makes of it. Shared system / tool prompts are whole 512-token blocks so that a
conversation's own text never lands inside a block another conversation uses.

Scenarios (``SCENARIOS``):

* ``chat``: multi-turn conversations over a handful of shared system prompts; think time between turns.
* ``agent``: agent sessions re-sending a growing context (tool prompt + every tool result) every few seconds.
* ``longdoc``: long-document QA, documents of 128K to 1M tokens, several questions per document.
* ``mixed`` (the default): chat + agent + a few long documents, merged by arrival time.

Sizes are chosen so that the default scenario runs in seconds at GLM-5.3 / 8xH200 capacity yet fills the
pool enough to evict; ``scale`` multiplies the number of sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dsakv.errors import DsakvError, check_choice
from dsakv.spec.layout import ceil_div
from dsakv.workloads.traces import MOONCAKE_BLOCK, TraceRequest


class _BlockIds:
    """Hands out fresh hash ids; one per generator so ids never collide inside a trace. With ``tenants`` > 0
    it also deals the prompts (conversations, sessions, questions) out to tenants, round-robin."""

    def __init__(self, tenants: int = 0) -> None:
        self.next = 0
        self.tenants = tenants
        self.contexts = 0

    def take(self, n: int) -> list[int]:
        ids = list(range(self.next, self.next + n))
        self.next += n
        return ids

    def next_tenant(self) -> str | None:
        self.contexts += 1
        return f"tenant-{(self.contexts - 1) % self.tenants}" if self.tenants else None


class _Context:
    """A prompt that grows: ``blocks`` name its 512-token blocks, the last one possibly partial."""

    def __init__(self, ids: _BlockIds, shared_blocks: list[int] | None = None) -> None:
        self.ids = ids
        self.blocks = list(shared_blocks or [])
        self.length = len(self.blocks) * MOONCAKE_BLOCK
        self.tenant = ids.next_tenant()

    def extend(self, n: int) -> None:
        self.length += int(n)
        need = ceil_div(self.length, MOONCAKE_BLOCK)
        if need > len(self.blocks):
            self.blocks.extend(self.ids.take(need - len(self.blocks)))

    def request(self, t_ms: float, output_length: int) -> TraceRequest:
        t = round(float(t_ms), 3)
        return TraceRequest(t, self.length, int(output_length), tuple(self.blocks), tenant=self.tenant)


def _uniform_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(rng.integers(lo, hi + 1))


def _chat(rng: np.random.Generator, ids: _BlockIds, scale: float, t0: float = 0.0) -> list[TraceRequest]:
    systems = [ids.take(_uniform_int(rng, 2, 12)) for _ in range(4)]
    out: list[TraceRequest] = []
    t_conv = t0
    for _ in range(max(1, round(60 * scale))):
        t_conv += rng.exponential(1500.0)  # a new conversation every 1.5 s on average
        ctx = _Context(ids, systems[int(rng.integers(len(systems)))])
        t = t_conv
        for _turn in range(1 + int(rng.geometric(0.25))):
            ctx.extend(_uniform_int(rng, 30, 1200))  # user message
            output = _uniform_int(rng, 50, 800)
            out.append(ctx.request(t, output))
            ctx.extend(output)  # the answer is part of the next turn's prompt
            t += 5000.0 + rng.exponential(15000.0)  # generation + think time
    return out


def _agent(rng: np.random.Generator, ids: _BlockIds, scale: float, t0: float = 0.0) -> list[TraceRequest]:
    tool_prompts = [ids.take(_uniform_int(rng, 8, 32)) for _ in range(2)]
    out: list[TraceRequest] = []
    t_session = t0
    for _ in range(max(1, round(12 * scale))):
        t_session += rng.exponential(8000.0)
        ctx = _Context(ids, tool_prompts[int(rng.integers(len(tool_prompts)))])
        ctx.extend(_uniform_int(rng, 200, 2000))  # the task
        t = t_session
        for _step in range(_uniform_int(rng, 8, 30)):
            output = _uniform_int(rng, 30, 400)  # a tool call
            out.append(ctx.request(t, output))
            ctx.extend(output)
            ctx.extend(_uniform_int(rng, 100, 6000))  # the tool's result
            t += 1500.0 + rng.exponential(2500.0)
    return out


def _longdoc(rng: np.random.Generator, ids: _BlockIds, scale: float, t0: float = 0.0) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    t_doc = t0
    lo, hi = np.log(128 * 1024), np.log(1024 * 1024)
    for _ in range(max(1, round(4 * scale))):
        t_doc += rng.exponential(30000.0)
        doc_len = int(np.exp(rng.uniform(lo, hi)))
        doc = ids.take(doc_len // MOONCAKE_BLOCK)  # whole blocks: the questions never share a partial block
        t = t_doc
        for _q in range(_uniform_int(rng, 2, 5)):
            ctx = _Context(ids, doc)
            ctx.extend(_uniform_int(rng, 20, 300))
            out.append(ctx.request(t, _uniform_int(rng, 100, 600)))
            t += 5000.0 + rng.exponential(20000.0)
    return out


def _mixed(rng: np.random.Generator, ids: _BlockIds, scale: float) -> list[TraceRequest]:
    return _chat(rng, ids, scale) + _agent(rng, ids, scale) + _longdoc(rng, ids, 0.5 * scale, t0=20000.0)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    build: Callable[[np.random.Generator, _BlockIds, float], list[TraceRequest]]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("mixed", "chat + agents + a few long documents (the default)", _mixed),
        Scenario("chat", "multi-turn chat over 4 shared system prompts", _chat),
        Scenario("agent", "agent sessions re-sending a growing context every few seconds", _agent),
        Scenario("longdoc", "long-document QA, 128K-1M-token documents, 2-5 questions each", _longdoc),
    )
}
DEFAULT_SCENARIO = "mixed"


def generate_scenario(
    name: str = DEFAULT_SCENARIO, seed: int = 0, scale: float = 1.0, tenants: int = 0
) -> list[TraceRequest]:
    """Requests of a named scenario in arrival order (stable sort by timestamp); deterministic for a seed.

    ``tenants`` > 0 deals each conversation, agent session and document question to one of that many
    tenants (``tenant-0`` ...), round-robin: the same requests, but only a tenant's own prompts share pages.
    """
    check_choice("scenario", name, SCENARIOS)
    if not (isinstance(scale, (int, float)) and 0 < scale <= 1000):
        raise DsakvError(f"scenario scale = {scale!r}: must be a number in (0, 1000]")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DsakvError(f"seed = {seed!r}: must be an integer >= 0")
    if isinstance(tenants, bool) or not isinstance(tenants, int) or tenants < 0:
        raise DsakvError(f"tenants = {tenants!r}: must be an integer >= 0")
    rng = np.random.default_rng(seed)
    requests = SCENARIOS[name].build(rng, _BlockIds(tenants), float(scale))
    requests.sort(key=lambda r: r.timestamp_ms)
    return requests
