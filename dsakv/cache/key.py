"""``RadixKey``: a prompt's token ids in the fixed byte encoding, the bytes the radix tree keys on, and
its namespace.

Token ids are stored once as unsigned 32-bit little-endian bytes (ids must lie in ``0 .. 2**32 - 1``),
``token_data``. The tree compares ``data``, a run of fixed-size page keys, so matching a node costs one
dictionary lookup and one ``memcmp`` however many pages it holds, and the key is built once per request
(``match`` and ``insert`` both accept a ``RadixKey`` in place of token ids). ``data`` is one of two kinds:

* token keys (``page_digest == 0``, the default): ``data`` is ``token_data`` itself, a page's key its
  ``4 * page_size`` token bytes: exact;
* page digests (``page_digest == page_size``): ``data`` holds, for each full page, the 16-byte xxh3_128
  digest of the page's token bytes (``PAGE_DIGEST_BYTES``; 16 B instead of 256 for a 64-token page), so a
  tree that keys on digests holds 16 bytes a cached page. The path from the root gives a page's position,
  so a digest needs no chaining. Two different pages share a digest with probability ``2**-128``: over the
  ``10**12`` pairs of pages that even a large cluster's trees compare in a day the chance of any collision is
  below ``10**-26``, far below the hardware's own error rates; still, the engine keeps exact token keys by
  default and the simulator takes digests for their memory (``dsakv.sim.config.SimConfig.page_keys``).
  A partial last page has no digest yet: ``extended`` digests each page once its last token arrives.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

import numpy as np
import xxhash

from dsakv.cache.events import NamespacePart, check_namespace_part
from dsakv.errors import DsakvError

TOKEN_BYTES = 4  # bytes per token id in the key encoding (uint32 little-endian)
MAX_TOKEN_ID = 2**32 - 1
PAGE_DIGEST_BYTES = 16  # xxh3_128 of a page's token bytes: the key of one page in a digest-keyed tree

_ARRAY_CODE = next(c for c in "IL" if array(c).itemsize == TOKEN_BYTES)
_SWAP = sys.byteorder != "little"

Tokens = Sequence[int] | np.ndarray


def _encode(tokens: Tokens) -> bytes:
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise DsakvError(
                f"tokens: array of dtype {tokens.dtype} and shape {tokens.shape}: must be a 1-D integer array"
            )
        in_range = tokens.dtype == np.uint32  # its type bounds a uint32 array's ids: no pass over them
        if not in_range and tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > MAX_TOKEN_ID):
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


def page_digests(token_data: bytes, first_page: int, end_page: int, page_size: int) -> bytes:
    """The digests (``PAGE_DIGEST_BYTES`` each) of pages ``first_page .. end_page - 1`` of ``token_data``."""
    page_bytes = page_size * TOKEN_BYTES
    pages = np.frombuffer(token_data, np.dtype((np.void, page_bytes)), end_page - first_page, first_page * page_bytes)
    # One bytes object a page, made in one C loop (a void item keeps its trailing zero bytes): a third less
    # per page than hashing a view of each row.
    return b"".join(map(xxhash.xxh3_128_digest, pages.tolist()))


class RadixKey:
    """Immutable token ids (as bytes) and namespace of one prompt; build once, pass to match and insert.

    ``extra_key`` and ``cache_salt`` (None, str, bytes or int) select the namespace: keys in different
    namespaces never share a page. ``page_digest``: 0 for token keys, or the page size whose full pages
    ``data`` holds as digests (see the module docstring); a cache takes only keys of its own kind
    (``RadixCache.key`` builds one).
    """

    __slots__ = ("data", "_token_data", "num_tokens", "page_digest", "extra_key", "cache_salt", "namespace")

    def __init__(
        self,
        tokens: Tokens,
        extra_key: NamespacePart = None,
        cache_salt: NamespacePart = None,
        *,
        page_digest: int = 0,
    ) -> None:
        if type(tokens) is not list and (
            isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence | np.ndarray)
        ):
            raise DsakvError(f"tokens: got {type(tokens).__name__}: must be a list or 1-D array of integer token ids")
        if len(tokens) == 0:
            raise DsakvError("tokens: empty key: a key needs at least one token id")
        if isinstance(page_digest, bool) or not isinstance(page_digest, int) or page_digest < 0:
            raise DsakvError(f"page_digest = {page_digest!r}: must be 0 (token keys) or a page size > 0 (digests)")
        check_namespace_part("extra_key", extra_key)
        check_namespace_part("cache_salt", cache_salt)
        token_data = self._token_data = _encode(tokens)
        self.num_tokens = len(token_data) // TOKEN_BYTES
        self.page_digest = page_digest
        self.data = (
            page_digests(token_data, 0, self.num_tokens // page_digest, page_digest) if page_digest else token_data
        )
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.namespace = (extra_key, cache_salt)

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def token_data(self) -> bytes:
        """The token ids' bytes. A digest key's ``extended`` keeps its two parts and joins them here, on the
        first read: its pages' digests need only the bytes from the last partial page on, and a key extended
        at a request's finish is inserted and dropped without its bytes ever being read (a 48 kB copy less)."""
        data = self._token_data
        if type(data) is tuple:
            data = self._token_data = data[0] + data[1]
        return data

    def prefix(self, num_tokens: int) -> RadixKey:
        """The key of the first ``num_tokens`` tokens, same namespace and kind: slices, nothing re-encoded."""
        if not 0 < num_tokens <= self.num_tokens:
            raise DsakvError(f"num_tokens = {num_tokens!r}: must lie in 1..{self.num_tokens}, the key's length")
        token_data = self.token_data[: num_tokens * TOKEN_BYTES]
        ps = self.page_digest
        return self._with_data(token_data, self.data[: num_tokens // ps * PAGE_DIGEST_BYTES] if ps else token_data)

    def extended(self, tokens: Tokens) -> RadixKey:
        """This key followed by ``tokens``, same namespace and kind: only ``tokens`` are encoded (and
        range-checked), and only the pages they complete are digested."""
        head, tail, ps = self.token_data, _encode(tokens), self.page_digest
        if not ps:
            token_data = head + tail
            return self._with_data(token_data, token_data)
        first, end = self.num_tokens // ps, (len(head) + len(tail)) // (ps * TOKEN_BYTES)
        window = head[first * ps * TOKEN_BYTES :] + tail  # from the first page without a digest on
        return self._with_data((head, tail), self.data + page_digests(window, 0, end - first, ps))

    def _with_data(self, token_data: bytes | tuple[bytes, bytes], data: bytes) -> RadixKey:
        """A key of this namespace and kind; ``token_data`` may be (head, tail), joined when first read."""
        key = object.__new__(RadixKey)
        size = len(token_data) if type(token_data) is bytes else len(token_data[0]) + len(token_data[1])
        key._token_data, key.data, key.num_tokens = token_data, data, size // TOKEN_BYTES
        key.page_digest = self.page_digest
        key.extra_key, key.cache_salt, key.namespace = self.extra_key, self.cache_salt, self.namespace
        return key

    def tokens(self) -> list[int]:
        """The token ids as a list (decoded; for tests and debugging)."""
        return np.frombuffer(self.token_data, dtype="<u4").tolist()

    def __repr__(self) -> str:
        kind = f", page digests of {self.page_digest} tokens" if self.page_digest else ""
        return f"RadixKey({self.num_tokens} tokens, extra_key={self.extra_key!r}, cache_salt={self.cache_salt!r}{kind})"


def as_key(
    tokens: Tokens | RadixKey, extra_key: NamespacePart, cache_salt: NamespacePart, page_digest: int = 0
) -> RadixKey:
    """``tokens`` as a ``RadixKey`` of kind ``page_digest``; a key passed in keeps its namespace (then
    extra_key/cache_salt must be None) and must be of that kind."""
    if type(tokens) is RadixKey:
        if tokens.page_digest != page_digest:
            raise DsakvError(
                f"key: {tokens!r} is keyed by {_kind(tokens.page_digest)}; this cache keys by "
                f"{_kind(page_digest)}: build keys with the cache's key()"
            )
        if extra_key is not None or cache_salt is not None:
            if (extra_key, cache_salt) != tokens.namespace:
                raise DsakvError(
                    f"extra_key/cache_salt = {(extra_key, cache_salt)!r}: a RadixKey already carries "
                    f"namespace {tokens.namespace!r}; pass None or the same values"
                )
        return tokens
    return RadixKey(tokens, extra_key, cache_salt, page_digest=page_digest)


def _kind(page_digest: int) -> str:
    return f"digests of {page_digest}-token pages" if page_digest else "token ids"
