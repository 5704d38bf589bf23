"""PD over the Mooncake Transfer Engine, with a ZMQ control channel (as SGLang's PD does).

The decode side (``TeReceiver``) binds a ZMQ REP socket and a transfer engine with its pool's buffers
registered; the prefill side (``TeSender``) connects both. The bytes go straight from the prefill pool's
pages into the decode pool's allocated pages (one write per run of contiguous ranges, ``copy_spans``); the
control channel carries only metadata::

    prefill (REQ)                                   decode (REP)
    hello {manifest}                          ->    manifest checked field by field; refused, or
                                              <-    {transfer engine address, component regions}
    offer {tokens, namespace, page count}     ->    count checked, cached prefix skipped, pages allocated
                                              <-    {epoch, skip, destination page ids}
    (transfer engine writes every component of every page not skipped)
    done {epoch, per page: components, digest} ->   digests of the arrived bytes checked, commit or fail
                                              <-    {outcome: success | fail | recompute, reason}
    abort {epoch}                             ->    pages freed, epoch closed
                                              <-    {ack: epoch}

A report for an ended epoch is rejected; a sender that goes silent is failed by the receiver's deadline. An
abort the decode side starts (``TeReceiver.abort``) keeps the pages in quarantine until the sender's next
message of that epoch, refused with reason ``aborted``, acknowledges it (a remote writer cannot be fenced).
Needs the ``pd`` extra (``mooncake-transfer-engine-non-cuda``, ``pyzmq``) and Debian's ``libibverbs1`` and
``libnuma1`` (the engine loads them even for TCP).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dsakv.engine.pd_pages import Acceptance, Export, ImportResult, PdImporter, PoolPages
from dsakv.errors import DsakvError
from dsakv.transfer.manifest import Manifest, TransferError
from dsakv.transfer.messages import Offer, PageReport, dumps, loads
from dsakv.transfer.pages import copy_spans

os.environ.setdefault("GLOG_minloglevel", "2")  # the engine's INFO / WARNING lines on stderr


def transfer_engine(buffers: Sequence[tuple[int, int]], host: str = "127.0.0.1"):
    """A Mooncake ``TransferEngine`` over TCP with peer-to-peer handshake and ``buffers`` registered."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise DsakvError(
            f"transport 'mooncake': needs the pd extra (pip install 'dsakv[pd]') and libibverbs1, libnuma1: {exc}"
        ) from None
    te = TransferEngine()
    if te.initialize(host, "P2PHANDSHAKE", "tcp", "") != 0:
        raise DsakvError(f"transport 'mooncake': TransferEngine.initialize({host!r}, P2PHANDSHAKE, tcp) failed")
    for addr, n in buffers:
        if te.register_memory(addr, n) != 0:
            raise DsakvError(f"transport 'mooncake': register_memory of {n} B failed")
    return te


class TeReceiver:
    """The decode side: serves one prefill sender's control messages and its transfer engine's writes."""

    def __init__(self, importer: PdImporter, endpoint: str = "tcp://127.0.0.1:*", host: str = "127.0.0.1") -> None:
        import zmq

        self.importer = importer
        self.pool_pages = importer.pool_pages
        self.te = transfer_engine(self.pool_pages.buffers(), host)
        self.te_address = f"{host}:{self.te.get_rpc_port()}"
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._peers_ok = False
        self._lock = threading.Lock()  # one message, expiry or abort at a time
        self.results: list[ImportResult] = []
        self.rejected: list[str] = []  # messages refused (stale epochs among them), for the tests and the log

    def serve(self, until_results: int = 1, timeout_s: float = 30.0) -> list[ImportResult]:
        """Answer control messages until ``until_results`` hand-offs have ended, or until ``timeout_s`` passes
        with no message and no live hand-off; a live hand-off past its deadline ends by its policy (``timeout``)."""
        start = len(self.results)
        while len(self.results) - start < until_results:
            if not self.poll_once(min(timeout_s, self._next_deadline())) and not self.importer.book.live:
                break
        return self.results[start:]

    def serve_while(self, keep_going: Callable[[], bool], poll_s: float = 0.02) -> None:
        """Answer control messages while ``keep_going()`` (a test's or a server's loop)."""
        while keep_going():
            self.poll_once(poll_s)

    def poll_once(self, wait_s: float) -> bool:
        """Answer one message if one arrives within ``wait_s``; otherwise end expired hand-offs. True if answered."""
        import zmq

        if self._sock.poll(int(wait_s * 1000), zmq.POLLIN):
            self._sock.send(dumps(self.handle(loads(self._sock.recv()))))
            return True
        with self._lock:
            self.results += self.importer.expire()
        return False

    def abort(self, epoch: int) -> None:
        """Abort a hand-off from the decode side (safe from another thread than the serving one). Its pages stay
        in quarantine until the sender's next message of ``epoch``, which is refused with reason ``aborted``
        and acknowledges that the sender has stopped writing."""
        with self._lock:
            ack = self.importer.abort(epoch, quarantine=True)
            self.results.append(ImportResult(ack.handoff_id, "aborted", "aborted", None, 0, 0))

    def _next_deadline(self) -> float:
        live = self.importer.book.live.values()
        if not live:
            return 3600.0
        return max(0.0, min(t.deadline for t in live) - self.importer.book.clock()) + 0.001

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One control message -> its reply; every refusal is ``{"ok": False, "reason", "error"}``."""
        op = str(msg["op"])
        try:
            with self._lock:
                epoch = msg.get("epoch")
                if epoch in self.importer.quarantined:  # the sender's acknowledgement of the decode side's abort
                    freed = self.importer.release_quarantine(epoch)
                    raise TransferError(
                        "aborted", f"epoch {epoch}: aborted by the decode side ({freed} pages released)"
                    )
                return {"op": op, "ok": True, **getattr(self, "_on_" + op, self._on_unknown)(msg)}
        except TransferError as exc:
            self.rejected.append(f"{op}: {exc}")
            return {"op": op, "ok": False, "reason": exc.reason, "error": str(exc)}

    def _on_unknown(self, msg: dict[str, Any]) -> dict[str, Any]:
        raise TransferError("state", f"control message op {msg.get('op')!r}: must be hello, offer, done or abort")

    def _on_hello(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.importer.manifest.check_matches(Manifest.from_json(msg["manifest"]))
        self._peers_ok = True
        return {"te": self.te_address, "regions": self.pool_pages.regions()}

    def _on_offer(self, msg: dict[str, Any]) -> dict[str, Any]:
        if not self._peers_ok:
            raise TransferError("manifest", "offer before a matching hello: the manifests were never compared")
        _, acc = self.importer.offer(Offer.from_json(msg["offer"]))
        return {"epoch": acc.epoch, "skip": acc.skip, "dest": list(acc.dest_pages)}

    def _on_done(self, msg: dict[str, Any]) -> dict[str, Any]:
        epoch = int(msg["epoch"])
        self.importer.book.get(epoch)  # an ended epoch: rejected here, nothing changes
        try:
            self.importer.report(epoch, [PageReport.from_json(r) for r in msg["pages"]])
        except TransferError as exc:
            result = self.importer.fail(epoch, exc)
        else:
            result = self.importer.finish(epoch)
        self.results.append(result)
        return {"outcome": result.outcome, "reason": result.reason, "error": result.error}

    def _on_abort(self, msg: dict[str, Any]) -> dict[str, Any]:
        ack = self.importer.abort(int(msg["epoch"]))
        self.results.append(ImportResult(ack.handoff_id, "aborted", "aborted", None, 0, 0))
        return {"ack": ack.epoch, "freed": len(ack.freed_pages)}

    def close(self) -> None:
        self._sock.close(0)


class TeSender:
    """The prefill side: one connection to a decode receiver (a control socket and a transfer engine)."""

    def __init__(self, pool_pages: PoolPages, manifest: Manifest, address: str, timeout_s: float = 30.0) -> None:
        import zmq

        self.pool_pages, self.manifest, self.timeout_s = pool_pages, manifest, timeout_s
        self.te = transfer_engine(pool_pages.buffers())
        self._sock = zmq.Context.instance().socket(zmq.REQ)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
        self._sock.connect(address)
        self.peer: dict[str, Any] | None = None
        self.bytes_written = 0

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        import zmq

        self._sock.send(dumps(msg))
        try:
            return loads(self._sock.recv())
        except zmq.Again:
            raise TransferError(
                "timeout", f"{msg['op']}: no reply from the decode side in {self.timeout_s} s"
            ) from None

    def hello(self) -> dict[str, Any]:
        reply = self.call({"op": "hello", "manifest": self.manifest.to_json()})
        if reply["ok"]:
            self.peer = reply
        return reply

    def offer(self, export: Export) -> Acceptance | dict[str, Any]:
        reply = self.call({"op": "offer", "offer": export.offer.to_json()})
        if not reply["ok"]:
            return reply
        return Acceptance(int(reply["epoch"]), int(reply["skip"]), tuple(int(p) for p in reply["dest"]))

    def write(
        self, export: Export, acc: Acceptance, indices: Sequence[int] | None = None, to: Sequence[int] | None = None
    ) -> None:
        """Write pages ``indices`` (default: every page not skipped) to the destinations of pages ``to``
        (default: the same pages) — the two differ only when a test reorders pages."""
        if self.peer is None:
            raise TransferError("manifest", "write before a matching hello")
        indices = list(range(acc.skip, export.offer.count.pages)) if indices is None else list(indices)
        to = indices if to is None else list(to)
        lengths = {c.name: c.item_bytes for c in self.manifest.components}
        regions = {k: tuple(v) for k, v in self.peer["regions"].items()}
        spans = copy_spans(
            self.pool_pages.regions(),
            regions,
            lengths,
            [export.pages[i] for i in indices],
            [acc.dest_pages[i - acc.skip] for i in to],
        )
        if not spans:
            return
        src, dst, n = (list(x) for x in zip(*spans))
        if self.te.batch_transfer_sync_write(self.peer["te"], src, dst, n) != 0:
            raise TransferError(
                "sender", f"transfer engine: a write of {len(spans)} ranges to {self.peer['te']} failed"
            )
        self.bytes_written += sum(n)

    def done(self, acc: Acceptance, reports: Sequence[PageReport]) -> dict[str, Any]:
        return self.call({"op": "done", "epoch": acc.epoch, "pages": [r.to_json() for r in reports]})

    def abort(self, epoch: int) -> dict[str, Any]:
        return self.call({"op": "abort", "epoch": epoch})

    def send(self, export: Export) -> dict[str, Any]:
        """The whole hand-off of one export: hello (once), offer, write, done; returns the last reply."""
        if self.peer is None:
            reply = self.hello()
            if not reply["ok"]:
                return reply
        acc = self.offer(export)
        if isinstance(acc, dict):
            return acc
        self.write(export, acc)
        return self.done(acc, export.reports[acc.skip :])

    def close(self) -> None:
        self._sock.close(0)


__all__ = ["TeReceiver", "TeSender", "transfer_engine"]
