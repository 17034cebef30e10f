"""Subscribe to the master's KV events (vLLM's format; kvstored/master/events.py).

:class:`EventSubscriber` connects a SUB socket to the master's ``events_endpoint`` and,
with a replay endpoint, fills gaps from it: it asks for every batch from the first seq it
wants (``from_seq``, or the one after the last it saw when a live batch skips ahead), reads
the answers until END_SEQ, then goes on with the live stream, skipping batches it already
has. So a subscriber that starts late (or misses messages: PUB drops what a slow or
not-yet-connected subscriber cannot take) still sees every batch the master's buffer holds,
each once and in seq order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import zmq

from kvstored.errors import DeadlineExceeded, InvalidArgument
from kvstored.kv_events import END_SEQ, KVEventBatch, decode_batch


def _check_endpoint(endpoint: str, what: str) -> str:
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise InvalidArgument(f"{what} must be a ZeroMQ address such as tcp://HOST:PORT, "
                              f"got {endpoint!r}")
    return endpoint


class EventSubscriber:
    """A consumer of one master's KV-event stream.

    Args:
        endpoint: the master's PUB address (``tcp://HOST:PORT``).
        replay_endpoint: its ROUTER replay address, or None (no gap filling).
        topic: the topic prefix to subscribe to ("" = all).

    Raises:
        InvalidArgument: an address that is not a ZeroMQ one.

    Not thread-safe (one thread owns the sockets); close with :meth:`close`.
    """

    def __init__(self, endpoint: str, replay_endpoint: str | None = None,
                 topic: str = "") -> None:
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(_check_endpoint(endpoint, "--endpoint"))
        self._replay_endpoint = (_check_endpoint(replay_endpoint, "--replay-endpoint")
                                 if replay_endpoint else None)

    def close(self) -> None:
        """Close the sockets (idempotent)."""
        self._sub.close(linger=0)

    def __enter__(self) -> EventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def replay(self, start_seq: int, timeout_s: float = 5.0) -> list[tuple[int, KVEventBatch]]:
        """Every buffered batch with seq >= ``start_seq``, oldest first (one request).

        Raises:
            InvalidArgument: no replay endpoint, or a payload that is not a KV event batch.
            DeadlineExceeded: no END_SEQ within ``timeout_s``.
        """
        if self._replay_endpoint is None:
            raise InvalidArgument("replay needs --replay-endpoint (the master's "
                                  "events_replay_endpoint)")
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self._replay_endpoint)
            sock.send_multipart((b"", start_seq.to_bytes(8, "big")))
            out: list[tuple[int, KVEventBatch]] = []
            deadline = time.monotonic() + timeout_s
            while True:
                left_ms = int(max(0.0, deadline - time.monotonic()) * 1e3)
                if not sock.poll(left_ms):
                    raise DeadlineExceeded(f"no end of replay from {self._replay_endpoint} "
                                           f"within {timeout_s} s")
                frames = sock.recv_multipart()
                if len(frames) != 4:
                    raise InvalidArgument(f"replay answer of {len(frames)} frames "
                                          "(expected 4: empty, topic, seq, payload)")
                _, _, seq_b, payload = frames
                if seq_b == END_SEQ:
                    return out
                out.append((int.from_bytes(seq_b, "big"), decode_batch(payload)))
        finally:
            sock.close(linger=0)

    def batches(self, *, from_seq: int | None = None, count: int | None = None,
                timeout_s: float | None = None) -> Iterator[tuple[int, KVEventBatch]]:
        """(seq, batch) in seq order, each once.

        Args:
            from_seq: replay from this seq first (needs a replay endpoint); None = live
                batches only (gaps in them are still filled when a replay endpoint is set).
            count: stop after this many batches (None = never).
            timeout_s: stop when no batch came for this long (None = wait forever).

        Raises:
            InvalidArgument / DeadlineExceeded: as :meth:`replay`.
        """
        n = 0
        want = from_seq  # next seq wanted (None: take the first live one)
        if from_seq is not None:
            for seq, batch in self.replay(from_seq):
                if want is not None and seq < want:
                    continue
                yield seq, batch
                want = seq + 1
                n += 1
                if count is not None and n >= count:
                    return
        while count is None or n < count:
            if not self._sub.poll(None if timeout_s is None else int(timeout_s * 1e3)):
                return
            frames = self._sub.recv_multipart()
            if len(frames) != 3:
                continue
            seq = int.from_bytes(frames[1], "big")
            if want is not None and seq < want:
                continue  # already had it (from a replay)
            if want is not None and seq > want and self._replay_endpoint is not None:
                for rseq, rbatch in self.replay(want):
                    if rseq < want or rseq >= seq:
                        continue
                    yield rseq, rbatch
                    want = rseq + 1
                    n += 1
                    if count is not None and n >= count:
                        return
            yield seq, decode_batch(frames[2])
            want = seq + 1
            n += 1
