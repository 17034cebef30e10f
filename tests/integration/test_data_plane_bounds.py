"""A bounded data plane (issue 6, section 3), driven with raw sockets.

A DataPlaneServer over loopback in front of a NodeCore over a TieredStore with the SSD tier
on. Server behaviour is observed through its hook events (a queue the test waits on with a
bounded timeout) and counters, never through sleeps.
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from it_helpers import random_keys, value_for, wait_until

from kvstored.addresses import parse_host_port
from kvstored.config import NodeConfig
from kvstored.errors import ErrorCode, TransferFailed
from kvstored.node.core import NodeCore
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.tcp import DataPlaneClient
from kvstored.transport.tcp_server import DataPlaneServer

HEADER = struct.Struct("<4sBBHII")
GET_ITEM = struct.Struct("<HBBQIH")
GET_ITEM_GEN = struct.Struct("<HBBQIHQ")  # what DataPlaneClient asks for (GET_FLAG_GENERATION)
EVENT_WAIT_S = 10.0  # a hang guard; every assertion is on what the server did, not on time
MIB = 1 << 20


@dataclass
class Plane:
    store: TieredStore
    core: NodeCore
    server: DataPlaneServer
    events: queue.Queue[tuple[str, dict[str, Any]]]

    def connect(self) -> socket.socket:
        return socket.create_connection(parse_host_port(self.server.address), timeout=EVENT_WAIT_S)

    def next_event(self, name: str) -> dict[str, Any]:
        """The next event called ``name`` (earlier other events are dropped)."""
        deadline = time.monotonic() + EVENT_WAIT_S
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"the server did not report {name!r} within {EVENT_WAIT_S} s"
            try:
                ev, fields = self.events.get(timeout=left)
            except queue.Empty:
                raise AssertionError(f"the server did not report {name!r} within {EVENT_WAIT_S} s") from None
            if ev == name:
                return fields

    def dram_used(self) -> int:
        return self.store.stats().tiers[0].used_bytes

    def ssd_blocks(self) -> int:
        return self.store.stats().tiers[1].num_blocks


@pytest.fixture
def make_plane() -> Iterator[Any]:
    made: list[Plane] = []
    dirs: list[str] = []

    def factory(*, request_timeout_s: float = 30.0, **overrides: Any) -> Plane:
        d = tempfile.mkdtemp(prefix="kvdp", dir="/tmp")
        dirs.append(d)
        fields: dict[str, Any] = {
            "node_id": f"dp-{uuid.uuid4().hex[:8]}",
            "dram_size_bytes": 8 * MIB,
            "ssd_dir": os.path.join(d, "ssd"),
            "ssd_size_bytes": 64 * MIB,
            "ssd_direct_io": False,
            "max_block_bytes": 4 * MIB,
            "max_batch_keys": 64,
            "log_level": "warning",
        }
        fields.update(overrides)
        cfg = NodeConfig(**fields)
        store = TieredStore.from_config(cfg)
        core = NodeCore(store, cfg, epoch=1)
        events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        server = DataPlaneServer(
            core, "127.0.0.1:0", request_timeout_s=request_timeout_s,
            hook=lambda ev, **f: events.put((ev, f)),
        )
        server.start()
        plane = Plane(store, core, server, events)
        made.append(plane)
        return plane

    yield factory
    for p in made:
        p.server.stop(0)
        p.store.close()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def put_frame(keys: list[bytes], sizes: list[int], ns: bytes = b"") -> bytes:
    body = struct.pack("<H", len(ns)) + ns
    for k, n in zip(keys, sizes, strict=True):
        body += struct.pack("<H", len(k)) + k + struct.pack("<QI", n, 0)
    return HEADER.pack(b"KVDP", 1, 2, 0, len(keys), len(body)) + body


def get_frame(keys: list[bytes]) -> bytes:
    body = struct.pack("<H", 0) + b"".join(struct.pack("<H", len(k)) + k for k in keys)
    return HEADER.pack(b"KVDP", 1, 1, 0, len(keys), len(body)) + body


def recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, f"connection closed after {len(out)} of {n} bytes"
        out += chunk
    return out


def read_error_then_eof(s: socket.socket) -> tuple[int, str]:
    """A whole-request error response, then the server closes the connection."""
    _magic, _v, _op, status, _count, body_len = HEADER.unpack(recv_exact(s, HEADER.size))
    msg = recv_exact(s, body_len).decode()
    assert s.recv(10) == b"", "the server should close the connection after a refused frame"
    return status, msg


# ---- announced counts and sizes are bounded before any allocation -----------------------------


def test_count_over_max_batch_keys_is_refused_before_the_body(make_plane: Any) -> None:
    p = make_plane(max_batch_keys=64)
    with p.connect() as s:
        s.sendall(HEADER.pack(b"KVDP", 1, 1, 0, 65, 200))  # the body is never sent
        status, msg = read_error_then_eof(s)
    assert status == ErrorCode.BATCH_TOO_LARGE and "65 items" in msg and "max_batch_keys" in msg
    assert p.server.counters().rejected_frames == 1


@pytest.mark.parametrize(("op", "flags"), [(1, 32), (1, 6), (1, 18), (1, 24), (1, 0x8000),
                                           (2, 0x8000), (2, 3), (2, 4)])
def test_unknown_request_flags_are_refused(make_plane: Any, op: int, flags: int) -> None:
    """Unknown bits, GET flags 2 (fill from peers) and 4 (peer export) together, GET flag 16
    (a probe) with 2 or 8 (ranges), any PUT flag but the replication factor's bits,
    PUT_FLAG_HANDOFF (1) and PUT_FLAG_SPARE (2), and those two together."""
    p = make_plane()
    with p.connect() as s:
        s.sendall(HEADER.pack(b"KVDP", 1, op, flags, 1, 18))
        status, msg = read_error_then_eof(s)
    assert status == ErrorCode.INVALID_ARGUMENT and f"flags {flags:#x}" in msg
    assert p.server.counters().rejected_frames == 1


def test_a_get_with_the_generation_flag_gets_longer_item_headers(make_plane: Any) -> None:
    p = make_plane()
    k = random_keys(2)
    p.core.put_inline([(k[0], b"v" * 100, b"")], b"")
    frame = get_frame(k)
    with p.connect() as s:
        _m, v, op, _flags, count, body_len = HEADER.unpack(frame[:HEADER.size])
        s.sendall(HEADER.pack(b"KVDP", v, op, 1, count, body_len)  # GET_FLAG_GENERATION
                  + frame[HEADER.size:])
        _m, _v, _op, status, count, _bl = HEADER.unpack(recv_exact(s, HEADER.size))
        assert (status, count) == (0, 2)
        code, _tier, found, size, meta_len, msg_len, gen = GET_ITEM_GEN.unpack(
            recv_exact(s, GET_ITEM_GEN.size))
        blocks, _ = p.store.list_blocks()
        stamped = blocks[0].generations[0]  # what the node reported to the master
        assert stamped > 0
        assert (code, found, size, meta_len, msg_len, gen) == (0, 1, 100, 0, 0, stamped)
        assert recv_exact(s, 100) == b"v" * 100
        assert GET_ITEM_GEN.unpack(recv_exact(s, GET_ITEM_GEN.size))[2] == 0  # the miss


def test_only_a_get_with_the_fill_flag_asks_the_nodes_peers_first(make_plane: Any) -> None:
    p = make_plane()
    k = random_keys(2)
    here = b"h" * 64
    p.core.put_inline([(k[0], here, b"")], b"")
    asked: list[tuple[list[bytes], bytes, float | None]] = []

    def fill(keys: list[bytes], namespace_id: bytes, *, remaining_s: float | None,
             **_: object) -> None:
        asked.append((list(keys), namespace_id, remaining_s))
        p.core.put_inline([(k[1], b"r" * 64, b"")], b"")  # as a copy from a peer would

    p.server.fill_from_peers = fill
    plain = DataPlaneClient(p.server.address)  # a node reading a peer: never the flag
    engine = DataPlaneClient(p.server.address, fill_from_peers=True)
    try:
        def sink(i: int, size: int, meta: bytes) -> memoryview:
            return memoryview(bytearray(size))

        items = plain.get(k, b"", sink, deadline=time.monotonic() + EVENT_WAIT_S)
        assert [it.found for it in items] == [True, False] and asked == []  # no remote reads
        items = engine.get(k, b"", sink, deadline=time.monotonic() + EVENT_WAIT_S)
        assert [it.found for it in items] == [True, True]  # filled before it was pinned
        assert len(asked) == 1 and asked[0][:2] == (k, b"")
        assert asked[0][2] is not None and 0 < asked[0][2] <= 30.0  # within the request's deadline
        assert p.next_event("get_filled") == {"num_keys": 2}
    finally:
        plain.close()
        engine.close()


def test_an_engine_get_streams_through_a_peers_block_its_node_has_no_room_to_keep(
    make_plane: Any,
) -> None:
    """Issue 17 section 3: a full node's fill receives a peer's block it cannot keep
    without dropping one into ``through`` (RemoteReads.fill); the engine's GET sends it
    from there (never cached), and a block no peer gave is still a miss."""
    p = make_plane()
    k = random_keys(3)
    p.core.put_inline([(k[0], b"h" * 64, b"")], b"")
    budgets: list[int] = []

    def fill(keys: list[bytes], namespace_id: bytes, *, remaining_s: float | None,
             through: dict[bytes, tuple[bytes, bytes] | None],
             through_budget_bytes: int) -> None:
        budgets.append(through_budget_bytes)
        through[k[1]] = (b"t" * 80, b"m")  # received, not kept: no room here

    p.server.fill_from_peers = fill
    engine = DataPlaneClient(p.server.address, fill_from_peers=True)
    try:
        got: dict[int, bytearray] = {}

        def sink(i: int, size: int, meta: bytes) -> memoryview:
            got[i] = bytearray(size)
            return memoryview(got[i])

        items = engine.get(k, b"", sink, deadline=time.monotonic() + EVENT_WAIT_S)
        assert [it.found for it in items] == [True, True, False]
        assert bytes(got[0]) == b"h" * 64 and bytes(got[1]) == b"t" * 80
        assert items[1].meta == b"m"
        assert budgets and budgets[0] > 0
        assert p.core.store.exists(k, namespace_id=b"") == [True, False, False]  # not cached
        assert p.server.num_streamed_through == 1
    finally:
        engine.close()


@pytest.mark.parametrize("op", [1, 2])
def test_body_longer_than_its_items_can_be_is_refused_at_once(make_plane: Any, op: int) -> None:
    p = make_plane()
    with p.connect() as s:
        s.sendall(HEADER.pack(b"KVDP", 1, op, 0, 2, 0xFFFFFFFF))  # 4 GiB announced for 2 keys
        status, msg = read_error_then_eof(s)
    assert status == ErrorCode.INVALID_ARGUMENT and "4294967295-byte body" in msg
    assert p.server.counters().header_bytes_buffered == 0


def test_request_bodies_share_one_budget_over_all_connections(make_plane: Any) -> None:
    budget = 64 << 10
    p = make_plane(dataplane_max_header_bytes=budget, max_batch_keys=4096)
    keys = random_keys(1500)  # a GET body of 1500 x 18 + 2 = 27002 bytes
    frame = get_frame(keys)
    body_len = len(frame) - HEADER.size
    with p.connect() as a, p.connect() as b, p.connect() as c:
        a.sendall(frame[:HEADER.size])  # header only: holds its share while the body is due
        b.sendall(frame[:HEADER.size])
        wait_until(lambda: p.server.counters().header_bytes_buffered == 2 * body_len,
                   what="two request bodies to hold the budget")
        c.sendall(frame)  # a third does not fit: it must wait, not allocate
        assert p.next_event("header_budget_waited")["num_bytes"] == body_len
        assert p.server.counters().header_bytes_buffered == 2 * body_len
        a.close()  # the first gives its share back; the third proceeds and is answered
        _m, _v, _op, status, count, _bl = HEADER.unpack(recv_exact(c, HEADER.size))
        assert status == 0 and count == len(keys)
        items = recv_exact(c, GET_ITEM.size * len(keys))
        assert all(GET_ITEM.unpack_from(items, i * GET_ITEM.size)[2] == 0 for i in range(len(keys)))
    wait_until(lambda: p.server.counters().header_bytes_buffered == 0, what="the budget to be free")


@pytest.mark.parametrize("first_key", ["good", "bad"])
def test_put_announcing_a_2_62_byte_item_is_refused_at_once(make_plane: Any, first_key: str) -> None:
    p = make_plane(request_timeout_s=60.0)
    before = p.dram_used()
    keys = random_keys(2)
    if first_key == "bad":
        keys[0] = b"short"  # a skipped item's size counts too
    with p.connect() as s:
        t0 = time.monotonic()
        s.sendall(put_frame(keys, [1 << 62, 1024]))
        status, msg = read_error_then_eof(s)
        took_s = time.monotonic() - t0
    assert status == ErrorCode.BLOCK_TOO_LARGE and str((1 << 62) + 1024) in msg
    assert took_s < 30.0  # not the 60 s request deadline: refused on the header
    assert p.server.counters().rejected_frames == 1
    assert p.dram_used() == before and p.store.exists(keys) == [False, False]


def test_oversized_items_within_the_request_bound_are_skipped_and_the_stream_stays_in_sync(
    make_plane: Any,
) -> None:
    p = make_plane(max_block_bytes=1 * MIB)
    k_big, k_ok = random_keys(2)
    with p.connect() as s:
        s.sendall(put_frame([k_big, k_ok], [2 * MIB, 1000]) + bytes(2 * MIB) + value_for(k_ok, 1000))
        _m, _v, _op, status, count, body_len = HEADER.unpack(recv_exact(s, HEADER.size))
        body = recv_exact(s, body_len)
    assert status == 0 and count == 2
    code0, stored0, msg_len0 = struct.unpack_from("<HBH", body, 0)
    code1, stored1, _ = struct.unpack_from("<HBH", body, 5 + msg_len0)
    assert (code0, stored0) == (ErrorCode.BLOCK_TOO_LARGE, 0) and (code1, stored1) == (0, 1)
    assert p.store.get(k_ok) == (value_for(k_ok, 1000), b"")


# ---- a PUT reserves only as its payload arrives ------------------------------------------------


def test_a_put_header_alone_reserves_nothing_and_demotes_nothing(make_plane: Any) -> None:
    p = make_plane(dram_size_bytes=8 * MIB)
    fill = random_keys(8)
    for k in fill:  # DRAM full: any reservation would demote a block to SSD
        assert p.store.put(k, value_for(k, MIB))
    used, on_ssd = p.dram_used(), p.ssd_blocks()
    keys = random_keys(4)
    with p.connect() as s:
        s.sendall(put_frame(keys, [MIB] * 4))
        assert p.next_event("payload_awaited")["index"] == 0
        assert (p.dram_used(), p.ssd_blocks()) == (used, on_ssd)  # nothing reserved or demoted
        s.sendall(value_for(keys[0], MIB)[:1])
        assert p.next_event("item_reserved") == {"index": 0, "size_bytes": MIB}
        s.sendall(value_for(keys[0], MIB)[1:])
        assert p.next_event("payload_awaited")["index"] == 1
        assert p.ssd_blocks() == on_ssd + 1  # exactly one block made room for exactly one item
    assert p.next_event("request_done")["code"] == ErrorCode.TRANSFER_FAILED
    assert p.store.exists(keys) == [False] * 4
    assert p.dram_used() == used - MIB  # the aborted reservation is free again


# ---- a request has a deadline as a whole ---------------------------------------------------------


def _trickle(s: socket.socket, data: bytes, stop: threading.Event, sent: list[int]) -> None:
    for i in range(len(data)):
        if stop.wait(0.05):  # one byte every 50 ms, far below any per-recv timeout
            return
        try:
            s.send(data[i : i + 1])
        except OSError:
            return
        sent[0] = i + 1


def test_a_trickling_writer_loses_its_reservation_at_the_request_deadline(make_plane: Any) -> None:
    timeout_s = 1.0
    p = make_plane(request_timeout_s=timeout_s)
    key, other = random_keys(2)
    size = 64 << 10
    used = p.dram_used()
    stop, sent = threading.Event(), [0]
    with p.connect() as s:
        s.sendall(put_frame([key], [size]))
        t = threading.Thread(target=_trickle, args=(s, value_for(key, size), stop, sent), daemon=True)
        t0 = time.monotonic()
        t.start()
        try:
            p.next_event("item_reserved")
            done = p.next_event("request_done")
            held_s = time.monotonic() - t0
            assert done["code"] == ErrorCode.DEADLINE_EXCEEDED
            assert p.server.counters().deadline_exceeded == 1
            assert held_s < 10 * timeout_s
            assert 0 < sent[0] < size and t.is_alive()  # the peer was still trickling
            assert p.dram_used() == used and p.store.exists([key]) == [False]
            # The space is reused at once; the trickling peer's further bytes never land in it.
            v = value_for(other, size)
            assert p.store.put(other, v)
            n = sent[0]
            wait_until(lambda: sent[0] > n + 3 or not t.is_alive(), what="the peer to try more bytes")
            assert p.store.get(other) == (v, b"")
        finally:
            stop.set()
            t.join(5)


def test_a_stalled_reader_loses_its_pins_at_the_request_deadline(make_plane: Any) -> None:
    p = make_plane(request_timeout_s=1.0, dram_size_bytes=48 * MIB, max_block_bytes=4 * MIB)
    keys = random_keys(10)
    for k in keys:
        p.store.put(k, value_for(k, 4 * MIB))
    stop, got = threading.Event(), [0]

    def slow_read(s: socket.socket) -> None:  # 64 KiB every 5 ms: every sendmsg progresses
        while not stop.wait(0.005):
            try:
                n = len(s.recv(64 << 10))
            except OSError:
                return
            if not n:
                return
            got[0] += n

    with p.connect() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.sendall(get_frame(keys))  # 40 MiB due, read at ~13 MB/s: ~3 s in all
        t = threading.Thread(target=slow_read, args=(s,), daemon=True)
        t.start()
        try:
            p.next_event("request_started")
            done = p.next_event("request_done")
            assert done["code"] == ErrorCode.DEADLINE_EXCEEDED
            assert 0 < got[0] < 10 * 4 * MIB  # the reader was making progress, and was cut off
            assert p.store.stats().pinned_blocks == 0
            assert p.server.counters().deadline_exceeded == 1
        finally:
            stop.set()
            t.join(5)


def test_a_large_put_gets_time_for_its_payload_at_the_minimum_rate(make_plane: Any) -> None:
    # 0.2 s for any request, plus 4 MiB at 1 MiB/s: a writer pausing 0.5 s mid-payload (slower
    # than the base timeout, faster than the minimum rate) is not cut off.
    p = make_plane(request_timeout_s=0.2, dataplane_min_bytes_per_s=1 * MIB)
    keys = random_keys(4)
    values = [value_for(k, MIB) for k in keys]
    with p.connect() as s:
        s.sendall(put_frame(keys, [MIB] * 4) + values[0])
        assert p.next_event("payload_awaited")["index"] == 0
        assert p.next_event("payload_awaited")["index"] == 1  # item 0 arrived whole
        time.sleep(0.5)  # being slow on purpose, not synchronisation
        s.sendall(b"".join(values[1:]))
        assert p.next_event("request_done")["code"] == 0
    assert [p.store.get(k) for k in keys] == [(v, b"") for v in values]


def test_the_deadline_counts_from_the_first_byte_of_the_request(make_plane: Any) -> None:
    p = make_plane(request_timeout_s=1.0)
    frame = get_frame(random_keys(3))
    stop, sent = threading.Event(), [0]
    with p.connect() as s:
        t = threading.Thread(target=_trickle, args=(s, frame, stop, sent), daemon=True)
        t.start()
        try:
            assert p.next_event("request_done")["code"] == ErrorCode.DEADLINE_EXCEEDED
            assert sent[0] < len(frame)  # cut off while the header/body was still trickling
        finally:
            stop.set()
            t.join(5)


# ---- the client checks what the server announces -------------------------------------------------


class FakeNode:
    """A listening socket that answers any request with ``reply`` (a malicious or broken node)."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.lsock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.lsock.accept()
        except OSError:
            return
        with conn:
            conn.recv(1 << 16)
            conn.sendall(self.reply)
            conn.recv(1 << 16)  # hold the connection until the client gives up

    def close(self) -> None:
        self.lsock.close()
        self.thread.join(5)


@pytest.mark.parametrize("case", ["huge_block", "huge_meta", "huge_error_message", "item_count",
                                  "huge_generation", "generation_on_a_miss"])
def test_the_client_checks_announced_sizes_before_allocating(case: str) -> None:
    ok = HEADER.pack(b"KVDP", 1, 1, 0, 1, 0)
    reply = {
        "huge_block": ok + GET_ITEM_GEN.pack(0, 1, 1, 1 << 62, 0, 0, 0),
        "huge_meta": ok + GET_ITEM_GEN.pack(0, 1, 1, 10, 0xFFFFFFF0, 0, 0),
        "huge_generation": ok + GET_ITEM_GEN.pack(0, 1, 1, 10, 0, 0, 1 << 63),
        "generation_on_a_miss": ok + GET_ITEM_GEN.pack(0, 0, 0, 0, 0, 0, 7),
        "huge_error_message": HEADER.pack(b"KVDP", 1, 1, int(ErrorCode.INTERNAL), 0, 0xFFFFFFF0),
        "item_count": HEADER.pack(b"KVDP", 1, 1, 0, 1 << 30, 0),
    }[case]
    node = FakeNode(reply)
    dp = DataPlaneClient(node.address, max_block_bytes=4 * MIB)
    asked: list[int] = []

    def sink(i: int, size: int, meta: bytes) -> memoryview | None:
        asked.append(size)
        return None

    try:
        with pytest.raises(TransferFailed, match="malformed frame"):
            dp.get(random_keys(1), b"", sink, deadline=time.monotonic() + 20)
        assert asked == []  # never asked to allocate for the announced size
    finally:
        dp.close()
        node.close()


def test_the_client_checks_the_put_response_body_size() -> None:
    node = FakeNode(HEADER.pack(b"KVDP", 1, 2, 0, 1, 0xFFFFFFF0))
    dp = DataPlaneClient(node.address)
    try:
        with pytest.raises(TransferFailed, match="4294967280-byte body"):
            dp.put([(random_keys(1)[0], memoryview(b"x" * 10), b"")], b"", deadline=time.monotonic() + 20)
    finally:
        dp.close()
        node.close()


# ---- the same bounds on a real daemon (SSD tier on), configured through NodeConfig -------------


def test_a_daemon_applies_the_data_plane_bounds_from_its_config(start_node: Any, tmp_path: Any) -> None:
    node = start_node(
        ssd_dir=str(tmp_path / "ssd"), ssd_size_bytes=64 * MIB, ssd_direct_io=False,
        dataplane_request_timeout_s=1.0,
    )
    dp = node.daemon._data_plane
    key = random_keys(1)[0]
    with socket.create_connection(parse_host_port(node.daemon.data_address), timeout=EVENT_WAIT_S) as s:
        s.sendall(put_frame([key], [1 << 62]))
        status, _msg = read_error_then_eof(s)
    assert status == ErrorCode.BLOCK_TOO_LARGE and dp.counters().rejected_frames == 1
    used = node.daemon.store.stats().tiers[0].used_bytes
    stop, sent = threading.Event(), [0]
    with socket.create_connection(parse_host_port(node.daemon.data_address), timeout=EVENT_WAIT_S) as s:
        s.sendall(put_frame([key], [64 << 10]))
        t = threading.Thread(target=_trickle, args=(s, value_for(key, 64 << 10), stop, sent), daemon=True)
        t.start()
        try:
            wait_until(lambda: dp.counters().deadline_exceeded == 1, what="the trickling PUT to be cut")
            assert t.is_alive() and sent[0] < 64 << 10  # cut while the peer was still sending
        finally:
            stop.set()
            t.join(5)
    wait_until(lambda: dp.num_busy() == 0, what="the connection thread to finish")
    assert node.daemon.store.stats().tiers[0].used_bytes == used
    assert node.daemon.store.exists([key]) == [False]


def test_a_spare_put_to_a_full_node_is_refused_quietly_and_an_older_node_gets_it_without_the_flag(
    make_plane: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PUT_FLAG_SPARE (a spill or replica PUT): a node whose DRAM and SSD are full of sole
    copies answers NO_CAPACITY per item and evicts nothing; a node older than the flag
    (its known PUT flags without it) refuses the header, and the client sends again
    without the flag, for that node from then on (it stores as any put, as before)."""
    from kvstored.transport import framing

    p = make_plane(dram_size_bytes=2 * MIB, ssd_dir=None, ssd_size_bytes=0,
                   max_block_bytes=MIB)
    keys = random_keys(3)
    for k in keys[:2]:
        p.core.put_inline([(k, value_for(k, MIB), b"")], b"")  # full: two sole copies
    client = DataPlaneClient(p.server.address, max_block_bytes=MIB)
    try:
        v = memoryview(value_for(keys[2], MIB))
        (got,) = client.put([(keys[2], v, b"")], b"", deadline=time.monotonic() + 10,
                            spare_only=True, replicas=2)
        assert (got.code, got.stored) == (ErrorCode.NO_CAPACITY, False)
        assert p.store.exists(keys) == [True, True, False]
        assert p.store.stats().tiers[0].evictions == 0 and client.put_spare_ok
        monkeypatch.setattr(framing, "PUT_FLAGS",
                            framing.PUT_FLAG_FACTOR_MASK | framing.PUT_FLAG_HANDOFF)
        (got,) = client.put([(keys[2], v, b"")], b"", deadline=time.monotonic() + 10,
                            spare_only=True, replicas=2)
        assert (got.code, got.stored) == (0, True)  # as before the flag: an eviction
        assert not client.put_spare_ok and client.put_factor_ok
        assert p.store.exists(keys).count(True) == 2
    finally:
        client.close()
