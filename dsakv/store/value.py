"""The stored value of one page: a fixed header, then both caches' bytes in the layout's ``packed`` order.

::

    offset  size  field
         0     8  magic            b"DSAKVPG\\0"
         8     2  format version   uint16 LE (FORMAT_VERSION)
        10     2  header bytes     uint16 LE (HEADER.size: a reader of another version can skip it)
        12    16  fingerprint      blake2b-128 of the layout's canonical JSON (spec, dtypes, page size, scales)
        28     4  page size        uint32 LE, tokens per page
        32     8  payload bytes    uint64 LE, == layout.page_bytes (main KV of every layer + indexer K)
        40    16  checksum         xxh3_128 of the 40 header bytes before it and the payload
        56     …  payload          every attention layer's main page, then every full layer's indexer page

The payload length is checked against the layout, not just against the header: a value that carries the
main KV without the indexer pages (SGLang #30057's half-restored page) has the wrong size even when its
header and checksum agree with its own bytes, and is never loaded. A value that fails any check is a miss
with a named reason (``MISS_REASONS``), so the caller recomputes the page; nothing is raised.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout

MAGIC = b"DSAKVPG\0"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sHH16sIQ16s")
FINGERPRINT_BYTES = 16
_CHECKED_PREFIX = HEADER.size - 16  # the header bytes the checksum covers (all but the checksum itself)

# Why a value is not loaded, in the order decode checks them.
MISS_REASONS = ("truncated", "magic", "version", "fingerprint", "page_size", "size", "checksum")


def layout_fingerprint(layout: CacheLayout, fp8_scales: Sequence[float] | None = None) -> bytes:
    """16 bytes naming what a page's bytes mean: the model spec, the layout and the pool's fp8 scales.

    Two engines share values only when they agree on all of it (the same bytes read through another spec,
    dtype or scale are other values). Built from the canonical JSON (sorted keys) of ``spec.to_dict()``,
    ``layout.to_dict()`` and the scales, so it is identical in every process.
    """
    canonical = {
        "spec": layout.spec.to_dict(),
        "layout": layout.to_dict(),
        "indexer_dtype": layout.indexer_dtype,
        "indexer_layers": list(layout.indexer_layers),
        "fp8_scales": None if fp8_scales is None else [float(s).hex() for s in fp8_scales],
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=FINGERPRINT_BYTES).digest()


@dataclass(frozen=True)
class PageValueFormat:
    """Encoder and checker of page values for one layout (``fingerprint`` from ``layout_fingerprint``)."""

    fingerprint: bytes
    page_size: int
    page_bytes: int

    @classmethod
    def for_layout(cls, layout: CacheLayout, fp8_scales: Sequence[float] | None = None) -> PageValueFormat:
        return cls(layout_fingerprint(layout, fp8_scales), layout.page_size, layout.page_bytes)

    @property
    def value_bytes(self) -> int:
        """Bytes of one stored value: header + both caches of one page."""
        return HEADER.size + self.page_bytes

    def encode(self, payload: bytes | bytearray | memoryview) -> bytes:
        """Header + ``payload`` (both caches of one page, ``page_bytes`` long, packed order)."""
        payload = memoryview(payload).cast("B")
        if payload.nbytes != self.page_bytes:
            raise DsakvError(
                f"payload: {payload.nbytes} bytes; a page value holds both caches of one page ({self.page_bytes} B)"
            )
        head = HEADER.pack(MAGIC, FORMAT_VERSION, HEADER.size, self.fingerprint, self.page_size, self.page_bytes, b"")
        checked = head[:_CHECKED_PREFIX]
        digest = xxhash.xxh3_128(checked)
        digest.update(payload)
        return checked + digest.digest() + payload.tobytes()

    def decode(self, value: bytes) -> DecodedPage:
        """The payload of ``value``, or the reason it is a miss. Never raises on any bytes."""
        if len(value) < HEADER.size:
            return DecodedPage(None, "truncated")
        magic, version, header_bytes, fingerprint, page_size, length, checksum = HEADER.unpack_from(value)
        if magic != MAGIC:
            return DecodedPage(None, "magic")
        if version != FORMAT_VERSION or header_bytes != HEADER.size:
            return DecodedPage(None, "version")
        if fingerprint != self.fingerprint:
            return DecodedPage(None, "fingerprint")
        if page_size != self.page_size:
            return DecodedPage(None, "page_size")
        if length != self.page_bytes or len(value) != HEADER.size + self.page_bytes:
            return DecodedPage(None, "size")
        view = memoryview(value)
        digest = xxhash.xxh3_128(view[:_CHECKED_PREFIX])
        digest.update(view[HEADER.size :])
        if digest.digest() != checksum:
            return DecodedPage(None, "checksum")
        return DecodedPage(view[HEADER.size :], None)


@dataclass(frozen=True)
class DecodedPage:
    """``payload`` (both caches of the page, a view into the value) when every check passed, else ``None``
    and ``miss_reason`` (one of ``MISS_REASONS``)."""

    payload: memoryview | None
    miss_reason: str | None

    @property
    def ok(self) -> bool:
        return self.payload is not None


__all__ = ["FORMAT_VERSION", "HEADER", "MAGIC", "MISS_REASONS", "DecodedPage", "PageValueFormat", "layout_fingerprint"]
