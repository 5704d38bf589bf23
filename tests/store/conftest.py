"""A real ``redis-server`` per test, on a free loopback port, for the store's tests.

``redis_server`` starts ``redis-server`` with no persistence in a tmp dir, waits until it answers PING,
yields a ``TestRedisServer`` (``LocalRedisServer`` plus ``flip_byte``) and stops it. The handle can kill,
pause (SIGSTOP), resume and restart the process mid-test. A machine without ``redis-server`` FAILS these
tests, saying how to install it: the store's behaviour is only claimed against a real server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dsakv.errors import DsakvError
from dsakv.store.local_server import LocalRedisServer, redis_server_binary


class TestRedisServer(LocalRedisServer):
    __test__ = False  # not a test class, despite its name

    def flip_byte(self, key: bytes, offset: int) -> None:
        """XOR one byte of a stored value with 0xFF in place (SETRANGE), as silent corruption would."""
        c = self.client()
        old = c.getrange(key, offset, offset)
        assert len(old) == 1, f"{key!r} has no byte at {offset}"
        c.setrange(key, offset, bytes([old[0] ^ 0xFF]))


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[TestRedisServer]:
    try:
        server = TestRedisServer(tmp_path, binary=redis_server_binary())
        server.start()
    except DsakvError as exc:
        pytest.fail(f"the store tests need a real redis-server: {exc}")
    yield server
    server.stop()
