"""The copy flag leaves the node: the feed and MasterLink tell the master which replicas are
remote-fill copies (kvstored/tiers/feed.py "Copies", node/cluster.py).

- A copy committed -> one ADDED change with ``copy=True`` (never an original first).
- A local put of the copied key -> the same replica ADDED again with ``copy=False``.
- A copy evicted or removed -> only its REMOVED (no re-report of a block that is gone).
- MasterLink's inventory and events carry the flag in ``BlockRef.copy``.
- A heartbeat answer's ``promote_copies`` unmarks those copies (absent ones are skipped);
  the next round re-reports them as originals.
"""

from __future__ import annotations

import asyncio
from typing import Any

from helpers import key

from kvstored.config import ClusterConfig
from kvstored.node.cluster import MasterLink
from kvstored.tiers.tiered import TieredStore
from kvstored.v1 import master_pb2 as pb

BLOCK = 4096


def _store() -> TieredStore:
    return TieredStore(dram_size_bytes=4 * BLOCK, arena_dir=None, node_id="copy")


def _fill_copy(store: TieredStore, i: int) -> None:
    res = store.reserve(key(i), BLOCK, copy=True)
    assert res is not None
    res.view[:] = bytes([i]) * BLOCK
    assert store.commit(res)


def _changes(store: TieredStore) -> list[tuple[bool, bytes, bool, int]]:
    changes, resync = store.change_feed.drain()
    assert not resync
    return [(c.added, c.key, c.copy, c.generation) for c in changes]


def test_copy_commit_is_one_added_with_copy_and_a_local_put_clears_it() -> None:
    with _store() as store:
        store.change_feed.reset()
        _fill_copy(store, 1)
        got = _changes(store)
        assert [(a, k, c) for a, k, c, _ in got] == [(True, key(1), True)]
        gen = got[0][3]
        assert not store.put(key(1), bytes([1]) * BLOCK)  # a local writer: no longer a copy
        assert _changes(store) == [(True, key(1), False, gen)]  # same replica, re-reported
        assert not store.put(key(1), bytes([1]) * BLOCK)  # an original stays one: no event
        assert _changes(store) == []
        store.put(key(2), bytes([2]) * BLOCK)
        assert [(a, k, c) for a, k, c, _ in _changes(store)] == [(True, key(2), False)]


def test_a_copy_that_leaves_dram_is_only_removed() -> None:
    with _store() as store:
        store.change_feed.reset()
        _fill_copy(store, 1)
        _fill_copy(store, 2)
        _changes(store)
        assert store.remove([key(1)]) == [True]
        assert [(a, k) for a, k, _, _ in _changes(store)] == [(False, key(1))]
        for i in range(10, 14):  # local puts fill DRAM: the copy is evicted first
            store.put(key(i), bytes([i]) * BLOCK)
        got = _changes(store)
        assert (False, key(2)) in [(a, k) for a, k, _, _ in got]
        assert all(not c for a, _, c, _ in got if a), f"an original reported as a copy: {got}"


class _Stub:
    """A master that records the BlockRefs it is sent."""

    def __init__(self) -> None:
        self.refs: dict[bytes, bool] = {}
        self.applied = 0
        self.promote: list[pb.BlockKey] = []

    async def RegisterNode(self, req: Any, timeout: float) -> Any:  # noqa: N802 (gRPC names)
        return pb.RegisterNodeResponse(node_lease_ms=10000, master_epoch=1)

    async def SyncInventory(self, req: Any, timeout: float) -> Any:  # noqa: N802
        self.refs = {b.key: b.copy for b in req.blocks}
        self.applied = req.seq
        return pb.SyncInventoryResponse()

    async def ReportEvents(self, req: Any, timeout: float) -> Any:  # noqa: N802
        for e in req.events:
            if e.kind == pb.BLOCK_EVENT_KIND_ADDED:
                self.refs[e.block.key] = e.block.copy
            else:
                self.refs.pop(e.block.key, None)
            self.applied = e.seq
        return pb.ReportEventsResponse(applied_seq=self.applied)

    async def Heartbeat(self, req: Any, timeout: float) -> Any:  # noqa: N802
        keep, self.promote = self.promote, []
        return pb.HeartbeatResponse(node_lease_ms=10000, promote_copies=keep)


def test_master_link_sends_the_copy_flag_in_inventories_and_events() -> None:
    with _store() as store:
        stub = _Stub()
        link = MasterLink(ClusterConfig(master_address="127.0.0.1:1"), node_id="n", epoch=1,
                          grpc_address="127.0.0.1:2", data_address="127.0.0.1:3", store=store,
                          load=lambda: 0.0)
        link._stub = stub  # type: ignore[assignment]

        async def main() -> None:
            _fill_copy(store, 1)
            store.put(key(2), b"x" * 10)
            await link.run_once()  # registration: the inventory says which is a copy
            assert stub.refs == {key(1): True, key(2): False}
            _fill_copy(store, 3)
            await link.run_once()
            assert stub.refs[key(3)] is True
            store.put(key(3), bytes([3]) * BLOCK)
            await link.run_once()
            assert stub.refs[key(3)] is False

        asyncio.run(main())


def test_a_heartbeat_promotion_keeps_the_copy_and_reports_it_as_an_original() -> None:
    with _store() as store:
        stub = _Stub()
        link = MasterLink(ClusterConfig(master_address="127.0.0.1:1"), node_id="n", epoch=1,
                          grpc_address="127.0.0.1:2", data_address="127.0.0.1:3", store=store,
                          load=lambda: 0.0)
        link._stub = stub  # type: ignore[assignment]

        async def main() -> None:
            _fill_copy(store, 1)
            _fill_copy(store, 2)
            await link.run_once()
            assert stub.refs == {key(1): True, key(2): True}
            stub.promote = [pb.BlockKey(key=key(1)), pb.BlockKey(key=key(9))]  # 9: absent
            await link.run_once()  # the answer arrives after this round's events
            assert link.num_copies_kept == 1
            await link.run_once()
            assert stub.refs == {key(1): False, key(2): True}
            for i in range(10, 13):  # one eviction: the remaining copy goes first, not key 1
                store.put(key(i), bytes([i]) * BLOCK)
            held = {b.key for b in store.list_blocks()[0]}
            assert key(1) in held and key(2) not in held

        asyncio.run(main())
