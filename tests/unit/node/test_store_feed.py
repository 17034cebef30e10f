"""The store's change feed and MasterLink draining it (no master: a fake stub records calls).

- After any sequence of puts, reads (promotions), removals, spills (demotions) and evictions,
  the drained events applied to the last listing give exactly the store's listing.
- Overflow sets ``resync_needed`` and drops the queue; the link then lists once and resyncs.
- A round lists nothing when the feed has not overflowed (listings are counted).
- Generations: every replica the store adds gets a new one (a remove + re-put too); a
  promotion or demotion keeps the source replica's; a pin carries the DRAM entry's; a new
  store (a restart) never reuses one; events and inventories carry them to the master.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstored.config import ClusterConfig
from kvstored.node.cluster import MasterLink, snapshot_inventory
from kvstored.tiers.feed import ChangeFeed
from kvstored.tiers.tiered import TieredStore
from kvstored.v1 import master_pb2 as pb

NAMESPACES = (b"", b"ns-a")


def _store(tmp: Path, *, ssd: bool = True) -> TieredStore:
    return TieredStore(dram_size_bytes=64 << 10, arena_dir=None, node_id="feed",
                       ssd_dir=tmp / "ssd" if ssd else None, ssd_size_bytes=96 << 10 if ssd else 0)


def _apply(model: dict[tuple[bytes, bytes, int], tuple[int, int, bool]], feed: ChangeFeed
           ) -> None:
    changes, resync = feed.drain()
    assert not resync
    for c in changes:
        rk = (c.namespace_id, c.key, c.tier)
        assert c.generation > 0, f"a change without a generation: {c}"
        if c.added:
            assert rk not in model, f"added twice without a removal: {rk}"
            model[rk] = (c.size_bytes, c.generation, c.copy)
        else:
            assert model.pop(rk)[:2] == (c.size_bytes, c.generation), \
                f"removed with another size or generation: {rk}"


_put = st.tuples(st.just("put"), st.integers(0, 7), st.sampled_from(NAMESPACES),
                 st.sampled_from([100, 9000, 20000]))
_op = st.one_of(  # puts weighted x3: 64 KiB of DRAM fills after a few, so evictions happen
    _put, _put, _put,
    st.tuples(st.just("get"), st.integers(0, 7), st.sampled_from(NAMESPACES)),
    st.tuples(st.just("remove"), st.integers(0, 7), st.sampled_from(NAMESPACES)),
    st.tuples(st.just("spill")),
    st.tuples(st.just("drain")),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=5, max_size=50))
def test_feed_replays_to_the_store_listing(tmp_path_factory: pytest.TempPathFactory,
                                           ops: list[tuple[Any, ...]]) -> None:
    with _store(tmp_path_factory.mktemp("s")) as store:
        feed = store.change_feed
        assert feed.resync_needed  # a new feed owes a full inventory
        feed.reset()
        model = snapshot_inventory(store)
        for op in ops:
            if op[0] == "put":
                store.put(op[1].to_bytes(2, "big") * 8, b"x" * op[3], namespace_id=op[2])
            elif op[0] == "get":
                store.get(op[1].to_bytes(2, "big") * 8, namespace_id=op[2])
            elif op[0] == "remove":
                store.remove([op[1].to_bytes(2, "big") * 8], namespace_id=op[2])
            elif op[0] == "spill":
                store.spill_to_ssd()
            else:
                _apply(model, feed)
                assert model == snapshot_inventory(store)
        _apply(model, feed)
        assert model == snapshot_inventory(store)
        assert not feed.resync_needed


def test_feed_sees_demotion_promotion_and_ssd_eviction(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        store.change_feed.reset()
        keys = [bytes([i]) * 16 for i in range(20)]
        for k in keys:  # 20 x 9000 B into 64 KiB of DRAM: LRU blocks demote, SSD evicts
            store.put(k, b"y" * 9000)
        assert store.get(keys[-8]) is not None
        changes, _ = store.change_feed.drain()
        kinds = {(c.added, c.tier) for c in changes}
        assert kinds == {(True, 1), (False, 1), (True, 2), (False, 2)}, kinds


def _gens(store: TieredStore, key: bytes) -> dict[int, int]:
    blocks, _ = store.list_blocks(limit=1 << 20)
    b = next(b for b in blocks if b.key == key)
    return {int(t): g for t, g in zip(b.tiers, b.generations, strict=True)}


def test_generations_new_per_replica_inherited_across_tiers(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        key = b"\x42" * 16
        store.put(key, b"a" * 9000)
        g1 = _gens(store, key)[1]
        assert g1 > 0
        pinned = store.pin_many([key])[0]
        assert pinned.generation == g1  # the data plane sends what the master is told
        store.unpin(pinned)
        store.remove([key])
        store.put(key, b"b" * 9000)  # a re-put with other bytes: a new replica
        g2 = _gens(store, key)[1]
        assert g2 > g1
        store.spill_to_ssd()  # demotion writes the DRAM replica's bytes: its generation
        assert _gens(store, key) == {1: g2, 2: g2}
        for i in range(12):  # push it out of DRAM (64 KiB): SSD only now
            store.put(bytes([i]) * 16, b"c" * 9000)
        assert _gens(store, key) == {2: g2}
        pinned = store.pin_many([key])[0]  # promotion reads the SSD replica: its generation
        assert pinned.generation == g2 and _gens(store, key)[1] == g2
        store.unpin(pinned)
    with _store(tmp_path) as again:  # a restart: SSD recovered, stamped anew
        assert again.exists([key]) == [True]
        assert min(_gens(again, key).values()) > g2


def test_overflow_sets_resync_and_never_loses_silently(tmp_path: Path) -> None:
    with _store(tmp_path, ssd=False) as store:
        store.change_feed.max_events = 4
        store.change_feed.reset()
        for i in range(4):
            store.put(bytes([i]) * 16, b"z" * 10)
        assert len(store.change_feed) == 4 and not store.change_feed.resync_needed
        store.put(b"\x09" * 16, b"z" * 10)
        changes, resync = store.change_feed.drain()
        assert resync and changes == []
        assert store.change_feed.num_overflows == 1
        store.change_feed.reset()
        store.put(b"\x0a" * 16, b"z" * 10)
        changes, resync = store.change_feed.drain()
        assert not resync and [(c.added, c.key) for c in changes] == [(True, b"\x0a" * 16)]


class _FakeStub:
    """Answers MasterService calls like a master that applies everything."""

    def __init__(self) -> None:
        self.replicas: dict[tuple[bytes, bytes, int], tuple[int, int]] = {}
        self.sync_calls = 0
        self.applied = 0

    async def RegisterNode(self, req: Any, timeout: float) -> Any:  # noqa: N802 (gRPC names)
        return pb.RegisterNodeResponse(node_lease_ms=10000, master_epoch=1)

    async def SyncInventory(self, req: Any, timeout: float) -> Any:  # noqa: N802
        self.sync_calls += 1
        if req.sync_id != getattr(self, "_sync_id", None):
            self._sync_id = req.sync_id
            self.replicas = {}
        for b in req.blocks:
            self.replicas[(b.namespace_id, b.key, b.tier)] = (b.size_bytes, b.generation)
        self.applied = req.seq if req.last_chunk else self.applied
        return pb.SyncInventoryResponse()

    async def ReportEvents(self, req: Any, timeout: float) -> Any:  # noqa: N802
        for e in req.events:
            assert e.seq == self.applied + 1, f"gap: {e.seq} after {self.applied}"
            self.applied = e.seq
            rk = (e.block.namespace_id, e.block.key, e.block.tier)
            if e.kind == pb.BLOCK_EVENT_KIND_ADDED:
                self.replicas[rk] = (e.block.size_bytes, e.block.generation)
            else:
                self.replicas.pop(rk, None)
        return pb.ReportEventsResponse(applied_seq=self.applied)

    async def Heartbeat(self, req: Any, timeout: float) -> Any:  # noqa: N802
        return pb.HeartbeatResponse(node_lease_ms=10000)


def test_master_link_drains_the_feed_and_lists_only_on_register_or_overflow(tmp_path: Path) -> None:
    with _store(tmp_path, ssd=False) as store:
        listed = []
        real_list = store.list_blocks

        def counting_list(**kw: Any) -> Any:
            listed.append(1)
            return real_list(**kw)

        def truth() -> dict[tuple[bytes, bytes, int], tuple[int, int]]:
            blocks, _ = real_list(limit=1 << 30)
            got = {(b.namespace_id, b.key, int(t)): (b.size_bytes, g)
                   for b in blocks for t, g in zip(b.tiers, b.generations, strict=True)}
            assert all(g > 0 for _, g in got.values())
            return got

        store.list_blocks = counting_list  # type: ignore[method-assign]
        stub = _FakeStub()
        link = MasterLink(ClusterConfig(master_address="127.0.0.1:1"), node_id="n", epoch=1,
                          grpc_address="127.0.0.1:2", data_address="127.0.0.1:3", store=store,
                          load=lambda: 0.0)
        link._stub = stub  # type: ignore[assignment]

        async def main() -> None:
            store.put(b"\x01" * 16, b"a" * 100)
            await link.run_once()  # registers and lists once
            assert len(listed) == 1 and stub.replicas == truth()
            for r in range(5):
                store.put(bytes([r + 2]) * 16, b"b" * 200)
                store.remove([b"\x01" * 16])
                await link.run_once()
                assert stub.replicas == truth()
            assert len(listed) == 1 and link.num_listings == 1  # no listing per round
            store.change_feed.max_events = 2
            for i in range(5):  # overflow: the next round takes one full inventory
                store.put(bytes([100 + i]) * 16, b"c" * 10)
            await link.run_once()
            assert len(listed) == 2 and store.change_feed.num_overflows == 1
            assert stub.replicas == truth()
            store.put(b"\xee" * 16, b"d" * 10)
            await link.run_once()
            assert len(listed) == 2 and stub.replicas == truth()

        asyncio.run(main())
