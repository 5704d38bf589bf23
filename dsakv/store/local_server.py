"""A private ``redis-server`` process on a free loopback port (the benchmark's and the tests' server).

No persistence (``--save ''``, no AOF), its files in a given directory, started only when asked (the
constructor has no side effects). It can be killed, paused (SIGSTOP: a hung server), resumed and restarted
on the same port, which is what the fault tests do.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from dsakv.errors import DsakvError

INSTALL_HINT = "install it: apt-get install -y redis-server (Debian/Ubuntu) or brew install redis (macOS)"


def redis_server_binary() -> str:
    """Path of ``redis-server``; raises ``DsakvError`` saying how to install it when it is not on PATH."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise DsakvError(f"redis-server: not found on PATH; {INSTALL_HINT}")
    return binary


# How many free ports a first start tries before it gives up.
START_PORT_TRIES = 3


class _PortTaken(Exception):
    """The server could not bind its port: another process holds it."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRedisServer:
    """One ``redis-server`` on 127.0.0.1; ``url`` stays the same across restarts."""

    def __init__(self, workdir: str | Path, binary: str | None = None, start_timeout_s: float = 10.0) -> None:
        self.binary = binary
        self.workdir = Path(workdir)
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.started = False  # once started, the port is kept across restarts

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start and wait until it answers PING; raises ``DsakvError`` if it exits or stays silent. The first start
        moves to another free port when the one it was given was taken before the server bound it (another process,
        e.g. a parallel test worker, between ``free_port`` and the bind); a restart keeps its port (its ``url``)."""
        tries = 1 if self.started else START_PORT_TRIES
        for attempt in range(1, tries + 1):
            try:
                self._start_once()
            except _PortTaken:
                if attempt == tries:
                    raise DsakvError(
                        f"redis-server: port {self.port} is taken by another process ({tries} tries)"
                    ) from None
                self.port = free_port()
            else:
                self.started = True
                return

    def _start_once(self) -> None:
        binary = self.binary or redis_server_binary()
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        log = self.workdir / f"redis-{self.port}.log"  # where redis-server says why it could not start
        args += ["--dir", str(self.workdir), "--daemonize", "no", "--loglevel", "warning", "--logfile", str(log)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") + (log.read_text() if log.exists() else "")
                err = err.strip().replace("\n", " ")
                self.proc = None
                if "Address already in use" in err:
                    raise _PortTaken
                raise DsakvError(f"redis-server: exited at start on port {self.port}: {err[-300:]}")
            if self.answers_ping():
                return
            time.sleep(0.02)
        self.stop()
        raise DsakvError(f"redis-server: no answer to PING on port {self.port} within {self.start_timeout_s} s")

    def answers_ping(self) -> bool:
        """This server answers: a PING is answered on its port by the process it started (``INFO``'s
        ``process_id``), not by another server that holds the port."""
        import redis

        if self.proc is None:
            return False
        try:
            client = self.client(timeout=0.2)
            return bool(client.ping()) and client.info("server").get("process_id") == self.proc.pid
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """Kill the server (SIGKILL: no shutdown work, as a crash). Idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a paused process must run to die promptly
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
        """A plain redis-py client of this server (for inspection; the store makes its own)."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)

    def __enter__(self) -> LocalRedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["INSTALL_HINT", "LocalRedisServer", "free_port", "redis_server_binary"]
