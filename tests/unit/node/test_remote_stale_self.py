"""A probe whose master still names this node for a block it no longer holds (its removal
event has not arrived: one heartbeat, or a failover's re-sync) asks once more avoiding this
node, so a replica elsewhere still counts (kvstored/node/remote.py ``extend_prefix`` and
``exists``). The whole-system test met it: node b's copies removed, then a vLLM lookup whose
prefix stopped at the first block the master still named on b, while node a held them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import pytest
from helpers import key
from remote_helpers import PerKeyMaster, make_core

from kvstored.node.core import NodeCore
from kvstored.node.remote import RemoteReads
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.types import Tier


class StaleSelfMaster(PerKeyMaster):
    """Each key is held by ``dst`` (stale: this node, which lacks it) and ``src``; ``dst`` is
    named first unless it is avoided, as the master ranks the asker's replica first."""

    def __init__(self, keys: Sequence[bytes], *, elsewhere: bool = True) -> None:
        super().__init__()
        self.elsewhere = elsewhere
        for k in keys:
            self.replicas[k] = ClusterReplica("dst", 7, Tier.DRAM, 100, 1, "127.0.0.1:1")

    def lookup_each(self, namespace_id: bytes, keys: Sequence[bytes], local: str,
                    timeout_s: float, avoid: Sequence[str] = (), max_alternates: int = 0,
                    ) -> dict[int, ClusterReplica] | None:
        got = super().lookup_each(namespace_id, keys, local, timeout_s, avoid, max_alternates)
        if "dst" not in avoid or not self.elsewhere or got is None:
            return got
        return {i: dataclasses.replace(r, node_id="src", data_address="127.0.0.1:2")
                for i, r in got.items()}


@pytest.fixture
def local() -> Iterator[NodeCore]:
    core = make_core("dst", block_bytes=64 << 10)
    yield core
    core.store.close()


def _reads(local: NodeCore, master: PerKeyMaster) -> RemoteReads:
    return RemoteReads(local, node_id="dst", lookup=master.lookup, report=master.report,
                       lookup_each=master.lookup_each)


def test_a_stale_replica_here_does_not_end_the_prefix_when_another_node_holds_it(
    local: NodeCore
) -> None:
    keys = [key(i) for i in range(4)]
    local.put_inline([(keys[0], b"x" * 100, b"")], b"")
    master = StaleSelfMaster(keys[1:])
    reads = _reads(local, master)
    try:
        # the local prefix is block 0; the master names us for 1..3, src holds them too
        assert reads.extend_prefix(b"", keys, local.lookup_prefix(keys, b"")) == [Tier.DRAM] * 4
        assert master.avoids[-1] == ["dst"]
        present, _ = reads.exists(b"", keys, [True, False, False, False], [])
        assert present == [True] * 4
    finally:
        reads.close()


def test_a_block_the_master_knows_only_here_stays_a_miss(local: NodeCore) -> None:
    keys = [key(i) for i in range(3)]
    master = StaleSelfMaster(keys, elsewhere=False)  # no other holder: avoid changes nothing
    reads = _reads(local, master)
    try:
        assert reads.extend_prefix(b"", keys, []) == []
        assert reads.exists(b"", keys, [False] * 3, [])[0] == [False] * 3
    finally:
        reads.close()
