"""RemoteReads.fill answers key by key: a block missing cluster-wide does not hide the
blocks after it (get, get_into and get_blocks are per key; only lookup_prefix is a prefix
operation). With a master that answers per key (``lookup_each``) one lookup names every
present block; an older master is asked in runs past the misses.

A real source data plane in-process; the master is a dict the test controls.
"""

from __future__ import annotations

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
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.types import Tier

BLOCK = 16 << 10


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


@pytest.mark.parametrize("old", [False, True], ids=["per-key-master", "older-master"])
def test_a_read_copies_every_block_present_cluster_wide_past_the_misses(
    planes: DataPlanes, local: NodeCore, old: bool
) -> None:
    src = make_core("src", block_bytes=BLOCK)
    gens: dict[bytes, int] = {}
    with_generations(src, gens)
    address = planes.serve(src)
    master = PerKeyMaster(old=old)
    present = [0, 2, 3, 6, 9]  # 1, 4, 5, 7, 8 are missing cluster-wide (their node died)
    for i in present:
        src.put_inline([(key(i), value(i), b"")], b"")
        gens[key(i)] = 100 + i
        master.replicas[key(i)] = ClusterReplica("src", 7, Tier.DRAM, len(value(i)), 100 + i,
                                                 address)
    reads = make_reads(local, master, lookup_each=master.lookup_each)
    try:
        got = reads.fill([key(i) for i in range(10)], b"")
        assert (got.num_found, got.num_fetched, got.num_dropped, got.num_failed) == (5, 5, 0, 0)
        assert local_bytes(local, list(range(10))) == [
            value(i) if i in present else None for i in range(10)
        ]
        if not old:
            assert master.each_lookups == 1 and master.lookups == 0  # one per-key lookup
    finally:
        reads.close()
