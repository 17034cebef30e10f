"""RemoteReads (kvstored/node/remote.py) against a real source node's data plane, in-process.

The master is a dict the test controls (key -> the replica it names), so the races are set up
exactly: the source changing generation between the copy and its verification (held at the
``before_verify`` hook), a peer that never answers, probes that must not fetch.

The source here is an *older* node: its data plane sends generation 0 (it does not know its
replicas' generations), so every copy is verified through the master, the fallback path.
The source that sends its generations is tested in test_remote_reads_fast.py and
test_remote_generations.py.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from helpers import key
from remote_helpers import FakeMaster, make_core

from kvstored.errors import NotFound
from kvstored.node.core import NodeCore
from kvstored.node.remote import RemoteReads
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import PinnedBlock, Tier

BLOCK = 64 << 10


def value(i: int) -> bytes:
    return bytes([i % 251]) * (BLOCK // 2 + i)


def _core(node_id: str) -> NodeCore:
    return make_core(node_id, block_bytes=BLOCK)


EXPORTED: dict[int, list[bytes]] = {}
"""Per source core (``id``): the keys its data plane read for a peer (GET_FLAG_PEER_EXPORT)."""


def _as_older_node(core: NodeCore) -> None:
    """Make ``core``'s pinned blocks carry generation 0 (a node that does not know them)."""
    inner_fn = core.pinned_chunks

    def pinned_chunks(keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int = 64
                      ) -> Iterator[tuple[int, list[Any]]]:
        inner = inner_fn(keys, namespace_id, chunk_keys=chunk_keys)
        try:
            for start, got in inner:
                yield start, [dataclasses.replace(b, generation=0)
                              if isinstance(b, PinnedBlock) else b for b in got]
        finally:
            inner.close()

    core.pinned_chunks = pinned_chunks  # type: ignore[method-assign]
    inner_export = core.store.read_for_export  # a peer's GET (GET_FLAG_PEER_EXPORT)

    exported = EXPORTED.setdefault(id(core), [])

    def read_for_export(keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[Any]:
        exported.extend(keys)
        return [dataclasses.replace(b, generation=0) if b is not None else None
                for b in inner_export(keys, namespace_id=namespace_id)]

    core.store.read_for_export = read_for_export  # type: ignore[method-assign]


@pytest.fixture
def source() -> Iterator[tuple[NodeCore, str]]:
    core = _core("src")
    _as_older_node(core)
    server = DataPlaneServer(core, "127.0.0.1:0")
    address = server.start()
    yield core, address
    server.stop(0.0)
    core.store.close()
    EXPORTED.pop(id(core), None)


@pytest.fixture
def local() -> Iterator[NodeCore]:
    core = _core("dst")
    yield core
    core.store.close()


def _publish(master: FakeMaster, src: NodeCore, address: str, ids: list[int], gen: int = 1) -> None:
    for i in ids:
        src.put_inline([(key(i), value(i), b"m")], b"")
        master.replicas[key(i)] = ClusterReplica("src", 7, Tier.DRAM, len(value(i)), gen, address)


def _eventually(cond: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _reads(local: NodeCore, master: FakeMaster, **kw: object) -> RemoteReads:
    return RemoteReads(local, node_id="dst", lookup=master.lookup, report=master.report, **kw)  # type: ignore[arg-type]


def _local_bytes(core: NodeCore, ids: list[int]) -> list[bytes | None]:
    out = core.get_inline([key(i) for i in ids], b"", budget_bytes=1 << 30)
    return [o.value if o.found else None for o in out]


def test_fill_copies_missing_blocks_from_the_peer_with_identical_bytes(
    source: tuple[NodeCore, str], local: NodeCore
) -> None:
    src, address = source
    master = FakeMaster()
    _publish(master, src, address, [1, 2, 3])
    local.put_inline([(key(0), value(0), b"")], b"")  # a local hit is never fetched
    reads = _reads(local, master)
    try:
        got = reads.fill([key(0), key(1), key(2), key(3), key(4)], b"")
        assert (got.num_found, got.num_fetched, got.num_dropped, got.num_failed) == (3, 3, 0, 0)
        assert _local_bytes(local, [0, 1, 2, 3, 4]) == [value(0), value(1), value(2), value(3), None]
        # the source's GET releases its pins once its response is sent (its own thread)
        assert _eventually(lambda: src.store.stats().pinned_blocks == 0)
        assert reads.wait_reports()
        assert master.reports == []  # a healthy peer is not reported
    finally:
        reads.close()


def test_copy_whose_source_changed_generation_during_the_transfer_is_dropped(
    source: tuple[NodeCore, str], local: NodeCore
) -> None:
    src, address = source
    master = FakeMaster()
    _publish(master, src, address, [1, 2])
    arrived, go = threading.Event(), threading.Event()

    def hold() -> None:  # the copies are in local reservations, not yet verified
        if arrived.is_set():  # the copy made once more against the new name: changed again
            old = master.replicas[key(2)]
            master.replicas[key(2)] = ClusterReplica("src", 7, Tier.DRAM, old.size_bytes,
                                                     old.generation + 1, address)
        arrived.set()
        assert go.wait(10)

    reads = _reads(local, master, before_verify=hold)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(reads.fill([key(1), key(2)], b"")))
    t.start()
    try:
        assert arrived.wait(10)
        # meanwhile the source dropped block 2 and a new write of it got generation 2
        old = master.replicas[key(2)]
        master.replicas[key(2)] = ClusterReplica("src", 7, Tier.DRAM, old.size_bytes, 2, address)
        assert _local_bytes(local, [1, 2]) == [None, None]  # nothing visible before verification
        go.set()
        t.join(10)
        got = result[0]
        assert got.num_fetched == 1 and got.num_dropped == 1  # type: ignore[attr-defined]
        assert _local_bytes(local, [1, 2]) == [value(1), None]
        dram = local.store.stats().tiers[0]
        assert dram.num_blocks == 1 and dram.used_bytes < 2 * len(value(1))  # the copy's space is back
    finally:
        go.set()
        t.join(10)
        reads.close()


def test_a_copy_renamed_once_on_the_same_source_is_copied_again_against_the_new_name(
    source: tuple[NodeCore, str], local: NodeCore
) -> None:
    # e.g. the source's pin promoted its SSD replica into DRAM: a new replica (generation)
    # of the same block on the same epoch, named by the master after the first copy
    src, address = source
    master = FakeMaster()
    _publish(master, src, address, [1, 2])
    calls: list[int] = []

    def rename_once() -> None:
        calls.append(master.replicas[key(2)].generation)
        if len(calls) == 1:
            r = master.replicas[key(2)]
            master.replicas[key(2)] = ClusterReplica("src", 7, Tier.DRAM, r.size_bytes, 5, address)

    reads = _reads(local, master, before_verify=rename_once)
    try:
        got = reads.fill([key(1), key(2)], b"")
        assert (got.num_fetched, got.num_dropped, got.num_failed) == (2, 0, 0)
        assert calls == [1, 5]  # a second copy of block 2 only, verified against generation 5
        assert _local_bytes(local, [1, 2]) == [value(1), value(2)]
    finally:
        reads.close()


def test_copy_whose_source_restarted_or_lost_the_block_is_dropped(
    source: tuple[NodeCore, str], local: NodeCore
) -> None:
    src, address = source
    master = FakeMaster()
    _publish(master, src, address, [1, 2])

    def change() -> None:
        del master.replicas[key(1)]  # gone from the cluster
        r = master.replicas[key(2)]  # the source restarted: same generation, new epoch
        master.replicas[key(2)] = ClusterReplica("src", 8, r.tier, r.size_bytes, r.generation,
                                                 address)

    reads = _reads(local, master, before_verify=change)
    try:
        got = reads.fill([key(1), key(2)], b"")
        assert got.num_fetched == 0 and got.num_dropped == 2
        assert _local_bytes(local, [1, 2]) == [None, None]
    finally:
        reads.close()


def test_a_peer_that_never_answers_is_a_miss_within_the_deadline_and_is_reported(
    local: NodeCore,
) -> None:
    # a listening socket nobody accepts from: the connection is queued, nothing is answered
    black = socket.socket()
    black.bind(("127.0.0.1", 0))
    black.listen(8)
    address = f"127.0.0.1:{black.getsockname()[1]}"
    master = FakeMaster()
    master.replicas[key(1)] = ClusterReplica("dead", 3, Tier.DRAM, len(value(1)), 1, address)
    reads = _reads(local, master, fetch_timeout_s=0.3)
    try:
        t0 = time.monotonic()
        got = reads.fill([key(1)], b"")
        elapsed = time.monotonic() - t0
        assert got.num_failed == 1 and got.num_fetched == 0
        assert elapsed < 0.3 + 1.0, elapsed
        assert _local_bytes(local, [1]) == [None]
        assert reads.wait_reports()
        assert master.reports == [("dead", 3, False)]
        # the caller's own deadline is shorter than the fetch timeout: it wins
        reads.fetch_timeout_s = 30.0
        t0 = time.monotonic()
        reads.fill([key(1)], b"", remaining_s=0.1)
        assert time.monotonic() - t0 < 0.1 + 1.0
        assert reads.wait_reports()
        assert master.reports[-1] == ("dead", 3, False)
    finally:
        reads.close()
        black.close()


def test_a_success_after_a_failure_heals_the_peer(
    source: tuple[NodeCore, str], local: NodeCore
) -> None:
    src, address = source
    master = FakeMaster()
    _publish(master, src, address, [1])
    black = socket.socket()
    black.bind(("127.0.0.1", 0))
    black.listen(8)
    good = master.replicas[key(1)]
    master.replicas[key(1)] = ClusterReplica("src", 7, Tier.DRAM, good.size_bytes, 1,
                                             f"127.0.0.1:{black.getsockname()[1]}")
    reads = _reads(local, master, fetch_timeout_s=0.3)
    try:
        assert reads.fill([key(1)], b"").num_failed == 1
        master.replicas[key(1)] = good
        assert reads.fill([key(1)], b"").num_fetched == 1
        assert reads.wait_reports()
        assert master.reports == [("src", 7, False), ("src", 7, True)]
    finally:
        reads.close()
        black.close()


def test_probes_extend_the_local_answer_and_never_fetch_or_pin(
    source: tuple[NodeCore, str], local: NodeCore
) -> None:
    src, address = source
    master = FakeMaster()
    _publish(master, src, address, [1, 2])
    local.put_inline([(key(0), value(0), b"")], b"")
    reads = _reads(local, master)
    try:
        keys = [key(0), key(1), key(2), key(3)]
        assert reads.extend_prefix(b"", keys, local.lookup_prefix(keys, b"")) == [Tier.DRAM] * 3
        present, tiers = local.exists(keys, b"", with_tiers=True)
        assert reads.exists(b"", keys, present, tiers) == (
            [True, True, True, False], [Tier.DRAM, Tier.DRAM, Tier.DRAM, None])
        # a key after a cluster-wide miss is looked up too
        assert reads.exists(b"", [key(3), key(2)], [False, False], [])[0] == [False, True]
        assert _local_bytes(local, [1, 2]) == [None, None]  # nothing was copied
        assert src.store.stats().pinned_blocks == 0
        assert EXPORTED[id(src)] == []  # the source's blocks were not read
    finally:
        reads.close()


def test_master_unreachable_is_a_miss_not_an_error(local: NodeCore) -> None:
    def lookup(*_: object) -> list[ClusterReplica]:
        raise NotFound("master down")

    reads = RemoteReads(local, node_id="dst", lookup=lookup, report=lambda *a: None)
    assert reads.fill([key(1)], b"").num_found == 0
    assert reads.extend_prefix(b"", [key(1)], []) == []


def test_a_read_copies_past_a_cluster_wide_miss_and_counts_outcomes(
    source: tuple[NodeCore, str], local: NodeCore
) -> None:
    from kvstored.node.metrics import NodeMetrics

    src, address = source
    master = FakeMaster()  # an older master: no per-key lookup, only longest prefixes
    _publish(master, src, address, [1, 3])  # 2 is missing cluster-wide
    local.metrics = NodeMetrics()
    reads = _reads(local, master)
    try:
        got = reads.fill([key(1), key(2), key(3)], b"")
        assert (got.num_found, got.num_fetched) == (2, 2)  # a read is per key
        assert master.lookups == 3  # two runs (past the miss) and the copies' verification
        assert _local_bytes(local, [1, 2, 3]) == [value(1), None, value(3)]
        assert local.metrics.registry.get_sample_value(
            "kvstored_remote_blocks_total", {"outcome": "fetched"}) == 2
    finally:
        reads.close()


def test_a_peer_that_refuses_the_request_is_a_miss_not_an_error(local: NodeCore) -> None:
    from kvstored.errors import Draining

    class Refusing:
        def get(self, *a: object, **k: object) -> list[object]:
            raise Draining("peer draining")

        def close(self) -> None:
            return None  # nothing to close: it never connected

    master = FakeMaster()
    master.replicas[key(1)] = ClusterReplica("p", 1, Tier.DRAM, 10, 1, "127.0.0.1:1")
    reads = RemoteReads(local, node_id="dst", lookup=master.lookup, report=master.report,
                        transport_for=lambda a: Refusing())  # type: ignore[arg-type,return-value]
    got = reads.fill([key(1)], b"")
    assert got.num_failed == 1 and _local_bytes(local, [1]) == [None]
    assert reads.wait_reports() and master.reports == []  # a refusal is not a broken peer
    reads.close()


def test_probes_ignore_a_replica_the_master_still_names_here_after_a_local_eviction(
    source: tuple[NodeCore, str], local: NodeCore
) -> None:
    src, address = source
    master = FakeMaster()
    _publish(master, src, address, [2])
    # block 1 was evicted here; the master has not heard yet and names this node for it
    master.replicas[key(1)] = ClusterReplica("dst", 7, Tier.DRAM, 100, 1, "127.0.0.1:1")
    reads = _reads(local, master)
    try:
        assert reads.extend_prefix(b"", [key(1), key(2)], []) == []
        assert reads.exists(b"", [key(1), key(2)], [False, False], [])[0] == [False, True]
        assert reads.fill([key(1)], b"").num_fetched == 0
    finally:
        reads.close()
