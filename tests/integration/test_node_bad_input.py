"""Bad input against a live node: every bad item gets its own error, nothing stored is harmed."""

from __future__ import annotations

import socket
import struct
import time

import grpc
import numpy as np
import pytest
from it_helpers import DaemonThread, random_keys, value_for, wait_until

from kvstored import (
    BatchTooLarge,
    BlockTooLarge,
    Client,
    ErrorCode,
    InvalidArgument,
    KeyInvalid,
    Namespace,
)
from kvstored.addresses import parse_host_port
from kvstored.rpc_status import error_from_rpc
from kvstored.transport.tcp import DataPlaneClient
from kvstored.v1 import node_pb2 as pb

pytestmark = pytest.mark.usefixtures("pinned_reads")  # the pinned path's tests (PinBlocks)

TRANSPORTS = ["shm", "tcp", "grpc"]
LIMIT = 4 << 20  # max_block_bytes of the test nodes


def _bad_batch() -> tuple[list[bytes], list[bytes], list[str]]:
    good = random_keys(3)
    keys = [good[0], b"", good[1], b"k" * 65, good[2], b"short"]
    values = [b"a" * 1000, b"b", b"c" * (LIMIT + 1), b"d", b"e" * 10, b"f"]
    expect = ["ok", "KeyInvalid", "BlockTooLarge", "KeyInvalid", "ok", "KeyInvalid"]
    return keys, values, expect


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_client_batch_mixing_good_and_bad_entries(node: DaemonThread, transport: str) -> None:
    keys, values, expect = _bad_batch()
    with Client(node.address_for(transport), transport=transport) as c:
        results = c.put(keys, values)
        got = ["ok" if r.ok else type(r.error).__name__ for r in results]
        assert got == expect
        assert [r.replicas_written for r in results] == [1 if e == "ok" else 0 for e in expect]
        assert not any(r.short for r in results)  # a refused put is an error, not a short one
        assert "#1" in str(results[1].error) and "empty" in str(results[1].error)
        assert str(LIMIT) in str(results[2].error)
        assert c.get([keys[0], keys[4]]) == [values[0], values[4]]
        assert c.exists([keys[2]]) == [False]


def _raw(channel: grpc.Channel, method: str, resp_cls: type) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(
        f"/kvstored.v1.NodeService/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=resp_cls.FromString,
    )


def test_server_validates_each_item_of_a_raw_put(node: DaemonThread) -> None:
    keys, values, expect = _bad_batch()
    meta_key = random_keys(1)[0]
    with grpc.insecure_channel(node.tcp_address) as ch:
        req = pb.PutRequest(items=[pb.PutItem(key=k, value=v) for k, v in zip(keys, values, strict=True)])
        req.items.append(pb.PutItem(key=meta_key, value=b"x", meta=b"m" * 5000))
        resp = _raw(ch, "Put", pb.PutResponse)(req, timeout=10)
        codes = [r.status.code for r in resp.results]
        assert codes == [0, ErrorCode.KEY_INVALID, ErrorCode.BLOCK_TOO_LARGE, ErrorCode.KEY_INVALID, 0,
                         ErrorCode.KEY_INVALID, ErrorCode.INVALID_ARGUMENT]
        assert [r.stored for r in resp.results] == [True, False, False, False, True, False, False]

        stream = ch.unary_stream("/kvstored.v1.NodeService/OpenSession",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.SessionEvent.FromString)(pb.OpenSessionRequest())
        sid = next(stream).session_id
        reserve = pb.ReservePutRequest(items=[
            pb.ReserveItem(key=random_keys(1)[0], size_bytes=10),
            pb.ReserveItem(key=b"", size_bytes=10),
            pb.ReserveItem(key=random_keys(1)[0], size_bytes=LIMIT + 1),
        ], session_id=sid)
        r = _raw(ch, "ReservePut", pb.ReservePutResponse)(reserve, timeout=10)
        assert [x.status.code for x in r.reservations] == [0, ErrorCode.KEY_INVALID, ErrorCode.BLOCK_TOO_LARGE]
        commit = _raw(ch, "CommitPut", pb.CommitPutResponse)(
            pb.CommitPutRequest(reservation_id=r.reservation_id, abort=True), timeout=10)
        assert len(commit.results) == 3

        pins = _raw(ch, "PinBlocks", pb.PinBlocksResponse)(
            pb.PinBlocksRequest(keys=[keys[0], b"", b"x" * 100], session_id=sid), timeout=10)
        assert [b.status.code for b in pins.blocks] == [0, ErrorCode.KEY_INVALID, ErrorCode.KEY_INVALID]
        assert pins.blocks[0].found and pins.blocks[0].size_bytes == 1000
        _raw(ch, "ReleasePins", pb.ReleasePinsResponse)(pb.ReleasePinsRequest(pin_ids=[pins.pin_id]), timeout=10)
        stream.cancel()
    assert node.daemon.store.stats().pinned_blocks == 0


def test_data_plane_validates_each_item(node: DaemonThread) -> None:
    dp = DataPlaneClient(node.daemon.data_address)
    good = random_keys(2)
    items = [
        (good[0], memoryview(b"a" * 5000), b""),
        (b"", memoryview(b"empty key"), b""),
        (good[1], memoryview(bytes(LIMIT + 1)), b""),
        (random_keys(1)[0], memoryview(b"big meta"), b"m" * 5000),
    ]
    try:
        out = dp.put(items, b"", deadline=time.monotonic() + 20)
        assert [o.code for o in out] == [
            0, ErrorCode.KEY_INVALID, ErrorCode.BLOCK_TOO_LARGE, ErrorCode.INVALID_ARGUMENT]
        # the connection stayed in sync after the skipped payloads
        got: dict[int, bytearray] = {}

        def sink(i: int, size: int, meta: bytes) -> memoryview:
            got[i] = bytearray(size)
            return memoryview(got[i])

        res = dp.get([good[0], b"", good[1]], b"", sink, deadline=time.monotonic() + 10)
        assert res[0].found and bytes(got[0]) == b"a" * 5000
        assert res[1].code == ErrorCode.KEY_INVALID
        assert not res[2].found and res[2].code == 0
    finally:
        dp.close()


def test_empty_and_oversized_keys_on_reads_name_the_index(node: DaemonThread) -> None:
    with Client(node.unix_address) as c:
        k = random_keys(1)[0]
        for bad, what in ((b"", "empty"), (b"k" * 65, "65 bytes"), (b"k" * 15, "15 bytes")):
            for call in (c.get, c.exists, c.lookup_prefix, c.remove):
                with pytest.raises(KeyInvalid, match=f"key #1 .*{what}|key #1 is {what}"):
                    call([k, bad])
        with pytest.raises(KeyInvalid, match="str"):
            c.get(["not bytes"])  # type: ignore[list-item]
        with pytest.raises(InvalidArgument, match="sequence"):
            c.get(k)


def test_oversized_block_is_refused_and_nothing_else_changes(node: DaemonThread) -> None:
    with Client(node.unix_address) as c:
        k = random_keys(1)[0]
        before = c.stats()
        r = c.put([k], [np.zeros(LIMIT + 1, np.uint8)])
        assert isinstance(r[0].error, BlockTooLarge) and not r[0].stored
        after = c.stats()
        assert after["tiers"][0]["used_bytes"] == before["tiers"][0]["used_bytes"]
        assert c.exists([k]) == [False]
        assert c.put([k], [np.zeros(LIMIT, np.uint8)])[0].stored  # exactly the limit is fine


def test_batch_too_large_is_refused(start_node: object) -> None:
    node = start_node(max_batch_keys=8)  # type: ignore[operator]
    keys = random_keys(9)
    with grpc.insecure_channel(node.tcp_address) as ch:
        with pytest.raises(grpc.RpcError) as info:
            _raw(ch, "LookupPrefix", pb.LookupPrefixResponse)(pb.LookupPrefixRequest(keys=keys), timeout=10)
        assert isinstance(error_from_rpc(info.value), BatchTooLarge)
    with Client(node.unix_address) as c:  # the client splits batches to the node's limit
        assert all(r.stored for r in c.put(keys, [b"v"] * 9))
        assert c.lookup_prefix(keys) == 9


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_client_of_one_namespace_cannot_read_probe_remove_or_learn_of_anothers_blocks(
    node: DaemonThread, transport: str
) -> None:
    # regression: B's get raised NamespaceMismatch (telling B that A holds the block), B's
    # exists said True, B's remove deleted A's block, B's put was an ok no-op, and a client
    # with no namespace read every namespace's blocks
    ns_a = Namespace(model_id="model-a")
    ns_b = Namespace(model_id="model-b")
    keys = random_keys(2)
    addr = node.address_for(transport)
    with Client(addr, transport=transport, namespace=ns_a) as a:
        assert all(r.stored for r in a.put(keys, [b"A0", b"A1"]))
    with Client(addr, transport=transport, namespace=ns_b) as b:
        assert b.get([random_keys(1)[0], keys[1]]) == [None, None]
        buf = bytearray(10)
        assert b.get_into([keys[0]], [buf]) == [None] and buf == bytearray(10)
        assert b.lookup_prefix(keys) == 0
        assert b.exists(keys) == [False, False]
        assert b.where(keys) == [None, None]
        assert b.remove(keys) == [False, False]
        # the same key under B names another block: stored, and read back as B's
        assert b.put(keys[:1], [b"B0"])[0].stored
        assert b.get(keys) == [b"B0", None]
    with Client(addr, transport=transport, namespace=ns_a) as a:
        assert a.get(keys) == [b"A0", b"A1"]
        # (the shm get's pin release is asynchronous: ordering is engineer fence's item)
        wait_until(lambda: node.daemon.store.stats().pinned_blocks == 0, what="pins released")
        assert a.remove(keys[1:]) == [True]
    with Client(addr, transport=transport) as anyone:  # the empty namespace is one too
        assert anyone.get(keys) == [None, None]
        assert anyone.exists(keys) == [False, False]
    listed = {(b.key, b.namespace_id) for b in node.daemon.store.list_blocks()[0]}
    assert listed == {(keys[0], ns_a.id), (keys[0], ns_b.id)}
    wait_until(lambda: node.daemon.store.stats().pinned_blocks == 0, what="pins released")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_buffer_too_small_names_index_and_sizes(node: DaemonThread, transport: str) -> None:
    keys = random_keys(3)
    with Client(node.address_for(transport), transport=transport) as c:
        c.put(keys, [b"x" * 100, b"y" * 5000, b"z" * 10])
        with pytest.raises(InvalidArgument, match=r"key #1 is 5000 bytes but buffer #1 holds 4096"):
            c.get_into(keys, [bytearray(100), bytearray(4096), bytearray(10)])
        with pytest.raises(InvalidArgument, match="read-only"):
            c.get_into(keys[:1], [b"immutable" * 20])
        with pytest.raises(InvalidArgument, match="one buffer per key"):
            c.get_into(keys, [bytearray(100)])
        # buffers of Python object pointers: refused both ways (regression: get_into wrote
        # block bytes over the pointers and the process segfaulted; put stored heap addresses)
        with pytest.raises(InvalidArgument, match=r"buffer #0 holds Python objects"):
            c.get_into(keys[2:], [np.empty(16, dtype=object)])
        objs = np.array([b"a", 1, None] * 4, dtype=object)
        bad_put = random_keys(1)
        (r,) = c.put(bad_put, [objs])  # a bad value is that item's error, as for a bad key
        assert not r.ok and isinstance(r.error, InvalidArgument), r
        assert "value #0 holds Python objects" in str(r.error)
        assert c.exists(bad_put) == [False]
        # the connection / pins are fine afterwards
        assert c.get(keys) == [b"x" * 100, b"y" * 5000, b"z" * 10]
    wait_until(lambda: node.daemon.store.stats().pinned_blocks == 0, what="pins released")


@pytest.mark.parametrize("method", ["Put", "Get", "ReservePut", "CommitPut", "PinBlocks", "LookupPrefix", "ListBlocks"])
def test_garbage_protobuf_is_invalid_argument(node: DaemonThread, method: str) -> None:
    with grpc.insecure_channel(node.tcp_address) as ch:
        raw = ch.unary_unary(f"/kvstored.v1.NodeService/{method}")  # bytes in, bytes out
        for garbage in (b"\xff\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * 3, b"\x12"):
            with pytest.raises(grpc.RpcError) as info:
                raw(garbage, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert type(error_from_rpc(info.value)) is InvalidArgument
    with Client(node.unix_address) as c:  # still serving
        k = random_keys(1)[0]
        assert c.put([k], [b"fine"])[0].stored and c.get([k]) == [b"fine"]


def test_garbage_on_the_data_plane_closes_only_that_connection(node: DaemonThread) -> None:
    with socket.create_connection(parse_host_port(node.daemon.data_address), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        header = s.recv(16)
        magic, _version, _op, status, _count, body_len = struct.unpack("<4sBBHII", header)
        assert magic == b"KVDP" and status == ErrorCode.INVALID_ARGUMENT
        assert s.recv(body_len + 10)  # the message
        assert s.recv(10) == b""  # then closed
    keys = random_keys(1)
    with Client(node.tcp_address, transport="tcp") as c:
        big = value_for(keys[0], 200_000)
        assert c.put(keys, [big])[0].stored and c.get(keys) == [big]


def test_bad_client_arguments(node: DaemonThread) -> None:
    with pytest.raises(InvalidArgument, match="transport"):
        Client(node.unix_address, transport="carrier-pigeon")
    with pytest.raises(InvalidArgument, match="timeout_s"):
        Client(node.unix_address, timeout_s=0)
    with pytest.raises(InvalidArgument, match="HOST:PORT"):
        Client("nonsense")
    with Client(node.unix_address) as c:
        with pytest.raises(InvalidArgument, match="2 keys but 1 values"):
            c.put(random_keys(2), [b"x"])
        r = c.put(random_keys(1), [object()])  # type: ignore[list-item]
        assert isinstance(r[0].error, InvalidArgument) and "object" in str(r[0].error)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_duplicate_key_within_one_put_batch_first_writer_wins(node: DaemonThread, transport: str) -> None:
    # regression: the batch was committed tail-first, so the later duplicate's bytes won
    k, other = random_keys(2)
    with Client(node.address_for(transport), transport=transport) as c:
        res = c.put([k, other, k], [b"first" * 1000, b"o" * 10, b"later" * 1000])
        assert [r.ok for r in res] == [True, True, True]
        assert [r.stored for r in res] == [True, True, False]  # the duplicate: an ok no-op
        assert c.get([k, other]) == [b"first" * 1000, b"o" * 10]
    wait_until(lambda: node.daemon.store.stats().pinned_blocks == 0, what="pins released")
