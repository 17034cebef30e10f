"""A node slow to open a client's session, under a tight deadline (a loaded machine).

A shared-memory client's first lookup opens its session (the OpenSession stream: one-sided
probes run only inside a live session). The vLLM connector gives its lookups 50 ms; under CPU
load the node's answer came later, the client cancelled the stream and raised Unavailable,
and every later lookup opened a fresh stream that raced its own 50 ms again: a second engine
process got 0 cached tokens from a node holding every block. Pinned here, with the node's
OpenSession held by a gate (no sleep decides anything):

- a session open that misses a call's deadline stays open: that call gets DeadlineExceeded,
  the next one takes the session once the node answers (one OpenSession, not one per call);
- ``Client.connect()`` (what the connector's client pool calls) opens the session up front,
  so a later lookup needs no session open within its deadline;
- the same for the asyncio client.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from it_helpers import random_keys, value_for, wait_until

from kvstored import Client
from kvstored.client.aio import AsyncClient
from kvstored.errors import DeadlineExceeded
from kvstored.integrations.blockio import ClientPool, ConnectorConfig
from kvstored.keys import Namespace
from kvstored.node.service import NodeServicer

NS_FIELDS = {"model_id": "test/model", "kv_dtype": "float32", "kv_layout": "test", "block_size": 16}


class OpenGate:
    """Holds the node's OpenSession handlers before they answer.

    Not holding (the start): every open passes. After :meth:`hold`, the n-th open to arrive
    (counting from 0, over the node's whole life) waits until :meth:`release` let n + 1
    through, or until teardown opens the gate for good.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.arrived = 0
        self._holding = False
        self._allowed = 0
        self._open = False

    def hold(self) -> None:
        with self._cond:
            self._holding, self._allowed = True, self.arrived

    def release(self, n: int) -> None:
        """Let the first ``n`` opens held since :meth:`hold` answer."""
        with self._cond:
            self._allowed += n
            self._cond.notify_all()

    def open_for_good(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def arrive(self) -> None:
        """(a thread of the node) Count this open; wait while it is held."""
        with self._cond:
            ticket = self.arrived
            self.arrived += 1
            if self._holding:
                self._cond.wait_for(lambda: self._open or ticket < self._allowed)


@pytest.fixture
def gated(start_node: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, OpenGate]]:
    """A node whose OpenSession handlers pass through an :class:`OpenGate`."""
    gate = OpenGate()
    original = NodeServicer.OpenSession

    async def open_session(self: NodeServicer, req: Any, context: Any) -> None:
        await asyncio.to_thread(gate.arrive)  # the node's loop serves everything else meanwhile
        await original(self, req, context)

    monkeypatch.setattr(NodeServicer, "OpenSession", open_session)  # before the node registers it
    node = start_node(ssd_size_bytes=0, ssd_dir=None)
    try:
        yield node, gate
    finally:
        gate.open_for_good()  # before the node stops: no handler left waiting


def _put(address: str, keys: list[bytes], namespace: Namespace | None = None) -> None:
    with Client(address, namespace=namespace) as w:
        assert all(r.stored for r in w.put(keys, [value_for(k, 8192) for k in keys]))


def test_a_session_open_that_misses_a_lookups_deadline_is_taken_by_the_next_call(gated) -> None:
    node, gate = gated
    keys = random_keys(4)
    _put(node.unix_address, keys)
    opens_before = gate.arrived
    gate.hold()
    with Client(node.unix_address) as c:
        assert c.describe().transport == "shm"
        # the node has not answered the open: a timeout, not a dead node
        with pytest.raises(DeadlineExceeded, match="stays open"):
            c.lookup_prefix(keys, timeout_s=0.05)
        wait_until(lambda: gate.arrived > opens_before, 60, "the open reached the node")
        gate.release(1)  # that open answers; any later one would wait for good
        assert c.lookup_prefix(keys, timeout_s=30) == 4  # the same stream's session
        assert c.get(keys[:1], timeout_s=30) == [value_for(keys[0], 8192)]
        assert gate.arrived == opens_before + 1  # one OpenSession, not one per call


def test_a_connected_client_needs_no_session_open_within_a_lookup(gated) -> None:
    node, gate = gated
    pool = ClientPool(lambda salt: Namespace(**NS_FIELDS, tenant_salt=salt),
                      ConnectorConfig(address=node.unix_address, lookup_timeout_ms=50))
    try:
        client = pool.get("")  # connects: Describe, transport, session
        keys = random_keys(4)
        _put(node.unix_address, keys, client.namespace)
        gate.hold()  # from here on, no open of the node answers
        assert client.lookup_prefix(keys, timeout_s=0.05) == 4
        info = client.connect(timeout_s=0.05)  # connected already: nothing to open
        assert info.transport == "shm"
    finally:
        pool.close()


def test_the_async_client_takes_a_session_that_opened_after_its_deadline(gated) -> None:
    node, gate = gated
    keys = random_keys(3)
    _put(node.unix_address, keys)
    opens_before = gate.arrived
    gate.hold()

    async def main() -> None:
        async with AsyncClient(node.unix_address) as c:
            await c.describe()
            with pytest.raises(DeadlineExceeded, match="stays open"):
                await c.lookup_prefix(keys, timeout_s=0.05)
            await asyncio.to_thread(wait_until, lambda: gate.arrived > opens_before, 60,
                                    "the open reached the node")
            gate.release(1)
            assert await c.lookup_prefix(keys, timeout_s=30) == 3
            assert gate.arrived == opens_before + 1
            await c.connect(timeout_s=30)
            assert gate.arrived == opens_before + 1  # the session is open: none reopened

    asyncio.run(main())
