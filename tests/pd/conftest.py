"""Fixtures of the PD hand-off tests: tiny engines whose prompts are longer than ``index_topk`` (so a wrong
index-K changes the top-k and the tokens), a real Mooncake Transfer Engine + ZMQ link on loopback (the
receiver answers in a thread of this process), and a real ``redis-server``.

The transfer engine needs the ``pd`` extra and Debian's ``libibverbs1`` / ``libnuma1``: without them these
tests FAIL with the install command, never skip.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pd_support import INSTALL, pd_config

from dsakv.engine.engine import Engine
from dsakv.engine.pd_pages import PdExporter, PoolPages
from dsakv.engine.pd_roles import PdRequest, decode_importer, manifest_of
from dsakv.errors import DsakvError
from dsakv.store.local_server import LocalRedisServer, redis_server_binary

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="session")
def transfer_engine_installed() -> None:
    """Fails (never skips) a test that needs the transfer engine when it cannot load."""
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"the PD tests need the Mooncake Transfer Engine ({INSTALL}): {exc}")


@dataclass
class Link:
    """A prefill engine and a decode engine joined by a transfer engine and a ZMQ control channel."""

    prefill: Engine
    decode: Engine
    exporter: PdExporter
    receiver: object
    sender: object

    def export(self, req: PdRequest, policy: str = "recompute"):
        from dsakv.engine.pd_roles import prefill

        return prefill(self.prefill, self.exporter, req, policy)


def make_link(prefill: Engine, decode: Engine, timeout_s: float = 5.0):
    from dsakv.engine.pd_mooncake import TeReceiver, TeSender

    man = manifest_of(prefill)
    receiver = TeReceiver(decode_importer(decode, timeout_s))
    sender = TeSender(PoolPages(prefill.pool, man), man, receiver.address, timeout_s=timeout_s)
    return Link(prefill, decode, PdExporter(prefill.pool, prefill.radix, man), receiver, sender)


@pytest.fixture
def link_factory(transfer_engine_installed) -> Iterator:
    """``link_factory(prefill_engine, decode_engine)`` -> a ``Link`` whose receiver serves in a thread."""
    stops = []

    def make(prefill: Engine, decode: Engine, timeout_s: float = 5.0) -> Link:
        link = make_link(prefill, decode, timeout_s)
        stop = threading.Event()
        thread = threading.Thread(target=link.receiver.serve_while, args=(lambda: not stop.is_set(),), daemon=True)
        thread.start()
        stops.append((stop, thread, link))
        return link

    yield make
    for stop, thread, link in stops:
        stop.set()
        thread.join(5)
        link.sender.close()
        link.receiver.close()


@pytest.fixture
def link(link_factory) -> Link:
    return link_factory(Engine(pd_config()), Engine(pd_config()))


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    try:
        server = LocalRedisServer(tmp_path, binary=redis_server_binary())
        server.start()
    except DsakvError as exc:
        pytest.fail(f"the PD store tests need a real redis-server: {exc}")
    yield server.url
    server.stop()
