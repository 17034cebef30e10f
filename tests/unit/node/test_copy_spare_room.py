"""A master's COPY (repair, drain, hot blocks) never evicts a sole copy to make room.

``RemoteReads.copy_from`` reserves with ``spare_only``: free space, remote-fill copies,
blocks on SSD, demotions the SSD takes as is. Making one block's replica by dropping
another block is a net loss, so with no such room the copy fails (the master's repair asks
again later, or of another target). In-process, over a real loopback data plane; every
store full by construction. The first test fails on main, where the copy evicted the
target's least recent original (a block held nowhere else) to store the replica.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import key
from remote_helpers import DataPlanes, PerKeyMaster, make_core, make_reads, with_generations

from kvstored.node.core import NodeCore
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.types import Reservation, Tier

BLOCK = 64 << 10


def value(i: int) -> bytes:
    return bytes([i % 251]) * BLOCK


@pytest.fixture
def planes() -> Iterator[DataPlanes]:
    p = DataPlanes()
    yield p
    p.close()


@pytest.fixture
def local() -> Iterator[NodeCore]:
    core = make_core("dst", block_bytes=BLOCK, dram_bytes=4 * BLOCK)
    yield core
    core.store.close()


def _source(planes: DataPlanes, ids: list[int]) -> ClusterReplica:
    core = make_core("src", block_bytes=BLOCK)
    with_generations(core, {key(i): 100 + i for i in ids})
    for i in ids:
        core.put_inline([(key(i), value(i), b"")], b"")
    return ClusterReplica("src", 7, Tier.DRAM, BLOCK, 100, planes.serve(core))


def _items(src: ClusterReplica, ids: list[int]) -> list[tuple[bytes, ClusterReplica]]:
    return [(key(i), ClusterReplica(src.node_id, src.epoch, src.tier, BLOCK, 100 + i,
                                    src.data_address)) for i in ids]


def test_a_copy_into_a_node_full_of_sole_copies_is_refused_and_evicts_nothing(
    planes: DataPlanes, local: NodeCore,
) -> None:
    for i in range(4):
        local.put_inline([(key(i), value(i), b"")], b"")  # the only copies of blocks 0..3
    src = _source(planes, [9])
    reads = make_reads(local, PerKeyMaster())
    try:
        got = reads.copy_from(_items(src, [9]), b"")
        assert (got.num_fetched, got.num_failed) == (0, 0)
        assert local.store.exists([key(i) for i in (0, 1, 2, 3, 9)]) == [True] * 4 + [False]
        assert local.store.stats().tiers[0].evictions == 0
    finally:
        reads.close()


def test_a_copy_takes_the_room_of_a_remote_fill_copy_and_is_kept_as_an_original(
    planes: DataPlanes, local: NodeCore,
) -> None:
    for i in range(3):
        local.put_inline([(key(i), value(i), b"")], b"")
    r = local.store.reserve(key(50), BLOCK, copy=True)  # a read's copy: a peer holds it
    assert isinstance(r, Reservation)
    r.view[:] = value(50)
    assert local.store.commit(r)
    src = _source(planes, [9])
    reads = make_reads(local, PerKeyMaster())
    try:
        got = reads.copy_from(_items(src, [9]), b"")
        assert got.num_fetched == 1
        assert local.store.exists([key(i) for i in (0, 1, 2, 9, 50)]) == [True] * 4 + [False]
        assert not {b.key: b for b in local.store.list_blocks()[0]}[key(9)].copy
    finally:
        reads.close()
