"""Read fallback (kvstored/node/remote.py): a block whose holder cannot be reached is copied from
the next holder the master named (``alternates``) within the same read; a failed holder is
suspect for a while (kvstored/node/suspects.py): sent as ``avoid`` and tried last.

Real source data planes in-process (each sends its replicas' generations); the master is a
dict the test controls (:class:`PerKeyMaster`), so which holder is named first is exact. The
holder's death between the lookup and the copy is set up at the ``before_copy`` hook (the
point the ``remote_fill_before_copy`` fault hook holds in a real node), never by a sleep.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator

import pytest
from remote_helpers import (
    DataPlanes,
    PerKeyMaster,
    key,
    local_bytes,
    make_core,
    make_reads,
    with_generations,
)

from kvstored.node.core import NodeCore
from kvstored.node.remote import MAX_FALLBACKS
from kvstored.node.suspects import MAX_SUSPECTS, Suspects
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import Tier

BLOCK = 16 << 10
IDS = list(range(6))


def value(i: int) -> bytes:
    return bytes([i % 251]) * (BLOCK // 2 + i)


@pytest.fixture
def planes() -> Iterator[DataPlanes]:
    p = DataPlanes()
    yield p
    p.close()


@pytest.fixture
def local() -> Iterator[NodeCore]:
    core = make_core("dst", block_bytes=BLOCK)
    yield core
    core.store.close()


def _dead_address() -> str:
    """A loopback port nobody listens on (a SIGKILLed holder: connect refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def _holder(planes: DataPlanes, node_id: str, gen: int, ids: list[int],
            *, wrong_gen: bool = False) -> ClusterReplica:
    """A live source ``node_id`` holding ``ids`` (each under generation ``gen + i``); returns
    the replica template the master names it by (generation filled per key below).
    ``wrong_gen``: it sends another generation than the one it is named by."""
    core = make_core(node_id, block_bytes=BLOCK)
    with_generations(core, {key(i): gen + i + (1000 if wrong_gen else 0) for i in ids})
    for i in ids:
        core.put_inline([(key(i), value(i), b"")], b"")
    return ClusterReplica(node_id, 7, Tier.DRAM, 0, gen, planes.serve(core))


def _name(master: PerKeyMaster, ids: list[int], first: ClusterReplica,
          *others: ClusterReplica) -> None:
    """The master names ``first`` for each key, ``others`` as its alternates, in order."""
    def per_key(r: ClusterReplica, i: int) -> ClusterReplica:
        return dataclasses.replace(r, size_bytes=len(value(i)), generation=r.generation + i)

    for i in ids:
        master.replicas[key(i)] = dataclasses.replace(
            per_key(first, i), alternates=tuple(per_key(o, i) for o in others))


def test_a_dead_holders_blocks_come_from_the_next_holder_in_the_same_read(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    dead = ClusterReplica("a", 7, Tier.DRAM, 0, 100, _dead_address())
    b = _holder(planes, "b", 200, IDS)
    _name(master, IDS, dead, b)
    reads = make_reads(local, master, lookup_each=master.lookup_each)
    try:
        got = reads.fill([key(i) for i in IDS], b"")
        assert (got.num_found, got.num_fetched, got.num_dropped, got.num_failed,
                got.num_fallbacks) == (6, 6, 0, 0, 6)
        assert local_bytes(local, IDS) == [value(i) for i in IDS]
        assert master.each_lookups == 1  # within the same request: no second lookup
        assert reads.wait_reports()
        assert master.reports == [("a", 7, False)]  # the failure still reaches the master
        assert reads.suspects.current() == ["a"]
    finally:
        reads.close()


def test_without_fallback_the_dead_holders_blocks_miss_as_before(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    _name(master, IDS, ClusterReplica("a", 7, Tier.DRAM, 0, 100, _dead_address()),
          _holder(planes, "b", 200, IDS))
    reads = make_reads(local, master, lookup_each=master.lookup_each, max_fallbacks=0)
    try:
        got = reads.fill([key(i) for i in IDS], b"")
        assert (got.num_fetched, got.num_failed, got.num_fallbacks) == (0, 6, 0)
        assert local_bytes(local, IDS) == [None] * 6
    finally:
        reads.close()


def test_a_holder_killed_between_the_lookup_and_the_copy_falls_back(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    a_core = make_core("a", block_bytes=BLOCK)
    with_generations(a_core, {key(i): 100 + i for i in IDS})
    for i in IDS:
        a_core.put_inline([(key(i), value(i), b"")], b"")
    a_server = DataPlaneServer(a_core, "127.0.0.1:0")
    a = ClusterReplica("a", 7, Tier.DRAM, 0, 100, a_server.start())
    _name(master, IDS, a, _holder(planes, "b", 200, IDS))
    stopped: list[bool] = []

    def kill_a() -> None:  # the lookup named a, alive; it dies before the copy
        if not stopped:
            a_server.stop(0.0)
            stopped.append(True)

    reads = make_reads(local, master, lookup_each=master.lookup_each, before_copy=kill_a)
    try:
        got = reads.fill([key(i) for i in IDS], b"")
        assert stopped and (got.num_fetched, got.num_failed, got.num_fallbacks) == (6, 0, 6)
        assert local_bytes(local, IDS) == [value(i) for i in IDS]
    finally:
        reads.close()
        a_core.store.close()


def test_bytes_that_fail_the_generation_check_on_the_fallback_holder_are_a_miss(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    dead = ClusterReplica("a", 7, Tier.DRAM, 0, 100, _dead_address())
    # b replaced its blocks since the lookup: it sends other generations than it is named by
    _name(master, IDS, dead, _holder(planes, "b", 200, IDS, wrong_gen=True))
    reads = make_reads(local, master, lookup_each=master.lookup_each)
    try:
        got = reads.fill([key(i) for i in IDS], b"")
        assert (got.num_fetched, got.num_dropped, got.num_fallbacks) == (0, 6, 6)
        assert local_bytes(local, IDS) == [None] * 6  # never the unverified bytes
    finally:
        reads.close()


def test_every_holder_dead_is_a_miss_after_a_bounded_number_of_fallbacks(
    local: NodeCore,
) -> None:
    master = PerKeyMaster()
    holders = [ClusterReplica(f"n{j}", 7, Tier.DRAM, 0, 100, _dead_address())
               for j in range(MAX_FALLBACKS + 3)]
    _name(master, IDS, holders[0], *holders[1:])
    reads = make_reads(local, master, lookup_each=master.lookup_each)
    try:
        got = reads.fill([key(i) for i in IDS], b"")
        assert (got.num_fetched, got.num_failed) == (0, 6)
        assert got.num_fallbacks == 6 * MAX_FALLBACKS  # 1 + MAX_FALLBACKS holders per block
        assert reads.wait_reports()
        assert sorted(p for p, _, _ in master.reports) == [f"n{j}" for j in range(MAX_FALLBACKS + 1)]
        assert local_bytes(local, IDS) == [None] * 6
    finally:
        reads.close()


def test_a_blackholed_holder_costs_one_read_its_deadline_then_the_next_holder_serves(
    planes: DataPlanes, local: NodeCore
) -> None:
    black = socket.socket()  # the kernel queues the connection; nothing ever answers
    black.bind(("127.0.0.1", 0))
    black.listen(8)
    master = PerKeyMaster()
    stuck = ClusterReplica("a", 7, Tier.DRAM, 0, 100, f"127.0.0.1:{black.getsockname()[1]}")
    _name(master, IDS, stuck, _holder(planes, "b", 200, IDS))
    reads = make_reads(local, master, lookup_each=master.lookup_each, fetch_timeout_s=0.5)
    try:
        # the first read gives a the whole deadline (a slow holder is never cut short):
        # nothing is left for b, so it misses, within the deadline, as before
        got = reads.fill([key(i) for i in IDS], b"")
        assert (got.num_fetched, got.num_failed, got.num_fallbacks) == (0, 6, 0)
        assert reads.suspects.current() == ["a"]
        # the next read tries b first (had it waited for a, nothing would be left for b)
        got = reads.fill([key(i) for i in IDS], b"")
        assert (got.num_fetched, got.num_failed) == (6, 0)
        assert local_bytes(local, IDS) == [value(i) for i in IDS]
        assert reads.wait_reports() and master.reports == [("a", 7, False)]  # a tried once
    finally:
        reads.close()
        black.close()


def test_a_suspect_holder_is_sent_as_avoid_tried_last_and_cleared_by_a_success(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    first, second = [0, 1, 2], [3, 4, 5]
    dead = ClusterReplica("a", 7, Tier.DRAM, 0, 100, _dead_address())
    b = _holder(planes, "b", 200, IDS)
    _name(master, IDS, dead, b)
    reads = make_reads(local, master, lookup_each=master.lookup_each)
    try:
        assert reads.fill([key(i) for i in first], b"").num_fallbacks == 3
        assert reads.wait_reports()
        assert master.reports == [("a", 7, False)]
        # this master ignores avoid and names a first again: the reader tries b first, so
        # the dead a costs this read nothing (no second failure)
        got = reads.fill([key(i) for i in second], b"")
        assert master.avoids == [[], ["a"]]
        assert (got.num_fetched, got.num_fallbacks) == (3, 0)
        assert reads.wait_reports() and master.reports == [("a", 7, False)]
        assert local_bytes(local, IDS) == [value(i) for i in IDS]
    finally:
        reads.close()
    # a success from a suspect clears it (its data plane came back)
    local2 = make_core("dst2", block_bytes=BLOCK)
    master2 = PerKeyMaster()
    a = _holder(planes, "a", 300, IDS)
    _name(master2, IDS, a)
    reads2 = make_reads(local2, master2, lookup_each=master2.lookup_each)
    try:
        reads2.suspects.mark("a")
        assert reads2.fill([key(i) for i in IDS], b"").num_fetched == 6  # the only holder
        assert reads2.suspects.current() == []
    finally:
        reads2.close()
        local2.store.close()


def test_suspects_expire_clear_reorder_and_stay_bounded() -> None:
    now = [100.0]
    s = Suspects(5.0, clock=lambda: now[0])
    s.mark("a")
    now[0] += 1
    s.mark("b")
    assert s.current() == ["a", "b"] and s.is_suspect("a")
    assert s.order(["a", "c", "b", "d"]) == ["c", "d", "a", "b"]
    now[0] += 4.5  # a's mark is 5.5 s old, b's 4.5 s
    assert s.current() == ["b"] and not s.is_suspect("a")
    assert s.clear("b") and not s.clear("b") and s.current() == []
    for i in range(MAX_SUSPECTS + 5):
        s.mark(f"n{i}")
    assert len(s.current()) == MAX_SUSPECTS and "n0" not in s.current()
    off = Suspects(0.0)
    off.mark("a")
    assert off.current() == [] and not off.is_suspect("a")
    with pytest.raises(ValueError, match="hold_s must be >= 0 seconds, got -1"):
        Suspects(-1)
