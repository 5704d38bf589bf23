"""MTP draft acceptance: one probability for every draft position, or one per position, and the expected yield."""

from __future__ import annotations

import itertools
import operator

from dsakv.errors import DsakvError


def check_accept(accept: object, k: int, name: str = "mtp_accept") -> float | tuple[float, ...]:
    """``accept`` checked: one acceptance probability in [0, 1] for every draft position, or a tuple (a list is
    taken as one) of ``k`` of them, position ``i``'s acceptance given positions ``1 .. i-1`` were accepted."""
    values = tuple(accept) if isinstance(accept, (list, tuple)) else (accept,)
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1 for v in values):
        raise DsakvError(
            f"{name} = {accept!r}: must be a probability in [0, 1] or a list of them, one per draft position"
        )
    if len(values) > 1 and len(values) != k:
        raise DsakvError(
            f"{name} = {accept!r}: {len(values)} per-position probabilities for {k} draft tokens: give one, or {k}"
        )
    return values if isinstance(accept, (list, tuple)) else accept


def accept_positions(accept: float | tuple[float, ...], k: int) -> tuple[float, ...]:
    """The acceptance probability of each of ``k`` draft positions (``accept`` as ``check_accept`` returns it)."""
    return tuple(accept) if isinstance(accept, tuple) else (accept,) * k


def tokens_per_decode(accept: float | tuple[float, ...], k: int) -> float:
    """Expected tokens one decode step yields per request with ``k`` draft tokens (1 without MTP): the token, plus
    draft position ``i`` where it and every earlier one are accepted (``1 + sum_i p_1 ... p_i``)."""
    return 1.0 + sum(itertools.accumulate(accept_positions(accept, k), operator.mul))
