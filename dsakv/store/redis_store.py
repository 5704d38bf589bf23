"""``RedisPageStore``: pages of both caches on a Redis / Valkey server, keyed by their chained hash.

Keys are ``key_prefix + hex(chained page hash)``. The hash is the one of ``dsakv.cache.events``, whose seed
encodes the namespace ``(extra_key, cache_salt)``: two tenants' identical prompts give different keys, so
they never share a value (LMCache's keys once ignored the salt: SGLang #37160). Each value is one
``PageValueFormat`` page (header + both caches), so main KV and indexer K are stored, found, evicted and
loaded as one unit: there is no key that holds one cache without the other.

Faults never reach the caller. A call that fails (server down, restarted, or slower than the command
timeout) returns what a miss returns, counts the failure, logs one warning for the whole outage, and the
store then answers every call as a miss without touching the network until a backoff (doubling per failed
attempt, ``StoreConfig.retry_initial_s`` .. ``retry_max_s``) has passed; the first call that succeeds ends
the outage. The server may also drop any page at any time (``maxmemory`` + ``allkeys-lru``), so a prefix
hit ends at the first page that is absent, and at the first value that fails its checks (counted per reason,
and deleted: the layout fingerprint is part of the key, so such a value is damage, and deleting it lets a
good copy be written again).

Not thread-safe: one engine step at a time, like the pool.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsakv.errors import DsakvError
from dsakv.store.config import StoreConfig
from dsakv.store.value import PageValueFormat

log = logging.getLogger("dsakv.store")

PagePut = tuple[bytes, bytes | bytearray | memoryview]  # (chained page hash, both caches' bytes)
KEY_FINGERPRINT_BYTES = 8


@dataclass
class StoreCounters:
    """What the store did, cumulatively. ``invalid`` counts values that were present but not loaded, by
    reason (``MISS_REASONS``); ``failed_calls`` the calls that met a server fault; ``skipped_calls`` the
    calls answered as misses during an outage's backoff; ``outages`` the separate outages seen."""

    pages_read: int = 0
    bytes_read: int = 0
    pages_written: int = 0
    bytes_written: int = 0
    pages_absent: int = 0
    invalid: Counter = field(default_factory=Counter)
    failed_calls: int = 0
    skipped_calls: int = 0
    outages: int = 0

    @property
    def invalid_total(self) -> int:
        return sum(self.invalid.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "pages_read": self.pages_read,
            "bytes_read": self.bytes_read,
            "pages_written": self.pages_written,
            "bytes_written": self.bytes_written,
            "pages_absent": self.pages_absent,
            "invalid": dict(self.invalid),
            "failed_calls": self.failed_calls,
            "skipped_calls": self.skipped_calls,
            "outages": self.outages,
        }


@dataclass(frozen=True)
class ServerMemory:
    """``used_bytes``: the server's ``used_memory``; ``max_bytes``: its ``maxmemory`` (0 when unlimited)."""

    used_bytes: int
    max_bytes: int

    def pages_that_fit(self, value_bytes: int) -> int | None:
        """Values of ``value_bytes`` the limit holds (an upper bound: keys and allocator overhead come on top);
        None without a limit."""
        return self.max_bytes // value_bytes if self.max_bytes else None


class RedisPageStore:
    """Batched, pipelined get / put of page values; every call bounded in time and never raising on a fault.

    The constructor does not connect (no side effects); the first call does. ``clock`` is the monotonic
    clock the backoff reads (a parameter so a caller can drive it).
    """

    def __init__(
        self, config: StoreConfig, value_format: PageValueFormat, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.format = value_format
        self.counters = StoreCounters()
        self._clock = clock
        self._client = None
        # the layout fingerprint is part of every key: engines of different models or dtypes sharing a server
        # never name the same key, so a value that fails its checks is damage, and is deleted
        self._prefix = (
            config.key_prefix.encode() + value_format.fingerprint[:KEY_FINGERPRINT_BYTES].hex().encode() + b":"
        )
        self._down = False
        self._backoff = config.retry_initial_s
        self._next_try = 0.0
        self._config_refused = False
        self._refusal_logged = False

    # ----- keys ----------------------------------------------------------------------------------
    def key(self, page_hash: bytes) -> bytes:
        """The server key of a page: ``key_prefix``, 8 bytes of the layout fingerprint and the chained hash,
        in hex (``dsakv:page:<fingerprint>:<hash>``)."""
        return self._prefix + page_hash.hex().encode()

    # ----- the three operations ------------------------------------------------------------------
    def lookup_prefix(self, hashes: Sequence[bytes]) -> int:
        """How many leading pages of ``hashes`` the server holds (a missing page ends the run).

        Existence only: a value can still fail its checks when fetched (``fetch_prefix`` verifies).
        Does not modify the server (EXISTS does not even refresh the LRU clock).
        """
        found = 0
        for start in range(0, len(hashes), self.config.batch_pages):
            batch = hashes[start : start + self.config.batch_pages]
            replies = self._pipelined(lambda pipe, b=batch: [pipe.exists(self.key(h)) for h in b])
            if replies is None:
                return found
            for present in replies:
                if not present:
                    self.counters.pages_absent += 1
                    return found
                found += 1
        return found

    def present(self, hashes: Sequence[bytes]) -> list[bool] | None:
        """Whether the server holds each page (EXISTS, pipelined), or None on a fault. Does not modify it."""
        out: list[bool] = []
        for start in range(0, len(hashes), self.config.batch_pages):
            batch = hashes[start : start + self.config.batch_pages]
            replies = self._pipelined(lambda pipe, b=batch: [pipe.exists(self.key(h)) for h in b])
            if replies is None:
                return None
            out += [bool(r) for r in replies]
        return out

    def fetch_prefix(self, hashes: Sequence[bytes]) -> list[memoryview]:
        """Both caches' bytes of the leading pages of ``hashes`` whose values pass every check.

        Stops at the first page that is absent or invalid (counted by reason) or at a fault; the pages
        after it are not loaded even if present, because a prefix hit cannot skip a page.
        """
        out: list[memoryview] = []
        for start in range(0, len(hashes), self.config.batch_pages):
            batch = hashes[start : start + self.config.batch_pages]
            replies = self._pipelined(lambda pipe, b=batch: [pipe.get(self.key(h)) for h in b])
            if replies is None:
                return out
            for value in replies:
                if value is None:
                    self.counters.pages_absent += 1
                    return out
                page = self.format.decode(value)
                if not page.ok:
                    self.counters.invalid[page.miss_reason] += 1
                    log.warning(
                        "store %s: a stored page failed its %s check; deleted, recomputed", self, page.miss_reason
                    )
                    bad = self.key(hashes[len(out)])
                    self._pipelined(lambda pipe, k=bad: [pipe.delete(k)])  # so that a good copy can be written again
                    return out
                out.append(page.payload)
                self.counters.pages_read += 1
                self.counters.bytes_read += len(value)
        return out

    def put_pages(self, pages: Sequence[PagePut]) -> int:
        """Store each ``(hash, payload)``; returns how many were written (0 .. len, fewer on a fault).

        Payloads are encoded (header, checksum) and checked for size first: a payload that is not both
        caches of one page raises ``DsakvError`` and nothing is written. Writing a page that exists
        rewrites the same bytes (values are a function of the key within one fingerprint).
        """
        for i, (_, payload) in enumerate(pages):
            if memoryview(payload).nbytes != self.format.page_bytes:
                raise DsakvError(
                    f"pages[{i}]: {memoryview(payload).nbytes} bytes; a page value holds both caches of one page "
                    f"({self.format.page_bytes} B)"
                )
        written = 0
        for start in range(0, len(pages), self.config.batch_pages):  # encoded per batch: memory stays bounded
            batch = [(self.key(h), self.format.encode(p)) for h, p in pages[start : start + self.config.batch_pages]]
            if self._pipelined(lambda pipe, b=batch: [pipe.set(k, v) for k, v in b]) is None:
                break
            written += len(batch)
            self.counters.pages_written += len(batch)
            self.counters.bytes_written += sum(len(v) for _, v in batch)
        return written

    def server_memory(self) -> ServerMemory | None:
        """The server's memory figures (``INFO memory``): what it uses and its ``maxmemory`` (0: no limit),
        for a caller that sizes the store tier from the server (the simulator's capacity check). None on a
        fault. Does not modify the server."""
        replies = self._pipelined(lambda pipe: [pipe.info("memory")])
        if replies is None:
            return None
        info = replies[0]
        return ServerMemory(used_bytes=int(info["used_memory"]), max_bytes=int(info.get("maxmemory", 0)))

    @property
    def is_down(self) -> bool:
        """True from a fault until the next call that succeeds."""
        return self._down

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ----- connection and faults -----------------------------------------------------------------
    def _connection(self):
        if self._client is None:
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            self._client = redis_client(
                self.config,
                retry=Retry(NoBackoff(), 0),  # one attempt per call: the store's own backoff bounds the waits
                redis_connect_func=self._on_connect,
            )
        return self._client

    def _on_connect(self, connection) -> None:
        """Every new connection (also after a server restart lost the setting) re-applies the budget."""
        import redis

        connection.on_connect()
        if self.config.budget_bytes is None:
            return
        connection.send_command(
            "CONFIG", "SET", "maxmemory", str(self.config.budget_bytes), "maxmemory-policy", "allkeys-lru"
        )
        try:
            connection.read_response()
        except redis.ResponseError as exc:  # managed servers often refuse CONFIG: their own limit applies
            if not self._config_refused:
                log.warning("store %s: server refused CONFIG SET maxmemory (%s); its own limit applies", self, exc)
            self._config_refused = True

    def _pipelined(self, queue: Callable[[Any], list]) -> list | None:
        """Run the commands ``queue`` adds to a pipeline in one round trip; None on a fault or in backoff."""
        import redis

        if self._down and self._clock() < self._next_try:
            self.counters.skipped_calls += 1
            return None
        try:
            pipe = self._connection().pipeline(transaction=False)
            queue(pipe)
            replies = pipe.execute()
        except redis.ResponseError as exc:  # the server answered but refused (e.g. OOM): not an outage
            self.counters.failed_calls += 1
            if not self._refusal_logged:
                log.warning("store %s: server refused a command (%s); those pages are not stored", self, exc)
                self._refusal_logged = True
            return None
        except redis.RedisError as exc:
            self._fail(exc)
            return None
        if self._down:
            log.warning("store %s: answering again after an outage; using it again", self)
            self._down = False
            self._backoff = self.config.retry_initial_s
        return replies

    def _fail(self, exc: Exception) -> None:
        self.counters.failed_calls += 1
        if not self._down:
            self.counters.outages += 1
            log.warning(
                "store %s: %s: %s; pages are recomputed and written nowhere until it answers (retrying with backoff)",
                self,
                type(exc).__name__,
                exc,
            )
        else:
            self._backoff = min(2 * self._backoff, self.config.retry_max_s)
        self._down = True
        self._next_try = self._clock() + self._backoff
        if self._client is not None:
            self._client.connection_pool.disconnect()

    def __str__(self) -> str:
        return str(self.config.parsed_url)


__all__ = ["PagePut", "RedisPageStore", "ServerMemory", "StoreCounters"]


def read_server_memory(config: StoreConfig) -> ServerMemory:
    """The memory figures of the server at ``config.url`` (``INFO memory``), read once with the config's
    bounded timeouts and without changing the server; ``DsakvError`` naming the URL when it cannot be read.
    For a caller that only sizes a store (the simulator's capacity check), not one that stores pages."""
    import redis

    client = redis_client(config)
    try:
        info = client.info("memory")
    except redis.RedisError as exc:
        raise DsakvError(
            f"store {config.url}: cannot read the server's memory figures ({type(exc).__name__})"
        ) from None
    finally:
        client.close()
    return ServerMemory(used_bytes=int(info["used_memory"]), max_bytes=int(info.get("maxmemory", 0)))


def redis_client(config: StoreConfig, **options: Any):
    """A redis-py client for ``config.url`` with the config's bounded connect and command timeouts (it
    connects on its first command); ``options`` go to ``redis.Redis`` as they are."""
    import redis

    url = config.parsed_url
    return redis.Redis(
        host=url.host,
        port=url.port,
        db=url.db,
        username=url.username,
        password=url.password,
        ssl=url.tls,
        socket_connect_timeout=config.connect_timeout_s,
        socket_timeout=config.command_timeout_s,
        **options,
    )
