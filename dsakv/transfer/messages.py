"""The hand-off's messages, as frozen records with one JSON encoding (the ZMQ control channel and the store's
meta key carry the same bytes). Namespace parts keep their kind (str / bytes / int / None) on the wire, so a
salt never turns from bytes into a string on the way (SGLang #23300 lost the salt between the sides)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsakv.cache.events import NamespacePart, check_namespace_part
from dsakv.transfer.manifest import TransferError
from dsakv.transfer.pages import PageCount, page_count
from dsakv.transfer.state import POLICIES


def encode_part(value: NamespacePart) -> list:
    if value is None:
        return ["none", ""]
    if isinstance(value, bytes):
        return ["bytes", value.hex()]
    if isinstance(value, str):
        return ["str", value]
    return ["int", str(value)]


def decode_part(field: str, data: object) -> NamespacePart:
    try:
        kind, text = data
        value = {"none": lambda t: None, "bytes": bytes.fromhex, "str": str, "int": int}[kind](text)
    except (TypeError, ValueError, KeyError):
        raise TransferError("namespace", f"{field}: {data!r} is not an encoded namespace part") from None
    check_namespace_part(field, value)
    return value


@dataclass(frozen=True)
class Offer:
    """The prefill side's announcement of one request's hand-off: its tokens and namespace, the logical
    length its pages cover and its own page count of that length, and the failure policy."""

    handoff_id: str
    tokens: tuple[int, ...]
    extra_key: NamespacePart
    cache_salt: NamespacePart
    count: PageCount
    policy: str = "recompute"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise TransferError("state", f"policy = {self.policy!r}: must be one of {', '.join(POLICIES)}")
        if len(self.tokens) < self.count.length:
            raise TransferError(
                "page_count", f"offer {self.handoff_id}: {len(self.tokens)} tokens for a length of {self.count.length}"
            )

    def to_json(self) -> dict[str, Any]:
        c = self.count
        return {
            "handoff_id": self.handoff_id,
            "tokens": list(self.tokens),
            "extra_key": encode_part(self.extra_key),
            "cache_salt": encode_part(self.cache_salt),
            "count": [c.length, c.page_size, c.pages, c.last_valid],
            "policy": self.policy,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Offer:
        try:
            length, ps, pages, last = (int(x) for x in data["count"])
            count = PageCount(length, ps, pages, last)
            return cls(
                str(data["handoff_id"]),
                tuple(int(t) for t in data["tokens"]),
                decode_part("extra_key", data["extra_key"]),
                decode_part("cache_salt", data["cache_salt"]),
                count,
                str(data["policy"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, TransferError):
                raise
            raise TransferError("state", f"offer: malformed ({exc})") from None

    def own_count(self) -> PageCount:
        """The page count this side computes from the announced length (the one function)."""
        return page_count(self.count.length, self.count.page_size)


@dataclass(frozen=True)
class PageReport:
    """The sender wrote page ``index`` of the hand-off: these components, with this digest."""

    index: int
    components: tuple[str, ...]
    digest: int

    def to_json(self) -> list:
        return [self.index, list(self.components), f"{self.digest:016x}"]

    @classmethod
    def from_json(cls, data: Sequence) -> PageReport:
        try:
            index, names, digest = data
            return cls(int(index), tuple(str(n) for n in names), int(digest, 16))
        except (TypeError, ValueError) as exc:
            raise TransferError("state", f"page report {data!r}: malformed ({exc})") from None


def dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def loads(data: bytes) -> dict[str, Any]:
    try:
        out = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TransferError("state", f"control message: not JSON ({exc})") from None
    if not isinstance(out, dict) or "op" not in out:
        raise TransferError("state", "control message: must be a JSON object with an 'op'")
    return out


__all__ = ["Offer", "PageReport", "decode_part", "dumps", "encode_part", "loads"]
