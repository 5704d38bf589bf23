"""The private ``redis-server`` never answers for another process that holds its port: a first start moves to a
free port, a restart keeps its own or fails in one line (the suite runs in parallel workers, README)."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.store.local_server import LocalRedisServer


def test_a_first_start_on_a_port_another_server_holds_moves_to_its_own(redis_server, tmp_path):
    late = LocalRedisServer(tmp_path / "late", binary=redis_server.binary)
    (tmp_path / "late").mkdir()
    late.port = redis_server.port  # taken between free_port and the bind, as by a parallel worker
    with late:
        assert late.port != redis_server.port
        assert late.client().info("server")["process_id"] == late.proc.pid
        assert redis_server.client().info("server")["process_id"] == redis_server.proc.pid


def test_a_restart_on_a_port_taken_meanwhile_is_a_one_line_error(redis_server, tmp_path):
    other = LocalRedisServer(tmp_path / "other", binary=redis_server.binary)
    (tmp_path / "other").mkdir()
    other.start()
    try:
        other.stop()
        other.port = redis_server.port  # its url is kept across restarts: no other port is tried
        with pytest.raises(DsakvError, match=rf"port {redis_server.port} is taken by another process \(1 tries\)"):
            other.restart()
        assert redis_server.answers_ping() and not other.answers_ping()
    finally:
        other.stop()
