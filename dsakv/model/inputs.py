"""What the engine hands the tiny model for one forward step, the paged cache the model reads and writes, and
the validation of both.

A ``SeqInput`` names one sequence's new tokens and where its context lives in the pool; see the
``dsakv.model.tiny_dsa`` docstring for the contract. ``validate_batch`` checks a whole batch against the spec and
the pool *before* the model writes anything, so bad input never leaves a partial write behind, and hands back
its slots as ``CheckedSlots``: the pool stores and reads those without checking them again, so a forward
checks each slot once, not once per layer.

``PagedCache`` is the part of the pool the model uses (``dsakv.engine.TwinPool`` implements it); the model
sits below the engine and never imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


def request_slots(pages: Sequence[int], num_tokens: int, page_size: int) -> torch.Tensor:
    """Slot ``page * page_size + offset`` of each position ``0 .. num_tokens - 1`` of a page table (int64)."""
    pos = torch.arange(num_tokens)
    table = torch.as_tensor(list(pages), dtype=torch.int64)
    return table[pos // page_size] * page_size + pos % page_size


@dataclass(frozen=True)
class CheckedSlots:
    """Token slots that ``validate_batch`` proved usable in one pool for one forward call.

    ``tensor`` is int64, 1-D, on the pool's device; every slot lies in a writable page of that pool
    (allocated or scratch) and none appears twice. A ``PagedCache`` stores and reads them without checking
    again; any other slots it is handed it checks. Only ``validate_batch`` builds them, and they are valid only
    until the allocator changes (the end of the forward).
    """

    tensor: torch.Tensor

    def __len__(self) -> int:
        return self.tensor.numel()

    def take(self, index: torch.Tensor) -> CheckedSlots:
        """The slots at the distinct positions ``index`` (a subset of checked slots stays checked)."""
        return CheckedSlots(self.tensor[index])


Slots = CheckedSlots | torch.Tensor | Sequence[int]  # anything but CheckedSlots is checked by the cache


@runtime_checkable
class PagedCache(Protocol):
    """The paged twin cache as the model uses it: one page id names both caches of ``layout.page_size`` tokens.

    ``store_*`` write only the addressed token rows of one layer; ``read_*`` do not modify the cache.
    ``CheckedSlots`` are trusted; any other slots are checked (range, writable page, distinct for stores)
    and bad ones raise ``DsakvError`` before anything is written.
    """

    layout: CacheLayout
    device: torch.device
    dcp: int  # ranks of the decode-context-parallel group holding the cache (1: one rank holds every token)

    def page_is_writable(self, page: int) -> bool:
        """True for allocated pages and scratch pages (the pages a slot may address)."""
        ...

    def store_main(self, layer: int, slots: Slots, latent: torch.Tensor, rope: torch.Tensor) -> None:
        """Quantize and write the main-KV row of each slot (``latent [n, kv_lora_rank]``, ``rope [n, rope]``)."""
        ...

    def store_indexer(self, layer: int, slots: Slots, key: torch.Tensor) -> None:
        """Quantize and write the indexer key of each slot (``key [n, index_head_dim]``; full layers only)."""
        ...

    def read_main(self, layer: int, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized (latent fp32 ``[n, kv_lora_rank]``, rope fp32 ``[n, rope]``) of each slot."""
        ...

    def read_indexer(self, layer: int, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw (fp8 key ``[n, index_head_dim]``, fp32 scale ``[n]``) of each slot (full layers only)."""
        ...

    def main_shards(self, layer: int) -> int:
        """Ranks ``layer``'s main KV is split over (token ``t`` of a page on rank ``t % shards``); 1 or ``dcp``."""
        ...

    def read_main_rank(self, layer: int, rank: int, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """``read_main`` of slots that all live on ``rank`` (one rank's partial attention reads these)."""
        ...


def _long_1d(name: str, value: Sequence[int] | torch.Tensor) -> torch.Tensor:
    t = (
        value
        if isinstance(value, torch.Tensor)
        else torch.as_tensor(list(value) if isinstance(value, range) else value)
    )
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise DsakvError(f"SeqInput.{name}: shape {list(t.shape)} dtype {t.dtype}: must be a 1-D integer sequence")
    return t.to(torch.int64)


@dataclass(frozen=True)
class SeqInput:
    """One sequence of a step: ``token_ids``/``positions``/``slots`` ``[n]`` of the new tokens and
    ``context_slots`` ``[L]`` for positions ``0..L-1`` (``positions == L-n..L-1``,
    ``context_slots[L-n:] == slots``). Lists, ranges and tensors are accepted; stored as int64 tensors."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    context_slots: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("token_ids", "positions", "slots", "context_slots"):
            object.__setattr__(self, name, _long_1d(name, getattr(self, name)))
        n, ctx = self.token_ids.numel(), self.context_slots.numel()
        if n == 0:
            raise DsakvError("SeqInput.token_ids: empty: a step computes at least one token per sequence")
        for name in ("positions", "slots"):
            if getattr(self, name).numel() != n:
                raise DsakvError(
                    f"SeqInput.{name}: length {getattr(self, name).numel()}: must equal len(token_ids) = {n}"
                )
        if ctx < n:
            raise DsakvError(f"SeqInput.context_slots: length {ctx}: must be >= len(token_ids) = {n}")
        if not torch.equal(self.positions, torch.arange(ctx - n, ctx)):
            raise DsakvError(
                f"SeqInput.positions: {self.positions[0].item()}..{self.positions[-1].item()}: must be the last "
                f"{n} positions of the context, {ctx - n}..{ctx - 1}"
            )
        if not torch.equal(self.context_slots[ctx - n :], self.slots):
            raise DsakvError("SeqInput.context_slots: its last len(token_ids) entries must equal slots")

    @property
    def context_len(self) -> int:
        return self.context_slots.numel()


@dataclass(frozen=True)
class Batch:
    """A validated batch: per-sequence inputs, their concatenation, each sequence's row range, and the checked
    slots the pool trusts (``slots``: the new tokens of every sequence; ``context[i]``: sequence i's context)."""

    seqs: tuple[SeqInput, ...]
    token_ids: torch.Tensor
    positions: torch.Tensor
    slots: CheckedSlots
    context: tuple[CheckedSlots, ...]
    rows: tuple[slice, ...]
    last_rows: torch.Tensor


def check_pool(spec: ModelSpec, pool: PagedCache) -> None:
    """The pool must hold this spec's cache shape, one indexer state per token, on the cpu."""
    lay = pool.layout
    for key in ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim", "indexer_types"):
        if getattr(lay.spec, key) != getattr(spec, key):
            raise DsakvError(
                f"pool layout spec {key} = {getattr(lay.spec, key)!r}: must equal the model's {getattr(spec, key)!r}"
            )
    if lay.num_attention_layers < spec.num_hidden_layers:
        raise DsakvError(f"pool attention layers = {lay.num_attention_layers}: must be >= {spec.num_hidden_layers}")
    if torch.device(pool.device).type != "cpu":
        raise DsakvError(f"pool device {pool.device}: the tiny model keeps its weights on cpu (must be cpu)")
    if lay.index_kpool != 1:
        raise DsakvError(
            f"pool index_kpool = {lay.index_kpool}: the model scores one indexer state per token (must be 1); "
            "no public code defines how N tokens' index states merge into one, so the compute path refuses it"
        )


def validate_batch(spec: ModelSpec, pool: PagedCache, seqs: Sequence[SeqInput]) -> Batch:
    """Check a batch against the spec and the pool; returns it concatenated, its slots as ``CheckedSlots`` on
    the pool's device. Does not touch the pool."""
    check_pool(spec, pool)
    if not isinstance(seqs, Sequence) or not seqs or not all(isinstance(s, SeqInput) for s in seqs):
        raise DsakvError(f"seqs: {type(seqs).__name__}: must be a non-empty list of SeqInput")
    vocab = spec.arch_value("vocab_size")
    page_size = pool.layout.page_size
    for i, s in enumerate(seqs):
        lo, hi = int(s.token_ids.min()), int(s.token_ids.max())
        if lo < 0 or hi >= vocab:
            raise DsakvError(f"seqs[{i}].token_ids: values {lo}..{hi}: must lie in 0..{vocab - 1}")
        if s.context_len > spec.max_position_embeddings:
            raise DsakvError(
                f"seqs[{i}] context length {s.context_len}: "
                f"must be <= max_position_embeddings = {spec.max_position_embeddings}"
            )
        if torch.unique(s.context_slots).numel() != s.context_len:
            raise DsakvError(f"seqs[{i}].context_slots: a slot appears twice; each position needs its own slot")
        if int(s.context_slots.min()) < 0:
            raise DsakvError(f"seqs[{i}].context_slots: negative slot {int(s.context_slots.min())}: slots are >= 0")
        for page in torch.unique(torch.div(s.context_slots, page_size, rounding_mode="floor")).tolist():
            if not pool.page_is_writable(page):
                raise DsakvError(
                    f"seqs[{i}]: slot in page {page}, which is not allocated: write only to allocated pages"
                )
    slots = torch.cat([s.slots for s in seqs])
    if torch.unique(slots).numel() != slots.numel():
        raise DsakvError("seqs: two new tokens of the batch share a slot; new slots must be distinct")
    bounds = torch.tensor([0] + [s.token_ids.numel() for s in seqs]).cumsum(0).tolist()
    rows = tuple(slice(a, b) for a, b in zip(bounds[:-1], bounds[1:]))
    device = pool.device
    return Batch(
        seqs=tuple(seqs),
        token_ids=torch.cat([s.token_ids for s in seqs]),
        positions=torch.cat([s.positions for s in seqs]),
        slots=CheckedSlots(slots.to(device)),
        context=tuple(CheckedSlots(s.context_slots.to(device)) for s in seqs),
        rows=rows,
        last_rows=torch.tensor(bounds[1:]) - 1,
    )
