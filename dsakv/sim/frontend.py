"""The serving front-end between a benchmark client and the scheduler (docs/steptime.md, fact 18).

One process takes the requests one at a time in the order the client sent them (vLLM's API server,
``--api-server-count`` 1; SGLang's TokenizerManager, ``--tokenizer-worker-num`` 1: HTTP parsing, chat template,
tokenization, the hand-off to the engine), each for ``request_s + token_s x prompt tokens``; then every request
takes a further ``latency_s`` to reach the scheduler's queue::

    sent_k ──► [ serial front-end: busy until free ] ──► + latency_s ──► scheduler queue
               start_k = max(sent_k, end_{k-1})
               end_k   = start_k + request_s + token_s x prompt_k
               queued_k = end_k + latency_s

A burst of short requests therefore reaches the engine spread over ``n x request_s``; a request sent alone waits
``request_s + token_s x prompt + latency_s``. With zero service time the queue is the plain latency
(``queued = sent + latency_s``, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FrontEnd:
    """The front-end's queue: ``queued_s`` (does not change it) and ``take`` (the request passes; the process is
    busy until its service ends). Requests must be taken in the order the client sent them."""

    latency_s: float = 0.0
    request_s: float = 0.0
    token_s: float = 0.0
    free_s: float = field(default=0.0, init=False)  # when the process has finished the requests taken so far

    @property
    def serial(self) -> bool:
        """Whether requests take service time (and so may wait for each other)."""
        return self.request_s > 0 or self.token_s > 0

    def _end_s(self, sent_s: float, prompt_tokens: int) -> float:
        if not self.serial:
            return sent_s
        start = sent_s if sent_s >= self.free_s else self.free_s
        return start + self.request_s + self.token_s * prompt_tokens

    def queued_s(self, sent_s: float, prompt_tokens: int) -> float:
        """When a request sent at ``sent_s`` would reach the scheduler's queue if it were taken next."""
        return self._end_s(sent_s, prompt_tokens) + self.latency_s

    def take(self, sent_s: float, prompt_tokens: int) -> float:
        """Pass the next request through: the process is busy until its service ends; returns its ``queued_s``."""
        self.free_s = self._end_s(sent_s, prompt_tokens)
        return self.free_s + self.latency_s
