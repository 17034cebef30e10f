"""Faults against a live node: broken streams, racing writers, dead clients and dead nodes."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from it_helpers import DaemonThread, random_keys, value_for, wait_until

from kvstored import AsyncClient, Client, Draining, LeaseExpired, Tier, Unavailable
from kvstored.addresses import parse_host_port
from kvstored.errors import InvalidArgument
from kvstored.rpc_status import error_from_rpc
from kvstored.v1 import node_pb2 as pb

pytestmark = pytest.mark.usefixtures("pinned_reads")  # the pinned path's tests (PinBlocks)

HEADER = struct.Struct("<4sBBHII")


def _dram_used(node: DaemonThread) -> int:
    return node.daemon.store.stats().tiers[0].used_bytes


def _put_frame(keys: list[bytes], sizes: list[int]) -> bytes:
    """A data-plane PUT request header + body, as documented in kvstored/transport/tcp.py."""
    body = struct.pack("<H", 0)
    for k, n in zip(keys, sizes, strict=True):
        body += struct.pack("<H", len(k)) + k + struct.pack("<QI", n, 0)
    return HEADER.pack(b"KVDP", 1, 2, 0, len(keys), len(body)) + body


def _connect_data_plane(node: DaemonThread) -> socket.socket:
    return socket.create_connection(parse_host_port(node.daemon.data_address), timeout=10)


@pytest.mark.parametrize("cut", ["after_header", "mid_second_payload", "before_last_byte"])
def test_data_plane_put_disconnect_mid_stream_leaves_nothing_visible(node: DaemonThread, cut: str) -> None:
    keys = random_keys(3)
    size = 1 << 20
    baseline = _dram_used(node)
    frame = _put_frame(keys, [size] * 3)
    payload = b"".join(value_for(k, size) for k in keys)
    sent = {"after_header": 0, "mid_second_payload": size + size // 2, "before_last_byte": 3 * size - 1}[cut]
    data_plane = node.daemon._data_plane
    assert data_plane is not None
    lost = data_plane.num_requests_lost
    with _connect_data_plane(node) as s:
        s.sendall(frame + payload[:sent])
    # the server counts the request as lost only after it aborted its reservations
    wait_until(lambda: data_plane.num_requests_lost == lost + 1, what="the server to see the broken PUT")
    assert _dram_used(node) == baseline, "the broken PUT's reservations were not aborted"
    assert node.daemon.core is not None and node.daemon.core.num_outstanding() == (0, 0, 0)
    with Client(node.unix_address) as c:
        assert c.exists(keys) == [False, False, False]
        assert c.get(keys) == [None, None, None]
        # the same keys can be written completely afterwards
        assert all(r.stored for r in c.put(keys, [value_for(k, size) for k in keys]))
        assert c.get(keys) == [value_for(k, size) for k in keys]


def test_data_plane_get_disconnect_mid_stream_releases_pins(node: DaemonThread) -> None:
    keys = random_keys(4)
    size = 2 << 20
    with Client(node.unix_address) as c:
        c.put(keys, [value_for(k, size) for k in keys])
    body = struct.pack("<H", 0) + b"".join(struct.pack("<H", len(k)) + k for k in keys)
    with _connect_data_plane(node) as s:
        s.sendall(HEADER.pack(b"KVDP", 1, 1, 0, len(keys), len(body)) + body)
        assert len(s.recv(100_000)) > 0  # the stream started
    wait_until(lambda: node.daemon.store.stats().pinned_blocks == 0, what="pins of the broken GET released")
    with Client(node.tcp_address, transport="tcp") as c:
        assert c.get(keys) == [value_for(k, size) for k in keys]


def test_eight_concurrent_writers_of_the_same_keys(node: DaemonThread) -> None:
    keys = random_keys(24)
    size = 256 << 10
    transports = ["shm", "tcp", "grpc", "shm", "tcp", "shm", "tcp", "grpc"]
    barrier = threading.Barrier(len(transports))
    outcomes: dict[int, list[bool]] = {}
    errors: list[BaseException] = []

    def writer(w: int, transport: str) -> None:
        try:
            with Client(node.address_for(transport), transport=transport, timeout_s=30) as c:
                c.describe()
                values = [value_for(k + bytes([w]), size) for k in keys]
                barrier.wait(timeout=30)
                results = c.put(keys, values)
                assert all(r.ok for r in results), [r.error for r in results if not r.ok][:2]
                outcomes[w] = [r.stored for r in results]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w, t)) for w, t in enumerate(transports)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    with Client(node.unix_address) as c:
        got = c.get(keys)
    for i, k in enumerate(keys):
        winners = [w for w in outcomes if outcomes[w][i]]
        assert len(winners) == 1, f"key {i}: {len(winners)} writers report stored"
        assert got[i] == value_for(k + bytes([winners[0]]), size), f"key {i} holds a torn or foreign value"


# ---- unreachable nodes ----------------------------------------------------------------------


@pytest.fixture
def silent_listeners(sock_dir: str) -> Iterator[dict[str, str]]:
    """Sockets that accept connections (kernel backlog) but never answer."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    unix = socket.socket(socket.AF_UNIX)
    path = os.path.join(sock_dir, "silent.sock")
    unix.bind(path)
    unix.listen(16)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    dead_port = free.getsockname()[1]
    free.close()
    yield {
        "silent_tcp": f"127.0.0.1:{tcp.getsockname()[1]}",
        "silent_unix": f"unix:{path}",
        "dead_unix": f"unix:{sock_dir}/nobody-here.sock",
        "dead_tcp": f"127.0.0.1:{dead_port}",
    }
    tcp.close()
    unix.close()


@pytest.mark.parametrize("kind", ["dead_unix", "dead_tcp", "silent_tcp", "silent_unix"])
def test_unreachable_node_raises_unavailable_within_the_deadline(silent_listeners: dict[str, str], kind: str) -> None:
    timeout_s = 1.0
    with Client(silent_listeners[kind], timeout_s=timeout_s) as c:
        for call in (lambda: c.get(random_keys(1)), lambda: c.put(random_keys(1), [b"x"]), c.stats):
            t0 = time.monotonic()
            with pytest.raises(Unavailable) as info:
                call()
            assert info.value.retriable
            assert time.monotonic() - t0 < timeout_s + 2.0, "the call overran its deadline"


@pytest.mark.parametrize("kind", ["dead_unix", "silent_tcp"])
def test_async_client_unreachable_raises_unavailable(silent_listeners: dict[str, str], kind: str) -> None:
    async def main() -> None:
        async with AsyncClient(silent_listeners[kind], timeout_s=1.0) as c:
            t0 = time.monotonic()
            with pytest.raises(Unavailable):
                await c.lookup_prefix(random_keys(2))
            assert time.monotonic() - t0 < 3.0

    asyncio.run(main())


def test_dead_data_plane_raises_unavailable_within_the_deadline(node: DaemonThread) -> None:
    keys = random_keys(1)
    with Client(node.tcp_address, transport="tcp", timeout_s=1.5) as c:
        c.put(keys, [b"x" * 200_000])
        node.daemon._data_plane.stop(0)  # type: ignore[union-attr]
        t0 = time.monotonic()
        with pytest.raises(Unavailable):
            c.get(keys)
        assert time.monotonic() - t0 < 3.5


def test_client_follows_a_node_restart_on_the_same_socket(
    start_node: object, sock_dir: str, ssd: dict[str, object]
) -> None:
    listen = [f"unix:{sock_dir}/restart.sock", "127.0.0.1:0"]
    ssd = {**ssd, "ssd_dir": ssd.get("ssd_dir", f"{sock_dir}/restart.ssd")}  # one dir for both
    first = start_node(node_id="restart-node", listen=listen, **ssd)  # type: ignore[operator]
    old_keys, new_keys = random_keys(3), random_keys(3)
    with Client(first.unix_address, timeout_s=15) as c:
        assert c.describe().transport == "shm"
        c.put(old_keys, [value_for(k, 50_000) for k in old_keys])
        old_epoch = c.describe().epoch
        first.stop()
        second = start_node(node_id="restart-node", listen=listen, **ssd)  # type: ignore[operator]
        # the same client: it must notice the new epoch and map the new arena
        assert all(r.stored for r in c.put(new_keys, [value_for(k, 50_000) for k in new_keys]))
        assert c.get(new_keys) == [value_for(k, 50_000) for k in new_keys]
        if ssd.get("ssd_size_bytes") == 0:
            assert c.get(old_keys) == [None] * 3  # DRAM only: gone with the old process
        else:  # spilled to SSD by the drain, read back by the new process
            assert c.get(old_keys) == [value_for(k, 50_000) for k in old_keys]
        assert c.describe().epoch != old_epoch
        assert second.daemon.store.get(new_keys[0]) == (value_for(new_keys[0], 50_000), b"")


def test_lapsed_leases_are_quarantined_until_the_session_ends(start_node: object) -> None:
    node = start_node(pin_lease_s=0.4)  # type: ignore[operator]
    core = node.daemon.core
    assert core is not None
    keys = random_keys(2)
    with Client(node.unix_address) as c:
        c.put(keys[:1], [b"x" * 10_000])
    baseline = _dram_used(node)
    with grpc.insecure_channel(node.tcp_address) as ch:
        def raw(method: str, resp: type) -> grpc.UnaryUnaryMultiCallable:
            return ch.unary_unary(f"/kvstored.v1.NodeService/{method}",
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=resp.FromString)

        stream = ch.unary_stream("/kvstored.v1.NodeService/OpenSession",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.SessionEvent.FromString)(pb.OpenSessionRequest())
        sid = next(stream).session_id
        assert sid and core.leases.num_sessions() == 1
        pins = raw("PinBlocks", pb.PinBlocksResponse)(
            pb.PinBlocksRequest(keys=keys[:1], session_id=sid), timeout=10)
        assert pins.pin_id and node.daemon.store.stats().pinned_blocks == 1
        res = raw("ReservePut", pb.ReservePutResponse)(
            pb.ReservePutRequest(items=[pb.ReserveItem(key=keys[1], size_bytes=1 << 20)], session_id=sid),
            timeout=10)
        assert res.reservation_id and _dram_used(node) == baseline + (1 << 20)
        # the "client" stalls: its leases lapse into quarantine, nothing is freed
        wait_until(lambda: core.quarantined_bytes() == 10_000 + (1 << 20), what="both leases to lapse")
        assert node.daemon.store.stats().pinned_blocks == 1
        assert _dram_used(node) == baseline + (1 << 20)
        assert raw("Stats", pb.StatsResponse)(pb.StatsRequest(), timeout=10).quarantined_bytes == 10_000 + (1 << 20)
        # ... until its session ends (the client is gone): then everything is freed at once
        stream.cancel()
        wait_until(lambda: core.leases.num_sessions() == 0, what="the session to close")
        assert core.quarantined_bytes() == 0
        assert node.daemon.store.stats().pinned_blocks == 0
        assert _dram_used(node) == baseline
        with pytest.raises(grpc.RpcError) as info:
            raw("CommitPut", pb.CommitPutResponse)(pb.CommitPutRequest(reservation_id=res.reservation_id), timeout=10)
        assert isinstance(error_from_rpc(info.value), LeaseExpired)

        # a caller without a session gets no grant at all: nobody could ever tell it is gone,
        # so a lapsed grant of its would stay quarantined for good (a tester's leak)
        for method, req, resp in (
            ("PinBlocks", pb.PinBlocksRequest(keys=keys[:1]), pb.PinBlocksResponse),
            ("ReservePut", pb.ReservePutRequest(items=[pb.ReserveItem(key=keys[1], size_bytes=4096)]),
             pb.ReservePutResponse),
        ):
            with pytest.raises(grpc.RpcError) as info:
                raw(method, resp)(req, timeout=10)
            err = error_from_rpc(info.value)
            assert isinstance(err, InvalidArgument) and "needs a session" in str(err), err
        assert core.quarantined_bytes() == 0 and node.daemon.store.stats().pinned_blocks == 0
        assert core.leases.num_active("pin") == 0 and core.leases.num_active("reservation") == 0
    with Client(node.unix_address) as c:
        assert c.exists(keys) == [True, False]


def test_draining_node_refuses_new_work_but_finishes_what_is_in_flight(node: DaemonThread) -> None:
    keys = random_keys(3)
    with Client(node.unix_address) as c:
        c.put(keys[:1], [b"before"])
    core = node.daemon.core
    assert core is not None
    # in flight when the drain starts: a read holding a pin, a write holding a reservation
    sid = node.call(core.open_session)
    pin_id, _ = node.call(lambda: core.pin_blocks(keys[:1], b"", session_id=sid))
    res_id, (reservation,) = node.call(
        lambda: core.reserve_put([(keys[2], 5, b"")], b"", session_id=sid)
    )
    node.call(core.start_draining)
    for transport in ("shm", "tcp", "grpc"):
        with Client(node.address_for(transport), transport=transport, timeout_s=5) as c:
            assert c.describe().draining
            with pytest.raises(Draining):
                c.put(keys[1:2], [b"x" * 100_000])
            with pytest.raises(Draining, match="refuses new reads"):
                c.get(keys[:1])
            # metadata calls never pin and stay answered
            assert c.lookup_prefix_tiers(keys) == [Tier.DRAM]
            assert c.exists(keys) == [True, False, False]
    node.daemon.store.arena[reservation.offset : reservation.offset + 5] = b"after"  # type: ignore[union-attr]
    assert [o.stored for o in core.commit_put(res_id)] == [True]
    assert core.release_pins([pin_id]) == 1
    assert core.num_outstanding() == (0, 0, 0)
    assert node.daemon.store.get(keys[2]) == (b"after", b"")  # type: ignore[union-attr]


def test_drain_grace_running_out_never_cancels_a_running_handler(start_node: object) -> None:
    """A handler still running when the drain grace is used up finishes and answers."""
    node = start_node(drain_grace_s=0.2)  # type: ignore[operator]
    core, daemon = node.daemon.core, node.daemon
    assert core is not None
    keys = random_keys(2)
    with Client(node.unix_address) as c:
        c.put(keys, [b"a", b"b"])
    entered, release, grace_over = threading.Event(), threading.Event(), threading.Event()
    list_blocks = core.list_blocks

    def held_list_blocks(*args: object, **kwargs: object) -> object:  # the hook: hold the handler
        entered.set()
        assert release.wait(30)
        return list_blocks(*args, **kwargs)  # type: ignore[arg-type]

    wait_drained = daemon._wait_drained

    async def observed_wait_drained(deadline: float) -> None:
        await wait_drained(deadline)
        grace_over.set()  # the drain gave up waiting: teardown starts now

    core.list_blocks = held_list_blocks  # type: ignore[method-assign]
    daemon._wait_drained = observed_wait_drained  # type: ignore[method-assign]
    answer: list[object] = []

    def call() -> None:
        with grpc.insecure_channel(node.tcp_address) as ch:
            try:
                answer.append(ch.unary_unary(
                    "/kvstored.v1.NodeService/ListBlocks",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=pb.ListBlocksResponse.FromString,
                )(pb.ListBlocksRequest(), timeout=30))
            except grpc.RpcError as exc:
                answer.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert entered.wait(10)
    stopper = threading.Thread(target=node.stop)
    stopper.start()
    assert grace_over.wait(10)
    release.set()
    caller.join(30)
    stopper.join(60)
    (got,) = answer
    assert isinstance(got, pb.ListBlocksResponse), f"the running handler was cut off: {got}"
    assert {b.key for b in got.blocks} == set(keys)
