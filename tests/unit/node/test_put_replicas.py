"""A put's extra replicas, written by the node (kvstored/node/put_replicas.py), in-process:
a real master's membership and placement on a FakeClock, real peers behind real data-plane
servers, the writer's own store.

Races are set up at the replicator's hooks (``started``, ``sent``), never by sleeping: the
write lease lapsing between the transfer and the PutEnd; a peer that went away after
placement.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from helpers import key

from kvstored.clock import FakeClock
from kvstored.config import ClusterConfig, NodeConfig
from kvstored.errors import NoCapacity, NotFound, TransferFailed, Unavailable
from kvstored.master.generations import Generations
from kvstored.master.index import BlockIndex
from kvstored.master.membership import Membership
from kvstored.master.placement import Placement
from kvstored.master.types import BlockEvent, BlockRef, EventKind, NodeSpec, TierUsage
from kvstored.node.cluster import MasterLink
from kvstored.node.core import NodeCore
from kvstored.node.put_replicas import PutReplicas, ReplicationFactors
from kvstored.node.spill import PeerRoom
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp import DataPlaneClient
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import Tier
from kvstored.v1 import master_pb2 as pb

BLOCK = 16 << 10
DRAM = 1 << 20
NS = b""
WRITE_LEASE_S = 2.0


def value(i: int) -> bytes:
    return random.Random(i).randbytes(BLOCK)


class InProcMaster:
    """Membership + placement on a FakeClock, answering MasterClient's top-up calls."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.index = BlockIndex(64)
        self.members = Membership(self.index, self.clock, Generations(100), node_lease_s=1000.0,
                                  unhealthy_after_failures=3)
        self.placement = Placement(self.members, write_lease_s=WRITE_LEASE_S)
        self.lock = threading.Lock()
        self.seq: dict[str, int] = {}
        self.down = False

    def join(self, node_id: str, data_address: str, zone: str = "") -> None:
        self.members.register(NodeSpec(node_id, 1, "127.0.0.1:1", data_address,
                                       (TierUsage(Tier.DRAM, DRAM, 0),), zone=zone))
        self.members.sync_inventory(node_id, 1, sync_id=1, blocks=[], last_chunk=True, seq=0)
        self.seq[node_id] = 0

    def report_added(self, node_id: str, keys: Sequence[bytes]) -> None:
        events = []
        for k in keys:
            self.seq[node_id] += 1
            events.append(BlockEvent(self.seq[node_id], EventKind.ADDED,
                                     BlockRef(NS, k, Tier.DRAM, BLOCK)))
        self.members.report_events(node_id, 1, events)

    def top_up_batch(self, items: Sequence[tuple[bytes, bytes, int, int]], *,
                     writer_node_id: str, max_used_fraction: float = 0.0,
                     timeout_s: float | None = None) -> list[Any]:
        if self.down:
            raise Unavailable("UNAVAILABLE: the master is down (test)")
        with self.lock:
            outs = self.placement.start_put_batch(
                [(ns, k, n) for ns, k, n, _ in items], factors=[f for *_, f in items],
                top_up=True, writer_node_id=writer_node_id, exclude_writer=True,
                holder_reports=True, max_used_fraction=max_used_fraction)
        return [o if isinstance(o, Exception) else (o.exists, o.generation, [
            ClusterReplica(r.node_id, r.epoch, r.tier, it[2], o.generation, r.data_address)
            for r in o.replicas], o.num_held) for it, o in zip(items, outs, strict=True)]

    def put_end_batch(self, items: Sequence[tuple[bytes, bytes, int, bool]], *,
                      timeout_s: float | None = None) -> list[Any]:
        if self.down:
            raise Unavailable("UNAVAILABLE: the master is down (test)")
        with self.lock:
            return self.placement.end_put_batch(items)


class Peer:
    def __init__(self, node_id: str) -> None:
        cfg = NodeConfig(node_id=node_id, dram_size_bytes=DRAM, ssd_size_bytes=0,
                         max_block_bytes=BLOCK, max_batch_keys=64)
        self.node_id = node_id
        self.store = TieredStore(dram_size_bytes=DRAM, arena_dir=None, max_block_bytes=BLOCK)
        self.core = NodeCore(self.store, cfg, epoch=1)
        self.server = DataPlaneServer(self.core, "127.0.0.1:0")
        self.factors = ReplicationFactors()  # what the daemon wires: the PUT carries it
        self.server.on_replica_factor = self.factors.record
        self.address = self.server.start()

    def close(self) -> None:
        self.server.stop(0.0)
        self.store.close()


class Pool:
    """A writer store ``w`` and peers, all joined to one in-process master."""

    def __init__(self, peers: Sequence[tuple[str, str]], writer_zone: str = "") -> None:
        self.master = InProcMaster()
        self.store = TieredStore(dram_size_bytes=DRAM, arena_dir=None, max_block_bytes=BLOCK)
        self.master.join("w", "127.0.0.1:9", writer_zone)
        self.peers = {n: Peer(n) for n, _ in peers}
        for n, zone in peers:
            self.master.join(n, self.peers[n].address, zone)
        self.factors = ReplicationFactors()
        self.events: list[tuple[str, list[str]]] = []
        self.hook_fn: Any = None
        self.rep = PutReplicas(self.store, self.master, self._transport, node_id="w",
                               factors=self.factors, hook=self._hook, timeout_s=5.0)

    def _transport(self, address: str) -> DataPlaneClient:
        return DataPlaneClient(address, pool_size=2, max_block_bytes=BLOCK)

    def _hook(self, event: str, **fields: Any) -> None:
        if event == "direct":  # placed through the cached view: (key, [peer ids])
            self.events.append((event, sorted(p for _, ps in fields["blocks"] for p in ps)))
        else:
            self.events.append((event, sorted(p for w in fields["writes"] for p, _ in w.peers)))
        if self.hook_fn is not None:
            self.hook_fn(event, **fields)

    def put(self, *idx: int) -> list[bytes]:
        keys = [key(i) for i in idx]
        for i, k in zip(idx, keys, strict=True):
            self.store.put(k, value(i))
        return keys

    def holders(self, k: bytes) -> list[str]:
        return sorted(n for n, p in self.peers.items() if p.store.exists([k])[0])

    def close(self) -> None:
        self.rep.close()
        for p in self.peers.values():
            p.close()
        self.store.close()


@pytest.fixture
def pool3() -> Iterator[Pool]:
    p = Pool([("a", "z2"), ("b", "z1"), ("c", "z3")], writer_zone="z1")
    yield p
    p.close()


def test_replicas_land_on_distinct_nodes_new_zones_first_with_identical_bytes(pool3: Pool) -> None:
    keys = pool3.put(1, 2)
    out = pool3.rep.replicate(NS, keys, 3)
    assert [(o.num_replicas, o.num_wanted, o.error) for o in out] == [(3, 3, None)] * 2
    for k, i in zip(keys, (1, 2), strict=True):
        assert pool3.holders(k) == ["a", "c"]  # b shares the writer's zone z1
        got = pool3.peers["a"].store.get(k)
        assert got is not None and bytes(got[0]) == value(i)
    assert pool3.events == [("started", ["a", "a", "c", "c"]), ("sent", ["a", "a", "c", "c"])]
    assert [pool3.factors.get(NS, k) for k in keys] == [3, 3]
    # the peers learned it from the PUT: their inventories carry it to a new master
    assert [pool3.peers[n].factors.get(NS, keys[0]) for n in ("a", "b", "c")] == [3, 0, 3]
    # the holders report their replicas: the master indexes them, and a second call writes
    # nothing (idempotent: the block has its factor)
    for n in ("a", "c"):
        pool3.master.report_added(n, keys)
    pool3.master.report_added("w", keys)
    pool3.events.clear()
    again = pool3.rep.replicate(NS, keys, 3)
    assert [(o.num_replicas, o.error) for o in again] == [(3, None)] * 2
    assert pool3.events == []
    assert pool3.master.index.replication_factor(NS, keys[0]) == 3


def test_fewer_nodes_than_asked_is_reported_short_with_the_reason(pool3: Pool) -> None:
    (k,) = pool3.put(1)
    (o,) = pool3.rep.replicate(NS, [k], 5)
    assert (o.num_replicas, o.num_wanted) == (4, 5)
    assert isinstance(o.error, NoCapacity) and "4 of 5 replicas" in str(o.error)
    assert pool3.rep.num_short == 1
    for n in ("w", "a", "b", "c"):  # every node reports its replica: none is left to take one
        pool3.master.report_added(n, [k])
    (o,) = pool3.rep.replicate(NS, [k], 5)
    assert (o.num_replicas, type(o.error)) == (4, NoCapacity)  # what it has, not 1
    assert pool3.master.placement.num_open_writes == 0


def test_absent_blocks_and_no_master_are_reported_never_silent(pool3: Pool) -> None:
    (k,) = pool3.put(1)
    out = pool3.rep.replicate(NS, [k, key(99)], 2)
    assert out[0].num_replicas == 2
    assert (out[1].num_replicas, type(out[1].error)) == (0, NotFound)
    assert "is not on node 'w'" in str(out[1].error)
    pool3.master.down = True
    (k2,) = pool3.put(2)
    (o,) = pool3.rep.replicate(NS, [k2], 2)
    assert (o.num_replicas, type(o.error)) == (1, Unavailable)
    assert pool3.factors.get(NS, k2) == 2  # recorded anyway: a master learns it later


def test_write_lease_lapsing_between_transfer_and_end_reports_only_held(pool3: Pool) -> None:
    # race: the master reclaims the write (its lease lapsed) after the peer stored the bytes
    # and before this node's PutEnd; the end is refused and the replica is not counted
    def lapse(event: str, **fields: Any) -> None:
        if event == "sent":
            pool3.master.clock.advance(WRITE_LEASE_S + 1)

    pool3.hook_fn = lapse
    (k,) = pool3.put(1)
    (o,) = pool3.rep.replicate(NS, [k], 2)
    assert (o.num_replicas, type(o.error)) == (1, NotFound)
    assert pool3.master.placement.num_open_writes == 0


def test_a_peer_gone_after_placement_is_a_failed_transfer_and_its_write_aborted(
        pool3: Pool) -> None:
    def kill_a(event: str, **fields: Any) -> None:
        if event == "started":
            pool3.peers["a"].server.stop(0.0)

    pool3.hook_fn = kill_a
    (k,) = pool3.put(1)
    (o,) = pool3.rep.replicate(NS, [k], 3)  # placed on a and c; a refuses connections
    assert (o.num_replicas, type(o.error)) == (2, TransferFailed)
    assert pool3.holders(k) == ["c"]
    assert pool3.master.placement.num_open_writes == 0


class _Stub:
    """A master that records the factors in the BlockRefs it is sent."""

    def __init__(self) -> None:
        self.factors: dict[bytes, int] = {}
        self.zone = ""
        self.applied = 0

    async def RegisterNode(self, req: Any, timeout: float) -> Any:  # noqa: N802 (gRPC names)
        self.zone = req.node.zone
        return pb.RegisterNodeResponse(node_lease_ms=10000, master_epoch=1)

    async def SyncInventory(self, req: Any, timeout: float) -> Any:  # noqa: N802
        self.factors = {b.key: b.replicas for b in req.blocks}
        self.applied = req.seq
        return pb.SyncInventoryResponse()

    async def ReportEvents(self, req: Any, timeout: float) -> Any:  # noqa: N802
        for e in req.events:
            if e.kind == pb.BLOCK_EVENT_KIND_ADDED:
                self.factors[e.block.key] = e.block.replicas
            else:
                self.factors.pop(e.block.key, None)
            self.applied = e.seq
        return pb.ReportEventsResponse(applied_seq=self.applied)

    async def Heartbeat(self, req: Any, timeout: float) -> Any:  # noqa: N802
        return pb.HeartbeatResponse(node_lease_ms=10000)


def test_master_link_sends_zone_and_factors_in_inventories_and_events() -> None:
    store = TieredStore(dram_size_bytes=DRAM, arena_dir=None, max_block_bytes=BLOCK)
    factors = ReplicationFactors()
    stub = _Stub()
    link = MasterLink(ClusterConfig(master_address="127.0.0.1:1"), node_id="n", epoch=1,
                      grpc_address="127.0.0.1:2", data_address="127.0.0.1:3", store=store,
                      load=lambda: 0.0, zone="rack-7", factors=factors)
    link._stub = stub  # type: ignore[assignment]  # a recording stand-in for the gRPC stub

    async def main() -> None:
        store.put(key(1), value(1))
        store.put(key(2), value(2))
        factors.record(NS, [key(1)], 2)
        await link.run_once()  # registration + inventory: a new master learns the factor
        assert (stub.zone, stub.factors) == ("rack-7", {key(1): 2, key(2): 0})
        factors.record(NS, [key(3)], 3)
        store.put(key(3), value(3))
        await link.run_once()
        assert stub.factors[key(3)] == 3
        assert store.remove([key(1)]) == [True]
        await link.run_once()
        assert key(1) not in stub.factors and factors.get(NS, key(1)) == 0  # forgotten

    try:
        asyncio.run(main())
    finally:
        store.close()


def test_factors_are_raise_only_bounded_and_checked() -> None:
    f = ReplicationFactors(max_entries=2)
    f.record(NS, [key(1)], 3)
    f.record(NS, [key(1)], 2)
    f.record(NS, [key(2)], 1)  # the default: nothing to remember
    assert (f.get(NS, key(1)), f.get(NS, key(2)), len(f)) == (3, 0, 1)
    f.record(NS, [key(3), key(4)], 2)
    assert len(f) == 2 and f.get(NS, key(1)) == 0  # the oldest went
    from kvstored.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"replicas must be in 1\.\.8, got 9"):
        f.record(NS, [key(1)], 9)


def test_more_keys_than_one_master_batch_go_in_several(pool3: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvstored.node.put_replicas as pr

    monkeypatch.setattr(pr, "MAX_MASTER_ITEMS", 2)
    keys = pool3.put(1, 2, 3)
    out = pool3.rep.replicate(NS, keys, 2)
    assert [o.num_replicas for o in out] == [2, 2, 2]
    assert [e for e, _ in pool3.events] == ["started", "sent", "started", "sent"]


# ---- the master unavailable (a failover): the cached peer view places (fail17) ----------
def _view(pool: Pool) -> list[PeerRoom]:
    zones = {"a": "z2", "b": "z1", "c": "z3"}
    return [PeerRoom(n, p.address, DRAM, zone=zones[n]) for n, p in pool.peers.items()]


def test_with_the_master_down_a_puts_replicas_go_to_peers_of_the_cached_view(
        pool3: Pool) -> None:
    # main: (1, Unavailable) for every block while no master answers
    view = _view(pool3)
    pool3.rep.peer_view = lambda: view
    pool3.rep.zone = "z1"
    pool3.master.down = True
    keys = pool3.put(1, 2)
    out = pool3.rep.replicate(NS, keys, 3)
    assert [(o.num_replicas, o.error) for o in out] == [(3, None)] * 2
    for k, i in zip(keys, (1, 2), strict=True):
        assert pool3.holders(k) == ["a", "c"]  # new zones first (b shares z1 with us)
        got = pool3.peers["c"].store.get(k)
        assert got is not None and bytes(got[0]) == value(i)
    # the peers learned the factor from the PUT: their inventories tell a new leader
    assert [pool3.peers[n].factors.get(NS, keys[0]) for n in ("a", "b", "c")] == [3, 0, 3]
    assert pool3.events == [("direct", ["a", "a", "c", "c"])]
    assert pool3.rep.num_replicas_direct == 4
    assert {p.node_id: p.room_bytes for p in view}["a"] == DRAM - 2 * BLOCK
    # within MASTER_RETRY_S the master is not asked again (a blackholed one costs a timeout)
    pool3.master.down = False
    (k3,) = pool3.put(3)
    (o,) = pool3.rep.replicate(NS, [k3], 2)
    assert (o.num_replicas, o.error) == (2, None) and pool3.events[-1][0] == "direct"


def test_the_master_down_and_no_peer_of_the_view_with_room_reports_the_real_cause(
        pool3: Pool) -> None:
    view = [PeerRoom(n, p.address, 0) for n, p in pool3.peers.items()]  # no room anywhere
    pool3.rep.peer_view = lambda: view
    pool3.master.down = True
    (k,) = pool3.put(1)
    (o,) = pool3.rep.replicate(NS, [k], 2)
    assert (o.num_replicas, type(o.error)) == (1, Unavailable)
    assert "master could not place" in str(o.error) and "the master is down" in str(o.error)
    # and with no view at all, the master's state is named too, never NoCapacity
    pool3.rep.peer_view = None
    (o,) = pool3.rep.replicate(NS, [k], 2)
    assert (o.num_replicas, type(o.error)) == (1, Unavailable) and "master" in str(o.error)


def test_a_new_leader_still_rebuilding_answers_unavailable_not_no_capacity(pool3: Pool) -> None:
    # the tester's NoCapacity("no other node has room"): a new leader whose nodes have
    # registered again but not yet synced their inventories has no candidate; that is its
    # own incompleteness, not a full pool (main: NoCapacity)
    fresh = InProcMaster()
    fresh.join("w", "127.0.0.1:9", "z1")
    for n, p in pool3.peers.items():  # registered, inventory not yet synced
        fresh.members.register(NodeSpec(n, 1, "127.0.0.1:1", p.address,
                                        (TierUsage(Tier.DRAM, DRAM, 0),)))
    pool3.rep.master = fresh
    (k,) = pool3.put(1)
    (o,) = pool3.rep.replicate(NS, [k], 2)
    assert (o.num_replicas, type(o.error)) == (1, Unavailable)
    assert "rebuilding" in str(o.error) and "1 of 4 registered nodes synced" in str(o.error)
    # with the cached view the replica is placed anyway
    view = _view(pool3)
    pool3.rep.peer_view = lambda: view
    (k2,) = pool3.put(2)
    (o,) = pool3.rep.replicate(NS, [k2], 2)
    assert (o.num_replicas, o.error) == (2, None) and pool3.events[-1][0] == "direct"
    # synced: a full pool is NoCapacity again
    for n in pool3.peers:
        fresh.members.sync_inventory(n, 1, sync_id=1, blocks=[], last_chunk=True, seq=0)
    pool3.rep._master_down_until = 0.0
    (o,) = pool3.rep.replicate(NS, [k2], 8)  # 4 nodes: never 8 holders
    assert type(o.error) is NoCapacity


def test_an_end_lost_to_a_failover_counts_the_peers_that_stored_the_block(pool3: Pool) -> None:
    # the leader dies between the transfer and the PutEnd: the peer holds an ordinary
    # replica and reports it to whoever leads next (main: reported as 1, Unavailable)
    def die(event: str, **fields: Any) -> None:
        if event == "sent":
            pool3.master.down = True

    pool3.hook_fn = die
    (k,) = pool3.put(1)
    (o,) = pool3.rep.replicate(NS, [k], 2)
    assert (o.num_replicas, o.error) == (2, None)
    assert len(pool3.holders(k)) == 1


def test_the_writer_marks_its_own_replica_redundant_once_a_peer_stored_one(pool3: Pool) -> None:
    from kvstored.tiers.ssd_format import store_key

    pool3.store.set_marks_trusted(True)  # what the node's master link does
    keys = pool3.put(1, 2)
    out = pool3.rep.replicate(NS, keys, 2)
    assert [o.num_replicas for o in out] == [2, 2]
    marks = pool3.store._state.marks  # noqa: SLF001 (white box: the marks made)
    for k in keys:
        holder = pool3.holders(k)
        assert marks.keeper_of(store_key(NS, k)) == holder[0]  # the peer keeps it
        assert not pool3.peers[holder[0]].store._state.marks.keeper_of(store_key(NS, k))  # noqa: SLF001
    assert pool3.store.has_redundant_victims()
    (k3,) = pool3.put(3)
    pool3.store.set_marks_trusted(False)  # untrusted: the writer marks nothing
    pool3.store.set_marks_trusted(True)
    pool3.store.set_marks_trusted(False)
    pool3.rep.replicate(NS, [k3], 2)
    assert marks.keeper_of(store_key(NS, k3)) is None and len(marks) == 0


def _fill_with_originals(peer: Peer, ids: range) -> None:
    for i in ids:
        assert peer.store.put(key(i), value(i))


def test_a_replica_never_evicts_an_original_of_a_peer_whose_room_vanished(pool3: Pool) -> None:
    """Issue 17 §3: the master placed the replicas on a and c from their last heartbeats,
    but a's DRAM has filled with its own originals since. The replica PUT carries
    PUT_FLAG_SPARE: a refuses it (NO_CAPACITY, quietly) and evicts nothing; the put
    reports 2 of 3 replicas with NoCapacity, never silently. (Fails on main: a evicted one
    of its sole copies to hold a redundant replica, and the put reported 3 of 3.)"""
    a = pool3.peers["a"]
    _fill_with_originals(a, range(100, 164))  # 64 of 64 blocks: full, sole copies
    (k,) = pool3.put(1)
    (o,) = pool3.rep.replicate(NS, [k], 3)
    assert a.store.exists([key(i) for i in range(100, 164)]) == [True] * 64, "a dropped originals"
    assert a.store.stats().tiers[0].evictions == 0 and a.store.spare_puts_refused == 1
    assert (o.num_replicas, o.num_wanted, type(o.error)) == (2, 3, NoCapacity)
    assert "had no room that drops no sole copy" in str(o.error)
    assert pool3.holders(k) == ["c"] and pool3.rep.num_refused_no_room == 1
    assert pool3.master.placement.num_open_writes == 0
    # with spare room (one of a's blocks is a remote-fill copy) a takes it there
    assert a.store.remove([key(163)])[0]
    r = a.store.reserve(key(300), BLOCK, copy=True)
    assert r is not None
    r.view[:] = value(300)
    assert a.store.commit(r)
    (k2,) = pool3.put(2)
    (o2,) = pool3.rep.replicate(NS, [k2], 3)
    assert (o2.num_replicas, o2.error) == (3, None)
    assert pool3.holders(k2) == ["a", "c"]
    assert a.store.exists([key(i) for i in range(100, 163)]) == [True] * 63
    assert a.store.exists([key(300)]) == [False]  # the copy's room


def test_with_the_master_down_a_peer_of_the_view_whose_room_vanished_drops_nothing(
        pool3: Pool) -> None:
    """The cached view says a has room; a is full of its own originals by now. The direct
    replica PUT carries PUT_FLAG_SPARE too: a refuses it, drops nothing, and the put
    reports 2 of 3 with NoCapacity naming it. (Fails on main: a evicted an original.)"""
    view = _view(pool3)
    pool3.rep.peer_view = lambda: view
    pool3.rep.zone = "z1"
    pool3.master.down = True
    a = pool3.peers["a"]
    _fill_with_originals(a, range(100, 164))
    (k,) = pool3.put(1)
    (o,) = pool3.rep.replicate(NS, [k], 3)
    assert a.store.exists([key(i) for i in range(100, 164)]) == [True] * 64, "a dropped originals"
    assert (o.num_replicas, type(o.error)) == (2, NoCapacity)
    assert "had no room that drops no sole copy" in str(o.error)
    assert pool3.holders(k) == ["c"]
