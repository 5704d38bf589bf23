"""AIConfigurator's routing of its measured MoE tables, replayed: how many experts the tables' tokens touched
(``bench/moe_stream.py`` and ``bench/measured_ops.py`` count the bytes a measured layer moved with it)."""

from __future__ import annotations

import functools
import statistics

import numpy as np

# AIConfigurator's routing of its MoE tables (ai-dynamo/aiconfigurator 095f58a51, ``collector/helper.py``:
# ``_generate_power_law_distribution`` with ``sample_power_law``; the DeepSeek models' ``power_law_alpha`` 1.01, as
# the tables' ``distribution`` column names it): tokens per expert drawn by inverse CDF from a power law on
# [1, 0.8 x tokens] (on [0.01, 2] when tokens x top-k <= experts), scaled to tokens x top-k, rounded, clamped at
# tokens (an expert takes a token once), and the sum restored one token at a time: added to the least-loaded expert
# below the clamp, or taken from the most-loaded (``_round_robin_adjust_per_rank``, one rank without EP).
AIC_POWER_LAW_ALPHA = 1.01
# Tables AIConfigurator collected with DeepSeek's grouped top-k in front of the kernel (its collector's
# ``sglang_moe_num_expert_group`` / ``topk_group``, from e23be5a79, 2026-07-13, the 0.5.14 collection): the grouping
# re-selects the generator's experts, so this replay does not stand for them (``moe_stream.py`` marks their lines,
# ``measured_ops.py`` leaves them out of its routed comparison).
GROUPED_TOPK_VERSIONS = {"sglang 0.5.14"}


def aic_expert_counts(
    tokens: int, experts: int, topk: int, rng: np.random.Generator, alpha: float = AIC_POWER_LAW_ALPHA
) -> np.ndarray:
    """Tokens per expert of one MoE layer as AIConfigurator's collector routes ``tokens`` tokens (module constants):
    ``experts`` integers, each at most ``tokens``, summing to ``tokens x topk``."""
    lo, hi = (1.0, tokens * 0.8) if tokens * topk > experts else (0.01, 2.0)
    u = rng.random(experts)
    draw = ((hi ** (1 - alpha) - lo ** (1 - alpha)) * u + lo ** (1 - alpha)) ** (1 / (1 - alpha))
    target = tokens * topk
    counts = np.round(draw / draw.sum() * target).astype(np.int64)
    overflow = int(np.clip(counts - tokens, 0, None).sum())
    counts = np.minimum(counts, tokens)
    counts = _adjust(counts, overflow, tokens)
    return _adjust(counts, target - int(counts.sum()), tokens)


def _adjust(counts: np.ndarray, delta: int, cap: int) -> np.ndarray:
    """Add ``delta`` tokens one at a time to the least-loaded expert below ``cap`` (a negative ``delta``: take them
    from the most-loaded one with any)."""
    while delta > 0:
        open_ = np.flatnonzero(counts < cap)
        if not open_.size:
            break
        counts[open_[np.argmin(counts[open_])]] += 1
        delta -= 1
    while delta < 0:
        held = np.flatnonzero(counts > 0)
        if not held.size:
            break
        counts[held[np.argmax(counts[held])]] -= 1
        delta += 1
    return counts


@functools.lru_cache(maxsize=1024)
def touched_experts(tokens: int, experts: int, topk: int, draws: int, seed: int = 0) -> float:
    """The mean number of experts with at least one of ``tokens`` tokens under AIConfigurator's routing (seeded:
    the same figure for the same arguments, so it is kept once computed)."""
    rng = np.random.default_rng(seed)
    return statistics.fmean(int((aic_expert_counts(tokens, experts, topk, rng) > 0).sum()) for _ in range(draws))
