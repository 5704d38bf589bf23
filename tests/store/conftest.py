"""A real ``redis-server`` per test, on a free loopback port, for the store's tests.

``redis_server`` starts ``redis-server`` with no persistence (``--save ''``, no AOF) in a tmp dir, waits until
it answers PING, yields a ``RedisServer`` and stops it. The handle can kill, pause (SIGSTOP: a hung server),
resume and restart the process mid-test, and flip a byte of a stored value (SETRANGE). A machine without
``redis-server`` FAILS these tests: the store's behaviour is only claimed against a real server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

INSTALL_HINT = "install it: apt-get install -y redis-server (Debian/Ubuntu), or brew install redis"
START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1; ``url`` stays the same across restarts."""

    def __init__(self, binary: str, workdir: Path, maxmemory: int | None = None) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.workdir), "--daemonize", "no", "--loglevel", "warning"]
        if self.maxmemory is not None:
            args += ["--maxmemory", str(self.maxmemory), "--maxmemory-policy", "allkeys-lru"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")
                pytest.fail(f"redis-server exited at start (port {self.port}): {err.strip()[-400:]}")
            try:
                if self.client(timeout=0.2).ping():
                    return
            except OSError:
                pass
            except Exception as exc:  # redis.ConnectionError / BusyLoadingError while it starts
                if "redis" not in type(exc).__module__:
                    raise
            time.sleep(0.02)
        self.stop()
        pytest.fail(f"redis-server on port {self.port} did not answer PING within {START_TIMEOUT_S} s")

    def stop(self) -> None:
        """Kill the server (SIGKILL: no shutdown work, as a crash); idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Kill and start again on the same port: every stored page is gone (no persistence)."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the server keeps its socket but answers nothing (a hung or very slow server)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def client(self, timeout: float = 5.0):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)

    def flip_byte(self, key: bytes, offset: int) -> None:
        """XOR one byte of a stored value with 0xFF in place (SETRANGE), as silent corruption would."""
        c = self.client()
        old = c.getrange(key, offset, offset)
        assert len(old) == 1, f"{key!r} has no byte at {offset}"
        c.setrange(key, offset, bytes([old[0] ^ 0xFF]))


@pytest.fixture
def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(f"redis-server not found on PATH; the store tests need a real server: {INSTALL_HINT}")
    return binary


@pytest.fixture
def redis_server(redis_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(redis_binary, tmp_path)
    server.start()
    yield server
    server.stop()
