"""The array fast path: a run of decode steps (every context one longer per step, optionally one prefill chunk a
step) priced as numpy arrays in one pass, bit for bit what ``RooflineStepTime.step_seconds`` gives step by step.

The sums of a run are exact integers per step (``sums.clipped_run``); ``RooflineStepTime.price`` prices arrays by
the same operations in the same order as one step's floats. Decode steps that see their whole top-k depend only on
the decode count, the context sum and the DP figures, so their seconds are kept in tables on the model
(``RooflineStepTime._saturated``) and read back.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from dsakv.sim.steptime.sums import StepSums, clipped_run, sparse_pairs

if TYPE_CHECKING:
    from dsakv.sim.steptime.roofline import RooflineStepTime

Dp = tuple[int | None, int | None]  # (dp_tokens, dp_decodes) of every step of the run

# Runs of steps shorter than this are priced step by step, longer ones as arrays: numpy's fixed cost per operation
# passes a scalar step's price at about four steps (measured on the x1 cluster bench's batches).
ARRAY_STRETCH_STEPS = 4
# The most entries (8 bytes each) the tables of decode steps that see their whole top-k hold, all together
# (``saturated_decodes``): 64 MiB; the x1 cluster bench's take ~17 MiB. Past it a stretch is
# priced and not kept (long contexts with many decodes run sums up into the millions).
SATURATED_TABLE_ENTRIES = 2**23


def run_seconds(
    model: RooflineStepTime,
    contexts: Sequence[int],
    steps: int,
    chunks: Sequence[tuple[int, int]] = (),
    dp_tokens: int | None = None,
    dp_decodes: int | None = None,
    joining: int | None = None,
) -> np.ndarray:
    """Seconds of each of ``steps`` steps of a run: step ``j`` decodes ``contexts[i] + j`` for every ``i``
    and, while there is one, prefills the chunk ``chunks[j] = (new tokens, context before)``; after the
    chunks, with ``joining``, the request they prefilled decodes ``joining + j`` too (``dp_tokens`` /
    ``dp_decodes`` as ``cost``'s, the same every step of the run). Entry ``j`` equals ``step_seconds`` of
    that step's batch bit for bit: the sums are exact integers per step and ``price`` prices each stretch of
    equal chunk sizes (or of decodes alone) in one pass."""
    out, j = [], 0
    for n, stretch in itertools.groupby(chunks[:steps], key=operator.itemgetter(0)):
        starts = [start for _, start in stretch]
        out.append(run_stretch(model, contexts, j, len(starts), (n, starts), (dp_tokens, dp_decodes)))
        j += len(starts)
    if j < steps:
        decodes = contexts if joining is None else [*contexts, joining]
        out.append(run_stretch(model, decodes, j, steps - j, (), (dp_tokens, dp_decodes)))
    return out[0] if len(out) == 1 else np.concatenate(out)


def run_stretch(
    model: RooflineStepTime,
    contexts: Sequence[int],
    first_step: int,
    steps: int,
    chunk: tuple[int, list[int]] | tuple[()],
    dp: Dp,
) -> np.ndarray:
    """Seconds of steps ``first_step .. first_step + steps - 1`` of a run whose chunks (if any) all have
    ``chunk = (new tokens, [context before, per step])``: as arrays, or step by step when that is cheaper
    (fewer than ``ARRAY_STRETCH_STEPS``; the same bits either way)."""
    decode = [c + first_step for c in contexts]
    if not chunk and steps >= ARRAY_STRETCH_STEPS and decode:
        low = min(decode)  # the tables are indexed by the context sum: never below 0
        if low >= 0 and (len(decode) == 1 or low >= (1 + model.num_speculative_tokens) * model.rank.topk):
            return saturated_decodes(model, decode, steps, dp)
    if steps < ARRAY_STRETCH_STEPS:
        return np.array(
            [
                model.step_seconds(((chunk[0], chunk[1][j]),) if chunk else (), [c + j for c in decode], *dp)
                for j in range(steps)
            ]
        )
    return price_decodes(model, decode, steps, dp, chunk)


def price_decodes(
    model: RooflineStepTime,
    decode: list[int],
    steps: int,
    dp: Dp,
    chunk: tuple[int, list[int]] | tuple[()] = (),
) -> np.ndarray:
    """``price`` over arrays of ``steps`` steps: step ``j`` decodes ``c + j`` for each ``c`` in ``decode``
    and prefills ``(chunk[0], chunk[1][j])`` (none without ``chunk``)."""
    topk = model.rank.topk
    first = model.sums((), decode)
    j = np.arange(steps, dtype=np.int64)
    dec_sum = first.dec_sum + len(decode) * j
    q = 1 + model.num_speculative_tokens
    dec_topk = clipped_run(decode, first.dec_topk, topk, j)
    dec_rows = dec_topk if q == 1 else clipped_run(decode, first.dec_rows, q * topk, j)
    if chunk:
        n, starts = chunk
        ctx = np.array(starts, dtype=np.int64)
        pairs = np.array([sparse_pairs(n, c, topk) for c in starts], dtype=np.int64)
        prefill = (1, n, n + ctx, n * ctx + n * (n + 1) // 2, pairs, np.minimum(n + ctx, n * topk))
    else:
        prefill = (0, 0, 0, 0, 0, 0)
    run = StepSums(*prefill, first.n_dec, dec_sum, dec_topk, dec_rows)
    return model.price_seconds(run, *dp, arrays=True)  # dec_sum: an array


def saturated_decodes(model: RooflineStepTime, decode: list[int], steps: int, dp: Dp) -> np.ndarray:
    """``run_stretch`` of ``steps`` decode steps whose every query sees its whole top-k (each context at
    least ``(1 + num_speculative_tokens) * topk``), or of a single decode: such a step's price depends only on the decode
    count, the context sum and ``dp``, so it is read from ``model._saturated`` (key: count and ``dp``; entry: the
    context sum, NaN until priced; no price is NaN) and only a stretch with an entry missing is priced,
    whole, and stored.
    The same bits as pricing every stretch: each entry is one step's ``price``. The tables hold 8 bytes
    per context sum up to the largest seen (≈ 17 MiB for the x1 cluster bench, shared by every instance),
    ``SATURATED_TABLE_ENTRIES`` at most in all: a stretch that would grow them past it is priced only."""
    n, first = len(decode), sum(decode)
    last = first + n * (steps - 1)  # the context sum of the stretch's last step
    key = (n, *dp)
    table = model._saturated.get(key)
    if table is None or table.size <= last:
        held = table.size if table is not None else 0
        size = max(last + 1, held * 5 // 4)
        if sum(t.size for t in model._saturated.values()) - held + size > SATURATED_TABLE_ENTRIES:
            return price_decodes(model, decode, steps, dp)
        grown = np.full(size, np.nan)
        if table is not None:
            grown[:held] = table
        table = model._saturated[key] = grown
    known = table[first : last + 1 : n]  # a view: step j's context sum is first + n * j
    if not np.isnan(known).any():
        return known.copy()
    seconds = price_decodes(model, decode, steps, dp)
    known[:] = seconds
    return seconds
