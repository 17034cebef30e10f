"""A data-plane GET that fails part-way keeps the items that arrived whole.

A real DataPlaneServer over loopback in front of a NodeCore (DRAM only), one block per GET
chunk, so its ``get_before_send(start)`` hook runs before each item goes out: the test
breaks the connection there (the hook raises), or holds it there until the client's
deadline passed. The torn-item case cuts the connection in the middle of an item's payload
(the server's ``send_all`` sends half of it, then fails). No sleeps: a hold waits on an
Event under a hang guard.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from helpers import key, tear_payload_at

from kvstored.config import NodeConfig
from kvstored.errors import DeadlineExceeded, TransferFailed
from kvstored.node.core import NodeCore
from kvstored.tiers.tiered import TieredStore
from kvstored.transport import tcp_server
from kvstored.transport.base import GetItem, completed_items
from kvstored.transport.tcp import DataPlaneClient
from kvstored.transport.tcp_server import DataPlaneServer

BLOCK = 64 << 10
M = 24
N = 10
HANG_GUARD_S = 10.0


def value(i: int) -> bytes:
    return bytes([(i * 7 + 1) % 251]) * (BLOCK // 2 + i)


class Node:
    """A source node: its core holds blocks 0..M-1, its data plane sends one per chunk and
    calls ``on_before_send(start)`` before each."""

    def __init__(self) -> None:
        cfg = NodeConfig(node_id="src", dram_size_bytes=8 << 20, ssd_size_bytes=0,
                         max_block_bytes=BLOCK, max_batch_keys=64)
        store = TieredStore(dram_size_bytes=8 << 20, arena_dir=None, max_block_bytes=BLOCK)
        self.core = NodeCore(store, cfg, epoch=7)
        self.core.put_inline([(key(i), value(i), b"m") for i in range(M)], b"")
        self.on_before_send: Any = None
        self.server = DataPlaneServer(self.core, "127.0.0.1:0", hook=self._hook)
        self.server.get_chunk_keys = 1
        self.address = self.server.start()

    def _hook(self, event: str, **fields: Any) -> None:
        if event == "get_before_send" and self.on_before_send is not None:
            self.on_before_send(fields["start"])

    def close(self) -> None:
        self.server.stop(0.0)
        self.core.store.close()


@pytest.fixture
def node() -> Iterator[Node]:
    n = Node()
    yield n
    n.close()


class Buffers:
    """A sink into one bytearray per index; remembers which indices it handed out."""

    def __init__(self, n: int) -> None:
        self.bufs: list[bytearray | None] = [None] * n

    def sink(self, i: int, size: int, meta: bytes) -> memoryview:
        self.bufs[i] = bytearray(size)
        return memoryview(self.bufs[i])  # type: ignore[arg-type]


def _break_at(n: int) -> Any:
    def hook(start: int) -> None:
        if start == n:
            raise ConnectionResetError("test: connection broken after the items before it")
    return hook


def _assert_kept(done: Sequence[GetItem | None], bufs: Buffers, kept: Sequence[int]) -> None:
    for i, it in enumerate(done):
        if i in kept:
            assert it is not None and it.found and it.size_bytes == len(value(i)), i
            assert bytes(bufs.bufs[i] or b"") == value(i), i
        else:
            assert it is None, i


def test_a_broken_connection_keeps_the_items_received_before_it(node: Node) -> None:
    node.on_before_send = _break_at(N)
    client = DataPlaneClient(node.address, max_block_bytes=BLOCK)
    bufs = Buffers(M)
    try:
        with pytest.raises(TransferFailed) as info:
            client.get([key(i) for i in range(M)], b"", bufs.sink,
                       deadline=time.monotonic() + HANG_GUARD_S)
    finally:
        client.close()
    done = completed_items(info.value, M)
    _assert_kept(done, bufs, range(N))  # N kept with the source's bytes, M - N missing


def test_a_passed_deadline_keeps_the_items_received_before_it(node: Node) -> None:
    release = threading.Event()
    node.on_before_send = lambda start: (release.wait(HANG_GUARD_S) if start == N else None)
    client = DataPlaneClient(node.address, max_block_bytes=BLOCK)
    bufs = Buffers(M)
    try:
        with pytest.raises(DeadlineExceeded) as info:
            client.get([key(i) for i in range(M)], b"", bufs.sink,
                       deadline=time.monotonic() + 0.5)  # the hold outlasts it
    finally:
        release.set()
        client.close()
    _assert_kept(completed_items(info.value, M), bufs, range(N))


def test_an_item_torn_mid_payload_is_never_reported_received(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.on_before_send = tear_payload_at(monkeypatch, tcp_server, N)
    client = DataPlaneClient(node.address, max_block_bytes=BLOCK)
    bufs = Buffers(M)
    try:
        with pytest.raises(TransferFailed) as info:
            client.get([key(i) for i in range(M)], b"", bufs.sink,
                       deadline=time.monotonic() + HANG_GUARD_S)
    finally:
        client.close()
    done = completed_items(info.value, M)
    assert bufs.bufs[N] is not None  # its payload had started into the sink's view...
    _assert_kept(done, bufs, range(N))  # ...but it is not reported: torn


def test_a_split_get_that_fails_keeps_what_every_stream_received_whole(node: Node) -> None:
    lock = threading.Lock()
    broke = [False]

    def break_once(start: int) -> None:
        with lock:
            if start != 3 or broke[0]:
                return
            broke[0] = True
        raise ConnectionResetError("test: one stream's connection broken")

    node.on_before_send = break_once
    client = DataPlaneClient(node.address, max_block_bytes=BLOCK, max_streams=2,
                             stream_min_bytes=1)  # 4 runs of 6 keys on 2 streams
    bufs = Buffers(M)
    try:
        with pytest.raises(TransferFailed) as info:
            client.get([key(i) for i in range(M)], b"", bufs.sink,
                       deadline=time.monotonic() + HANG_GUARD_S,
                       size_hints=[len(value(i)) for i in range(M)])
    finally:
        client.close()
    done = completed_items(info.value, M)
    kept = [i for i, it in enumerate(done) if it is not None]
    assert len(kept) >= 3  # at least the broken run's first 3 items
    _assert_kept(done, bufs, kept)


def test_a_peer_export_streams_in_small_chunks_so_a_late_failure_keeps_the_head(node: Node) -> None:
    # A peer's export GET (the read RemoteReads makes) at the server's default chunking: the
    # blocks go out a few at a time as they are read, not all at the end, so a transfer that
    # breaks late still leaves the reader the blocks before the break.
    node.server.get_chunk_keys = tcp_server.GET_CHUNK_KEYS  # the defaults, not the fixture's 1
    node.server.export_chunk_keys = tcp_server.EXPORT_CHUNK_KEYS
    starts: list[int] = []
    last = (M - 1) // tcp_server.EXPORT_CHUNK_KEYS * tcp_server.EXPORT_CHUNK_KEYS

    def record_and_break_at_last(start: int) -> None:
        starts.append(start)
        if start == last:
            raise ConnectionResetError("test: connection broken before the last chunk")

    node.on_before_send = record_and_break_at_last
    client = DataPlaneClient(node.address, max_block_bytes=BLOCK, peer_export=True)
    bufs = Buffers(M)
    try:
        with pytest.raises(TransferFailed) as info:
            client.get([key(i) for i in range(M)], b"", bufs.sink,
                       deadline=time.monotonic() + HANG_GUARD_S)
    finally:
        client.close()
    assert starts == list(range(0, last + 1, tcp_server.EXPORT_CHUNK_KEYS))
    _assert_kept(completed_items(info.value, M), bufs, range(last))
