"""RemoteReads: the per-item generation path, single-flight and parallel peers.

Real source data planes in-process; the master is a dict the test controls. Every race is
held at a hook the test controls (``before_copy``, ``before_verify``, ``on_wait``, a
barrier between two peers' copies); nothing waits on a sleep.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import key
from remote_helpers import FakeMaster, make_core, with_generations
from thread_helpers import completes, in_thread

from kvstored.node.core import NodeCore
from kvstored.node.remote import RemoteReads
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import Tier

BLOCK = 64 << 10


def value(i: int) -> bytes:
    return bytes([i % 251]) * (BLOCK // 2 + i)


def _core(node_id: str) -> NodeCore:
    return make_core(node_id, block_bytes=BLOCK)


@dataclasses.dataclass
class Source:
    core: NodeCore
    address: str
    node_id: str
    generations: dict[bytes, int]
    """What the source's pinned blocks say their generation is (absent = 0, unknown)."""
    exported: list[bytes] = dataclasses.field(default_factory=list)
    """Keys the source's data plane read for a peer (GET_FLAG_PEER_EXPORT), in order."""

    def publish(self, master: FakeMaster, ids: list[int], gen: int) -> None:
        for i in ids:
            self.core.put_inline([(key(i), value(i), b"m")], b"")
            master.replicas[key(i)] = ClusterReplica(self.node_id, 7, Tier.DRAM,
                                                     len(value(i)), gen, self.address)




@pytest.fixture
def make_source() -> Iterator[Any]:
    made: list[tuple[DataPlaneServer, NodeCore]] = []

    def factory(node_id: str = "src") -> Source:
        core = _core(node_id)
        gens: dict[bytes, int] = {}
        exported: list[bytes] = []
        with_generations(core, gens, exported)
        server = DataPlaneServer(core, "127.0.0.1:0")
        made.append((server, core))
        return Source(core, server.start(), node_id, gens, exported)

    yield factory
    for server, core in made:
        server.stop(0.0)
        core.store.close()


@pytest.fixture
def local() -> Iterator[NodeCore]:
    core = _core("dst")
    yield core
    core.store.close()


def _reads(local: NodeCore, master: FakeMaster, **kw: object) -> RemoteReads:
    return RemoteReads(local, node_id="dst", lookup=master.lookup, report=master.report, **kw)  # type: ignore[arg-type]


def _local_bytes(core: NodeCore, ids: list[int]) -> list[bytes | None]:
    out = core.get_inline([key(i) for i in ids], b"", budget_bytes=1 << 30)
    return [o.value if o.found else None for o in out]


# ---- the generation the source sends with each block -----------------------------------------


def test_a_copy_sent_with_the_named_generation_is_verified_without_asking_the_master(
    make_source: Any, local: NodeCore
) -> None:
    src = make_source()
    master = FakeMaster()
    src.publish(master, [1, 2], gen=5)
    src.generations.update({key(1): 5, key(2): 5})
    reads = _reads(local, master)
    try:
        got = reads.fill([key(1), key(2)], b"")
        assert (got.num_fetched, got.num_dropped) == (2, 0)
        assert master.lookups == 1  # the read's lookup only: no verification round trip
        assert _local_bytes(local, [1, 2]) == [value(1), value(2)]
    finally:
        reads.close()


def test_a_copy_whose_source_changed_generation_before_the_send_is_dropped(
    make_source: Any, local: NodeCore
) -> None:
    src = make_source()
    master = FakeMaster()
    src.publish(master, [1, 2], gen=5)
    src.generations.update({key(1): 5, key(2): 5})

    def replace_block_2() -> None:  # after the lookup, before the GET: a new write of block 2
        src.generations[key(2)] = 6  # the master has not heard yet: it still names 5

    reads = _reads(local, master, before_copy=replace_block_2)
    try:
        got = reads.fill([key(1), key(2)], b"")
        assert (got.num_fetched, got.num_dropped) == (1, 1)
        assert _local_bytes(local, [1, 2]) == [value(1), None]
        assert local.store.stats().tiers[0].num_blocks == 1  # the dropped copy's space is back
    finally:
        reads.close()


def test_copies_without_a_generation_are_still_verified_through_the_master(
    make_source: Any, local: NodeCore
) -> None:
    src = make_source()
    master = FakeMaster()
    src.publish(master, [1, 2], gen=5)
    src.generations[key(1)] = 5  # the source knows block 1's generation, not block 2's

    def master_moves_on() -> None:  # held after each copy: block 2 got a new write meanwhile
        r = master.replicas[key(2)]  # (every time: a renamed block is copied once more)
        master.replicas[key(2)] = dataclasses.replace(r, generation=r.generation + 1)

    reads = _reads(local, master, before_verify=master_moves_on)
    try:
        got = reads.fill([key(1), key(2)], b"")
        assert (got.num_fetched, got.num_dropped) == (1, 1)
        assert master.lookups == 3  # block 2 needed the master's word (its copy and re-copy)
        assert _local_bytes(local, [1, 2]) == [value(1), None]
    finally:
        reads.close()


# ---- single-flight -------------------------------------------------------------------------------


def test_a_second_read_of_a_block_being_copied_waits_for_that_copy(
    make_source: Any, local: NodeCore
) -> None:
    src = make_source()
    master = FakeMaster()
    src.publish(master, [1, 2], gen=1)
    arrived, go, waiting = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:  # read 1's copies arrived, not yet verified
        arrived.set()
        assert go.wait(10)

    reads = _reads(local, master, before_verify=hold, on_wait=lambda n: waiting.set())
    t1, r1 = in_thread(lambda: reads.fill([key(1), key(2)], b""))
    try:
        assert arrived.wait(10)
        t2, r2 = in_thread(lambda: reads.fill([key(1), key(2)], b""))
        assert waiting.wait(10)  # read 2 waits for read 1's copy ...
        assert master.lookups == 1  # ... and neither looked up nor copied anything itself
        arrived.clear()
        go.set()
        t1.join(10)
        t2.join(10)
        assert not t1.is_alive() and not t2.is_alive()
        assert (r1[0].num_fetched, r1[0].num_waited) == (2, 0)
        assert (r2[0].num_fetched, r2[0].num_waited, r2[0].num_found) == (0, 2, 0)
        assert not arrived.is_set()  # read 2 never reached a copy of its own
        assert _local_bytes(local, [1, 2]) == [value(1), value(2)]
        assert sorted(src.exported) == [key(1), key(2)]  # each block left the source once
        assert src.core.store.stats().hits == 0  # a peer's read is no engine hit there
        assert len(reads.flights) == 0
    finally:
        go.set()
        t1.join(10)
        reads.close()


def test_a_block_another_reads_copy_brought_here_is_marked_found_for_a_read_that_waited(
    make_source: Any, local: NodeCore
) -> None:
    """Issue 17 (the TCP full-node flake, 2 of 24 missed): a read that waited for another
    read's copy of its blocks left them unmarked in its ``through``, so when the copy was
    dropped here before this read pinned it (the spiller takes copies first), the
    data-plane GET (and the inline Get) did not read it again: a plain miss of a block the
    pool held. Both waited-for blocks must be marked found (``through[key]`` None). (Fails
    on the old code: ``through`` stayed empty.)"""
    src = make_source()
    master = FakeMaster()
    src.publish(master, [1, 2], gen=1)
    arrived, go, waiting = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:  # read 1's copies arrived, not yet verified
        arrived.set()
        assert go.wait(10)

    reads = _reads(local, master, before_verify=hold, on_wait=lambda n: waiting.set())
    t1, r1 = in_thread(lambda: reads.fill([key(1), key(2)], b""))
    through: dict[bytes, Any] = {}
    try:
        assert arrived.wait(10)
        t2, r2 = in_thread(lambda: reads.fill([key(1), key(2)], b"", through=through,
                                              through_budget_bytes=1 << 20))
        assert waiting.wait(10)  # read 2 waits for read 1's copy
        go.set()
        t1.join(10)
        t2.join(10)
        assert (r1[0].num_fetched, r2[0].num_waited) == (2, 2)
        assert through == {key(1): None, key(2): None}  # found in the pool, by read 1
        local.remove([key(1), key(2)], b"")  # dropped before read 2's pin (the spiller)
        again: dict[bytes, Any] = {}  # what the GET then does: read once more, not cached
        got = reads.fill([k for k, v in through.items() if v is None], b"", through=again,
                         through_budget_bytes=1 << 20, cache=False)
        assert got.num_found == 2
        assert again == {key(1): (value(1), b"m"), key(2): (value(2), b"m")}
    finally:
        go.set()
        t1.join(10)
        reads.close()


def test_a_read_waiting_for_another_copy_keeps_its_own_deadline(
    make_source: Any, local: NodeCore
) -> None:
    src = make_source()
    master = FakeMaster()
    src.publish(master, [1], gen=1)
    arrived, go = threading.Event(), threading.Event()

    def hold() -> None:
        arrived.set()
        assert go.wait(10)

    reads = _reads(local, master, before_verify=hold)
    t1, r1 = in_thread(lambda: reads.fill([key(1)], b""))
    try:
        assert arrived.wait(10)
        t0 = time.monotonic()
        got = completes(lambda: reads.fill([key(1)], b"", remaining_s=0.2), timeout_s=5,
                        blocked_msg="a waiting read ran past its own deadline")
        assert time.monotonic() - t0 < 0.2 + 1.0
        assert (got.num_waited, got.num_fetched) == (1, 0)
        assert _local_bytes(local, [1]) == [None]  # a miss: the first copy is still held
        go.set()
        t1.join(10)
        assert r1[0].num_fetched == 1 and _local_bytes(local, [1]) == [value(1)]
    finally:
        go.set()
        t1.join(10)
        reads.close()


# ---- peers in parallel ---------------------------------------------------------------------------


def test_blocks_of_two_peers_are_copied_at_the_same_time(
    make_source: Any, local: NodeCore
) -> None:
    a, b = make_source("a"), make_source("b")
    master = FakeMaster()
    a.publish(master, [1], gen=1)
    b.publish(master, [2], gen=1)
    both = threading.Barrier(2, timeout=5)  # only passes when both peers' copies are under way
    reads = _reads(local, master, before_copy=both.wait)
    try:
        got = completes(lambda: reads.fill([key(1), key(2)], b""), timeout_s=20)
        assert (got.num_found, got.num_fetched) == (2, 2)
        assert _local_bytes(local, [1, 2]) == [value(1), value(2)]
    finally:
        reads.close()
