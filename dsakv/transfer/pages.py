"""The one page-count function both sides use, the per-page digest, and the copy spans of a page run.

``page_count(length, page_size)``: a hand-off of ``length`` logical tokens covers ``ceil(length / page_size)``
pages, the last holding ``length - (pages - 1) * page_size`` valid tokens. The prefill side announces its
``PageCount``; the decode side computes its own from the same length and refuses any difference
(``check_same_count``) — SGLang's prefill and decode counted different lengths (prompt + sampled token vs
prompt) and "fixed" it by truncating to the shorter list, so the mismatch became silent. An empty hand-off
or an empty destination list is an error, never "nothing to send".

``page_digest``: xxh3_64 over (page index in the request, valid tokens, the page's packed bytes). It names
the page by its *position in the request*, never by a slot or page id (those differ between the sides), so
a page delivered to the wrong position, a stale page, or a page with one flipped bit fails.

``copy_spans``: per page, the byte ranges that carry each named component from the sender's block to the
receiver's, merged where both sides are contiguous (with equal layouts a run of pages becomes one write).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from dsakv.errors import DsakvError
from dsakv.transfer.manifest import TransferError

_POSITION = struct.Struct("<QI")  # page index in the request, valid tokens of the page


@dataclass(frozen=True)
class PageCount:
    """``pages`` pages cover ``length`` tokens; the last page holds ``last_valid`` of them (1..page_size)."""

    length: int
    page_size: int
    pages: int
    last_valid: int

    def valid_tokens(self, index: int) -> int:
        if not 0 <= index < self.pages:
            raise TransferError("page_count", f"page index {index}: the hand-off has pages 0..{self.pages - 1}")
        return self.last_valid if index == self.pages - 1 else self.page_size


def page_count(length: int, page_size: int) -> PageCount:
    """The page count of a hand-off of ``length`` tokens; ``length`` 0 is an error (nothing to hand over)."""
    for name, value in (("length", length), ("page_size", page_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DsakvError(f"{name} = {value!r}: must be a non-negative integer")
    if page_size < 1:
        raise DsakvError(f"page_size = {page_size}: must be a positive integer")
    if length == 0:
        raise TransferError("page_count", "length = 0: a hand-off covers at least one token (empty hand-off refused)")
    pages = -(-length // page_size)
    return PageCount(length, page_size, pages, length - (pages - 1) * page_size)


def check_same_count(mine: PageCount, announced: PageCount) -> None:
    """The peer's count equals ours, field by field; a one-page drift or a different last page is refused."""
    if mine != announced:
        raise TransferError(
            "page_count",
            f"page count: {mine.pages} pages ({mine.last_valid} valid in the last) of {mine.length} tokens here, "
            f"{announced.pages} pages ({announced.last_valid} valid) of {announced.length} tokens announced",
        )


def check_destination(count: PageCount, skip: int, dest: Sequence[int]) -> None:
    """``dest`` holds exactly one page id per page not skipped (and at least one unless all are skipped)."""
    need = count.pages - skip
    if not 0 <= skip <= count.pages:
        raise TransferError("page_count", f"skip = {skip}: must lie in 0..{count.pages}")
    if len(dest) != need:
        raise TransferError(
            "page_count", f"destination: {len(dest)} page ids for {need} pages to receive (empty or short is refused)"
        )


def page_digest(index: int, valid: int, parts: Sequence[bytes | memoryview]) -> int:
    """xxh3_64 of the page's position in the request, its valid tokens and its bytes: ``parts`` are the
    components' bytes in the manifest's order (one packed block, or one buffer per component)."""
    h = xxhash.xxh3_64(_POSITION.pack(index, valid))
    for part in parts:
        h.update(part)
    return h.intdigest()


def copy_spans(
    src_regions: dict[str, tuple[int, int]],
    dst_regions: dict[str, tuple[int, int]],
    lengths: dict[str, int],
    src_pages: Sequence[int],
    dst_pages: Sequence[int],
) -> list[tuple[int, int, int]]:
    """(source address, destination address, length) that carry every named component of ``src_pages[i]``
    to ``dst_pages[i]``; each side gives per component name its (address of page 0, bytes between pages).

    Ranges are sorted by source address and merged where both sides are contiguous: with the same layout
    on both sides a run of consecutive pages becomes one write (packed pools) or one write per component."""
    if set(src_regions) != set(dst_regions) or set(lengths) != set(src_regions):
        raise TransferError("components", "copy spans: the two sides name different components")
    if len(src_pages) != len(dst_pages):
        raise TransferError("page_count", f"copy spans: {len(src_pages)} source pages, {len(dst_pages)} destinations")
    raw = []
    for name, n in lengths.items():
        (sb, ss), (db, ds) = src_regions[name], dst_regions[name]
        raw += [(sb + sp * ss, db + dp * ds, n) for sp, dp in zip(src_pages, dst_pages)]
    raw.sort()
    spans: list[tuple[int, int, int]] = []
    for s, d, n in raw:
        if spans and spans[-1][0] + spans[-1][2] == s and spans[-1][1] + spans[-1][2] == d:
            spans[-1] = (spans[-1][0], spans[-1][1], spans[-1][2] + n)
        else:
            spans.append((s, d, n))
    return spans


__all__ = ["PageCount", "check_destination", "check_same_count", "copy_spans", "page_count", "page_digest"]
