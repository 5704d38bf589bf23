"""The constant step time: a fixed time per step plus a time per token (tests, or an engine measured that way)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dsakv.errors import DsakvError


@dataclass(frozen=True)
class ConstantStepTime:
    """``seconds = per_step + per_token * tokens`` (tokens = prefill tokens + decodes)."""

    per_step_s: float = 0.02
    per_token_s: float = 0.0

    def __post_init__(self) -> None:
        if self.per_step_s < 0 or self.per_token_s < 0:
            raise DsakvError("constant step time: per_step_s and per_token_s must be >= 0")

    def step_tokens(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> int:
        return sum(n for n, _ in prefill) + len(decode)

    def step_seconds(
        self,
        prefill: Sequence[tuple[int, int]],
        decode: Sequence[int],
        dp_tokens: int | None = None,
        dp_decodes: int | None = None,
    ) -> float:
        """``dp_tokens`` / ``dp_decodes`` (every DP group's, as the roofline takes them) do not change a constant."""
        return self.per_step_s + self.per_token_s * self.step_tokens(prefill, decode)

    def run_seconds(
        self,
        contexts: Sequence[int],
        steps: int,
        chunks: Sequence[tuple[int, int]] = (),
        dp_tokens: int | None = None,
        dp_decodes: int | None = None,
        joining: int | None = None,
    ) -> np.ndarray:
        """Seconds of each of ``steps`` steps of these decodes, with ``chunks[j]`` prefilled in step ``j`` while
        there is one, and a decode of ``joining + j`` from step ``len(chunks)`` on (``RooflineStepTime``'s twin)."""
        out = [self.step_seconds((chunk,), contexts) for chunk in chunks[:steps]]
        rest = steps - len(out)
        if rest:
            out += [self.step_seconds((), [*contexts, *(() if joining is None else (joining,))])] * rest
        return np.array(out)

    def to_dict(self) -> dict:
        return {"model": "constant", "per_step_s": self.per_step_s, "per_token_s": self.per_token_s}
