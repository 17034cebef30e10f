"""KV events for routers: the leading master publishes block events over ZeroMQ.

The format and the sockets are vLLM's (``vllm/distributed/kv_events.py``,
ZmqEventPublisher), so routers built for vLLM's KV events read kvstored's cluster-wide
view: a PUB socket sends one multipart message per batch, and a ROUTER socket replays the
buffered batches to a subscriber that missed some::

    PUB      (topic, seq: 8 bytes big-endian, payload: msgpack KVEventBatch)
    ROUTER   request  (identity, b"", start seq: 8 bytes big-endian)
             answers  (identity, b"", topic, seq, payload) per buffered batch with
                      seq >= start, then (identity, b"", b"", END_SEQ, b"")

Flow: :class:`~kvstored.master.observed.ObservedBlockIndex` calls
:meth:`KVEventPublisher.replicas_changed` on the master's event loop; the publisher turns
it into a BlockStored / BlockRemoved (kvstored/kv_events.py) and hands it to its own thread
through a bounded queue (the loop never blocks on ZeroMQ). The thread batches with
:class:`EventBatcher` (at most ``max_events`` blocks per batch, or ``batch_ms`` after the
first pending event), numbers batches 0, 1, 2, ... for the publisher's life (across
terms), keeps the last ``buffer_steps`` for replay, and answers replay requests. A new term
(:meth:`KVEventPublisher.new_term`) publishes AllBlocksCleared first; the nodes'
inventories then come as BlockStored when their holders become readable.

Events report *visible* replicas (committed, holder readable), so a node whose lease lapses
or that turns unhealthy is reported removed, and reported stored again when readable.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import structlog
import zmq

from kvstored.errors import ConfigInvalid, InvalidArgument
from kvstored.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    encode_batch,
    removed_event,
    stored_event,
)
from kvstored.types import Tier

log = structlog.get_logger(__name__)

DEFAULT_MAX_EVENTS = 256
"""Blocks per batch at most (events of one node, tier and namespace are merged)."""
DEFAULT_BATCH_MS = 10.0
"""A pending event is sent at most this long after it was recorded, milliseconds."""
DEFAULT_QUEUE_EVENTS = 100_000
"""Events the loop may hand the thread before it drops (and counts) new ones."""


def _num_blocks(event: KVEvent) -> int:
    return 1 if isinstance(event, AllBlocksCleared) else len(event.block_hashes)


def _same_group(a: KVEvent, b: KVEvent) -> bool:
    return (type(a) is type(b) and not isinstance(a, AllBlocksCleared)
            and isinstance(b, BlockStored | BlockRemoved)
            and isinstance(a, BlockStored | BlockRemoved)
            and (a.node_id, a.tier, a.namespace_id) == (b.node_id, b.tier, b.namespace_id))


class EventBatcher:
    """Sans-I/O batching: events in, sealed batches out (times are passed in).

    A batch is due when it holds ``max_events`` blocks, or ``batch_ms`` after its first
    event was added. Consecutive events of one kind, node, tier and namespace are merged
    into one event (their keys concatenated, order kept).

    Args:
        max_events: blocks per batch at most (> 0).
        batch_ms: milliseconds a pending event may wait (>= 0; 0 = every add is due).

    Raises:
        InvalidArgument: ``max_events`` < 1 or ``batch_ms`` < 0.
    """

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS,
                 batch_ms: float = DEFAULT_BATCH_MS) -> None:
        if max_events < 1:
            raise InvalidArgument(f"events max_events must be >= 1, got {max_events}")
        if batch_ms < 0:
            raise InvalidArgument(f"events batch_ms must be >= 0, got {batch_ms}")
        self.max_events = int(max_events)
        self.batch_s = float(batch_ms) / 1e3
        self._events: list[KVEvent] = []
        self._num_blocks = 0
        self._first_s: float | None = None

    @property
    def num_pending_blocks(self) -> int:
        """Blocks (AllBlocksCleared counts one) waiting in the open batch."""
        return self._num_blocks

    def add(self, event: KVEvent, now_s: float) -> list[list[KVEvent]]:
        """Add one event at monotonic time ``now_s``.

        An event larger than the room left is split. Returns the events of every batch that
        filled up (``max_events`` blocks each), to be sealed by the caller in order (most
        often none); the remainder stays pending.
        """
        full: list[list[KVEvent]] = []
        pieces: list[KVEvent] = [event]
        if isinstance(event, BlockStored | BlockRemoved) and len(event.block_hashes) > 1:
            pieces = []
            hashes = list(event.block_hashes)
            room = self.max_events - self._num_blocks
            while hashes:
                take, hashes = hashes[:room], hashes[room:]
                pieces.append(_with_hashes(event, take))
                room = self.max_events
        for piece in pieces:
            if self._first_s is None:
                self._first_s = now_s
            if self._events and _same_group(self._events[-1], piece):
                last = self._events[-1]
                assert isinstance(last, BlockStored | BlockRemoved)
                assert isinstance(piece, BlockStored | BlockRemoved)
                self._events[-1] = _with_hashes(last, [*last.block_hashes, *piece.block_hashes])
            else:
                self._events.append(piece)
            self._num_blocks += _num_blocks(piece)
            if self._num_blocks >= self.max_events:
                full.append(self._take())
        return full

    def due_in_s(self, now_s: float) -> float | None:
        """Seconds until the open batch is due (0: now); None when nothing is pending."""
        if self._first_s is None:
            return None
        return max(0.0, self._first_s + self.batch_s - now_s)

    def take_due(self, now_s: float) -> list[KVEvent] | None:
        """The open batch's events if it is due at ``now_s`` (then it is emptied), else None."""
        left = self.due_in_s(now_s)
        if left is None or left > 0:
            return None
        return self._take()

    def take_all(self) -> list[KVEvent]:
        """The open batch's events, due or not (then it is emptied)."""
        return self._take()

    def _take(self) -> list[KVEvent]:
        out, self._events, self._num_blocks, self._first_s = self._events, [], 0, None
        return out


def _with_hashes(event: BlockStored | BlockRemoved,
                 hashes: list[bytes | int]) -> BlockStored | BlockRemoved:
    if isinstance(event, BlockStored):
        return BlockStored(block_hashes=hashes, parent_block_hash=event.parent_block_hash,
                           token_ids=event.token_ids, block_size=event.block_size,
                           lora_id=event.lora_id, medium=event.medium,
                           lora_name=event.lora_name, node_id=event.node_id, tier=event.tier,
                           namespace_id=event.namespace_id)
    return BlockRemoved(block_hashes=hashes, medium=event.medium, node_id=event.node_id,
                        tier=event.tier, namespace_id=event.namespace_id)


class ReplayBuffer:
    """The last ``buffer_steps`` sealed batches, for the replay socket.

    Raises:
        InvalidArgument: ``buffer_steps`` < 1.
    """

    def __init__(self, buffer_steps: int) -> None:
        if buffer_steps < 1:
            raise InvalidArgument(f"master.events_buffer_steps must be >= 1, got {buffer_steps}")
        self._buf: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)

    def append(self, seq: int, payload: bytes) -> None:
        """Keep one batch (the oldest falls out when full)."""
        self._buf.append((seq, payload))

    def since(self, start_seq: int) -> Iterator[tuple[int, bytes]]:
        """(seq, payload) of every buffered batch with seq >= ``start_seq``, oldest first."""
        return ((s, p) for s, p in list(self._buf) if s >= start_seq)

    @property
    def oldest_seq(self) -> int | None:
        """The oldest buffered seq (None when empty)."""
        return self._buf[0][0] if self._buf else None


@dataclass(frozen=True, slots=True)
class PublisherSettings:
    """Where and how the master publishes (``[master] events_*``).

    Attributes:
        endpoint: the PUB socket's bind address (``tcp://HOST:PORT``; port 0 = any).
        replay_endpoint: the ROUTER socket's bind address; "" = no replay.
        buffer_steps: batches kept for replay.
        max_events / batch_ms: :class:`EventBatcher`'s.
        topic: the first frame of every message ("" as vLLM's default).
    """

    endpoint: str
    replay_endpoint: str = ""
    buffer_steps: int = 10_000
    max_events: int = DEFAULT_MAX_EVENTS
    batch_ms: float = DEFAULT_BATCH_MS
    topic: str = ""
    max_queue_events: int = DEFAULT_QUEUE_EVENTS


def _bind(sock: zmq.Socket[bytes], endpoint: str, setting: str) -> str:
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise ConfigInvalid(f"cannot bind {setting} {endpoint!r}: {exc}; give "
                            "tcp://HOST:PORT (port 0 = any) or change the setting") from None
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)


class KVEventPublisher:
    """Publishes the master's visible-replica changes as vLLM KV events (see the module
    docstring). Implements :class:`~kvstored.master.observed.IndexObserver`.

    Args:
        settings: sockets, buffer and batching.
        node_of: the node id of a holder at the moment of the call (None: unknown, the
            event is dropped and counted).
        clock: monotonic seconds for batching (``time.monotonic``).

    Raises:
        ConfigInvalid: an endpoint cannot be bound (from :meth:`start`).
        InvalidArgument: a buffer or batch setting out of range.

    Concurrency: :meth:`replicas_changed` and :meth:`new_term` are called on the master's
    loop (they only enqueue); the sockets belong to the publisher's thread.
    """

    def __init__(self, settings: PublisherSettings, *,
                 node_of: Callable[[int], str | None] = lambda h: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.node_of = node_of
        self._clock = clock
        self._batcher = EventBatcher(settings.max_events, settings.batch_ms)
        self._replay_buf = ReplayBuffer(settings.buffer_steps)
        self._queue: queue.Queue[KVEvent | threading.Event | None] = queue.Queue(
            settings.max_queue_events)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._next_seq = 0
        self._topic = settings.topic.encode()
        self.endpoint = ""
        self.replay_endpoint = ""
        self.num_batches = 0
        self.num_dropped = 0

    # ---- loop side ---------------------------------------------------------------------
    def replicas_changed(self, namespace_id: bytes, keys: Sequence[bytes], *, holder: int,
                         tier: Tier, visible: bool) -> None:
        """Record one change (IndexObserver); never blocks."""
        node_id = self.node_of(holder)
        if node_id is None:
            self.num_dropped += len(keys)
            log.warning("kv_event_unknown_holder", holder=holder, num_blocks=len(keys))
            return
        make = stored_event if visible else removed_event
        self._put(make(list(keys), node_id=node_id, tier=tier, namespace_id=namespace_id))

    def new_term(self) -> None:
        """A new term's index starts empty: publish AllBlocksCleared (before its events)."""
        self._put(AllBlocksCleared())

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Send every event recorded before this call now, batch due or not (blocks the
        caller until the thread did, up to ``timeout_s``; tests and shutdown).

        Returns:
            True once sent; False on timeout or when the publisher is not running.
        """
        if self._thread is None:
            return False
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def _put(self, event: KVEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.num_dropped += _num_blocks(event)
            log.warning("kv_event_queue_full", max_queue_events=self.settings.max_queue_events)

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Bind the sockets and start the thread (idempotent).

        Raises:
            ConfigInvalid: an endpoint cannot be bound.
        """
        if self._thread is not None:
            return
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        self.endpoint = _bind(pub, self.settings.endpoint, "master.events_endpoint")
        self._pub = pub
        if self.settings.replay_endpoint:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            try:
                self.replay_endpoint = _bind(router, self.settings.replay_endpoint,
                                             "master.events_replay_endpoint")
            except ConfigInvalid:
                router.close()
                pub.close()
                self._pub = None
                raise
            self._router = router
        self._thread = threading.Thread(target=self._run, name="kvstored-kv-events",
                                        daemon=True)
        self._thread.start()
        log.info("kv_events_started", endpoint=self.endpoint,
                 replay_endpoint=self.replay_endpoint)

    def stop(self, timeout_s: float = 2.0) -> None:
        """Send what is pending, stop the thread, close the sockets (idempotent)."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._thread = None
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None

    # ---- thread side ---------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        if self._router is not None:
            poller.register(self._router, zmq.POLLIN)
        stopping = False
        while not stopping:
            if self._router is not None and dict(poller.poll(0)):
                self._serve_replay()
            wait = self._batcher.due_in_s(self._clock())
            ev: KVEvent | threading.Event | None
            try:
                ev = self._queue.get(timeout=min(wait if wait is not None else 0.05, 0.05))
            except queue.Empty:
                ev = _NOTHING
            while ev is not _NOTHING:
                if ev is None:
                    stopping = True
                    break
                if isinstance(ev, threading.Event):
                    if self._batcher.num_pending_blocks:
                        self._send(self._batcher.take_all())
                    ev.set()
                    ev = _NOTHING
                    continue
                for batch in self._batcher.add(ev, self._clock()):
                    self._send(batch)
                try:
                    ev = self._queue.get_nowait()
                except queue.Empty:
                    ev = _NOTHING
            due = (self._batcher.take_all() if stopping
                   else self._batcher.take_due(self._clock()))
            if due:
                self._send(due)

    def _send(self, events: list[KVEvent]) -> None:
        assert self._pub is not None
        seq = self._next_seq
        self._next_seq += 1
        payload = encode_batch(KVEventBatch(ts=time.time(), events=events))
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._replay_buf.append(seq, payload)
        self.num_batches += 1

    def _serve_replay(self) -> None:
        assert self._router is not None
        frames = self._router.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("kv_event_replay_request_invalid", num_frames=len(frames))
            return
        ident, _, start = frames
        for seq, payload in self._replay_buf.since(int.from_bytes(start, "big")):
            self._router.send_multipart((ident, b"", self._topic, seq.to_bytes(8, "big"),
                                         payload))
        self._router.send_multipart((ident, b"", b"", END_SEQ, b""))


_NOTHING = AllBlocksCleared()  # "the queue was empty" marker (compared by identity)
