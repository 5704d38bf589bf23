"""KV events over ZMQ, as vLLM's ``ZmqEventPublisher`` sends them, and a subscriber that feeds a ``PrefixIndex``.

The wire (vLLM's, so vLLM's subscriber example reads it):

* PUB socket: one multipart message per batch, ``(topic, seq, payload)``; ``seq`` is an 8-byte big-endian
  sequence number counting batches from 0, ``payload`` is msgpack of a ``KVEventBatch`` (``schema.py``).
* ROUTER replay socket: a request is one frame, the first sequence number wanted (8 bytes big-endian, after
  the empty delimiter a REQ socket adds); the answer is every buffered ``(seq, payload)`` from there on, each
  as its own message, then the end marker ``(seq = -1, payload = b"")``. The buffer keeps the last
  ``buffer_steps`` batches.

A PUB socket drops messages a subscriber is too slow or too late to take (a slow joiner misses the first
ones); the subscriber sees the hole in the sequence numbers and asks the replay socket for it, so its index
ends up exactly what the publisher's caches hold as long as the hole is still in the buffer. A hole older
than the buffer cannot be filled: the subscriber counts it (``unrecovered``), and its index may then miss
pages (it never invents them: a lost ``BlockRemoved`` leaves a page that a later ``BlockStored`` of the same
hash reports as an anomaly). The socket is an XPUB (a PUB that also reports its subscriptions; the same to a
SUB): ``wait_for_subscriber`` lets a publisher whose consumer has no replay socket hold its first batch until
the subscription is in.

The publisher owns its sockets in one thread (ZMQ sockets are not thread-safe): ``publish`` queues a batch,
the thread sends it and serves replay requests between batches. pyzmq and msgspec are the ``events`` extra;
this module is imported only when events go on the wire.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence

import zmq

from dsakv.cache.events import CacheEvent
from dsakv.errors import DsakvError
from dsakv.kvevents.endpoint import check_endpoint
from dsakv.kvevents.index import PrefixIndex
from dsakv.kvevents.schema import BatchCodec, KVEventBatch, PageCost, wire_event

END_SEQ = -1  # the replay's end marker, as vLLM sends it
SEQ_BYTES = 8
DEFAULT_BUFFER_STEPS = 10_000  # vLLM's default replay buffer (batches)
IDLE_POLL_MIN_S, IDLE_POLL_MAX_S = 0.005, 0.08  # the publisher thread's look at its sockets between batches


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def seq_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


class KVEventPublisher:
    """PUB + ROUTER publisher with a bounded replay buffer (vLLM's ``ZmqEventPublisher``'s protocol).

    * ``endpoint`` / ``replay_endpoint``: addresses to bind (the publisher is the stable side). A port of
      ``*`` binds a free port; ``bound_endpoint`` / ``bound_replay_endpoint`` say which.
    * ``drop_on_pub(seq)``: fault injection: when it returns True the batch is buffered for replay but not
      sent on PUB, as if the network lost it (tests use it to exercise gap recovery).
    * ``close()`` sends what is queued, then closes the sockets; the publisher is unusable afterwards.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        data_parallel_rank: int = 0,
        buffer_steps: int = DEFAULT_BUFFER_STEPS,
        drop_on_pub: Callable[[int], bool] | None = None,
    ) -> None:
        check_endpoint("endpoint", endpoint)
        if replay_endpoint is not None:
            check_endpoint("replay_endpoint", replay_endpoint)
        if isinstance(buffer_steps, bool) or not isinstance(buffer_steps, int) or buffer_steps < 1:
            raise DsakvError(f"buffer_steps = {buffer_steps!r}: must be a positive integer")
        if isinstance(data_parallel_rank, bool) or not isinstance(data_parallel_rank, int) or data_parallel_rank < 0:
            raise DsakvError(f"data_parallel_rank = {data_parallel_rank!r}: must be an integer >= 0")
        self.data_parallel_rank = data_parallel_rank
        self._topic = topic.encode("utf-8")
        self.drop_on_pub = drop_on_pub
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue()
        self._codec = BatchCodec()
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._replay = self._ctx.socket(zmq.ROUTER) if replay_endpoint is not None else None
        try:
            self._pub.bind(endpoint)
            if self._replay is not None:
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise DsakvError(f"KV events: cannot bind {endpoint} / {replay_endpoint}: {exc}") from None
        self.bound_endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.bound_replay_endpoint = (
            self._replay.getsockopt_string(zmq.LAST_ENDPOINT) if self._replay is not None else None
        )
        self.next_seq = 0  # sequence number of the next batch sent (= batches sent so far)
        self.published = 0  # batches queued by publish (the sequence number the next one will get)
        self.replays_served = 0
        self._subscribed = threading.Event()  # a SUB's subscription reached the socket
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dsakv-kv-events", daemon=True)
        self._thread.start()

    def publish(self, batch: KVEventBatch) -> None:
        """Queue ``batch`` for sending (its ``data_parallel_rank`` defaults to the publisher's)."""
        if self._error is not None:
            raise DsakvError(f"KV events publisher failed: {self._error!r}")
        if not self._thread.is_alive():
            raise DsakvError("KV events publisher: closed")
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self.data_parallel_rank
        self._queue.put(batch)
        self.published += 1

    def publish_cache_events(self, events: Sequence[CacheEvent], cost: PageCost | None = None) -> None:
        """One batch of the cache's events (one step's), stamped with the wall-clock time."""
        if events:
            self.publish(KVEventBatch(time.time(), [wire_event(e, cost) for e in events]))

    def wait_for_subscriber(self, timeout_s: float = 10.0) -> None:
        """Block until a subscriber's subscription has reached the socket (what it is sent from then on, it
        receives unless a queue overflows); ``DsakvError`` after ``timeout_s``."""
        if not self._subscribed.wait(timeout_s):
            raise DsakvError(f"KV events: no subscriber joined {self.bound_endpoint} within {timeout_s} s")

    def flush(self, timeout_s: float = 10.0) -> None:
        """Block until every queued batch is sent (and buffered for replay)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise DsakvError(f"KV events publisher: {self._queue.unfinished_tasks} batches unsent")
            time.sleep(0.002)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._close_sockets()

    def __enter__(self) -> KVEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        """Send queued batches as they come; between them, look at the sockets every ``wait_s``, which doubles
        while nothing happens (up to ``IDLE_POLL_MAX_S``): a replay request right after a batch (a drain) is
        served within ``IDLE_POLL_MIN_S``, and an idle publisher does not wake hundreds of times a second."""
        wait_s = IDLE_POLL_MIN_S
        try:
            while True:
                while self._pub.poll(0):  # (un)subscriptions: first byte 1 subscribes, 0 unsubscribes
                    if self._pub.recv()[:1] == b"\x01":
                        self._subscribed.set()
                if self._replay is not None:
                    while self._replay.poll(0):
                        self._serve_replay()
                        wait_s = IDLE_POLL_MIN_S
                try:
                    batch = self._queue.get(timeout=wait_s)
                except queue.Empty:
                    wait_s = min(2 * wait_s, IDLE_POLL_MAX_S)
                    continue
                wait_s = IDLE_POLL_MIN_S
                if batch is None:
                    self._queue.task_done()
                    return
                self._send(batch)
                self._queue.task_done()
        except BaseException as exc:  # surfaced by the next publish(); the thread must not die silently
            self._error = exc
            raise

    def _send(self, batch: KVEventBatch) -> None:
        seq = self.next_seq
        payload = self._codec.encode(batch)
        self._buffer.append((seq, payload))
        self.next_seq = seq + 1
        if self.drop_on_pub is None or not self.drop_on_pub(seq):
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != SEQ_BYTES:
            return  # not a replay request (identity, empty delimiter, start seq): ignored, as vLLM does
        client, _, start = frames
        start_seq = seq_of(start)
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", seq_bytes(seq), payload))
        self._replay.send_multipart((client, b"", seq_bytes(END_SEQ), b""))
        self.replays_served += 1


class KVEventSubscriber:
    """SUB (+ DEALER for replay) client that applies an instance's batches to a ``PrefixIndex`` in sequence
    order, filling holes from the replay socket.

    Batches are applied strictly in order: ``next_seq`` is the first one not applied yet. A batch past it
    triggers a replay of the hole (``gaps`` counts them); one before it (a replayed batch seen again) is
    skipped (``duplicates``). Call ``receive`` to take what arrives within a time; ``catch_up(n)`` to be sure
    of the first ``n`` batches (the publisher's ``next_seq``), replaying when the last ones never arrived.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        instance: Hashable = 0,
        index: PrefixIndex | None = None,
        topic: str = "",
        replay_timeout_s: float = 5.0,
    ) -> None:
        check_endpoint("endpoint", endpoint)
        if replay_endpoint is not None:
            check_endpoint("replay_endpoint", replay_endpoint)
        self.instance = instance
        self.index = index if index is not None else PrefixIndex()
        self.replay_timeout_ms = int(replay_timeout_s * 1000)
        self._codec = BatchCodec()
        self._ctx = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self._sub.connect(endpoint)
        self._replay = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.DEALER)
            self._replay.connect(replay_endpoint)
        self.next_seq = 0
        self.received = 0  # batches taken from PUB
        self.replayed = 0  # batches applied from a replay
        self.gaps = 0
        self.duplicates = 0
        self.unrecovered = 0  # batches lost for good (no replay socket, or older than its buffer)

    def receive(self, timeout_s: float) -> int:
        """Apply every batch arriving within ``timeout_s`` (returns early once the stream pauses after
        something arrived); returns the number of batches applied, replayed ones included."""
        before = self.next_seq
        deadline = time.monotonic() + timeout_s
        while True:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sub.poll(wait_ms if self.next_seq == before else min(wait_ms, 50)):
                return self.next_seq - before
            _topic, seq, payload = self._sub.recv_multipart()
            self.received += 1
            self._take(seq_of(seq), payload)

    def catch_up(self, next_seq: int, timeout_s: float = 10.0, tail_wait_s: float = 0.2) -> None:
        """Apply batches until the first ``next_seq`` are applied, returning as soon as they are: each is taken
        as it arrives, and when none has arrived for ``tail_wait_s`` the rest is asked of the replay socket (a
        tail never sent on PUB, or a late joiner's past). ``DsakvError`` if they cannot all be had within
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.next_seq < next_seq:
            left = deadline - time.monotonic()
            if left <= 0:
                got = f"{self.next_seq} of {next_seq} batches applied within {timeout_s} s"
                raise DsakvError(f"KV events of {self.instance!r}: {got}")
            if self._sub.poll(max(1, int(min(left, tail_wait_s) * 1000))):
                _topic, seq, payload = self._sub.recv_multipart()
                self.received += 1
                self._take(seq_of(seq), payload)
            elif self._replay is not None:
                self._replay_from(self.next_seq, next_seq)

    def close(self) -> None:
        self._sub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def __enter__(self) -> KVEventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self, seq: int, payload: bytes) -> None:
        if seq < self.next_seq:
            self.duplicates += 1
            return
        if seq > self.next_seq:
            self.gaps += 1
            if self._replay is not None:
                self._replay_from(self.next_seq, seq)
            if seq > self.next_seq:  # still a hole: lost for good
                self.unrecovered += seq - self.next_seq
                self.next_seq = seq
        self._apply(payload)

    def _apply(self, payload: bytes) -> None:
        self.index.apply_batch(self.instance, self._codec.decode(payload))
        self.next_seq += 1

    def _replay_from(self, start: int, stop: int) -> None:
        """Ask for ``start`` onwards; apply, in order, the replayed batches from ``next_seq`` up to ``stop``
        (later ones come again on PUB). Reads the answer to its end marker."""
        self._replay.send_multipart((b"", seq_bytes(start)))
        while True:
            if not self._replay.poll(self.replay_timeout_ms):
                raise DsakvError(f"KV events: the replay socket did not answer within {self.replay_timeout_ms} ms")
            _, seq_frame, payload = self._replay.recv_multipart()
            seq = seq_of(seq_frame)
            if seq == END_SEQ:
                return
            if seq == self.next_seq and seq < stop:
                self._apply(payload)
                self.replayed += 1


__all__ = ["KVEventPublisher", "KVEventSubscriber"]
