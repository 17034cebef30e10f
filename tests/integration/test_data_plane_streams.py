"""A large data-plane GET split over several streams (kvstored/transport/tcp_streams.py).

A DataPlaneServer over loopback in front of a NodeCore over a DRAM-only TieredStore; between
client and server a byte-exact proxy that can hold one connection's response (until the test
releases it) or cut it after a chosen number of bytes, picked by a key in the request. No
sleeps: every wait is on an Event or a polled condition under a hang guard.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from it_helpers import random_keys, value_for, wait_until

from kvstored.addresses import parse_host_port
from kvstored.config import NodeConfig
from kvstored.errors import TransferFailed
from kvstored.node.core import NodeCore
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.framing import GET_ITEM_GEN, HEADER, RANGE, RANGE_TO_END
from kvstored.transport.tcp import DataPlaneClient
from kvstored.transport.tcp_server import DataPlaneServer

MIB = 1 << 20
BLOCK = MIB
HANG_GUARD_S = 10.0


class Proxy:
    """Forwards data-plane connections to ``target``; per connection, by its first request:

    - its body holds ``cut_key``: forward ``cut_after`` response bytes, then close both sides;
    - its body holds ``hold_key``: hold the request (the node does not see it) until
      ``release`` is set, then forward it.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.cut_key: bytes | None = None
        self.cut_after = 0
        self.hold_key: bytes | None = None
        self.release = threading.Event()
        self.held = threading.Event()  # a held request is waiting at the proxy
        self.cut = threading.Event()  # a cut connection was closed mid-response
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.lsock.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            t.start()
            self._threads.append(t)

    @staticmethod
    def _recv_exact(s: socket.socket, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = s.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def _serve(self, c: socket.socket) -> None:
        u = socket.create_connection(parse_host_port(self.target))
        self._socks += [c, u]
        try:
            head = self._recv_exact(c, HEADER.size)
            body = self._recv_exact(c, HEADER.unpack(head)[5])
            cut = self.cut_key is not None and self.cut_key in body
            if self.hold_key is not None and self.hold_key in body:
                self.held.set()
                self.release.wait(HANG_GUARD_S)
            u.sendall(head + body)
            sent = 0
            while True:
                want = 1 << 16
                if cut:
                    want = min(want, self.cut_after - sent)
                    if want <= 0:
                        self.cut.set()  # before the client can see the cut
                        c.shutdown(socket.SHUT_RDWR)
                        return
                data = u.recv(want)
                if not data:
                    return
                c.sendall(data)
                sent += len(data)
        except OSError:
            return
        finally:
            c.close()
            u.close()

    def close(self) -> None:
        self.release.set()
        self.lsock.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()


@pytest.fixture
def plane() -> Iterator[Any]:
    cfg = NodeConfig(node_id=f"st-{uuid.uuid4().hex[:8]}", dram_size_bytes=64 * MIB,
                     ssd_size_bytes=0, max_block_bytes=4 * MIB, log_level="warning")
    store = TieredStore.from_config(cfg)
    core = NodeCore(store, cfg, epoch=1)
    done: list[int] = []  # codes of finished requests (the hook runs on the server's threads)
    server = DataPlaneServer(
        core, "127.0.0.1:0",
        hook=lambda ev, **f: done.append(f["code"]) if ev == "request_done" else None,
    )
    server.start()
    proxy = Proxy(server.address)
    server.done = done  # type: ignore[attr-defined]
    yield store, server, proxy
    proxy.close()
    server.stop(0)
    store.close()


def _put(store: TieredStore, n: int) -> tuple[list[bytes], list[bytes]]:
    keys = random_keys(n)
    values = [value_for(k, BLOCK) for k in keys]
    for k, v in zip(keys, values, strict=True):
        assert store.put(k, v)
    return keys, values


def test_a_split_get_lands_every_block_in_its_own_buffer(plane: Any) -> None:
    store, server, _ = plane
    keys, values = _put(store, 8)
    bufs = [bytearray(BLOCK) for _ in keys]
    before = server.counters().requests
    dp = DataPlaneClient(server.address, max_streams=2, stream_min_bytes=2 * MIB)
    try:
        got = dp.get(keys, b"", lambda i, size, meta: memoryview(bufs[i]),
                     deadline=time.monotonic() + 30, size_hints=[BLOCK] * len(keys))
        assert dp.num_split_gets == 1
        assert server.counters().requests - before == 4  # one request per 2 MiB run
        assert [g.found for g in got] == [True] * len(keys)
        assert [g.generation > 0 for g in got] == [True] * len(keys)
        assert [bytes(b) for b in bufs] == values  # each block in its own buffer, whole
        # No hints: the running average of what this client received plans the split.
        bufs = [bytearray(BLOCK) for _ in keys]
        dp.get(keys, b"", lambda i, size, meta: memoryview(bufs[i]), deadline=time.monotonic() + 30)
        assert dp.num_split_gets == 2
        assert [bytes(b) for b in bufs] == values
    finally:
        dp.close()
    wait_until(lambda: store.stats().pinned_blocks == 0, what="the node to release its pins")


def test_a_split_get_mixes_hits_and_misses_in_key_order(plane: Any) -> None:
    store, server, _ = plane
    keys, values = _put(store, 6)
    absent = random_keys(2)
    asked = [keys[0], absent[0], *keys[1:4], absent[1], *keys[4:]]
    bufs = {i: bytearray(BLOCK) for i in range(len(asked))}
    dp = DataPlaneClient(server.address, max_streams=3, stream_min_bytes=MIB)
    try:
        got = dp.get(asked, b"", lambda i, size, meta: memoryview(bufs[i]),
                     deadline=time.monotonic() + 30, size_hints=[BLOCK] * len(asked))
    finally:
        dp.close()
    assert dp.num_split_gets == 1
    assert [g.found for g in got] == [k not in absent for k in asked]
    assert [bytes(bufs[i]) for i, k in enumerate(asked) if k not in absent] == values


@pytest.mark.parametrize("torn", [0, 1])
def test_one_stream_torn_mid_payload_fails_the_whole_get_and_stops_the_other(
    plane: Any, torn: int
) -> None:
    """Stream ``torn`` is cut in the middle of its first payload while the other stream's
    response is held back by the proxy: get() must fail with TransferFailed (no item reported
    found) and return without waiting for the held stream, which only the abort (shutting
    down its socket) can end."""
    store, server, proxy = plane
    keys, _ = _put(store, 2)  # two runs of one block, one per stream
    proxy.cut_key = keys[torn]
    proxy.cut_after = HEADER.size + GET_ITEM_GEN.size + BLOCK // 2  # half of the block
    proxy.hold_key = keys[1 - torn]
    handed: list[int] = []

    def sink(i: int, size: int, meta: bytes) -> memoryview:
        handed.append(i)
        return memoryview(bytearray(size))

    dp = DataPlaneClient(proxy.address, max_streams=2, stream_min_bytes=BLOCK)
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(dp.get(keys, b"", sink, deadline=time.monotonic() + 60,
                                  size_hints=[BLOCK] * 2))
        except Exception as exc:  # noqa: BLE001  (the assertion below names it)
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    try:
        t.start()
        assert proxy.held.wait(HANG_GUARD_S), "the held stream's request never reached the node"
        t.join(HANG_GUARD_S)
        assert not t.is_alive(), "get() waited for the held stream instead of stopping it"
        assert proxy.cut.is_set()
        assert len(outcome) == 1 and isinstance(outcome[0], TransferFailed), outcome
        assert "sibling" not in str(outcome[0])  # the torn stream's own error is reported
        assert handed == [torn]  # the torn block was being written; nothing was returned
    finally:
        proxy.release.set()
        dp.close()
    wait_until(lambda: store.stats().pinned_blocks == 0, what="the node to release its pins")


def test_a_lone_large_block_is_read_as_ranges_into_its_one_buffer(plane: Any) -> None:
    store, server, _ = plane
    keys, values = _put(store, 1)
    before = server.counters().requests
    asked: list[tuple[int, int]] = []
    buf = bytearray(BLOCK)

    def sink(i: int, size: int, meta: bytes) -> memoryview:
        asked.append((i, size))
        return memoryview(buf)

    # 3 streams, 256 KiB minimum, the hint 1.5x the block: ranges of 512 KiB, the last one
    # empty (the block is smaller than the hint); every byte still lands once, in order.
    dp = DataPlaneClient(server.address, max_streams=3, stream_min_bytes=BLOCK // 4)
    try:
        got = dp.get(keys, b"", sink, deadline=time.monotonic() + 30, size_hints=[BLOCK * 3 // 2])
    finally:
        dp.close()
    assert dp.num_split_gets == 1
    assert server.counters().requests - before == 3  # one request per range
    assert asked == [(0, BLOCK)]  # one sink call for the block, whatever the ranges
    assert got[0].found and got[0].size_bytes == BLOCK and got[0].generation > 0
    assert bytes(buf) == values[0]
    wait_until(lambda: store.stats().pinned_blocks == 0, what="the node to release its pins")


def test_a_block_replaced_between_its_range_pins_is_a_miss(plane: Any) -> None:
    """The second range's request is held at the proxy until the first range was served
    and the block replaced by other bytes (a new replica, a new generation): the ranges
    come from two replicas, so the block must be a miss, never a mix of the two."""
    store, server, proxy = plane
    keys, values = _put(store, 1)
    proxy.hold_key = RANGE.pack(BLOCK // 2, RANGE_TO_END)  # the second range's request
    buf = bytearray(BLOCK)
    dp = DataPlaneClient(proxy.address, max_streams=2, stream_min_bytes=BLOCK // 2)
    outcome: list[object] = []

    def run() -> None:
        outcome.append(dp.get(keys, b"", lambda i, size, meta: memoryview(buf),
                              deadline=time.monotonic() + 60, size_hints=[BLOCK]))

    t = threading.Thread(target=run, daemon=True)
    try:
        t.start()
        assert proxy.held.wait(HANG_GUARD_S), "the second range never reached the proxy"
        wait_until(lambda: server.done == [0], what="the first range to be served")
        assert store.remove(keys) == [True]
        other = value_for(keys[0][::-1], BLOCK)
        assert store.put(keys[0], other)
        proxy.release.set()
        t.join(HANG_GUARD_S)
        assert not t.is_alive()
    finally:
        proxy.release.set()
        dp.close()
    got = outcome[0]
    assert isinstance(got, list) and not got[0].found, got  # not a mix of two replicas
    assert bytes(buf[: BLOCK // 2]) == values[0][: BLOCK // 2]  # the first range landed
    assert not any(buf[BLOCK // 2 :])  # the other replica's range was skipped, not written


def test_a_node_refusing_ranges_is_read_whole_from_then_on(
    plane: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvstored.transport import framing

    store, server, _ = plane
    keys, values = _put(store, 1)
    # An older node knows GET flags 1, 2 and 4 only: it refuses 8 and closes the connection.
    monkeypatch.setattr(framing, "GET_FLAGS", 1 | 2 | 4)
    buf = bytearray(BLOCK)
    dp = DataPlaneClient(server.address, max_streams=2, stream_min_bytes=BLOCK // 2)
    try:
        got = dp.get(keys, b"", lambda i, size, meta: memoryview(buf),
                     deadline=time.monotonic() + 30, size_hints=[BLOCK])
        assert got[0].found and bytes(buf) == values[0]  # read whole after the refusal
        assert not dp.ranges_ok and dp.num_split_gets == 0
        assert server.counters().rejected_frames >= 1  # (the sibling may be stopped first)
        # Even once the node would take ranges, this client reads it whole from now on.
        monkeypatch.setattr(framing, "GET_FLAGS", 1 | 2 | 4 | 8)
        buf[:] = bytes(BLOCK)
        got = dp.get(keys, b"", lambda i, size, meta: memoryview(buf),
                     deadline=time.monotonic() + 30, size_hints=[BLOCK])
        assert got[0].found and bytes(buf) == values[0]
        assert dp.num_split_gets == 0
    finally:
        dp.close()
