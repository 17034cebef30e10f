"""A read through a full DRAM-only node serves every block the pool holds (issue 17 §3).

A remote fill for an inline gRPC Get receives a block it has no room to keep (its copy
would drop a block the pool holds nowhere else) into a private buffer, verifies it like a
copy and hands it to the reply (``RemoteReads.fill(through=...)``), never caching it; the
node's unique blocks stay. The reply's byte budget bounds what is carried that way.
In-process: a real source data plane, the master as a dict (remote_helpers).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from helpers import key
from remote_helpers import FakeMaster as _Master
from test_fill_spares_pool import BLOCK, _core, value

from kvstored.node.remote import RemoteReads
from kvstored.node.service import NodeServicer
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import Tier
from kvstored.v1 import node_pb2 as pb


def test_a_get_through_a_full_dram_only_node_streams_what_it_cannot_keep() -> None:
    src, dst = _core("src", 8 * BLOCK), _core("dst", 4 * BLOCK)
    server = DataPlaneServer(src, "127.0.0.1:0")
    address = server.start()
    master = _Master()
    reads = RemoteReads(dst, node_id="dst", lookup=master.lookup, report=master.report)
    try:
        remote = list(range(10, 16))
        for i in remote:
            src.put_inline([(key(i), value(i), b"")], b"")
        gens = {b.key: b.generations[0] for b in src.store.list_blocks()[0]}
        for i in remote:
            master.replicas[key(i)] = ClusterReplica("src", 7, Tier.DRAM, BLOCK, gens[key(i)],
                                                     address)
        dst.put_inline([(key(i), value(i), b"") for i in range(4)], b"")  # full of uniques
        keys = [key(i) for i in [0, 1, *remote, 2, 3]]
        with ThreadPoolExecutor(2) as pool:
            servicer = NodeServicer(dst, pool, version="test")
            servicer.remote = reads
            resp = asyncio.run(servicer.Get(pb.GetRequest(keys=keys), None))
        got = [r.value if r.found else None for r in resp.results]
        assert got == [value(i) for i in [0, 1, *remote, 2, 3]]  # every block, right bytes
        assert dst.store.exists([key(i) for i in range(4)]) == [True] * 4  # none dropped
        assert dst.store.exists([key(i) for i in remote]) == [False] * 6  # none cached
        assert dst.store.stats().tiers[0].evictions == 0
    finally:
        reads.close()
        server.stop(0.0)
        src.store.close()
        dst.store.close()


def test_what_is_streamed_through_stays_within_the_budget_it_is_given() -> None:
    src, dst = _core("src", 8 * BLOCK), _core("dst", 4 * BLOCK)
    server = DataPlaneServer(src, "127.0.0.1:0")
    address = server.start()
    master = _Master()
    reads = RemoteReads(dst, node_id="dst", lookup=master.lookup, report=master.report)
    try:
        for i in (10, 11, 12):
            src.put_inline([(key(i), value(i), b"")], b"")
        gens = {b.key: b.generations[0] for b in src.store.list_blocks()[0]}
        for i in (10, 11, 12):
            master.replicas[key(i)] = ClusterReplica("src", 7, Tier.DRAM, BLOCK, gens[key(i)],
                                                     address)
        dst.put_inline([(key(i), value(i), b"") for i in range(4)], b"")
        through: dict[bytes, tuple[bytes, bytes] | None] = {}
        reads.fill([key(10), key(11), key(12)], b"", through=through,
                   through_budget_bytes=2 * BLOCK)
        # 12: over the budget, not received (None: found, the reply asks the client again)
        assert through == {key(10): (value(10), b""), key(11): (value(11), b""), key(12): None}
        assert reads.num_skipped == 1
    finally:
        reads.close()
        server.stop(0.0)
        src.store.close()
        dst.store.close()


def test_pin_blocks_through_a_full_dram_only_node_marks_what_it_cannot_keep() -> None:
    """The shared-memory read (PinBlocks) cannot carry bytes: a peer's block the full node
    has no room to keep is marked ``through`` (with its size), never received nor cached,
    and is no miss for the skipped counter; a key no node holds stays a plain miss; then
    the inline Get of exactly the marked keys streams them through with the right bytes."""
    src, dst = _core("src", 8 * BLOCK), _core("dst", 4 * BLOCK)
    server = DataPlaneServer(src, "127.0.0.1:0")
    address = server.start()
    master = _Master()
    reads = RemoteReads(dst, node_id="dst", lookup=master.lookup, report=master.report)
    try:
        remote = [10, 11, 12]
        for i in remote:
            src.put_inline([(key(i), value(i), b"")], b"")
        gens = {b.key: b.generations[0] for b in src.store.list_blocks()[0]}
        for i in remote:
            master.replicas[key(i)] = ClusterReplica("src", 7, Tier.DRAM, BLOCK, gens[key(i)],
                                                     address)
        dst.put_inline([(key(i), value(i), b"") for i in range(4)], b"")  # full of uniques
        ids = [0, 1, *remote, 2, 3]
        keys = [key(i) for i in ids] + [key(99)]  # 99: no node holds it
        session_id = dst.open_session()
        with ThreadPoolExecutor(2) as pool:
            servicer = NodeServicer(dst, pool, version="test")
            servicer.remote = reads
            resp = asyncio.run(servicer.PinBlocks(
                pb.PinBlocksRequest(keys=keys, session_id=session_id, epoch=dst.epoch), None))
            assert [b.found for b in resp.blocks] == [True, True, False, False, False,
                                                      True, True, False]
            assert [b.through for b in resp.blocks] == [False] * 2 + [True] * 3 + [False] * 3
            assert [b.size_bytes for b in resp.blocks[2:5]] == [BLOCK] * 3
            assert reads.num_skipped == 0  # marked for the Get, not missed
            assert dst.store.exists([key(i) for i in remote]) == [False] * 3  # none cached
            dst.release_pins_report([resp.pin_id])
            got = asyncio.run(servicer.Get(pb.GetRequest(keys=[key(i) for i in remote]), None))
        assert [r.value if r.found else None for r in got.results] == [value(i) for i in remote]
        assert dst.store.exists([key(i) for i in range(4)]) == [True] * 4  # none dropped
        assert dst.store.stats().tiers[0].evictions == 0
    finally:
        reads.close()
        server.stop(0.0)
        src.store.close()
        dst.store.close()
