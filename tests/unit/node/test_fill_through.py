"""A read through a full DRAM-only node serves every block the pool holds (issue 17 §3).

A remote fill for an inline gRPC Get receives a block it has no room to keep (its copy
would drop a block the pool holds nowhere else) into a private buffer, verifies it like a
copy and hands it to the reply (``RemoteReads.fill(through=...)``), never caching it; the
node's unique blocks stay. The reply's byte budget bounds what is carried that way.
In-process: a real source data plane, the master as a dict (remote_helpers).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from helpers import key
from remote_helpers import FakeMaster as _Master
from test_fill_spares_pool import BLOCK, _core, value

from kvstored.errors import ErrorCode
from kvstored.node.remote import RemoteReads
from kvstored.node.service import NodeServicer
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp import DataPlaneClient
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


def test_a_block_moved_to_a_peer_between_the_check_and_the_pin_is_read_again_not_missed(
) -> None:
    """Every key is here when the read starts (no fill runs), then the spiller moves one to
    the peer (which holds it before this node drops it) before the read pins or copies it:
    PinBlocks marks it ``through`` (size unknown: 0) and the inline Get answers it
    BatchTooLarge beside a value, so either client asks again and gets it from the peer.
    The move is injected after the fill step (a wrapper), deterministic. On main both were
    plain misses (seen in CI as "1 miss in 13 runs, cause not found")."""
    src, dst = _core("src", 8 * BLOCK), _core("dst", 4 * BLOCK)
    server = DataPlaneServer(src, "127.0.0.1:0")
    address = server.start()
    master = _Master()
    reads = RemoteReads(dst, node_id="dst", lookup=master.lookup, report=master.report)
    moved = key(20)
    try:
        src.put_inline([(moved, value(20), b"")], b"")  # the peer's replica (spilled there)
        gen = src.store.list_blocks()[0][0].generations[0]
        master.replicas[moved] = ClusterReplica("src", 7, Tier.DRAM, BLOCK, gen, address)
        dst.put_inline([(key(i), value(i), b"") for i in (0, 1, 2)] + [(moved, value(20), b"")],
                       b"")
        keys = [key(0), moved]
        session_id = dst.open_session()
        with ThreadPoolExecutor(2) as pool:
            servicer = NodeServicer(dst, pool, version="test")
            servicer.remote = reads
            fill = servicer._fill_from_peers

            async def fill_then_move(*args: Any, **kwargs: Any) -> list[bool] | None:
                before = await fill(*args, **kwargs)
                dst.store.remove([moved])  # the spiller's drop, after the peer stored it
                return before

            servicer._fill_from_peers = fill_then_move  # type: ignore[method-assign]
            resp = asyncio.run(servicer.PinBlocks(
                pb.PinBlocksRequest(keys=keys, session_id=session_id, epoch=dst.epoch), None))
            assert [(b.found, b.through) for b in resp.blocks] == [(True, False), (False, True)]
            dst.release_pins_report([resp.pin_id])
            dst.put_inline([(moved, value(20), b"")], b"")  # here again, to move once more
            got = asyncio.run(servicer.Get(pb.GetRequest(keys=keys), None))
            assert got.results[0].value == value(0)
            assert got.results[1].status.code == ErrorCode.BATCH_TOO_LARGE  # ask again
            servicer._fill_from_peers = fill  # type: ignore[method-assign]
            again = asyncio.run(servicer.Get(pb.GetRequest(keys=[moved]), None))
        assert again.results[0].value == value(20)  # from the peer
    finally:
        reads.close()
        server.stop(0.0)
        src.store.close()
        dst.store.close()


def test_a_fill_that_does_not_cache_carries_every_block_and_keeps_none() -> None:
    """``fill(cache=False)``: every block received goes to ``through`` (verified, under
    the budget), none into the store, even with room here; without ``through`` (or with
    marks only) it is refused with a clear error."""
    src, dst = _core("src", 8 * BLOCK), _core("dst", 8 * BLOCK)
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
        through: dict[bytes, tuple[bytes, bytes] | None] = {}
        reads.fill([key(10), key(11), key(12)], b"", through=through,
                   through_budget_bytes=2 * BLOCK, cache=False)
        assert through == {key(10): (value(10), b""), key(11): (value(11), b""), key(12): None}
        assert dst.store.exists([key(10), key(11), key(12)]) == [False] * 3  # none kept
        with pytest.raises(ValueError, match="through=None"):
            reads.fill([key(10)], b"", cache=False)
        with pytest.raises(ValueError, match="through_sizes=a dict"):
            reads.fill([key(10)], b"", through={}, through_sizes={}, cache=False)
    finally:
        reads.close()
        server.stop(0.0)
        src.store.close()
        dst.store.close()


def test_a_data_plane_get_sends_the_blocks_its_node_lost_after_the_fill() -> None:
    """An engine's TCP GET (GET_FLAG_FILL_FROM_PEERS) through a node that loses blocks
    between the fill and the pin: the copy its fill committed (dropped by the spiller,
    which takes copies first, once the copies put the node past its high watermark: the
    e2e test_a_tcp_data_plane_get_through_a_full_dram_only_node... flake, 2 of 24 missed
    under load) and a block that was here and moved to the peer. Both are read once more
    into private buffers (``fill(cache=False)``) and sent, never cached. The drops are
    injected after the fill (a wrapper), deterministic; before, both were misses (the
    data plane has no "ask again" answer)."""
    src, dst = _core("src", 8 * BLOCK), _core("dst", 8 * BLOCK)
    server = DataPlaneServer(src, "127.0.0.1:0")
    address = server.start()
    reader = DataPlaneServer(dst, "127.0.0.1:0")
    reader_address = reader.start()
    master = _Master()
    reads = RemoteReads(dst, node_id="dst", lookup=master.lookup, report=master.report)
    copied, moved = key(10), key(20)
    calls: list[tuple[list[bytes], bool]] = []
    try:
        for i in (10, 20):  # the peer's replicas (20: spilled there)
            src.put_inline([(key(i), value(i), b"")], b"")
        gens = {b.key: b.generations[0] for b in src.store.list_blocks()[0]}
        for k in (copied, moved):
            master.replicas[k] = ClusterReplica("src", 7, Tier.DRAM, BLOCK, gens[k], address)
        dst.put_inline([(key(0), value(0), b""), (moved, value(20), b"")], b"")

        def fill_then_drop(keys: list[bytes], namespace_id: bytes, **kwargs: Any) -> Any:
            cache = kwargs.get("cache", True)
            calls.append((list(keys), cache))
            got = reads.fill(keys, namespace_id, **kwargs)
            if cache:
                assert dst.store.exists([copied]) == [True]  # the fill's copy, committed
                dst.store.remove([copied, moved])  # the spiller's drop, the move's end
            return got

        reader.fill_from_peers = fill_then_drop
        engine = DataPlaneClient(reader_address, fill_from_peers=True)
        bufs: dict[int, bytearray] = {}

        def sink(i: int, size: int, meta: bytes) -> memoryview:
            bufs[i] = bytearray(size)
            return memoryview(bufs[i])

        try:
            keys = [key(0), copied, moved, key(99)]  # 99: no node holds it
            items = engine.get(keys, b"", sink, deadline=time.monotonic() + 30)
        finally:
            engine.close()
        assert [it.found for it in items] == [True, True, True, False]
        assert [bytes(bufs[i]) for i in (0, 1, 2)] == [value(0), value(10), value(20)]
        assert calls == [(keys, True), ([copied, moved], False)]  # 99 is not asked again
        assert dst.store.exists([copied, moved]) == [False, False]  # sent, not cached
        assert reader.num_streamed_through == 2
    finally:
        reads.close()
        reader.stop(0.0)
        server.stop(0.0)
        src.store.close()
        dst.store.close()


def test_an_inline_get_whose_only_blocks_were_lost_after_the_fill_reads_them_again() -> None:
    """The inline gRPC Get of blocks its fill copied here, dropped (the spiller's drop of
    copies, injected after the fill: deterministic) before the read: a reply with no value
    cannot answer BatchTooLarge (the client would ask forever), so before they were plain
    misses (the e2e test_a_get_of_every_block_through_a_full_dram_only_node... flake, 2 of
    24 missed under load, in the client's last call). Now they are read once more into
    private buffers (``fill(cache=False)``) and carried, never cached."""
    src, dst = _core("src", 8 * BLOCK), _core("dst", 8 * BLOCK)
    server = DataPlaneServer(src, "127.0.0.1:0")
    address = server.start()
    master = _Master()
    reads = RemoteReads(dst, node_id="dst", lookup=master.lookup, report=master.report)
    lost = [key(10), key(11)]
    try:
        for i in (10, 11):
            src.put_inline([(key(i), value(i), b"")], b"")
        gens = {b.key: b.generations[0] for b in src.store.list_blocks()[0]}
        for k in lost:
            master.replicas[k] = ClusterReplica("src", 7, Tier.DRAM, BLOCK, gens[k], address)
        with ThreadPoolExecutor(2) as pool:
            servicer = NodeServicer(dst, pool, version="test")
            servicer.remote = reads
            fill = servicer._fill_from_peers

            async def fill_then_drop(*args: Any, **kwargs: Any) -> list[bool] | None:
                before = await fill(*args, **kwargs)
                assert dst.store.exists(lost) == [True, True]  # the fill's copies
                dst.store.remove(lost)  # the spiller's drop of copies
                return before

            servicer._fill_from_peers = fill_then_drop  # type: ignore[method-assign]
            resp = asyncio.run(servicer.Get(pb.GetRequest(keys=lost), None))
        # (both fit the reply's budget here; past it the rest answer BatchTooLarge)
        assert [r.value if r.found else None for r in resp.results] == [value(10), value(11)]
        assert dst.store.exists(lost) == [False, False]  # carried, not cached
    finally:
        reads.close()
        server.stop(0.0)
        src.store.close()
        dst.store.close()
