"""Fencing: no copy outlives the space it touches (issue 6 section 1), against a live node.

Every race is held at a chosen point by a hook (kvstored.client._hooks on the client side,
NodeCore.test_hook on the node side) that a test controls with threading.Events; lease lapses
are made by moving the node's clock, never by waiting. Each test checks that every block read
back is byte-identical to what its writer put and that quarantined bytes return to 0. The SSD
tier is on, as in production.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from it_helpers import DaemonThread, random_keys, value_for, wait_until

from kvstored import AsyncClient, Client, LeaseExpired
from kvstored.addresses import parse_host_port
from kvstored.client import _hooks, _shm

# the pinned path's (PinBlocks) and the ReservePut path's tests; reserve-ahead slots: test_slot_puts.py
pytestmark = pytest.mark.usefixtures("pinned_reads", "reserve_put_path")

SIZE = 4 << 20  # > 256 KiB: the async client copies on its I/O threads
HEADER = struct.Struct("<4sBBHII")


class HookGate:
    """A client hook that records every event and holds the first ``hold`` event until
    :attr:`go` is set (on the thread that reached it)."""

    def __init__(self, hold: str | None) -> None:
        self.hold = hold
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.reached = threading.Event()
        self.go = threading.Event()
        self._lock = threading.Lock()
        self._held = False

    def __call__(self, event: str, **fields: Any) -> None:
        with self._lock:
            self.events.append((event, fields))
            hold = event == self.hold and not self._held
            self._held = self._held or hold
        if hold:
            self.reached.set()
            assert self.go.wait(60), "the test never released the hook"

    def index(self, event: str, **match: Any) -> int:
        with self._lock:
            for i, (name, fields) in enumerate(self.events):
                if name == event and all(fields.get(k) == v for k, v in match.items()):
                    return i
        raise AssertionError(f"event {event} {match} not seen: {[e for e, _ in self.events]}")



@pytest.fixture(autouse=True)
def _both_control_paths(control_channel: str) -> str:
    """Every test here runs over the control channel and over gRPC."""
    return control_channel


@pytest.fixture
def gate() -> Iterator[Any]:
    gates: list[HookGate] = []

    def make(hold: str | None) -> HookGate:
        g = HookGate(hold)
        gates.append(g)
        _hooks.install(g)
        return g

    yield make
    _hooks.install(None)
    for g in gates:
        g.go.set()


@pytest.fixture
def fnode(start_node: Any, tmp_path: Path) -> DaemonThread:
    """A node with the SSD tier on."""
    return start_node(  # type: ignore[no-any-return]
        dram_size_bytes=64 << 20, ssd_dir=str(tmp_path / "ssd"), ssd_size_bytes=128 << 20,
        max_block_bytes=8 << 20,
    )


def _used(node: DaemonThread) -> int:
    return node.daemon.store.stats().tiers[0].used_bytes


def _idle(node: DaemonThread) -> None:
    """Nothing held: no pins, reservations, quarantine.

    A get's pin over the control channel is released by the client's next request or by its
    idle flush (kvstored/client/_control.py): waited for, bounded. (From async code, call it
    with ``asyncio.to_thread`` so the client's loop can run that flush.)"""
    core = node.daemon.core
    assert core is not None
    wait_until(lambda: core.num_outstanding() == (0, 0, 0), timeout_s=10,
               what=f"nothing outstanding (now {core.num_outstanding()})")
    assert core.num_outstanding() == (0, 0, 0)
    assert core.quarantined_bytes() == 0
    assert node.daemon.store.stats().pinned_blocks == 0


def _lapse_all_leases(node: DaemonThread) -> int:
    """Move the node's clock (and the client's: the same host's) past every lease and reap:
    lapsed leases go to quarantine."""
    core = node.daemon.core
    assert core is not None
    core.clock = lambda: time.monotonic() + 10_000.0
    _shm._clock = core.clock  # restored by the control_channel fixture
    return core.reap_expired()


# ---- (b) asyncio cancellation at a hook-held point ---------------------------------------------


def test_cancelled_async_put_aborts_only_after_its_copy(fnode: DaemonThread, gate: Any) -> None:
    ka, kb = random_keys(1), random_keys(2)
    g = gate("shm_copy_in_mid")
    baseline = _used(fnode)

    async def main() -> None:
        async with AsyncClient(fnode.unix_address, timeout_s=60) as a, \
                AsyncClient(fnode.unix_address, timeout_s=60) as b:
            await a.describe()
            task = asyncio.create_task(a.put(ka, [value_for(ka[0], SIZE)]))
            assert await asyncio.to_thread(g.reached.wait, 30)
            task.cancel()
            # A's copy is half done and held; its space must stay A's: B writes elsewhere
            assert all(r.stored for r in await b.put(kb, [value_for(k, SIZE) for k in kb]))
            assert not task.done()  # the cancelled put waits for its own copy
            g.go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await b.get(kb) == [value_for(k, SIZE) for k in kb]
            assert await b.exists(ka) == [False]

    asyncio.run(main())
    assert g.index("shm_copy_in_done") < g.index("rpc", method="CommitPut", abort=True)
    _idle(fnode)
    assert _used(fnode) == baseline + 2 * SIZE


def test_cancelled_async_get_into_releases_only_after_its_copy(fnode: DaemonThread, gate: Any) -> None:
    keys = random_keys(1)
    with Client(fnode.unix_address) as c:
        c.put(keys, [value_for(keys[0], SIZE)])
    g = gate("shm_copy_out_mid")

    async def main() -> None:
        async with AsyncClient(fnode.unix_address, timeout_s=60) as a, \
                AsyncClient(fnode.unix_address, timeout_s=60) as b:
            buf = np.zeros(SIZE, dtype=np.uint8)
            task = asyncio.create_task(a.get_into(keys, [buf]))
            assert await asyncio.to_thread(g.reached.wait, 30)
            task.cancel()
            # the reader still copies: its block stays pinned, it cannot be removed or reused
            assert await b.remove(keys) == [False]
            assert fnode.daemon.store.stats().pinned_blocks == 1
            g.go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert bytes(buf) == value_for(keys[0], SIZE)  # the copy ran to its end
            assert await b.remove(keys) == [True]

    asyncio.run(main())
    assert g.index("shm_copy_out_done") < g.index("rpc", method="ReleasePins")
    _idle(fnode)


# ---- (c) a lease that lapses mid-copy ----------------------------------------------------------


def test_reservation_lapsing_mid_copy_is_quarantined_and_its_commit_refused(
    fnode: DaemonThread, gate: Any
) -> None:
    ka, kb = random_keys(1), random_keys(2)
    g = gate("shm_copy_in_mid")
    baseline = _used(fnode)
    box: list[BaseException] = []

    def writer() -> None:
        with Client(fnode.unix_address, timeout_s=60) as a:
            try:
                a.put(ka, [value_for(ka[0], SIZE)])
            except BaseException as exc:
                box.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    assert g.reached.wait(30)
    assert _lapse_all_leases(fnode) == 1
    core = fnode.daemon.core
    assert core is not None
    assert core.quarantined_bytes() == SIZE and _used(fnode) == baseline + SIZE
    with Client(fnode.unix_address) as b:
        assert all(r.stored for r in b.put(kb, [value_for(k, SIZE) for k in kb]))
        g.go.set()  # A finishes writing its (quarantined) space, then commits
        t.join(30)
        assert len(box) == 1 and isinstance(box[0], LeaseExpired), box
        assert core.quarantined_bytes() == 0 and _used(fnode) == baseline + 2 * SIZE
        assert b.get(kb) == [value_for(k, SIZE) for k in kb]
        assert b.exists(ka) == [False]
        assert all(r.stored for r in b.put(ka, [value_for(ka[0], SIZE)]))  # a retry works
        assert b.get(ka + kb) == [value_for(k, SIZE) for k in ka + kb]
    _idle(fnode)


def test_pin_lapsing_mid_copy_is_quarantined_and_the_read_reports_lease_expired(
    fnode: DaemonThread, gate: Any
) -> None:
    keys, other = random_keys(1), random_keys(1)
    with Client(fnode.unix_address) as c:
        c.put(keys, [value_for(keys[0], SIZE)])
    g = gate("shm_copy_out_mid")
    box: list[BaseException] = []
    buf = np.zeros(SIZE, dtype=np.uint8)

    def reader() -> None:
        with Client(fnode.unix_address, timeout_s=60) as a:
            try:
                a.get_into(keys, [buf])
            except BaseException as exc:
                box.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    assert g.reached.wait(30)
    assert _lapse_all_leases(fnode) == 1
    core = fnode.daemon.core
    assert core is not None
    assert core.quarantined_bytes() == SIZE
    with Client(fnode.unix_address) as b:
        assert b.remove(keys) == [False]  # quarantined: still pinned, the bytes cannot change
        assert all(r.stored for r in b.put(other, [value_for(other[0], SIZE)]))
        g.go.set()
        t.join(30)
        assert len(box) == 1 and isinstance(box[0], LeaseExpired), box
        assert bytes(buf) == value_for(keys[0], SIZE)  # late, but never foreign bytes
        assert core.quarantined_bytes() == 0
        out = np.zeros(SIZE, dtype=np.uint8)
        assert b.get_into(keys, [out]) == [SIZE] and bytes(out) == value_for(keys[0], SIZE)
        assert b.get(other) == [value_for(other[0], SIZE)]
    _idle(fnode)


# ---- (e) a cancel that lands while the reserve/pin RPC is in flight ----------------------------


@pytest.mark.parametrize("op", ["put", "get"])
def test_cancel_during_reserve_or_pin_rpc_releases_what_it_got(fnode: DaemonThread, op: str) -> None:
    keys = random_keys(1)
    if op == "get":
        with Client(fnode.unix_address) as c:
            c.put(keys, [value_for(keys[0], SIZE)])
    baseline = _used(fnode)
    core = fnode.daemon.core
    assert core is not None
    reached, go = threading.Event(), threading.Event()
    point = "reserve_put_held" if op == "put" else "pin_blocks_held"

    def hook(event: str) -> None:  # on the node's store thread, inside the RPC
        if event == point:
            reached.set()
            assert go.wait(60)

    async def main() -> None:
        async with AsyncClient(fnode.unix_address, timeout_s=60) as a:
            await a.describe()
            core.test_hook = hook
            coro = a.put(keys, [value_for(keys[0], SIZE)]) if op == "put" else a.get(keys)
            task = asyncio.create_task(coro)
            try:
                assert await asyncio.to_thread(reached.wait, 30)
                task.cancel()
            finally:
                core.test_hook = None
                go.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            # observed at once, not after a lease: the cancelled call released what it got
            _idle(fnode)
            assert _used(fnode) == baseline
            if op == "put":
                assert await a.exists(keys) == [False]
                assert (await a.put(keys, [value_for(keys[0], SIZE)]))[0].stored
            assert await a.get(keys) == [value_for(keys[0], SIZE)]
            await asyncio.to_thread(_idle, fnode)

    try:
        asyncio.run(main())
    finally:
        go.set()


# ---- ordering within one client, and release at exit --------------------------------------------


def test_get_then_remove_then_put_is_ordered_on_shared_memory(
    fnode: DaemonThread, control_channel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvstored.client import _control

    monkeypatch.setattr(_control, "IDLE_RELEASE_S", 3600.0)  # only the next request releases
    core = fnode.daemon.core
    assert core is not None
    with Client(fnode.unix_address) as c:
        assert c.describe().transport == "shm"
        for i in range(30):
            keys = random_keys(1)
            old, new = value_for(keys[0], 300_000), value_for(keys[0] + b"new", 300_000)
            assert c.put(keys, [old])[0].stored
            assert c.get(keys) == [old]
            # over gRPC the get releases its pin itself; over the channel its next request does
            held = 1 if control_channel == "control" else 0
            assert core.num_outstanding()[0] == held, f"try {i}: pins after the get"
            assert c.remove(keys) == [True], f"try {i}"
            assert c.put(keys, [new])[0].stored, f"try {i}"
            assert c.get(keys) == [new]
    _idle(fnode)


def test_dropped_session_stream_of_a_live_process_keeps_its_space(fnode: DaemonThread, gate: Any) -> None:
    """The stream ends while the client process lives (a copy held mid-way): the node keeps
    the session until the process exits or the client acks with CloseSession."""
    keys = random_keys(1)
    g = gate("shm_copy_in_mid")
    baseline = _used(fnode)
    core = fnode.daemon.core
    servicer = fnode.daemon._servicer
    assert core is not None and servicer is not None
    a = Client(fnode.unix_address, timeout_s=60)
    results: list[Any] = []
    t = threading.Thread(target=lambda: results.append(a.put(keys, [value_for(keys[0], SIZE)])))
    t.start()
    assert g.reached.wait(30)
    assert core.leases.num_sessions() == 1 and _used(fnode) == baseline + SIZE
    a._session._call.cancel()  # the connection drops; this process (the writer) lives on
    wait_until(lambda: fnode.call(servicer.num_process_watches) == 1,
               what="the node to see the stream end")
    assert core.leases.num_sessions() == 1, "a live writer's session must not end"
    assert _used(fnode) == baseline + SIZE and core.num_outstanding()[1] == 1
    g.go.set()
    t.join(30)
    assert results and results[0][0].stored  # the reservation was never taken from it
    a.close()  # its ack (CloseSession) ends the dropped session too, and the process watch
    assert core.leases.num_sessions() == 0 and fnode.call(servicer.num_process_watches) == 0
    with Client(fnode.unix_address) as c:
        assert c.get(keys) == [value_for(keys[0], SIZE)]
    _idle(fnode)


def test_close_session_is_the_clients_ack(fnode: DaemonThread) -> None:
    core = fnode.daemon.core
    servicer = fnode.daemon._servicer
    assert core is not None and servicer is not None
    keys = random_keys(1)
    with Client(fnode.unix_address) as c:
        c.put(keys, [value_for(keys[0], SIZE)])
        assert core.leases.num_sessions() == 1
    assert core.leases.num_sessions() == 0  # closed by CloseSession, not by a process watch
    assert fnode.call(servicer.num_process_watches) == 0
    _idle(fnode)


def test_close_waits_for_a_copy_of_another_thread(fnode: DaemonThread, gate: Any) -> None:
    keys = random_keys(1)
    g = gate("shm_copy_in_mid")
    a = Client(fnode.unix_address, timeout_s=60)
    results: list[Any] = []
    t = threading.Thread(target=lambda: results.append(a.put(keys, [value_for(keys[0], SIZE)])))
    t.start()
    assert g.reached.wait(30)
    closer = threading.Thread(target=a.close)
    closer.start()
    wait_until(lambda: a._session._closed, what="close() to start")
    g.go.set()  # the copy ends, and commits under the still-open session
    t.join(30)
    closer.join(30)
    assert results and results[0][0].stored
    with Client(fnode.unix_address) as c:
        assert c.get(keys) == [value_for(keys[0], SIZE)]
    _idle(fnode)


# ---- the node's own data-plane threads are self-fenced -----------------------------------------


def test_data_plane_reservation_is_never_reclaimed_by_lease_or_reaper(fnode: DaemonThread) -> None:
    keys = random_keys(1)
    value = value_for(keys[0], SIZE)
    baseline = _used(fnode)
    body = struct.pack("<H", 0) + struct.pack("<H", 16) + keys[0] + struct.pack("<QI", SIZE, 0)
    with socket.create_connection(parse_host_port(fnode.daemon.data_address), timeout=30) as s:
        s.sendall(HEADER.pack(b"KVDP", 1, 2, 0, 1, len(body)) + body + value[: SIZE // 2])
        wait_until(lambda: _used(fnode) == baseline + SIZE, what="the data plane to reserve")
        # however late the peer is, nothing but the receiving thread itself can free the space
        assert _lapse_all_leases(fnode) == 0
        core = fnode.daemon.core
        assert core is not None and core.quarantined_bytes() == 0
        assert _used(fnode) == baseline + SIZE
        s.sendall(value[SIZE // 2 :])
        assert len(s.recv(1 << 16)) >= HEADER.size  # the PUT response
    with Client(fnode.unix_address) as c:
        assert c.get(keys) == [value]
    _idle(fnode)


def test_quarantine_is_in_stats_metrics_and_kvstorectl(fnode: DaemonThread, gate: Any) -> None:
    import json
    import urllib.request

    from click.testing import CliRunner

    from kvstored.cli.kvstorectl import main as ctl

    keys = random_keys(1)
    with Client(fnode.unix_address) as c:
        c.put(keys, [value_for(keys[0], SIZE)])
    g = gate("shm_copy_out_mid")
    buf = np.zeros(SIZE, dtype=np.uint8)
    a = Client(fnode.unix_address, timeout_s=60)
    t = threading.Thread(target=lambda: pytest.raises(LeaseExpired, a.get_into, keys, [buf]))
    t.start()
    try:
        assert g.reached.wait(30)
        assert _lapse_all_leases(fnode) == 1
        with Client(fnode.unix_address) as c:
            stats = c.stats()
        assert stats["quarantined_bytes"] == SIZE and stats["num_sessions"] == 1  # A's
        text = urllib.request.urlopen(f"http://{fnode.daemon.metrics_address}/metrics", timeout=10).read().decode()
        line = next(x for x in text.splitlines() if x.startswith("kvstored_quarantine_bytes "))
        assert float(line.split()[1]) == SIZE
        res = CliRunner().invoke(ctl, ["--address", fnode.unix_address, "--output", "json", "stats"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["quarantined_bytes"] == SIZE
        res = CliRunner().invoke(ctl, ["--address", fnode.unix_address, "stats"])
        assert "quarantined_bytes" in res.output
    finally:
        g.go.set()
        t.join(30)
        a.close()
    _idle(fnode)
