"""Where the store is and how long it may take: ``redis://host:port/db`` and bounded timeouts.

A plain-Redis URL works against a local ``redis-server``, Valkey and managed Redis alike (``rediss://`` for
TLS, ``redis://:password@host:port/db`` or ``user:password@`` for a server with a password).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from dsakv.errors import DsakvError, check_choice

URL_SCHEMES = ("redis", "rediss")
URL_FORM = "redis://HOST:PORT/DB"


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL. ``str()`` gives it back without the password."""

    host: str
    port: int
    db: int
    tls: bool = False
    username: str | None = None
    password: str | None = None

    def __str__(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{self.host}:{self.port}/{self.db}"


def parse_store_url(url: str) -> StoreURL:
    """``redis://HOST:PORT/DB`` (port and db required: a store URL names exactly one database).

    Raises ``DsakvError`` with one line naming what is wrong and the expected form.
    """
    if not isinstance(url, str) or not url:
        raise DsakvError(f"store url = {url!r}: must be {URL_FORM}")
    parts = urlsplit(url)
    if parts.scheme not in URL_SCHEMES:
        check_choice(f"store url {url!r}: scheme", parts.scheme, URL_SCHEMES)
    try:
        port = parts.port
    except ValueError:
        raise DsakvError(f"store url {url!r}: port must be an integer in 1..65535 ({URL_FORM})") from None
    if not parts.hostname or port is None or port == 0:
        raise DsakvError(f"store url {url!r}: needs a host and a port in 1..65535 ({URL_FORM})")
    db = parts.path.lstrip("/")
    if not db.isdigit() or not db.isascii() or parts.query or parts.fragment:
        raise DsakvError(f"store url {url!r}: must end in /DB, a database number >= 0, and nothing after ({URL_FORM})")
    return StoreURL(
        host=parts.hostname,
        port=port,
        db=int(db),
        tls=parts.scheme == "rediss",
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


def _check_seconds(field: str, value: object, upper: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DsakvError(f"{field} = {value!r}: must be a number of seconds in (0, {upper}]")
    if not 0 < value <= upper:
        raise DsakvError(f"{field} = {value!r}: must be a number of seconds in (0, {upper}]")


@dataclass(frozen=True)
class StoreConfig:
    """How the page store talks to its server. Every wait is bounded; nothing retries inside a call.

    * ``connect_timeout_s`` / ``command_timeout_s``: socket limits of one connection attempt / one pipelined
      batch. A slow or hung server costs the caller at most this long per call, then the call is a miss.
    * ``retry_initial_s`` .. ``retry_max_s``: after a failure the store sits out (every call a miss, no
      network) for a backoff that doubles per failed attempt, then tries again; one success ends the outage.
    * ``budget_bytes``: the server's ``maxmemory`` (set with ``allkeys-lru`` at connect, so the server evicts
      the least recently used pages); ``None`` leaves the server's own setting.
    * ``batch_pages``: pages per pipelined round trip (a bound on one reply's size).
    * ``key_prefix``: prepended to every page key (the hex of the page's chained hash).
    """

    url: str
    key_prefix: str = "dsakv:page:"
    connect_timeout_s: float = 1.0
    command_timeout_s: float = 2.0
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    budget_bytes: int | None = None
    batch_pages: int = 64

    def __post_init__(self) -> None:
        parse_store_url(self.url)
        for name in ("connect_timeout_s", "command_timeout_s", "retry_initial_s", "retry_max_s"):
            _check_seconds(name, getattr(self, name), 3600)
        if self.retry_max_s < self.retry_initial_s:
            raise DsakvError(f"retry_max_s = {self.retry_max_s}: must be >= retry_initial_s = {self.retry_initial_s}")
        if self.budget_bytes is not None and (
            isinstance(self.budget_bytes, bool) or not isinstance(self.budget_bytes, int) or self.budget_bytes < 1
        ):
            raise DsakvError(f"budget_bytes = {self.budget_bytes!r}: must be a positive integer or None")
        if isinstance(self.batch_pages, bool) or not isinstance(self.batch_pages, int) or self.batch_pages < 1:
            raise DsakvError(f"batch_pages = {self.batch_pages!r}: must be a positive integer")
        if not isinstance(self.key_prefix, str):
            raise DsakvError(f"key_prefix = {self.key_prefix!r}: must be a string")

    @property
    def parsed_url(self) -> StoreURL:
        return parse_store_url(self.url)


__all__ = ["URL_FORM", "URL_SCHEMES", "StoreConfig", "StoreURL", "parse_store_url"]
