"""The spiller's part in "the pool never drops a block it has room for" (issue 17 §3).

In-process, over test_spill's real master placement (FakeClock) and real peer data planes:

- backpressure: a put into a full source with peers that have room waits for a spill round
  (``Spiller.wait_for_room``, woken at once, not at its interval) and evicts nothing;
- a full pool: the round moves nothing, the put evicts at once (no wait for the bound);
- the master unreachable: batches go to the cached peer view (``refresh_peers``), bounded
  by the room each peer had below the high watermark.

The spill thread's interval is an hour, so only the put's wake-up can run a round.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from helpers import key
from test_spill import (  # noqa: F401 (fixtures: master, src, peers)
    BLOCK,
    PEER_DRAM,
    InProcMaster,
    Peer,
    _present,
    _spiller,
    master,
    peers,
    src,
    value,
)

from kvstored.errors import Unavailable
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Tier


def _dram_evictions(store: TieredStore) -> int:
    return next(t for t in store.stats().tiers if t.tier == Tier.DRAM).evictions


def test_a_put_into_a_full_node_waits_for_a_spill_round_instead_of_evicting(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    sp = _spiller(src, master, interval_s=3600.0)
    sp.start()
    src.set_pool_room(sp.wait_for_room, wait_s=60.0)
    try:
        for i in (100, 101, 102):  # 15 + 3 blocks into 16: the last two need room
            assert src.put(key(i), value(i))
    finally:
        src.set_pool_room(None)
        sp.close()
    assert _dram_evictions(src) == 0 and src.evictions_for_good == 0
    assert sp.counters.put_waits >= 1 and sp.counters.blocks_moved >= 2
    everywhere = [src, peers["b"].store, peers["c"].store]
    for i in [*range(15), 100, 101, 102]:
        assert any(s.exists([key(i)])[0] for s in everywhere), f"block {i} left the pool"


def test_a_full_pool_moves_nothing_and_the_put_evicts_without_waiting_out_the_bound(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    for n in peers:
        master.heartbeat(n, None, used=PEER_DRAM)  # every peer full
    sp = _spiller(src, master, interval_s=3600.0)
    sp.start()
    src.set_pool_room(sp.wait_for_room, wait_s=3600.0)  # a wait to the bound would hang
    try:
        assert src.put(key(100), value(100))
        assert src.put(key(101), value(101))  # no room anywhere: evicts the LRU block
    finally:
        src.set_pool_room(None)
        sp.close()
    assert sp.counters.no_capacity >= 1 and sp.counters.blocks_moved == 0
    assert src.exists([key(0)]) == [False] and src.evictions_for_good == 1


class DownMaster:
    """The in-process master while it answers, then unreachable (every call Unavailable)."""

    def __init__(self, up: InProcMaster, peers: dict[str, Peer], room: dict[str, int]) -> None:
        self.up, self.peers, self.room, self.down = up, peers, room, False
        self.calls = 0

    def list_nodes(self) -> dict[str, Any]:
        if self.down:
            raise Unavailable("master down")
        return {"nodes": [
            {"node_id": n, "data_address": p.address, "health": "healthy",
             "tiers": [{"tier": "DRAM", "capacity_bytes": PEER_DRAM,
                        "used_bytes": int(0.9 * PEER_DRAM) - self.room[n]}]}
            for n, p in self.peers.items()]}

    def put_end_and_start_batch(self, ends: Sequence[Any], items: Sequence[Any], **kw: Any
                                ) -> Any:
        self.calls += 1
        if self.down:
            raise Unavailable("master down")
        return self.up.put_end_and_start_batch(ends, items, **kw)

    def put_end_batch(self, items: Sequence[Any], **kw: Any) -> Any:
        self.calls += 1
        if self.down:
            raise Unavailable("master down")
        return self.up.put_end_batch(items, **kw)

    def put_start_batch(self, items: Sequence[Any], **kw: Any) -> Any:
        return self.up.put_start_batch(items, **kw)


def test_with_the_master_unreachable_batches_go_to_the_cached_peers_with_room(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    down = DownMaster(master, peers, {"b": 0, "c": 4 * BLOCK})  # c: room for one batch of 4
    sp = _spiller(src, down)  # type: ignore[arg-type]
    try:
        view = sp.refresh_peers(force=True)
        assert sorted((p.node_id, p.room_bytes) for p in view) == [("b", 0), ("c", 4 * BLOCK)]
        down.down = True
        assert sp.run_once() == 4  # one batch to c, then no cached peer has room
        assert sp.refresh_peers(force=True) == view  # a failed refresh keeps the view
    finally:
        sp.close()
    assert sp.counters.blocks_moved_direct == 4 and sp.counters.no_capacity >= 1
    assert _present(src) == list(range(4, 15))  # the coldest left, only once c stored them
    c = peers["c"].store
    assert [c.get(key(i)) for i in range(4)] == [(value(i), b"") for i in range(4)]
    assert [p.room_bytes for p in sp.peers if p.node_id == "c"] == [0]
    assert down.calls == 1  # asked once; then the cached view for MASTER_RETRY_S


def test_a_transfer_to_a_cached_peer_that_fails_keeps_every_local_copy(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    down = DownMaster(master, peers, {"b": 0, "c": 8 * BLOCK})
    sp = _spiller(src, down)  # type: ignore[arg-type]
    try:
        sp.refresh_peers(force=True)
        down.down = True
        peers["c"].close()  # the cached peer is gone too: connection refused
        assert sp.run_once() == 0
    finally:
        sp.close()
    assert _present(src) == list(range(15)) and sp.counters.blocks_failed >= 4


class RebuildingMaster(DownMaster):
    """A new leader that answers but cannot place yet: every item Unavailable (its node
    table is incomplete: ``Placement.rebuilding``), and its ListNodes names the peers as
    "syncing" (``syncing``) or not at all (``listed``)."""

    def __init__(self, up: InProcMaster, peers: dict[str, Peer], room: dict[str, int]) -> None:
        super().__init__(up, peers, room)
        self.rebuilding = False
        self.syncing: set[str] = set()
        self.listed: set[str] | None = None
        self.departed: set[str] = set()

    def list_nodes(self) -> dict[str, Any]:
        got = super().list_nodes()
        if self.rebuilding:
            got["nodes"] = [dict(n, health="syncing" if n["node_id"] in self.syncing
                                 else n["health"]) for n in got["nodes"]
                            if self.listed is None or n["node_id"] in self.listed]
            got["departed"] = [{"node_id": n} for n in self.departed]
        return got

    def put_end_and_start_batch(self, ends: Sequence[Any], items: Sequence[Any], **kw: Any
                                ) -> Any:
        if not self.rebuilding:
            return super().put_end_and_start_batch(ends, items, **kw)
        self.calls += 1
        return ([Unavailable("rebuilding")] * len(ends),
                [Unavailable("the master is still rebuilding its node table")] * len(items))


def test_a_new_leader_that_cannot_place_yet_sends_the_batch_to_the_cached_view(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    # main: every item's Unavailable was a failed start (no victim for 5 s) and the put then
    # evicted a block the pool had room for; now the batch goes to the cached view
    new = RebuildingMaster(master, peers, {"b": 0, "c": 4 * BLOCK})
    sp = _spiller(src, new)  # type: ignore[arg-type]
    try:
        sp.refresh_peers(force=True)
        new.rebuilding = True
        assert sp.run_once() == 4
    finally:
        sp.close()
    assert sp.counters.blocks_moved_direct == 4 and sp.counters.blocks_failed == 0
    assert [peers["c"].store.get(key(i)) for i in range(4)] == [(value(i), b"") for i in range(4)]


def test_the_view_keeps_peers_a_new_leader_lists_as_syncing_or_not_yet(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    # main: a new leader's first ListNodes (its nodes syncing, or not registered yet)
    # emptied the view exactly when no master could place or name a holder
    new = RebuildingMaster(master, peers, {"b": 2 * BLOCK, "c": 4 * BLOCK})
    sp = _spiller(src, new)  # type: ignore[arg-type]
    try:
        assert sorted(p.node_id for p in sp.refresh_peers(force=True)) == ["b", "c"]
        new.rebuilding, new.syncing, new.listed = True, {"b"}, {"b"}  # c: not registered yet
        assert sorted(p.node_id for p in sp.refresh_peers(force=True)) == ["b", "c"]
        new.departed = {"c"}  # the master says c left: it goes
        assert [p.node_id for p in sp.refresh_peers(force=True)] == ["b"]
    finally:
        sp.close()


class TermMaster(RebuildingMaster):
    """:class:`RebuildingMaster` whose listings carry a leader's ``term``."""

    def __init__(self, up: InProcMaster, peers: dict[str, Peer], room: dict[str, int]) -> None:
        super().__init__(up, peers, room)
        self.term = 3

    def list_nodes(self) -> dict[str, Any]:
        return dict(super().list_nodes(), term=self.term)


def test_each_peer_of_the_view_records_the_term_that_listed_it_healthy(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    # a read trusts a complete lookup of term T for a peer only if T's listing named it
    # healthy (kvstored/node/remote.py view_peers): a peer carried over a failover is not
    new = TermMaster(master, peers, {"b": 2 * BLOCK, "c": 4 * BLOCK})
    sp = _spiller(src, new)  # type: ignore[arg-type]
    try:
        terms = {p.node_id: p.synced_term for p in sp.refresh_peers(force=True)}
        assert terms == {"b": 3, "c": 3}
        new.term = 4  # a new leader: b re-registered and is still syncing, c not yet
        new.rebuilding, new.syncing, new.listed = True, {"b"}, {"b"}
        terms = {p.node_id: p.synced_term for p in sp.refresh_peers(force=True)}
        assert terms == {"b": 0, "c": 0}
        new.syncing = set()  # b synced: term 4 has its inventory; c still on its way
        terms = {p.node_id: p.synced_term for p in sp.refresh_peers(force=True)}
        assert terms == {"b": 4, "c": 0}
    finally:
        sp.close()


def test_a_replicated_block_keeps_its_factor_and_never_joins_its_other_replica(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    """The tester's finding (issue 17): with the master down, put(replicas=2) blocks ended
    with one copy and factor 1. A direct spill went to the peer with the most room even when
    it held the block's other replica: its PUT answered "already present", the local copy
    went, two replicas became one; and a block it did store arrived without its factor, so a
    new leader learned factor 1 from the inventories and never repaired it. Now each PUT
    carries the blocks' factor (the peer records it) and a replicated block the peer already
    held stays here. (Fails on the old code: block 0 gone here, c's factors empty.)"""
    c = peers["c"]
    assert c.store.put(key(0), value(0))  # c holds block 0's other replica
    recorded: list[tuple[list[bytes], int]] = []
    c.server.on_replica_factor = lambda ns, keys, factor: recorded.append((list(keys), factor))
    factors = {key(0): 2, key(1): 2, key(2): 3}
    down = DownMaster(master, peers, {"b": 0, "c": 4 * BLOCK})  # c: room for one batch of 4
    sp = _spiller(src, down, factor_of=lambda ns, k: factors.get(k, 0))  # type: ignore[arg-type]
    try:
        sp.refresh_peers(force=True)
        down.down = True
        sp.run_once()
    finally:
        sp.close()
    assert src.exists([key(0)]) == [True], "block 0's replica here left for the node holding its other one"
    assert src.exists([key(1), key(2), key(3)]) == [False] * 3  # moved to c
    assert sorted((sorted(int.from_bytes(k, "big") for k in ks), f) for ks, f in recorded) == [
        ([0, 1], 2), ([2], 3)]  # each PUT carried its blocks' factor (none for block 3)
    assert [c.store.get(key(i)) for i in range(4)] == [(value(i), b"") for i in range(4)]


def test_two_nodes_spilling_into_each_other_through_the_cached_view_keep_every_block(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    """Issue 17 §3 (tester's scenE, puts during the master's first node lease): src sends
    its 4 coldest blocks to c through the cached view; right after c stored them, before
    src removes its copies (the ``sent`` hook), c's own round sends those very blocks back
    to src, which answers "held already". main: each side took that for a move and removed
    its copy, and the 4 blocks were gone from the pool. Now only a block the peer stored
    *now* counts: c keeps its copies, src's go."""
    from kvstored.config import NodeConfig
    from kvstored.node.core import NodeCore
    from kvstored.node.spill import Spiller
    from kvstored.transport.tcp import DataPlaneClient
    from kvstored.transport.tcp_server import DataPlaneServer

    cfg = NodeConfig(node_id="src", dram_size_bytes=16 * BLOCK, ssd_size_bytes=0,
                     max_block_bytes=BLOCK, max_batch_keys=64)
    server = DataPlaneServer(NodeCore(src, cfg, epoch=1), "127.0.0.1:0")
    src_address = server.start()
    c = peers["c"]
    to_c = RebuildingMaster(master, {"c": c}, {"c": 4 * BLOCK})
    src_peer = SimpleNamespace(address=src_address)  # what the listing reads of a peer
    to_src = RebuildingMaster(master, {"src": src_peer}, {"src": 8 * BLOCK})  # type: ignore[dict-item]
    back = Spiller(c.store, to_src,  # type: ignore[arg-type]
                   lambda a: DataPlaneClient(a, pool_size=2, max_block_bytes=BLOCK),
                   node_id="c", high_watermark=0.9, low_watermark=0.5, batch_blocks=4)
    crossed: list[int] = []

    def hook(event: str, moves: list[Any]) -> None:
        if event == "sent" and not crossed:  # c stored them; src has not removed its copies
            crossed.append(back.run_once(need_bytes=4 * BLOCK))

    sp = _spiller(src, to_c, hook=hook)  # type: ignore[arg-type]
    try:
        assert [p.node_id for p in sp.refresh_peers(force=True)] == ["c"]
        assert [p.node_id for p in back.refresh_peers(force=True)] == ["src"]
        to_c.rebuilding = to_src.rebuilding = True
        assert sp.run_once() == 4  # one batch to c, then c's room (as cached) is spent
    finally:
        sp.close()
        back.close()
        server.stop(0.0)
    on_c = [i for i, ok in enumerate(c.store.exists([key(i) for i in range(15)])) if ok]
    assert sorted(set(_present(src)) | set(on_c)) == list(range(15))  # main: 0..3 on neither
    assert crossed == [0]  # c's round sent the 4 back, src held them: c removed none
    assert back.counters.blocks_held_by_peer == 4 and back.counters.blocks_moved == 0
    assert _present(src) == list(range(4, 15))
    assert [c.store.get(key(i)) for i in range(4)] == [(value(i), b"") for i in range(4)]


def test_with_the_master_unreachable_a_batch_larger_than_the_cached_room_moves_what_fits(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    # main: the whole batch (4) had to fit the cached room (3 blocks): nothing moved, and a
    # put waiting for room evicted an original for good (bench_spill's master-down burst)
    down = DownMaster(master, peers, {"b": 0, "c": 3 * BLOCK})
    sp = _spiller(src, down)  # type: ignore[arg-type]
    try:
        sp.refresh_peers(force=True)
        down.down = True
        assert sp.run_once() == 3  # the 3 coldest to c, then no cached peer has room
    finally:
        sp.close()
    assert sp.counters.blocks_moved_direct == 3
    assert _present(src) == list(range(3, 15))
    c = peers["c"].store
    assert [c.get(key(i)) for i in range(3)] == [(value(i), b"") for i in range(3)]
    assert [p.room_bytes for p in sp.peers if p.node_id == "c"] == [0]
    # its room up to capacity (a spare-only hand-off's) shrank by the same 3 blocks
    full = [p.full_room_bytes for p in sp.peers if p.node_id == "c"]
    assert full == [PEER_DRAM - int(0.9 * PEER_DRAM)]


def _put_with_the_master_down(src: TieredStore, sp: Any, down: DownMaster) -> None:
    sp.refresh_peers(force=True)
    down.down = True
    sp.start()
    src.set_pool_room(sp.wait_for_room, wait_s=60.0)
    try:
        for i in (100, 101, 102):  # 15 + 3 blocks into 16: the last two need room
            assert src.put(key(i), value(i))
    finally:
        src.set_pool_room(None)
        sp.close()


def _every_block_held(src: TieredStore, peers: dict[str, Peer]) -> None:
    everywhere = [src, peers["b"].store, peers["c"].store]
    for i in [*range(15), 100, 101, 102]:
        assert any(s.exists([key(i)])[0] for s in everywhere), f"block {i} left the pool"


def test_a_put_with_the_master_down_and_a_batch_past_the_cached_room_evicts_nothing(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    # the round's batch (4) is larger than c's cached room (3): the part that fits moves
    down = DownMaster(master, peers, {"b": 0, "c": 3 * BLOCK})
    sp = _spiller(src, down, interval_s=3600.0)
    _put_with_the_master_down(src, sp, down)
    assert src.evictions_for_good == 0 and sp.counters.blocks_moved_direct >= 2
    _every_block_held(src, peers)


def test_a_hand_off_with_the_master_down_leaves_at_once_and_the_put_evicts_nothing(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    # c has no room below the high watermark in the view, but room up to its capacity:
    # the spare-only hand-off takes the block. main: the hand-off then awaited a master
    # lookup that cannot answer (CONFIRM_WAIT_S, the spill thread held), its copy stayed
    # here, and the put evicted an original for good.
    down = DownMaster(master, peers, {"b": 0, "c": 0})
    sp = _spiller(src, down, interval_s=3600.0)
    _put_with_the_master_down(src, sp, down)
    assert src.evictions_for_good == 0
    assert sp.counters.handoffs_accepted >= 2 and sp.counters.blocks_moved_direct == 0
    assert not sp._awaiting  # left here at once: no second original
    _every_block_held(src, peers)
    on_peers = [peers[n].store.exists([key(i)])[0] for n in ("b", "c") for i in range(15)]
    assert sum(on_peers) == sp.counters.handoffs_accepted
    assert sum(src.exists([key(i)])[0] for i in range(15)) == 15 - sp.counters.handoffs_accepted
