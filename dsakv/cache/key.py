"""``RadixKey``: a prompt's token ids in the fixed byte encoding the radix tree keys on, plus its namespace.

Token ids are stored once as unsigned 32-bit little-endian bytes (ids must lie in ``0 .. 2**32 - 1``).
The tree compares these bytes directly: a page is ``4 * page_size`` bytes, a run of pages one slice, so
matching a node costs one dictionary lookup and one ``memcmp`` however many pages it holds, and the key
is built once per request (``match`` and ``insert`` both accept a ``RadixKey`` in place of token ids).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import numpy as np

from dsakv.cache.events import NamespacePart, check_namespace_part
from dsakv.errors import DsakvError

TOKEN_BYTES = 4  # bytes per token id in the key encoding (uint32 little-endian)
MAX_TOKEN_ID = 2**32 - 1

_ARRAY_CODE = next(c for c in "IL" if array(c).itemsize == TOKEN_BYTES)
_SWAP = sys.byteorder != "little"

Tokens = Sequence[int] | np.ndarray


def _encode(tokens: Tokens) -> bytes:
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise DsakvError(
                f"tokens: array of dtype {tokens.dtype} and shape {tokens.shape}: must be a 1-D integer array"
            )
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > MAX_TOKEN_ID):
            raise DsakvError(f"tokens: ids must lie in 0..{MAX_TOKEN_ID}; got {int(tokens.min())}..{int(tokens.max())}")
        return np.ascontiguousarray(tokens, dtype="<u4").tobytes()
    try:
        arr = array(_ARRAY_CODE, tokens)
    except (OverflowError, TypeError) as exc:
        bad = next(
            (t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_TOKEN_ID), None
        )
        raise DsakvError(f"tokens: contains {bad!r}: token ids must be integers in 0..{MAX_TOKEN_ID} ({exc})") from None
    if _SWAP:
        arr.byteswap()
    return arr.tobytes()


class RadixKey:
    """Immutable token ids (as bytes) and namespace of one prompt; build once, pass to match and insert.

    ``extra_key`` and ``cache_salt`` (None, str, bytes or int) select the namespace: keys in different
    namespaces never share a page.
    """

    __slots__ = ("data", "num_tokens", "extra_key", "cache_salt", "namespace")

    def __init__(self, tokens: Tokens, extra_key: NamespacePart = None, cache_salt: NamespacePart = None) -> None:
        if type(tokens) is not list and (
            isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence | np.ndarray)
        ):
            raise DsakvError(f"tokens: got {type(tokens).__name__}: must be a list or 1-D array of integer token ids")
        if len(tokens) == 0:
            raise DsakvError("tokens: empty key: a key needs at least one token id")
        check_namespace_part("extra_key", extra_key)
        check_namespace_part("cache_salt", cache_salt)
        self.data = _encode(tokens)
        self.num_tokens = len(self.data) // TOKEN_BYTES
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.namespace = (extra_key, cache_salt)

    def __len__(self) -> int:
        return self.num_tokens

    def prefix(self, num_tokens: int) -> RadixKey:
        """The key of the first ``num_tokens`` tokens, same namespace: a slice of ``data``, nothing re-encoded."""
        if not 0 < num_tokens <= self.num_tokens:
            raise DsakvError(f"num_tokens = {num_tokens!r}: must lie in 1..{self.num_tokens}, the key's length")
        return self._with_data(self.data[: num_tokens * TOKEN_BYTES])

    def extended(self, tokens: Tokens) -> RadixKey:
        """This key followed by ``tokens``, same namespace: only ``tokens`` are encoded (and range-checked)."""
        return self._with_data(self.data + _encode(tokens))

    def _with_data(self, data: bytes) -> RadixKey:
        key = object.__new__(RadixKey)
        key.data, key.num_tokens = data, len(data) // TOKEN_BYTES
        key.extra_key, key.cache_salt, key.namespace = self.extra_key, self.cache_salt, self.namespace
        return key

    def tokens(self) -> list[int]:
        """The token ids as a list (decoded; for tests and debugging)."""
        return np.frombuffer(self.data, dtype="<u4").tolist()

    def __repr__(self) -> str:
        return f"RadixKey({self.num_tokens} tokens, extra_key={self.extra_key!r}, cache_salt={self.cache_salt!r})"


def as_key(tokens: Tokens | RadixKey, extra_key: NamespacePart, cache_salt: NamespacePart) -> RadixKey:
    """``tokens`` as a ``RadixKey``; a key passed in keeps its namespace (then extra_key/cache_salt must be None)."""
    if type(tokens) is RadixKey:
        if extra_key is not None or cache_salt is not None:
            if (extra_key, cache_salt) != tokens.namespace:
                raise DsakvError(
                    f"extra_key/cache_salt = {(extra_key, cache_salt)!r}: a RadixKey already carries "
                    f"namespace {tokens.namespace!r}; pass None or the same values"
                )
        return tokens
    return RadixKey(tokens, extra_key, cache_salt)
