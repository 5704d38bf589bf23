"""A request as the scheduler sees it: token ids, a page table, and its accounting. No tensors.

Positions and pages of one request (page size 64 shown as ``|``)::

    tokens     = prompt + outputs               (len(tokens) = prompt_len + len(outputs))
    computed   = [0, num_computed)               KV of both caches is in ``pages``
    pages      = [p0 | p1 | p2 ...]              covers at least num_computed tokens
    shared     = pages[:num_shared_pages]        owned by the radix tree (locked through ``node``)
    owned      = pages[num_shared_pages:]        held by this request alone; it frees them

A running request always has ``num_computed < len(tokens)``: the last token's KV is written by the next
step, which also yields the next token. A finished request drops its prompt and its key (a long trace must
not keep every prompt alive); ``outputs`` and ``stats`` remain.

With a prefix cache the request carries ``key``, the ``RadixKey`` of its tokens (of the cache's kind: token keys
or page digests, ``key_page_digest``), encoded once: the prompt
at its first match (not at arrival: a long waiting queue would hold every prompt twice), each output token
the first time a key reaches it. Every match and insert takes a slice of it (``radix_key``), so no token is
encoded twice. The key carries the request's namespace (``extra_key``, ``cache_salt``): every lookup and
insert of the request happens in it, so requests of different namespaces never share a page.

A prompt is a list, a 1-D integer array, or a compact sequence that ``np.asarray`` expands (the simulator's
``dsakv.workloads.traces.MooncakePrompt`` keeps a trace prompt as its hash ids): such a prompt is expanded
when its key is encoded (and when it is checked on arrival, unless it states ``token_id_bounds`` within the
token id range), and never kept expanded, so a waiting request costs what its compact form costs.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from dsakv.cache.events import NamespacePart
from dsakv.cache.key import MAX_TOKEN_ID, RadixKey
from dsakv.cache.tree import Node
from dsakv.errors import DsakvError


def check_max_new_tokens(max_new_tokens: object) -> None:
    """``max_new_tokens`` must be an integer >= 0 (0: the request finishes at once with no output)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise DsakvError(f"max_new_tokens = {max_new_tokens!r}: must be an integer >= 0")


def check_prompt(prompt: Sequence[int], max_token_id: int = MAX_TOKEN_ID) -> None:
    """Raise ``DsakvError`` unless ``prompt`` is a 1-D list or array of integer token ids in 0..max_token_id
    (``MAX_TOKEN_ID``, the prefix cache's key encoding, unless a model's vocabulary bounds it lower).

    Checked on arrival, so a bad prompt is refused before it is queued (it would otherwise fail inside a
    later ``step``, at the head of the queue, blocking every request behind it). Empty is allowed here: it
    is rejected with a reason like any request that can never run.
    """
    if isinstance(prompt, str | bytes) or not isinstance(prompt, Sequence | np.ndarray):
        raise DsakvError(f"prompt: got {type(prompt).__name__}: must be a list or 1-D array of integer token ids")
    bounds = getattr(prompt, "token_id_bounds", None)  # a compact prompt vouching for its ids: not expanded
    if bounds is not None and 0 <= bounds[0] and bounds[1] <= max_token_id:
        return
    ids = prompt if isinstance(prompt, np.ndarray) else np.asarray(prompt)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise DsakvError(
            f"prompt: shape {list(ids.shape)} dtype {ids.dtype}: must be a 1-D sequence of integer token ids"
        )
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi > max_token_id:
            raise DsakvError(f"prompt token ids {lo}..{hi}: must lie in 0..{max_token_id}")
        # numpy reads a bool among ints as 0 / 1: look for one (only a sequence of Python objects holding a 0 or
        # a 1 can hide one; a compact prompt that converts itself through ``__array__`` holds no Python ints)
        if (
            lo <= 1
            and ids is not prompt
            and not hasattr(prompt, "__array__")
            and any(t is True or t is False for t in prompt)
        ):
            raise DsakvError("prompt: contains a bool: token ids must be integers")


def check_request_id(what: str, request_id: object) -> None:
    """Raise ``DsakvError`` unless ``request_id`` can key the scheduler's maps (it is hashable)."""
    try:
        hash(request_id)
    except TypeError:
        raise DsakvError(f"{what}request_id = {request_id!r}: must be hashable (a str, an int, a tuple ...)") from None


def check_eos_token_id(eos_token_id: object, max_token_id: int = MAX_TOKEN_ID) -> None:
    """Raise ``DsakvError`` unless ``eos_token_id`` is None or a token id (an integer in 0..max_token_id)."""
    if eos_token_id is not None and (
        isinstance(eos_token_id, bool)
        or not isinstance(eos_token_id, Integral)
        or not 0 <= eos_token_id <= max_token_id
    ):
        raise DsakvError(f"eos_token_id = {eos_token_id!r}: must be None or a token id in 0..{max_token_id}")


class Status(enum.Enum):
    WAITING = "waiting"  # queued for admission (new, or preempted with recompute: holds nothing)
    RUNNING = "running"  # admitted; holds pages
    OFFLOADED = "offloaded"  # preempted with offload: its pages' bytes are on the host, it holds no page
    LOADING = "loading"  # admitted; its lower-tier hit is being copied into its pages (it computes nothing yet)
    FINISHED = "finished"
    REJECTED = "rejected"  # refused at admission with ``stats.reason``; never ran
    ABORTED = "aborted"


@dataclass(slots=True)
class RequestStats:
    """Per-request accounting; step indices count ``Scheduler.step`` calls (the first step is 0)."""

    prompt_tokens: int
    hit_tokens: int = 0  # prefix-cache hit at first admission (page-aligned), every tier together
    hit_tokens_host: int = 0  # the part of hit_tokens loaded back from the host tier
    hit_tokens_store: int = 0  # the part of hit_tokens loaded back from the store tier
    resume_hit_tokens: int = 0  # hits taken again when re-admitted after a recompute preemption
    computed_tokens: int = 0  # tokens whose KV this request wrote (drafts included, recomputes included)
    pages_written: int = 0  # pages allocated to this request for its own writes (restores not counted)
    restored_pages: int = 0  # pages restored from host after offload preemptions
    preemptions: int = 0
    offloaded_pages: int = 0  # pages copied to host over all its offload preemptions
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    outcome: str = "waiting"  # admitted / rejected / finished / aborted
    reason: str = ""
    arrival_step: int = 0
    admit_step: int | None = None
    first_token_step: int | None = None
    finish_step: int | None = None

    def to_dict(self) -> dict[str, int | str | None]:
        return {name: getattr(self, name) for name in self.__slots__}


class Request:
    """One generation request. Created by ``Scheduler.add_request``; callers read, the scheduler writes."""

    __slots__ = (
        "id",
        "prompt",
        "prompt_len",
        "max_new_tokens",
        "eos_token_id",
        "outputs",
        "status",
        "num_computed",
        "pages",
        "num_shared_pages",
        "node",
        "offloaded_tokens",
        "estimated_pages",
        "key",
        "key_page_digest",
        "extra_key",
        "cache_salt",
        "page_hashes",
        "load_hashes",
        "stats",
    )

    def __init__(
        self,
        request_id: Hashable,
        prompt: Sequence[int],
        max_new_tokens: int,
        eos_token_id: int | None,
        step: int,
        extra_key: NamespacePart = None,
        cache_salt: NamespacePart = None,
        key_page_digest: int = 0,
    ) -> None:
        self.id = request_id
        self.prompt = prompt
        self.extra_key = extra_key  # the prefix-cache namespace: (extra_key, cache_salt)
        self.cache_salt = cache_salt
        self.key: RadixKey | None = None  # RadixKey of tokens[:key.num_tokens], the prompt at least (radix_key)
        self.key_page_digest = key_page_digest  # the prefix cache's kind of key (RadixCache.page_digest)
        self.prompt_len = len(prompt)
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id
        self.outputs: list[int] = []
        self.status = Status.WAITING
        self.num_computed = 0
        self.pages: list[int] = []
        self.num_shared_pages = 0
        self.node: Node | None = None  # radix node locked for the shared pages (None: nothing locked)
        self.offloaded_tokens = 0  # while OFFLOADED: tokens whose KV waits on the host
        # pages it is expected to hold at its peak, estimated at (re)admission: a soft budget, not a
        # reservation (dsakv.scheduler.admission.estimate_pages)
        self.estimated_pages = 0
        self.page_hashes: list[bytes] = []  # chained hashes of its first pages, computed once (lower tiers)
        # while LOADING: the hashes its pending load-backs read, from host and from the store
        self.load_hashes: tuple[tuple[bytes, ...], tuple[bytes, ...]] = ((), ())
        self.stats = RequestStats(prompt_tokens=self.prompt_len, arrival_step=step)

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id!r}, status={self.status.value}, prompt={self.prompt_len}, "
            f"outputs={len(self.outputs)}, computed={self.num_computed}, pages={len(self.pages)})"
        )

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.outputs)

    @property
    def owned_pages(self) -> list[int]:
        return self.pages[self.num_shared_pages :]

    @property
    def is_done(self) -> bool:
        return self.status in (Status.FINISHED, Status.REJECTED, Status.ABORTED)

    def tokens(self, end: int | None = None, start: int = 0) -> Sequence[int]:
        """Token ids ``[start, end)`` of prompt + outputs: a numpy view or a list, like the prompt."""
        end = self.num_tokens if end is None else end
        plen = self.prompt_len
        if start == 0 and end == plen:
            return self.prompt
        if end <= plen:
            return self.prompt[start:end]
        if start >= plen:
            return self.outputs[start - plen : end - plen]
        head = self.prompt[start:]
        tail = self.outputs[: end - plen]
        if isinstance(head, np.ndarray):
            return np.concatenate([head, np.asarray(tail, dtype=head.dtype)])
        return list(head) + tail

    def radix_key(self, end: int) -> RadixKey:
        """The prefix cache's key of tokens ``[0, end)``, ``0 < end <= num_tokens``: a slice of ``key``, after
        encoding the prompt (first call) or the output tokens up to ``end`` it does not cover yet (each is
        encoded once; extended only to ``end``, the key needs no slice then)."""
        key = self.key
        if key is None:
            prompt = self.prompt  # a compact prompt (not a list or an array) is expanded here, once
            tokens = prompt if isinstance(prompt, list | tuple | np.ndarray) else np.asarray(prompt)
            key = self.key = RadixKey(tokens, self.extra_key, self.cache_salt, page_digest=self.key_page_digest)
        if end > key.num_tokens:
            plen = self.prompt_len
            key = self.key = key.extended(self.outputs[key.num_tokens - plen : end - plen])
        return key if end == key.num_tokens else key.prefix(end)

    def release_prompt(self) -> None:
        """Drop the prompt and its key once the request is done; ``prompt_len`` and ``outputs`` stay."""
        self.prompt = ()
        self.key = None
        self.page_hashes = []
