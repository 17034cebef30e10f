"""The sync client's one-call put (kvstored/client/_fastput.py) against a live node.

The general put's tests hold races with client hooks (kvstored.client._hooks), and a hook
sends every put through the general path; so the seams here are the fast path's own: its
``copy_at`` and its control channel's ``call``, replaced by the test (threading.Event to hold,
the node's clock moved to lapse a lease; no sleeps). Every test checks the bytes read back
and where the slot space went (held, quarantined, or free again).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from it_helpers import DaemonThread, random_keys, value_for, wait_until

from kvstored import Client
from kvstored.client import _fastput
from kvstored.client._control import NoAnswer
from kvstored.errors import BlockTooLarge, InvalidArgument, KeyInvalid, LeaseExpired
from kvstored.node.slots import SLOT

SIZE = 1 << 20


def _slot_bytes(node: DaemonThread, c: Client) -> int:
    core = node.daemon.core
    assert core is not None
    return core.leases.held_bytes(c._session._session_id, SLOT)  # noqa: SLF001


def _methods(c: Client, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The control channel's calls of ``c`` from now on (method names, in order)."""
    control = c._st.control  # noqa: SLF001
    assert control is not None, "no control channel"
    call = control.call
    methods: list[str] = []

    def record(method: str, *args: Any, **kwargs: Any) -> Any:
        methods.append(method)
        return call(method, *args, **kwargs)

    monkeypatch.setattr(control, "call", record)
    return methods


def _taken() -> int:
    return _fastput.FAST_PUT_STATS["taken"]


def test_a_steady_put_is_one_call_and_one_commit_slots(
    node: DaemonThread, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Client(node.unix_address, transport="shm") as c:
        c.describe()
        methods = _methods(c, monkeypatch)
        written: list[bytes] = []
        for n in range(4):
            keys = random_keys(4)
            before = _taken()
            methods.clear()
            got = c.put(keys, [value_for(k, SIZE) for k in keys])
            assert [r.stored for r in got] == [True] * 4 and all(r.error is None for r in got)
            # the first put asks for its slots (the general path); then one call each
            assert _taken() - before == (0 if n == 0 else 1), n
            assert methods == (["CommitSlots"] * 2 if n == 0 else ["CommitSlots"]), (n, methods)
            written += keys
        assert c.get(written) == [value_for(k, SIZE) for k in written]
        before = _taken()
        again = c.put(written[-4:], [np.frombuffer(value_for(k, SIZE), dtype=np.uint8)
                                     for k in written[-4:]])  # numpy values, stored already
        assert _taken() - before == 1
        assert [(r.stored, r.error) for r in again] == [(False, None)] * 4  # existed
        # two puts' worth: the last refill is granted after the answer put() returned on
        wait_until(lambda: _slot_bytes(node, c) == 8 * SIZE, what="two puts' worth of slots")
    core = node.daemon.core
    assert core is not None and core.quarantined_bytes() == 0


@pytest.mark.parametrize("case", ["metas", "replicas", "mixed_sizes", "bad_key", "not_a_buffer",
                                  "too_large", "tuple", "small"])
def test_what_the_one_call_path_does_not_take_the_general_path_answers(
    node: DaemonThread, case: str,
) -> None:
    with Client(node.unix_address, transport="shm") as c:
        warm = random_keys(4)
        c.put(warm, [value_for(k, SIZE) for k in warm])  # the pool holds this shape now
        keys = random_keys(4)
        values: Any = [value_for(k, SIZE) for k in keys]
        kwargs: dict[str, Any] = {}
        want: list[Any] = [True] * 4
        if case == "metas":
            kwargs["metas"] = [b"m"] * 4
        elif case == "replicas":
            kwargs["replicas"] = 1
        elif case == "mixed_sizes":
            values[1] = values[1][: SIZE // 2]
        elif case == "bad_key":
            keys[2] = b""
            want[2] = KeyInvalid
        elif case == "not_a_buffer":
            values[3] = 12345
            want[3] = InvalidArgument
        elif case == "too_large":
            values[0] = bytes(node.daemon.cfg.max_block_bytes + 1)
            want[0] = BlockTooLarge
        elif case == "tuple":
            keys, values = tuple(keys), tuple(values)
        elif case == "small":
            values = [v[:100] for v in values]  # inline: one Put with the values
        before, passed = _taken(), _fastput.FAST_PUT_STATS["passed"]
        got = c.put(keys, values, **kwargs)
        assert _taken() == before and _fastput.FAST_PUT_STATS["passed"] == passed
        for r, w in zip(got, want, strict=True):
            if w is True:
                assert r.stored and r.error is None, (case, r)
            else:
                assert isinstance(r.error, w) and not r.stored, (case, r)
        for k, v, w in zip(keys, values, want, strict=True):
            if w is True:
                assert c.get([k]) == [bytes(v)]
        if case == "bad_key":
            assert "key #2" in str(got[2].error)


def test_a_commit_that_got_no_answer_returns_its_slots_acks_it_and_the_retry_stores(
    node: DaemonThread, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the first CommitSlots of a fast put fails with no answer: the slots it copied into go
    # back to the pool (returned with the next CommitSlots, freed), its request id is acked
    # as an orphan, and the client's retry (the general path) stores every block
    core = node.daemon.core
    assert core is not None
    with Client(node.unix_address, transport="shm", timeout_s=60) as c:
        warm = random_keys(4)
        c.put(warm, [value_for(k, SIZE) for k in warm])
        control = c._st.control  # noqa: SLF001
        assert control is not None
        call = control.call
        failed: list[int] = []
        returned: list[int] = []
        acks: list[bool] = []

        def once(method: str, request: Any, *args: Any, **kwargs: Any) -> Any:
            if not failed:
                failed.append(request.request_id)
                failed.extend(request.write_slot_ids)
                raise NoAnswer("the control channel failed: injected by the test")
            returned.extend(request.return_slot_ids)
            return call(method, request, *args, **kwargs)

        monkeypatch.setattr(control, "call", once)
        start = c._start_orphan_acks  # noqa: SLF001
        monkeypatch.setattr(c, "_start_orphan_acks", lambda: (acks.append(True), start()))
        keys = random_keys(4)
        before = _taken()
        got = c.put(keys, [value_for(k, SIZE) for k in keys])
        assert [r.stored for r in got] == [True] * 4
        assert _taken() == before  # the retry went the general way
        assert len(failed) == 5 and acks == [True]
        assert set(failed[1:]) <= set(returned)  # handed back: returned by the retry's commit
        assert not set(failed[1:]) & c._st.slots.slot_ids()  # noqa: SLF001 (never reused)
        assert c.get(keys) == [value_for(k, SIZE) for k in keys]
        more = random_keys(4)
        assert all(r.stored for r in c.put(more, [value_for(k, SIZE) for k in more]))
        wait_until(lambda: not c._st.orphans, what="the orphan ack sent")  # noqa: SLF001
        wait_until(lambda: _slot_bytes(node, c) == 8 * SIZE, what="the pool, the returns freed")
        assert core.quarantined_bytes() == 0


def test_a_slot_lapsing_mid_copy_on_the_one_call_path_is_quarantined_and_refused(
    node: DaemonThread, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A's fast put is held inside its copy while the node's clock passes the slots' lease:
    # they are quarantined (never handed to B); A's late commit is refused per item
    # (LeaseExpired) and is the ack that frees them; B's blocks keep their bytes
    core = node.daemon.core
    assert core is not None
    reached, go = threading.Event(), threading.Event()
    copy_at = _fastput.copy_at

    def held_copy(view: Any, offsets: Any, values: Any, *, stream: bool) -> None:
        copy_at(view, offsets[:1], values[:1], stream=stream)
        if not reached.is_set():
            reached.set()
            assert go.wait(60)
        copy_at(view, offsets[1:], values[1:], stream=stream)

    with Client(node.unix_address, transport="shm", timeout_s=60) as a, \
            Client(node.unix_address, transport="shm", reserve_ahead_bytes=0) as b:
        warm = random_keys(2)
        a.put(warm, [value_for(k, SIZE) for k in warm])
        # the pool: the 2 slots left of the first grant, and the warm put's refill (granted
        # after its answer, so waited for here: it lapses with the others below)
        wait_until(lambda: _slot_bytes(node, a) == 4 * SIZE, what="the warm put's refill")
        ka, kb = random_keys(2), random_keys(2)
        monkeypatch.setattr(_fastput, "copy_at", held_copy)
        before = _taken()
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(a.put(ka, [value_for(k, SIZE) for k in ka])))
        t.start()
        try:
            assert reached.wait(30)
            core.clock = lambda: time.monotonic() + 10_000.0
            assert core.reap_expired() >= 1
            assert core.quarantined_bytes() == 4 * SIZE  # the 2 being written, the 2 idle
            assert all(r.stored for r in b.put(kb, [value_for(k, SIZE) for k in kb]))
        finally:
            go.set()
            t.join(60)
        assert _taken() - before == 1
        assert [type(r.error) for r in out[0]] == [LeaseExpired, LeaseExpired]
        assert not any(r.stored for r in out[0])
        assert core.quarantined_bytes() == 2 * SIZE  # the late commit acked its 2 slots
        assert b.get(kb) == [value_for(k, SIZE) for k in kb]
        assert b.get(ka) == [None, None]
    assert core.quarantined_bytes() == 0  # A's session ended: its idle slots are freed
