"""Cache events and the chained page hash they carry.

A router or another storage tier tracks the cache's content from three events: ``PagesStored``,
``PagesRemoved`` and ``AllCleared``. Each page is named by a chained hash that is identical in every
process, whatever ``PYTHONHASHSEED`` is (Python's ``hash()`` is never used):

    seed     = H(b"dsakv.page-chain.v1" || namespace)          namespace = extra_key, cache_salt (below)
    h[0]     = H(seed   || tokens of page 0)
    h[i]     = H(h[i-1] || tokens of page i)

* ``H`` is a named hash: ``xxh3_64`` (8-byte digest, the default), ``blake2b`` (32 bytes), ``sha256``.
* Tokens are encoded as unsigned 32-bit little-endian integers, ``page_size`` of them per page (the
  same bytes the radix tree keys on; in speculative mode only the page's own tokens are hashed).
* ``namespace`` encodes ``extra_key`` then ``cache_salt``, each as a type tag (``n`` none, ``s`` UTF-8
  string, ``b`` bytes, ``i`` signed 64-bit little-endian integer) followed by a 4-byte little-endian
  length and the value bytes. So a salt changes every hash of the chain, and no two namespaces share a
  seed unless their keys are equal.

The hash names pages for consumers outside the process; the tree itself keys on the token bytes, so a
colliding hash can never cause a wrong hit (tests pin this with a deliberately colliding hash).

Besides the hashes, a ``PagesStored`` carries what a consumer needs to index the pages without the tree:
the page ids, the tokens, the page size, the position of the run in its key, the namespace and the medium
(the fields of vLLM's ``BlockStored``, one to one; see ``PagesStored``). The cache calls its sink only once
its own state is consistent again; what happens when the sink raises is ``SinkFailure``'s.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from dsakv.errors import DsakvError, check_choice

HashFn = Callable[[bytes], bytes]
NamespacePart = str | bytes | int | None

CHAIN_DOMAIN = b"dsakv.page-chain.v1"

HASH_FUNCTIONS: dict[str, HashFn] = {
    "xxh3_64": xxhash.xxh3_64_digest,
    "blake2b": lambda data: hashlib.blake2b(data, digest_size=32).digest(),
    "sha256": lambda data: hashlib.sha256(data).digest(),
}


def get_hash(name: str) -> HashFn:
    """The hash function called ``name``; raises ``DsakvError`` listing the valid names."""
    check_choice("hash_name", name, HASH_FUNCTIONS)
    return HASH_FUNCTIONS[name]


def check_namespace_part(field: str, value: object) -> None:
    """Raise ``DsakvError`` unless ``value`` is None, a str, bytes or an int (the encodable kinds)."""
    if value is None or isinstance(value, (str, bytes)):
        return
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return
    raise DsakvError(f"{field} = {value!r}: must be None, a str, bytes or a 64-bit int")


def _encode_part(value: NamespacePart) -> bytes:
    if value is None:
        return b"n" + struct.pack("<I", 0)
    if isinstance(value, str):
        raw, tag = value.encode("utf-8"), b"s"
    elif isinstance(value, bytes):
        raw, tag = value, b"b"
    else:
        raw, tag = struct.pack("<q", value), b"i"
    return tag + struct.pack("<I", len(raw)) + raw


def encode_namespace(extra_key: NamespacePart, cache_salt: NamespacePart) -> bytes:
    """Fixed byte encoding of a namespace (see the module docstring)."""
    return _encode_part(extra_key) + _encode_part(cache_salt)


def chain_seed(hash_fn: HashFn, extra_key: NamespacePart = None, cache_salt: NamespacePart = None) -> bytes:
    """The parent hash of a namespace's first page."""
    return hash_fn(CHAIN_DOMAIN + encode_namespace(extra_key, cache_salt))


def chain_hashes(hash_fn: HashFn, parent: bytes, data: bytes, page_bytes: int, stride: int, npages: int) -> list[bytes]:
    """Hashes of ``npages`` pages whose tokens start every ``stride`` bytes of ``data``, chained from ``parent``."""
    out = []
    h = parent
    view = memoryview(data)  # a page is copied once, into the hashed bytes, not sliced out first
    for i in range(npages):
        start = i * stride
        h = hash_fn(h + view[start : start + page_bytes])
        out.append(h)
    return out


def token_bytes(tokens: list[int]) -> bytes:
    """The fixed encoding of token ids: unsigned 32-bit little-endian."""
    return struct.pack(f"<{len(tokens)}I", *tokens)


def token_ids(data: bytes) -> tuple[int, ...]:
    """The token ids of ``data`` in the fixed encoding (``token_bytes``'s inverse)."""
    return struct.unpack(f"<{len(data) // 4}I", data)


MEDIUM_GPU = "GPU"  # the device tier's medium, as vLLM names it


@dataclass(frozen=True, slots=True)
class PagesStored:
    """Pages entered the cache: one run of consecutive full pages of one key, in one namespace.

    * ``hashes[i]`` names ``pages[i]``; ``parent_hash`` is the hash the chain continues from: the previous
      page's, or the namespace seed when ``first_page == 0``.
    * ``first_page``: the position in its key of the run's first page (page ``first_page + i`` of the key is
      ``pages[i]``), so a consumer can tell a run that starts the key from one that extends a cached prefix.
    * ``token_data``: the run's tokens in the fixed encoding, ``page_size`` per page, in order (in speculative
      mode each page's own tokens, not the bigram overhang); ``token_ids`` decodes them on demand
      (``len == len(pages) * page_size``), so a consumer that needs only the hashes (the simulator's oracle
      router) never pays for a tuple of ints.
    * ``extra_key``, ``cache_salt``: the namespace every page of the run belongs to (the seed hashes them).
    * ``medium``: the tier that holds the pages (``MEDIUM_GPU`` for the device pool).

    vLLM's ``BlockStored`` maps field for field (docs/prefix_cache.md, "Events and page hashes"):
    ``block_hashes = hashes``, ``parent_block_hash = None if first_page == 0 else parent_hash``,
    ``token_ids``, ``block_size = page_size``, ``lora_id`` / ``lora_name`` from ``extra_key``, ``medium``,
    and ``extra_keys = [(extra_key, cache_salt)] * len(hashes)``.
    """

    hashes: tuple[bytes, ...]
    parent_hash: bytes
    pages: tuple[int, ...]
    page_size: int
    token_data: bytes
    first_page: int
    extra_key: NamespacePart
    cache_salt: NamespacePart
    medium: str = MEDIUM_GPU

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The run's token ids (``token_data`` decoded)."""
        return token_ids(self.token_data)


@dataclass(frozen=True, slots=True)
class PagesRemoved:
    """Pages left the cache (evicted); their page ids may be reused at once. vLLM's ``BlockRemoved``:
    ``block_hashes = hashes``, ``medium``."""

    hashes: tuple[bytes, ...]
    pages: tuple[int, ...]
    medium: str = MEDIUM_GPU


@dataclass(frozen=True, slots=True)
class AllCleared:
    """The whole cache was reset (vLLM's ``AllBlocksCleared``): every page of every namespace left it."""


CacheEvent = PagesStored | PagesRemoved | AllCleared


@dataclass(frozen=True, slots=True)
class SinkFailure:
    """An event the sink raised on. The cache calls the sink after the operation that caused the event is
    complete and consistent; an ``Exception`` from the sink is caught (the operation's result stands, and the
    caller, who may be a scheduler in the middle of a step, gets it), recorded here with the event so the
    consumer can re-deliver or resync, and reported as a ``RuntimeWarning``."""

    event: CacheEvent
    error: Exception
