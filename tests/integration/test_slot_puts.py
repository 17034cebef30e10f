"""Reserve-ahead puts against a live node (kvstored/client/_slots.py, kvstored/node/slots.py).

A race is held by a client hook (kvstored.client._hooks) that the test releases with a
threading.Event; lease lapses are made by moving the node's clock, never by waiting. Each test
checks the bytes read back and where the slot space went (held by the session, quarantined,
or free again).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from it_helpers import DaemonThread, random_keys, value_for, wait_until

from kvstored import AsyncClient, Client
from kvstored.client import _hooks, _shm
from kvstored.errors import LeaseExpired
from kvstored.node.slots import SLOT

SIZE = 1 << 20


def _slot_bytes(node: DaemonThread, client: Client | AsyncClient) -> int:
    """Slot bytes the node holds for the client's session (active and quarantined)."""
    core = node.daemon.core
    assert core is not None
    sid = client._session._session_id if isinstance(client, Client) else client._session_id  # noqa: SLF001
    return core.leases.held_bytes(sid, SLOT)


def test_a_steady_put_is_one_commit_and_the_session_end_returns_the_pool(
    node: DaemonThread, control_channel: str,
) -> None:
    core = node.daemon.core
    assert core is not None
    used = lambda: node.daemon.store.stats().tiers[0].used_bytes  # noqa: E731
    base = used()
    methods: list[str] = []
    with Client(node.unix_address, transport="shm") as c:
        c.describe()
        for n in range(3):
            keys = random_keys(4)
            methods.clear()
            _hooks.install(lambda e, **f: methods.append(f["method"]) if e == "rpc" else None)
            try:
                assert all(r.stored for r in c.put(keys, [value_for(k, SIZE) for k in keys]))
            finally:
                _hooks.install(None)
            assert methods == (["CommitSlots"] * 2 if n == 0 else ["CommitSlots"]), (n, methods)
            assert c.get(keys) == [value_for(k, SIZE) for k in keys]
        # the pool for the next put (4 slots of 1 MiB) is held: reserved room, counted as used;
        # over the control channel two puts' worth (each refill arrives after its answer)
        pool = 8 * SIZE if control_channel == "control" else 4 * SIZE
        assert _slot_bytes(node, c) == pool
        assert used() == base + 12 * SIZE + pool
    assert used() == base + 12 * SIZE  # close() ended the session: its unused slots returned
    assert core.quarantined_bytes() == 0


def test_a_slot_lapsing_mid_copy_is_quarantined_and_its_commit_refused(
    node: DaemonThread, control_channel: str,
) -> None:
    # the writer is held half-way through its copy into a slot while the node's clock moves
    # past the lease: the slot is quarantined (never handed to B); A's late commit is refused
    # (LeaseExpired for the item) and frees it; B's block keeps its bytes
    core = node.daemon.core
    assert core is not None
    ka, kb = random_keys(1), random_keys(1)
    reached, go = threading.Event(), threading.Event()

    def hold(event: str, **_f: Any) -> None:
        if event == "shm_copy_in_mid" and not reached.is_set():
            reached.set()
            assert go.wait(60)

    with Client(node.unix_address, transport="shm", timeout_s=60) as a, \
            Client(node.unix_address, transport="shm", reserve_ahead_bytes=0) as b:
        a.describe()
        b.describe()
        _hooks.install(hold)
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(a.put(ka, [value_for(ka[0], SIZE)])))
        t.start()
        try:
            assert reached.wait(30)
            _hooks.install(None)
            core.clock = lambda: time.monotonic() + 10_000.0
            assert core.reap_expired() >= 1
            # over the control channel A's pool holds two puts' worth: the idle slot lapses too
            idle = SIZE if control_channel == "control" else 0
            assert core.quarantined_bytes() == SIZE + idle
            assert b.put(kb, [value_for(kb[0], SIZE)])[0].stored
        finally:
            go.set()
            t.join(60)
        r = out[0][0]
        assert isinstance(r.error, LeaseExpired) and not r.stored
        assert core.quarantined_bytes() == idle  # the late commit was the ack of its slot
        assert b.get(kb) == [value_for(kb[0], SIZE)]
        assert b.get(ka) == [None]
    assert core.quarantined_bytes() == 0  # A's session ended: its idle slot is freed


def test_cancelled_async_put_returns_its_slot_only_after_its_copy(node: DaemonThread) -> None:
    ka, kb = random_keys(1), random_keys(1)
    reached, go = threading.Event(), threading.Event()
    events: list[str] = []

    def hold(event: str, **fields: Any) -> None:
        events.append(event if event != "rpc" else f"rpc {fields['method']}")
        if event == "shm_copy_in_mid" and not reached.is_set():
            reached.set()
            assert go.wait(60)

    async def main() -> None:
        async with AsyncClient(node.unix_address, transport="shm", timeout_s=60) as a:
            await a.describe()
            _hooks.install(hold)
            task = asyncio.create_task(a.put(ka, [value_for(ka[0], SIZE)]))
            assert await asyncio.to_thread(reached.wait, 30)
            task.cancel()
            await asyncio.sleep(0)  # the cancel is delivered; the copy is still held
            held = _slot_bytes(node, a)
            # A's slots (the one its copy may still write, and the idle one of its two puts'
            # worth) are A's while that copy may run: never B's
            assert held == 2 * SIZE
            with Client(node.unix_address, transport="shm", reserve_ahead_bytes=0) as b:
                assert b.put(kb, [value_for(kb[0], SIZE)])[0].stored
                go.set()
                with pytest.raises(asyncio.CancelledError):
                    await task
                _hooks.install(None)
                assert a._st.slots.take_returns(  # noqa: SLF001
                    (a._session_id, a._st.info.epoch)) != []  # noqa: SLF001
                assert b.get(kb) == [value_for(kb[0], SIZE)]
                assert b.get(ka) == [None]

    try:
        asyncio.run(main())
    finally:
        go.set()
        _hooks.install(None)
    assert events.index("shm_copy_in_done") > events.index("shm_copy_in_mid")
    assert "rpc CommitSlots" in events[: events.index("shm_copy_in_mid")]  # the grant only


def test_a_slot_near_its_lease_end_is_returned_not_written(
    node: DaemonThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the client's clock says the pool's slots are about to lapse: the put writes none of them
    # (they are returned with its CommitSlots) and asks for fresh ones
    with Client(node.unix_address, transport="shm") as c:
        keys = random_keys(2)
        assert all(r.stored for r in c.put(keys, [value_for(k, SIZE) for k in keys]))
        old = c._st.slots.slot_ids()  # noqa: SLF001
        assert len(old) == 2
        later = time.monotonic() + 10_000.0
        monkeypatch.setattr("kvstored.client._slots.time.monotonic", lambda: later)
        monkeypatch.setattr(_shm, "_clock", lambda: later)
        pool = c._st.slots  # noqa: SLF001
        taken: list[set[int]] = []
        take_all = pool.take_all

        def record(*args: Any) -> Any:
            got = take_all(*args)
            if got is not None:
                taken.append({i for ids, _ in got.values() for i in ids})
            return got

        monkeypatch.setattr(pool, "take_all", record)
        keys = random_keys(2)
        assert all(r.stored for r in c.put(keys, [value_for(k, SIZE) for k in keys]))
        new = taken[-1]  # the slots written
        assert len(new) == 2 and not new & old
        assert c.get(keys) == [value_for(k, SIZE) for k in keys]
        # the old ones were freed by the return; held: the next two puts' worth (the refill
        # granted after the answer)
        assert _slot_bytes(node, c) == 4 * SIZE


# ---- the refill granted after the answer (control channel: grant_after_answer) ----------


class _HeldRefill:
    """Holds the node's first refill granted after its answer (``grant_after_answer``) on
    the store executor, off the event loop, until :meth:`release`."""

    def __init__(self, node: DaemonThread, monkeypatch: pytest.MonkeyPatch) -> None:
        core = node.daemon.core
        assert core is not None
        self.core = core
        self.reached, self.go = threading.Event(), threading.Event()
        # every refill "needs I/O": it runs on the store executor, so holding it there leaves
        # the loop serving everyone else
        monkeypatch.setattr(core.slots, "_refill_needs_io", lambda *_a: True)
        core.slots.test_hook = self._hook

    def _hook(self, event: str) -> None:
        if event == "grant_after_answer" and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(60)

    def release(self) -> None:
        self.go.set()
        self.core.slots.test_hook = None


def test_a_put_is_answered_before_its_refill_is_granted(
    node: DaemonThread, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A's put returns while the node still holds the refill it asked for (the answer came
    # first); another client's put and reads go on meanwhile; A's next put reads the refill's
    # frame, then its own answer, and every byte is right
    held = _HeldRefill(node, monkeypatch)
    k1, k2, kb = random_keys(4), random_keys(4), random_keys(2)
    try:
        with Client(node.unix_address, transport="shm", timeout_s=60) as a, \
                Client(node.unix_address, transport="shm", reserve_ahead_bytes=0) as b:
            a.describe()
            assert all(r.stored for r in a.put(k1, [value_for(k, SIZE) for k in k1]))
            assert held.reached.wait(30)  # put() returned; its refill is held now
            assert b.get(k1) == [value_for(k, SIZE) for k in k1]  # committed, readable
            assert all(r.stored for r in b.put(kb, [value_for(k, SIZE) for k in kb]))
            assert _slot_bytes(node, a) == 4 * SIZE  # the pool's other half; no refill yet
            held.release()
            monkeypatch.undo()  # refills on the loop again
            assert all(r.stored for r in a.put(k2, [value_for(k, SIZE) for k in k2]))
            assert a.get(k1 + k2 + kb) == [value_for(k, SIZE) for k in k1 + k2 + kb]
            # the pool: the refill held above (read with the second put), and the second
            # put's own refill, granted once its answer was sent
            wait_until(lambda: _slot_bytes(node, a) == 8 * SIZE, what="two puts' worth of slots")
            assert a._st.slots.held_bytes() in (4 * SIZE, 8 * SIZE)  # noqa: SLF001 (its frame read or not yet)
    finally:
        held.release()
    assert held.core.quarantined_bytes() == 0
    assert held.core.leases.held_bytes(0, SLOT) == 0


def test_a_refill_held_past_its_sessions_end_is_freed_not_granted(
    node: DaemonThread, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the session ends while its refill waits to be granted: the late grant is refused and
    # its room freed (nothing leaks, nothing is quarantined)
    held = _HeldRefill(node, monkeypatch)
    core = held.core
    used = lambda: node.daemon.store.stats().tiers[0].used_bytes  # noqa: E731
    base = used()
    keys = random_keys(4)
    a = Client(node.unix_address, transport="shm", timeout_s=60)
    try:
        a.describe()
        assert all(r.stored for r in a.put(keys, [value_for(k, SIZE) for k in keys]))
        assert held.reached.wait(30)
        sid = a._session._session_id  # noqa: SLF001
        core.close_session(sid)  # as when A's process dies: its slots are freed
        assert core.leases.held_bytes(sid, SLOT) == 0
        held.release()
        wait_until(lambda: used() == base + 4 * SIZE, what="only the 4 blocks stored")
        assert core.leases.held_bytes(sid, SLOT) == 0
        assert core.quarantined_bytes() == 0
    finally:
        held.release()
        a.close()
    assert used() == base + 4 * SIZE


def test_a_refill_lost_with_its_connection_is_freed_by_the_orphan_ack(node: DaemonThread) -> None:
    # the control connection fails before the refill's frame is read: the client never
    # learns those slots, so it acks the request as an orphan and the node frees them
    events: list[dict[str, Any]] = []
    _hooks.install(lambda e, **f: events.append(f) if e == "slot_refill_arrived" else None)
    try:
        with Client(node.unix_address, transport="shm", timeout_s=60) as c:
            keys = random_keys(4)
            assert all(r.stored for r in c.put(keys, [value_for(k, SIZE) for k in keys]))
            control = c._st.control  # noqa: SLF001
            assert control is not None
            for conn in list(control._free):  # noqa: SLF001 (the connection "fails")
                control._free.remove(conn)  # noqa: SLF001
                conn.close()
            assert [e["lost"] for e in events] == [True]
            c.stats()  # the next call sends the ack (in the background)
            wait_until(lambda: _slot_bytes(node, c) == 4 * SIZE, what="the lost refill freed")
            keys2 = random_keys(4)
            assert all(r.stored for r in c.put(keys2, [value_for(k, SIZE) for k in keys2]))
            assert c.get(keys + keys2) == [value_for(k, SIZE) for k in keys + keys2]
    finally:
        _hooks.install(None)
    core = node.daemon.core
    assert core is not None and core.quarantined_bytes() == 0


def test_async_puts_read_each_refill_with_the_next_request(node: DaemonThread) -> None:
    # the asyncio client's channel: the refill's frame of one put is read with the next
    # request on that connection, before that request's own answer
    arrived: list[bool] = []
    _hooks.install(lambda e, **f: arrived.append(f["lost"]) if e == "slot_refill_arrived" else None)

    async def main() -> None:
        async with AsyncClient(node.unix_address, transport="shm", timeout_s=60) as a:
            batches = [random_keys(4) for _ in range(3)]
            for keys in batches:
                assert all(r.stored for r in await a.put(keys, [value_for(k, SIZE) for k in keys]))
            assert arrived == [False, False]  # the last one's frame is not read yet
            every = [k for keys in batches for k in keys]
            assert await a.get(every) == [value_for(k, SIZE) for k in every]
            wait_until(lambda: _slot_bytes(node, a) == 8 * SIZE, what="two puts' worth of slots")

    try:
        asyncio.run(main())
    finally:
        _hooks.install(None)
    core = node.daemon.core
    assert core is not None and core.quarantined_bytes() == 0


def test_plain_batches_travel_as_columns_and_metas_as_slot_writes(
    node: DaemonThread, control_channel: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node takes both CommitSlots shapes: a plain batch (no metas) goes as packed
    columns once the node answered ``accepts_columns``, a batch with metas as SlotWrites;
    both store the right bytes (a failed write in a columns request is answered in
    ``results``: the lapsed-slot test above runs on columns too)."""
    from kvstored.node import service

    calls: list[int] = []
    real = service._column_writes  # noqa: SLF001
    monkeypatch.setattr(service, "_column_writes", lambda req: calls.append(len(req.write_slot_ids)) or real(req))
    with Client(node.unix_address, transport="shm") as c:
        for _ in range(3):
            keys = random_keys(4)
            assert all(r.stored for r in c.put(keys, [value_for(k, SIZE) for k in keys]))
            assert c.get(keys) == [value_for(k, SIZE) for k in keys]
            assert calls == [4], calls  # (the first put's grant answer said accepts_columns)
            assert c.put(keys, [value_for(k, SIZE) for k in keys])[0].stored is False  # existed
            assert calls == [4, 4], calls
            calls.clear()
        keys = random_keys(4)
        got = c.put(keys, [value_for(k, SIZE) for k in keys], metas=[b"m"] * 4)
        assert all(r.stored for r in got) and calls == []  # metas: SlotWrites
        assert c.get(keys) == [value_for(k, SIZE) for k in keys]


def test_a_request_with_both_shapes_or_uneven_columns_is_refused() -> None:
    from kvstored.errors import InvalidArgument
    from kvstored.node.service import _column_writes
    from kvstored.v1 import node_pb2 as pb

    ok = pb.CommitSlotsRequest(write_slot_ids=[1, 2], write_keys=[b"a", b"b"], write_sizes=[3, 4])
    assert _column_writes(ok) == [(1, b"a", 3, b""), (2, b"b", 4, b"")]
    with pytest.raises(InvalidArgument, match="2 write_slot_ids, 1 write_keys and 2 write_sizes"):
        _column_writes(pb.CommitSlotsRequest(write_slot_ids=[1, 2], write_keys=[b"a"], write_sizes=[3, 4]))
    both = pb.CommitSlotsRequest(write_slot_ids=[1], write_keys=[b"a"], write_sizes=[3],
                                 writes=[pb.SlotWrite(slot_id=2, key=b"b", size_bytes=1)])
    with pytest.raises(InvalidArgument, match="got 1 writes, 1 write_slot_ids"):
        _column_writes(both)
