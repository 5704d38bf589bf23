"""MTP speculative decoding: the draft chain, the MTP layer's cache writes, and why both caches stay exact.

The model's MTP layer (``dsakv.model.mtp``) drafts; the target verifies; the scheduler rolls back. One
decode step of a request whose ``N = num_computed`` positions are cached and whose last token ``t[N]`` is
known, with a chain of ``k`` drafts (``EngineConfig.num_speculative_tokens``)::

    pending (from the last step)   MTP row at N-1: (target h[N-1], t[N]) -> d1       already in the MTP cache
    chain   (propose, before the   MTP row at N  : (its own h', d1)      -> d2       written at N .. N+k-2:
             target's forward)     ...           MTP row at N+k-2 -> dk               past the accepted end
    verify  (the target)           rows N .. N+k : [t[N], d1 .. dk] -> greedy g0 .. gk   both target caches
            accept a = longest prefix with d(i) == g(i-1); new tokens d1 .. da, ga
    extend  (after verification)   MTP rows N .. N+a: (target h[p], t[p+1]) -> rewrites the MTP cache at the
                                   positions now verified; the last row's prediction is the next step's d1

So after every step the MTP cache at each verified position ``p < num_computed`` holds exactly what a
non-speculative run that runs the MTP layer on every computed token writes there (the target's hidden
state at ``p`` and the token at ``p + 1``), and everything past ``num_computed`` in every layer of both
caches is stale: the scheduler cuts the page table at that token boundary (``scheduler.rollback``) and the
next step's writes land there before anything reads them. Prefill chunks extend the MTP cache over their
positions too (the token after a chunk's last position is the next prompt token, or the sampled one).

``num_speculative_tokens = 0`` runs the extend only: the MTP cache is filled (what a prefill engine hands to a decode
engine) and nothing is drafted. ``index_share_for_mtp_iteration`` lets chain steps after the first attend
the previous step's selection plus their own position instead of scoring the MTP layer's indexer.

Padding follows the engine's batch-invariance rule: every sequence of an MTP forward is padded to
``min_rows`` rows in scratch slots (``SeqInput`` positions after the real ones), so a row's bytes do not
depend on its batch mates.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from dsakv.engine.config import SCRATCH_SEQS, EngineConfig
from dsakv.engine.pool import TwinPool
from dsakv.model.inputs import PagedCache, SeqInput, request_slots
from dsakv.model.mtp import MtpOutput
from dsakv.scheduler.batch import BatchItem
from dsakv.scheduler.request import Request

__all__ = ["DraftChoice", "MtpSpeculator", "MtpTotals", "PendingDraft", "greedy_choice"]

# (request, index of the token the row predicts, logits row) -> the draft token; greedy by default. Tests
# pass their own to force a reject at a chosen position; any choice keeps the output tokens (verification).
DraftChoice = Callable[[Request, int, torch.Tensor], int]


def greedy_choice(request: Request, index: int, logits: torch.Tensor) -> int:
    return int(logits.argmax())


class MtpLayer(Protocol):
    def forward_paged(
        self,
        pool: PagedCache,
        seqs: Sequence[SeqInput],
        hidden: torch.Tensor,
        *,
        reuse: Sequence[torch.Tensor] | None = None,
        budget_bytes: int | None = None,
    ) -> MtpOutput: ...


@dataclass(frozen=True)
class PendingDraft:
    """A request's next first draft: the MTP row at ``position`` (its ``num_computed - 1``) predicted
    ``token``; ``hidden`` and ``selection`` are that row's output and attended positions (the chain's input)."""

    position: int
    token: int
    hidden: torch.Tensor
    selection: torch.Tensor


@dataclass
class MtpTotals:
    forward_calls: int = 0
    extend_rows: int = 0  # MTP rows at verified positions (and prefill chunks)
    chain_rows: int = 0  # MTP rows of chain steps 2..k
    indexer_rows_read: int = 0  # MTP-layer indexer K rows scored (fewer with index_share_for_mtp_iteration)
    draft_tokens: int = 0  # drafts proposed (verified by the target)
    accepted_tokens: int = 0  # drafts the target's greedy tokens confirmed


@dataclass(frozen=True)
class _Rows:
    """One sequence of an MTP forward: ``tokens`` at positions ``length - len(tokens) .. length - 1``."""

    request: Request
    tokens: list[int]
    length: int
    hidden: torch.Tensor  # [len(tokens), hidden]
    reuse: torch.Tensor | None  # [width] positions to attend besides the row's own (index share)


@dataclass(frozen=True)
class _RowResult:
    logits: torch.Tensor  # the last real row's
    hidden: torch.Tensor
    selection: torch.Tensor


class MtpSpeculator:
    """Drafts with the MTP layer and keeps its cache in step with the target's (see the module docstring).

    Holds the pending first draft of each decoding request; ``forget`` drops it (finish, abort).
    """

    def __init__(
        self, layer: MtpLayer, pool: TwinPool, config: EngineConfig, max_positions: int, choice: DraftChoice | None
    ) -> None:
        self.layer, self.pool, self.config = layer, pool, config
        self.scratch_slots = pool.allocator.first_page * config.page_size
        self.max_positions = max_positions
        self.choice = choice or greedy_choice
        self.totals = MtpTotals()
        self._pending: dict[Hashable, PendingDraft] = {}

    def forget(self, request_id: Hashable) -> None:
        self._pending.pop(request_id, None)

    # ----- the chain ------------------------------------------------------------------------------
    def propose(self, items: Sequence[BatchItem]) -> dict[int, list[int]]:
        """Drafts of every item with ``num_draft > 0`` (keyed by its index in ``items``): the pending first
        draft, then one MTP forward per further chain step over every chain still running."""
        chains: dict[int, list[int]] = {}
        state: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, item in enumerate(items):
            if not item.num_draft:
                continue
            pending = self._pending.get(item.request.id)
            if item.start == 0:  # a one-token prompt: no position precedes it, so no MTP row can draft yet
                chains[i] = [int(item.request.tokens(1)[0])] * item.num_draft  # any drafts verify losslessly
                continue
            if pending is None or pending.position != item.start - 1:
                raise AssertionError(
                    f"MTP: request {item.request.id!r} decodes from {item.start} without its pending draft"
                )
            chains[i] = [pending.token]
            state[i] = (pending.hidden, pending.selection)
        share = self.config.index_share_for_mtp_iteration
        for j in range(1, max((items[i].num_draft for i in state), default=0)):
            live = [i for i in state if items[i].num_draft > j]
            rows = [
                _Rows(
                    items[i].request,
                    [chains[i][-1]],
                    items[i].start + j,
                    state[i][0][None],
                    state[i][1] if share else None,
                )
                for i in live
            ]
            for i, res in zip(live, self._run(rows)):
                chains[i].append(self.choice(items[i].request, items[i].start + j + 1, res.logits))
                state[i] = (res.hidden, res.selection)
            self.totals.chain_rows += len(live)
        self.totals.draft_tokens += sum(len(c) for c in chains.values())
        return chains

    # ----- after verification ---------------------------------------------------------------------
    def extend(self, entries: Sequence[tuple[BatchItem, Sequence[int], int]], hidden: torch.Tensor) -> None:
        """Write the MTP cache at every position the target computed and kept in this forward.

        ``entries``: per item, the tokens reported for it (accepted drafts + the model's next token, or none
        for a prefill chunk) and its first row in ``hidden`` (the target's final-normed hidden states).
        """
        rows = []
        for item, new, first in entries:
            req = item.request
            self.totals.accepted_tokens += max(len(new) - 1, 0)
            after = req.tokens(item.end if item.sample else item.end + 1, item.start + 1)
            tokens = [int(t) for t in after] + ([int(t) for t in new] if item.sample else [])
            rows.append(_Rows(req, tokens, item.start + len(tokens), hidden[first : first + len(tokens)], None))
        results = self._run(rows)
        self.totals.extend_rows += sum(len(r.tokens) for r in rows)
        if not self.config.num_speculative_tokens:
            return
        for r, res in zip(rows, results):  # a prefill chunk's too: its remainder may be a one-token decode
            pos = r.length - 1
            token = self.choice(r.request, pos + 2, res.logits)
            self._pending[r.request.id] = PendingDraft(pos, token, res.hidden, res.selection)

    # ----- MTP forwards -------------------------------------------------------------------------------
    def _run(self, rows: Sequence[_Rows]) -> list[_RowResult]:
        """MTP forwards over ``rows``, as few as the scratch pages allow; the last real row of each."""
        out: list[_RowResult] = []
        group: list[tuple[_Rows, SeqInput]] = []
        used = 0
        for r in rows:
            pad = self._pad(len(r.tokens), r.length)
            if group and (used + pad > self.scratch_slots or len(group) >= SCRATCH_SEQS):
                out += self._forward(group)
                group, used = [], 0
            group.append((r, self._seq(r, pad, used)))
            used += pad
        if group:
            out += self._forward(group)
        return out

    def _pad(self, n: int, length: int) -> int:
        if not self.config.batch_invariant:
            return 0
        return max(0, min(self.config.min_rows - n, self.max_positions - length))

    def _seq(self, r: _Rows, pad: int, scratch_start: int) -> SeqInput:
        n = len(r.tokens)
        context = request_slots(r.request.pages, r.length, self.config.page_size)
        if pad:
            context = torch.cat([context, torch.arange(scratch_start, scratch_start + pad)])
        return SeqInput(
            token_ids=r.tokens + [0] * pad,
            positions=torch.arange(r.length - n, r.length + pad),
            slots=context[r.length - n :],
            context_slots=context,
        )

    def _forward(self, group: list[tuple[_Rows, SeqInput]]) -> list[_RowResult]:
        seqs = [seq for _, seq in group]
        width = group[0][0].hidden.shape[-1]
        hidden = torch.cat(
            [
                torch.cat([r.hidden, r.hidden.new_zeros(seq.token_ids.numel() - len(r.tokens), width)])
                for r, seq in group
            ]
        )
        reuse = None
        if group[0][0].reuse is not None:  # index share: the previous row's choice plus the row's own position
            reuse = [
                torch.cat([r.reuse, seq.positions[:1]]).expand(seq.token_ids.numel(), -1).clone() for r, seq in group
            ]
        res = self.layer.forward_paged(
            self.pool, seqs, hidden, reuse=reuse, budget_bytes=self.config.logits_budget_bytes
        )
        self.totals.forward_calls += 1
        self.totals.indexer_rows_read += res.indexer_rows
        out, row = [], 0
        for (r, seq), sel in zip(group, res.selections):
            last = row + len(r.tokens) - 1
            out.append(_RowResult(res.logits[last], res.hidden[last], sel[len(r.tokens) - 1]))
            row += seq.token_ids.numel()
        return out
