"""The lean control channel (kvstored/node/control.py, kvstored/client/_control.py).

The release of a shared-memory get's pin rides on the client's next request: these tests
hold that request at a client hook (before it is sent) and check that until it arrives the
block stays pinned (not removable, not evicted by a put storm), and that it is released once
the request was served. Also: the idle flush, session ownership of a connection, bad frames,
and the fallback to gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from it_helpers import DaemonThread, random_keys, value_for, wait_until

from kvstored import Client, Tier
from kvstored.client import _control, _hooks
from kvstored.errors import ErrorCode
from kvstored.transport.control import frame, recv_frame
from kvstored.v1 import node_pb2 as pb

pytestmark = pytest.mark.usefixtures("pinned_reads")  # the pinned path's tests (PinBlocks)

SIZE = 4 << 20


@pytest.fixture
def cnode(start_node: Any) -> DaemonThread:
    return start_node(dram_size_bytes=64 << 20, ssd_size_bytes=256 << 20)  # type: ignore[no-any-return]


@pytest.fixture
def no_idle_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a request releases a deferred pin (the idle flusher waits for an hour)."""
    monkeypatch.setattr(_control, "IDLE_RELEASE_S", 3600.0)


@pytest.fixture
def hook() -> Iterator[list[Any]]:
    installed: list[Any] = []
    yield installed
    _hooks.install(None)


def _pins(node: DaemonThread) -> int:
    core = node.daemon.core
    assert core is not None
    return core.num_outstanding()[0]


def test_describe_advertises_the_channel_and_the_client_uses_it(cnode: DaemonThread) -> None:
    with Client(cnode.unix_address) as c:
        info = c.describe()
        assert info.control_path == cnode.daemon.grpc_addresses[0][len("unix:"):] + ".ctl"
        assert c._st.control is not None and c._st.control.path == info.control_path
    with Client(cnode.tcp_address) as c:  # not local: gRPC only
        assert c.describe().control_path and c._st.control is None


def test_switch_off_keeps_every_call_on_grpc(
    cnode: DaemonThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_control.ENV_SWITCH, "0")
    keys = random_keys(2)
    with Client(cnode.unix_address) as c:
        assert all(r.stored for r in c.put(keys, [value_for(k, 1000) for k in keys]))
        assert c._st.control is None and c.describe().transport == "shm"
        assert c.get(keys) == [value_for(k, 1000) for k in keys]
        assert _pins(cnode) == 0  # released by its own ReleasePins


def test_deferred_release_holds_the_pin_until_the_next_request_arrives(
    cnode: DaemonThread, no_idle_flush: None, hook: list[Any]
) -> None:
    key, other = random_keys(1), random_keys(1)
    storm = random_keys(20)  # 80 MiB through a 64 MiB DRAM tier: forces eviction
    with Client(cnode.unix_address, timeout_s=60) as a, Client(cnode.unix_address, timeout_s=60) as b:
        assert a.put(key, [value_for(key[0], SIZE)])[0].stored
        assert a.get(key) == [value_for(key[0], SIZE)]
        assert a._st.control is not None and a._st.control.num_pending() == 1
        assert _pins(cnode) == 1  # the get returned; its pin is held until A's next request
        for k in storm:
            assert b.put([k], [value_for(k, SIZE)])[0].stored
        assert b.where(key) == [Tier.DRAM]  # pinned: never evicted meanwhile
        assert b.remove(key) == [False]  # pinned: kept

        reached, go = threading.Event(), threading.Event()
        sent: list[list[int]] = []

        def hold(event: str, **fields: Any) -> None:
            if event == "control_release_sent" and not reached.is_set():
                sent.append(fields["pin_ids"])
                reached.set()
                assert go.wait(60)

        _hooks.install(hold)
        box: list[Any] = []
        t = threading.Thread(target=lambda: box.append(a.lookup_prefix(other)))
        t.start()
        try:
            assert reached.wait(30)  # A's next request is built, not yet sent
            assert _pins(cnode) == 1 and b.remove(key) == [False]
        finally:
            go.set()
        t.join(30)
        _hooks.install(None)
        assert box == [0] and len(sent) == 1 and len(sent[0]) == 1
        assert _pins(cnode) == 0  # served before the lookup's answer came back
        assert a._st.control.num_pending() == 0
        assert b.remove(key) == [True]


def test_grpc_call_after_a_get_sends_the_release_first(
    cnode: DaemonThread, no_idle_flush: None
) -> None:
    keys = random_keys(1)
    with Client(cnode.unix_address) as c:
        c.put(keys, [value_for(keys[0], SIZE)])
        assert c.get(keys) == [value_for(keys[0], SIZE)] and _pins(cnode) == 1
        assert c.stats()["pinned_blocks"] == 0  # Stats is gRPC: the release went ahead of it
        assert _pins(cnode) == 0


def test_an_idle_client_releases_its_deferred_pin(cnode: DaemonThread) -> None:
    keys = random_keys(1)
    with Client(cnode.unix_address) as c:
        c.put(keys, [value_for(keys[0], SIZE)])
        assert c.get(keys) == [value_for(keys[0], SIZE)]
        wait_until(lambda: _pins(cnode) == 0, what="the idle flush of the deferred release")
        assert c._st.control is not None and c._st.control.num_pending() == 0


def test_close_releases_the_deferred_pin(cnode: DaemonThread, no_idle_flush: None) -> None:
    keys = random_keys(1)
    c = Client(cnode.unix_address)
    c.put(keys, [value_for(keys[0], SIZE)])
    assert c.get(keys) == [value_for(keys[0], SIZE)] and _pins(cnode) == 1
    c.close()
    assert _pins(cnode) == 0


def _raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def _ask(s: socket.socket, req: pb.ControlRequest) -> pb.ControlResponse:
    s.sendall(frame(req))
    return pb.ControlResponse.FromString(recv_frame(s))


def test_a_connection_belongs_to_one_session(cnode: DaemonThread) -> None:
    core = cnode.daemon.core
    assert core is not None
    path = cnode.daemon._servicer.control_path  # type: ignore[union-attr]
    s1, s2 = core.open_session("t1"), core.open_session("t2")
    with _raw(path) as s:
        probe = pb.LookupPrefixRequest(keys=random_keys(1))
        assert _ask(s, pb.ControlRequest(session_id=s1, lookup_prefix=probe)).error_code == 0
        resp = _ask(s, pb.ControlRequest(session_id=s2, lookup_prefix=probe))
        assert resp.error_code == ErrorCode.INVALID_ARGUMENT and str(s1) in resp.error_message
        assert _ask(s, pb.ControlRequest(session_id=s1, lookup_prefix=probe)).error_code == 0
        # a refused request still runs its piggybacked release (the client counts it sent)
        key = random_keys(1)
        with Client(cnode.unix_address) as c:
            c.put(key, [b"v" * 100])
        pin_id, got = core.pin_blocks(key, b"", lease_ms=60_000, epoch=0, session_id=s1)
        assert pin_id and _pins(cnode) == 1
        resp = _ask(s, pb.ControlRequest(session_id=s2, release_pin_ids=[pin_id], lookup_prefix=probe))
        assert resp.error_code == ErrorCode.INVALID_ARGUMENT and resp.released.num_released == 1
        assert _pins(cnode) == 0
    core.close_session(s1)
    core.close_session(s2)


def test_a_garbage_frame_is_an_invalid_argument_and_the_node_keeps_serving(cnode: DaemonThread) -> None:
    path = cnode.daemon._servicer.control_path  # type: ignore[union-attr]
    with _raw(path) as s:
        s.sendall((5).to_bytes(4, "big") + b"\xff\xff\xff\xff\xff")
        resp = pb.ControlResponse.FromString(recv_frame(s))
        assert resp.error_code == ErrorCode.INVALID_ARGUMENT and "ControlRequest" in resp.error_message
        ok = _ask(s, pb.ControlRequest(lookup_prefix=pb.LookupPrefixRequest(keys=random_keys(1))))
        assert ok.error_code == 0 and ok.lookup_prefix.num_hit_blocks == 0
    with Client(cnode.unix_address) as c:
        assert c.exists(random_keys(1)) == [False]


def test_a_dropped_connection_releases_nothing_of_the_session(
    cnode: DaemonThread, no_idle_flush: None
) -> None:
    """Fencing is per session: the pins of a get stay until released or the session ends."""
    keys = random_keys(1)
    with Client(cnode.unix_address) as c:
        c.put(keys, [value_for(keys[0], SIZE)])
        assert c.get(keys) == [value_for(keys[0], SIZE)]
        ctl = c._st.control
        assert ctl is not None
        for conn in list(ctl._free):  # the connections drop under the client
            conn.sock.shutdown(socket.SHUT_RDWR)
        wait_until(lambda: not cnode.daemon._control._transports,  # type: ignore[union-attr]
                   what="the node to see the connection end")
        assert _pins(cnode) == 1  # still the session's
        assert c.lookup_prefix(keys) == 1  # a new connection; carries the release again
        assert _pins(cnode) == 0


def test_async_client_defers_the_release_to_its_next_request(
    cnode: DaemonThread, no_idle_flush: None
) -> None:
    from kvstored import AsyncClient

    keys, other = random_keys(1), random_keys(1)
    sent: list[list[int]] = []

    def record(event: str, **fields: Any) -> None:
        if event == "control_release_sent":
            sent.append(fields["pin_ids"])

    async def main() -> None:
        async with AsyncClient(cnode.unix_address, timeout_s=30) as a:
            assert (await a.put(keys, [value_for(keys[0], SIZE)]))[0].stored
            assert await a.get(keys) == [value_for(keys[0], SIZE)]
            assert a._st.control is not None and a._st.control.num_pending() == 1
            assert _pins(cnode) == 1  # held until the next request
            _hooks.install(record)
            assert await a.exists(other) == [False]  # carries the release
            _hooks.install(None)
            assert len(sent) == 1 and len(sent[0]) == 1 and _pins(cnode) == 0
            assert await a.get(keys) == [value_for(keys[0], SIZE)] and _pins(cnode) == 1
        assert _pins(cnode) == 0  # close() sent it

    asyncio.run(main())


def test_an_oversized_frame_closes_only_that_connection(cnode: DaemonThread) -> None:
    from kvstored.transport.control import MAX_FRAME_BYTES

    path = cnode.daemon._servicer.control_path  # type: ignore[union-attr]
    with _raw(path) as s:
        s.sendall((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
        assert s.recv(16) == b""  # closed by the node, nothing answered
    with _raw(path) as s:  # the node still serves others
        ok = _ask(s, pb.ControlRequest(exists=pb.ExistsRequest(keys=random_keys(2))))
        assert ok.error_code == 0 and list(ok.exists.exists) == [False, False]


def test_partial_frames_over_the_buffer_budget_close_the_connection_that_passes_it(
    cnode: DaemonThread,
) -> None:
    # regression (tester): 8 connections of 63 MiB half-frames took 500 MiB of the node
    control = cnode.daemon._control  # type: ignore[attr-defined]
    path = cnode.daemon._servicer.control_path  # type: ignore[union-attr]
    control.max_buffered_bytes = 1 << 20
    part = 600 << 10
    try:
        with _raw(path) as first, _raw(path) as second:
            first.sendall((2 << 20).to_bytes(4, "big") + bytes(part))
            wait_until(lambda: control.buffered_bytes == 4 + part, what="the first half-frame held")
            # closed by the node while it sends (it would pass the budget): EOF or a reset
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                second.sendall((2 << 20).to_bytes(4, "big") + bytes(part))
                assert second.recv(16) == b""
            wait_until(lambda: control.buffered_bytes == 4 + part, what="the second one dropped")
            assert control.buffered_bytes == 4 + part  # the first one is untouched
            with _raw(path) as third:  # the node still serves small requests
                ok = _ask(third, pb.ControlRequest(exists=pb.ExistsRequest(keys=random_keys(1))))
                assert ok.error_code == 0
        wait_until(lambda: control.buffered_bytes == 0, what="the closed connections' bytes freed")
    finally:
        control.max_buffered_bytes = 256 << 20


def _read_frame(s: socket.socket) -> pb.ControlResponse:
    size = int.from_bytes(s.recv(4, socket.MSG_WAITALL), "big")
    return pb.ControlResponse.FromString(s.recv(size, socket.MSG_WAITALL))


def test_a_request_that_waits_keeps_the_answers_in_order(
    cnode: DaemonThread, no_idle_flush: None
) -> None:
    """A request that suspends (an SSD promotion on the store executor) is finished on a task;
    the next request on its connection is not read before it answered (one answer per
    request, in order), while the event loop itself stays free."""
    core = cnode.daemon.core
    assert core is not None
    keys = random_keys(24)  # 96 MiB into a 64 MiB DRAM tier: the first ones are demoted
    with Client(cnode.unix_address) as c:
        for k in keys:
            assert c.put([k], [value_for(k, SIZE)])[0].stored
        cold = [k for k, t in zip(keys, c.where(keys), strict=True) if t == Tier.SSD]
        assert cold, "no block was demoted to SSD"
        info, ctl = c._st.info, c._st.control
        assert info is not None and ctl is not None
        session_id = c._session.session_id(deadline=1e18)
        reached, go = threading.Event(), threading.Event()

        def hold(event: str) -> None:  # on the store executor, inside the promoting pin
            if event == "pin_blocks_held" and not reached.is_set():
                reached.set()
                assert go.wait(30), "the test never let the pin go on"

        core.test_hook = hold
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(ctl.path)
                s.sendall(frame(pb.ControlRequest(session_id=session_id, pin_blocks=pb.PinBlocksRequest(
                    keys=[cold[0]], lease_ms=30000, epoch=info.epoch, session_id=session_id,
                    request_id=1))))
                assert reached.wait(30), "the pin never reached the store executor"
                s.sendall(frame(pb.ControlRequest(exists=pb.ExistsRequest(keys=[cold[0]]))))
                cnode.call(lambda: None)  # the loop is free (the pin waits elsewhere) ...
                cnode.call(lambda: None)
                s.setblocking(False)
                with pytest.raises(BlockingIOError):  # ... yet nothing was answered out of order
                    s.recv(1, socket.MSG_PEEK)
                s.settimeout(30)
                go.set()
                first, second = _read_frame(s), _read_frame(s)  # both may come in one read
        finally:
            core.test_hook = None
            go.set()
        assert first.WhichOneof("op") == "pin_blocks" and first.pin_blocks.blocks[0].found
        assert second.WhichOneof("op") == "exists" and list(second.exists.exists) == [True]
        assert core.release_pins([first.pin_blocks.pin_id]) == 1


def test_a_parked_flusher_is_woken_once_not_per_get(cnode: DaemonThread) -> None:
    """Gets that follow each other must not wake the release flusher each time (a thread
    wake-up per get was ~30 us of its latency): the first deferral wakes a parked flusher,
    the next ones find it awake (it polls until it has been idle for FLUSHER_PARK_S)."""
    ctl = _control.ControlChannel(cnode.daemon.grpc_addresses[0][len("unix:"):] + ".ctl")
    try:
        wakes: list[None] = []
        ctl._flusher = threading.current_thread()  # as if running: defer_release starts none
        ctl._flusher_parked = True  # ... and parked in its untimed wait
        real_notify = ctl._wake.notify
        ctl._wake.notify = lambda n=1: (wakes.append(None), real_notify(n))  # type: ignore[method-assign]
        for pin_id in (11, 12, 13):  # three gets before the flusher thread got to run
            ctl.defer_release(pin_id)
        assert len(wakes) == 1 and ctl.num_pending() == 3
    finally:
        ctl._flusher = None
        ctl._pending.clear()
        ctl.close()
