"""The decode side's state of each hand-off: explicit states, an epoch per allocation, a deadline, the commit rule.

::

    OFFERED --allocate--> RECEIVING --commit (every page complete and verified)--> COMMITTED
       |                      |  \\--fail (digest, missing part, timeout, sender gone)--> FAILED
       \\------------------abort (either side; acknowledged with AbortAck)--------------> ABORTED

* **Epoch.** Every allocation takes a new epoch from the ``TransferBook``. Each report of the sender names
  it; a report for an epoch that ended (aborted, failed, committed) is rejected (``TransferError("epoch")``):
  a late write after an abort can never complete a later transfer whose pages reuse the same ids.
* **Commit both or neither.** A page counts as arrived only when *every* component of the manifest (each
  layer's main KV, each full layer's index-K, the MTP layers') was reported for it and the digest of the
  bytes that arrived equals the sender's. ``commit`` refuses (naming the page and the component) otherwise,
  so the decode side never enters a page in its radix tree, or decodes on it, half-filled.
* **Outcome.** Every transfer ends in ``success`` or in the policy's outcome: ``fail`` (the request errors)
  or ``recompute`` (the decode side prefills it itself); never a decode on a stale buffer.

No bytes here: the engine computes the digests of what it received and reports them (``verify``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from dsakv.errors import DsakvError, check_choice
from dsakv.transfer.manifest import TransferError
from dsakv.transfer.pages import PageCount, check_destination

POLICIES = ("fail", "recompute")  # what a failed hand-off becomes (vLLM's kv_load_failure_policy)


class TransferState(Enum):
    OFFERED = "offered"
    RECEIVING = "receiving"
    COMMITTED = "committed"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def ended(self) -> bool:
        return self in (TransferState.COMMITTED, TransferState.FAILED, TransferState.ABORTED)


@dataclass(frozen=True)
class AbortAck:
    """The acknowledgement of an abort: from now on every report of ``epoch`` is rejected."""

    handoff_id: str
    epoch: int
    freed_pages: tuple[int, ...]


@dataclass
class Transfer:
    """One hand-off on the decode side. Pages ``0 .. skip - 1`` the decode side already caches (both
    caches, in the request's namespace); ``dest_pages[i]`` receives page ``skip + i``."""

    handoff_id: str
    count: PageCount
    components: frozenset[str]
    policy: str
    deadline: float
    epoch: int = 0
    skip: int = 0
    dest_pages: tuple[int, ...] = ()
    state: TransferState = TransferState.OFFERED
    reason: str | None = None
    arrived: dict[int, frozenset[str]] = field(default_factory=dict)
    expected: dict[int, int] = field(default_factory=dict)
    verified: set[int] = field(default_factory=set)
    duplicates: int = 0

    @property
    def outcome(self) -> str | None:
        """``success``, the policy's ``fail`` / ``recompute`` once ended badly, or None while running."""
        if self.state is TransferState.COMMITTED:
            return "success"
        return self.policy if self.state.ended else None

    @property
    def pending(self) -> range:
        return range(self.skip, self.count.pages)

    def _require(self, epoch: int) -> None:
        if self.state.ended:
            raise TransferError(
                "epoch", f"hand-off {self.handoff_id}: epoch {epoch} ended ({self.state.value}); report rejected"
            )
        if epoch != self.epoch:
            raise TransferError(
                "epoch", f"hand-off {self.handoff_id}: report for epoch {epoch}, the allocation is epoch {self.epoch}"
            )
        if self.state is not TransferState.RECEIVING:
            raise TransferError(
                "state", f"hand-off {self.handoff_id}: {self.state.value}; pages are reported while receiving"
            )

    def report(self, epoch: int, index: int, components: Iterable[str], digest: int) -> None:
        """The sender wrote page ``index`` (the named components) and computed ``digest`` over its bytes.

        A duplicate report with the same components and digest is ignored (counted); a different one, a page
        outside the pending range or an unknown component is an error."""
        self._require(epoch)
        if index not in self.pending:
            raise TransferError(
                "page_count", f"page {index}: not to be received (pages {self.skip}..{self.count.pages - 1})"
            )
        names = frozenset(components)
        unknown = sorted(names - self.components)
        if unknown:
            raise TransferError("components", f"page {index}: unknown components {unknown}")
        if index in self.arrived:
            if self.arrived[index] == names and self.expected[index] == digest:
                self.duplicates += 1
                return
            raise TransferError("duplicate", f"page {index}: reported twice with different contents")
        self.arrived[index] = names
        self.expected[index] = digest

    def verify(self, index: int, actual: int) -> None:
        """The digest of the bytes that arrived for page ``index``; a mismatch fails the transfer."""
        if index not in self.expected:
            raise TransferError("missing", f"page {index}: no report from the sender")
        if actual != self.expected[index]:
            raise TransferError("digest", f"page {index}: digest of the received bytes does not match the sender's")
        self.verified.add(index)

    def incomplete(self) -> str | None:
        """The first page (and its components) not fully reported, or None when every page arrived whole."""
        for index in self.pending:
            got = self.arrived.get(index)
            if got is None:
                return f"page {index}: never arrived"
            lacking = sorted(self.components - got)
            if lacking:
                return f"page {index}: {', '.join(lacking)} never arrived"
        return None

    def missing(self) -> str | None:
        """The first thing that keeps the transfer from committing, or None when every page is complete."""
        gap = self.incomplete()
        if gap is not None:
            return gap
        unverified = [i for i in self.pending if i not in self.verified]
        return f"page {unverified[0]}: not verified" if unverified else None

    def commit(self) -> None:
        if self.state is not TransferState.RECEIVING:
            raise TransferError(
                "state", f"hand-off {self.handoff_id}: {self.state.value}; only a receiving one commits"
            )
        gap = self.missing()
        if gap is not None:
            raise TransferError("missing", f"hand-off {self.handoff_id}: {gap}")
        self.state = TransferState.COMMITTED

    def fail(self, reason: str) -> None:
        if not self.state.ended:
            self.state, self.reason = TransferState.FAILED, reason


class TransferBook:
    """Every hand-off of one decode engine by epoch; epochs only grow; ended epochs stay known (rejected)."""

    def __init__(self, timeout_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise DsakvError(f"timeout_s = {timeout_s!r}: must be a positive number of seconds")
        self.timeout_s = float(timeout_s)
        self.clock = clock
        self._epoch = 0
        self.live: dict[int, Transfer] = {}
        self.ended: dict[int, Transfer] = {}

    def offer(self, handoff_id: str, count: PageCount, components: Iterable[str], policy: str) -> Transfer:
        check_choice("policy", policy, POLICIES)
        return Transfer(str(handoff_id), count, frozenset(components), policy, self.clock() + self.timeout_s)

    def allocate(self, transfer: Transfer, skip: int, dest_pages: Sequence[int]) -> int:
        """Give ``transfer`` its destination pages and a new epoch; it is now RECEIVING."""
        if transfer.state is not TransferState.OFFERED:
            raise TransferError("state", f"hand-off {transfer.handoff_id}: {transfer.state.value}; allocate once")
        check_destination(transfer.count, skip, dest_pages)
        self._epoch += 1
        transfer.epoch, transfer.skip, transfer.dest_pages = self._epoch, skip, tuple(dest_pages)
        transfer.state = TransferState.RECEIVING
        self.live[self._epoch] = transfer
        return self._epoch

    def get(self, epoch: int) -> Transfer:
        """The live transfer of ``epoch``; an ended or unknown epoch is a ``TransferError("epoch")``."""
        if epoch in self.live:
            return self.live[epoch]
        if epoch in self.ended:
            t = self.ended[epoch]
            raise TransferError(
                "epoch", f"epoch {epoch} (hand-off {t.handoff_id}) ended {t.state.value}; late report rejected"
            )
        raise TransferError("epoch", f"epoch {epoch}: no such allocation")

    def end(self, transfer: Transfer) -> tuple[int, ...]:
        """Move an ended transfer out of the live set; returns the destination pages its caller must free
        (none after a commit: they belong to the cache then)."""
        if not transfer.state.ended:
            raise TransferError("state", f"hand-off {transfer.handoff_id}: still {transfer.state.value}")
        self.live.pop(transfer.epoch, None)
        self.ended[transfer.epoch] = transfer
        return () if transfer.state is TransferState.COMMITTED else transfer.dest_pages

    def abort(self, epoch: int) -> AbortAck:
        t = self.get(epoch)
        t.state, t.reason = TransferState.ABORTED, "aborted"
        return AbortAck(t.handoff_id, epoch, self.end(t))

    def expired(self) -> list[Transfer]:
        """Live transfers past their deadline, failed with reason ``timeout`` (still live: ``end`` them)."""
        now = self.clock()
        out = [t for t in self.live.values() if now > t.deadline]
        for t in out:
            t.fail("timeout")
        return out

    def held_pages(self) -> int:
        return sum(len(t.dest_pages) for t in self.live.values())


__all__ = ["POLICIES", "AbortAck", "Transfer", "TransferBook", "TransferState"]
