"""Pool LRU across nodes (kvstored/node/spill.py ``Spiller.hand_off``), in-process: the
source and real peer nodes behind real data-plane servers (test_spill's fixtures).

When the whole pool is full a put into the source must evict an original; if a peer's
coldest original is colder than ours (by more than the margin), ours is handed off to it
(a data-plane PUT with PUT_FLAG_HANDOFF carrying our coldest age) and the peer evicts its
colder block to take it; a peer whose coldest is in fact younger refuses, and ours stays
(to be evicted here, as without pool LRU). Ages are set by moving blocks' last-use stamps
back, never by sleeping; the spill thread's interval is an hour, so only a put's wake-up
runs a round.
"""

from __future__ import annotations

from typing import Any

from helpers import key
from test_spill import (  # noqa: F401 (fixtures: master, src, peers)
    BLOCK,
    PEER_DRAM,
    InProcMaster,
    Peer,
    _spiller,
    master,
    peers,
    src,
    value,
)

from kvstored.node.spill import PeerRoom, SpillCollector, Spiller, past_high
from kvstored.tiers.ssd_format import store_key
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.tcp import DataPlaneClient


def _age(s: TieredStore, i: int, seconds: float) -> None:
    """Make block ``key(i)``'s last use ``seconds`` older (white box: its DRAM stamp)."""
    s._state.dram.entries[store_key(b"", key(i))].touched -= seconds  # noqa: SLF001


def _fill_peer(p: Peer, cold_age_s: float) -> None:
    """Fill the peer's DRAM with blocks 1000.., block 1000 used ``cold_age_s`` ago, the
    others 1 s ago."""
    n = PEER_DRAM // BLOCK
    for i in range(1000, 1000 + n):
        assert p.store.put(key(i), value(i))
        _age(p.store, i, 1.0)
    _age(p.store, 1000, cold_age_s - 1.0)


def _full_src(src: TieredStore) -> None:
    assert src.put(key(15), value(15))  # 16 of 16: full
    _age(src, 0, 10.0)  # the source's coldest original: 10 s old


def _view(sp: Spiller, peers: dict[str, Peer], b_age_s: float) -> None:
    """The spiller's cached peer view: both peers full, b's coldest ``b_age_s`` old."""
    sp.peers = [PeerRoom("b", peers["b"].address, 0, b_age_s),
                PeerRoom("c", peers["c"].address, 0, 0.0)]


def test_a_peer_with_a_colder_block_takes_ours_and_drops_its_own(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    _fill_peer(peers["b"], cold_age_s=100.0)
    _full_src(src)
    sp = _spiller(src, master)
    _view(sp, peers, 100.0)
    b = peers["b"].store
    try:
        # b stored it but its ADDED event has not reached the master: ours stays (a reader
        # anywhere still finds the block here; on the old code it was gone at once)
        assert sp.hand_off(BLOCK) == 0
        assert src.exists([key(0)]) == [True] and b.exists([key(0)]) == [True]
        assert sp.victims(BLOCK) and key(0) not in [v.key for v in sp.victims(BLOCK)]
        master.report_added("b", [key(0)])  # b's event arrives
        assert sp.confirm_moved() == 1
    finally:
        sp.close()
    assert src.exists([key(0)]) == [False] and b.exists([key(0)]) == [True]
    assert b.get(key(0)) == (value(0), b"")
    assert b.exists([key(1000), key(1001)]) == [False, True]  # b's colder block went
    assert (sp.counters.handoffs_sent, sp.counters.handoffs_accepted,
            sp.counters.handoffs_refused) == (1, 1, 0)
    assert b.handoffs_taken == 1 and b.evictions_for_good == 1
    assert peers["c"].store.exists([key(0)]) == [False]  # c's coldest is not colder: untried
    metrics = {m.name: m.samples[0].value for m in SpillCollector(sp).collect()}
    assert metrics["kvstored_spill_handoffs_accepted"] == 1


def test_a_peer_whose_coldest_is_younger_than_the_view_said_refuses_and_ours_stays(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    _fill_peer(peers["b"], cold_age_s=5.0)  # in truth younger than our 10 s
    _full_src(src)
    sp = _spiller(src, master)
    _view(sp, peers, 100.0)  # a stale view: b looked colder
    try:
        assert sp.hand_off(BLOCK) == 0
    finally:
        sp.close()
    b = peers["b"].store
    assert src.exists([key(0)]) == [True] and b.exists([key(0)]) == [False]
    assert b.exists([key(1000)]) == [True] and b.evictions_for_good == 0
    assert (sp.counters.handoffs_sent, sp.counters.handoffs_refused) == (1, 1)
    assert b.handoffs_declined == 1


def test_no_hand_off_within_the_margin_or_with_pool_lru_off(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    _fill_peer(peers["b"], cold_age_s=100.0)
    _full_src(src)
    near = _spiller(src, master, pool_lru_margin_s=1.0)
    _view(near, peers, 10.5)  # older than our 10 s, by less than the margin
    off = _spiller(src, master, pool_lru=False)
    _view(off, peers, 100.0)
    try:
        assert near.handoff_target(src.coldest_original_age_s()) is None
        assert near.hand_off(BLOCK) == 0 and off.hand_off(BLOCK) == 0
    finally:
        near.close()
        off.close()
    assert near.counters.handoffs_sent == 0 and off.counters.handoffs_sent == 0
    assert src.exists([key(0)]) == [True] and peers["b"].store.handoffs_declined == 0


def test_a_put_into_a_full_pool_hands_our_coldest_block_off_instead_of_evicting_it(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    """The whole path: the put finds no room, the spill round finds every peer full
    (NoCapacity), the hand-off moves block 0 to b, and the put takes its space."""
    for n in peers:
        master.heartbeat(n, None, used=PEER_DRAM)  # every peer full per the master
    _fill_peer(peers["b"], cold_age_s=100.0)
    _full_src(src)
    sp = _spiller(src, master, interval_s=3600.0)
    _view(sp, peers, 100.0)
    # b reports what its data plane stored (as a real node's woken link does); the put's
    # round waits for the master to name b's replica before ours goes
    def b_reports() -> None:  # on b's data-plane thread
        with master.lock:
            master.report_added("b", [key(0)])

    peers["b"].server.on_stored = b_reports
    sp.start()
    src.set_pool_room(sp.wait_for_room, wait_s=3600.0)  # a wait to the bound would hang
    try:
        assert src.put(key(100), value(100))
    finally:
        src.set_pool_room(None)
        sp.close()
    assert sp.counters.no_capacity >= 1 and sp.counters.blocks_moved == 0
    assert sp.counters.handoffs_accepted == 1 and src.evictions_for_good == 0
    assert src.exists([key(0), key(100)]) == [False, True]
    assert peers["b"].store.exists([key(0), key(1000)]) == [True, False]


def test_a_tiered_node_with_dram_room_does_not_spill_on_its_own(
    master: InProcMaster, tmp_path: Any
) -> None:
    """Free DRAM counts as pool room (the master's placement places there), so a node
    whose SSD is past its watermark but whose DRAM is not spills nothing by itself (two
    such nodes would move blocks into each other's DRAM); a put needing room still does."""
    store = TieredStore(dram_size_bytes=8 * BLOCK, arena_dir=None, ssd_dir=tmp_path / "ssd",
                        ssd_size_bytes=8 * (BLOCK + 4096), ssd_direct_io=False,
                        max_block_bytes=BLOCK)
    try:
        for i in range(14):  # DRAM 8 of 8, SSD 6+ of 8 (each block's file has a trailer)
            store.put(key(i), value(i))
        assert past_high(store.stats(), 0.5)
        assert store.remove([key(i) for i in range(13, 8, -1)]) == [True] * 5  # DRAM: 3 of 8
        assert not past_high(store.stats(), 0.5)
        sp = Spiller(store, master, lambda a: DataPlaneClient(a, pool_size=2,
                                                              max_block_bytes=BLOCK),
                     node_id="src2", high_watermark=0.5, low_watermark=0.25)
        try:
            assert sp.run_once() == 0 and sp.counters.rounds == 0
        finally:
            sp.close()
    finally:
        store.close()


def test_a_peer_with_room_past_its_watermark_takes_our_block_before_a_colder_peer_drops_one(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    """Issue 17 §3 (three DRAM 16 + SSD 32 MiB nodes, 125 blocks in 144 MiB: sole copies
    lost): with no peer below the placement's high watermark, the hand-off went to the peer
    whose coldest block was the oldest, which evicted it for ours, while another peer still
    had free space above its watermark. A block is dropped only when the whole pool is
    full: a peer with room up to its capacity (``PeerRoom.full_room_bytes``) takes ours
    first, asked for a spare-only hand-off (it evicts nothing of its own for it). (Fails on
    the old code: b drops its block 1000, c's room goes unused.)"""
    _fill_peer(peers["b"], cold_age_s=100.0)  # full, its coldest colder than ours
    c = peers["c"].store
    for i in range(2000, 2000 + PEER_DRAM // BLOCK - 2):  # past 90 % of its DRAM, 2 free
        assert c.put(key(i), value(i))
    _full_src(src)
    sp = _spiller(src, master)
    sp.peers = [PeerRoom("b", peers["b"].address, 0, 100.0),
                PeerRoom("c", peers["c"].address, 0, 0.0, full_room_bytes=2 * BLOCK)]
    try:
        assert sp.hand_off(BLOCK) == 0  # c stored it; ours leaves once the master names c's
        assert src.exists([key(0)]) == [True] and c.exists([key(0)]) == [True]
        master.report_added("c", [key(0)])
        assert sp.confirm_moved() == 1
    finally:
        sp.close()
    assert src.exists([key(0)]) == [False] and c.exists([key(0)]) == [True]
    assert c.get(key(0)) == (value(0), b"")
    assert peers["b"].store.exists([key(1000)]) == [True], "b dropped a block for ours"
    assert peers["b"].store.evictions_for_good == 0 and c.evictions_for_good == 0
    assert c.exists([key(i) for i in range(2000, 2000 + PEER_DRAM // BLOCK - 2)]) == [True] * (
        PEER_DRAM // BLOCK - 2)


def test_a_spare_only_hand_off_a_full_peer_refuses_drops_nothing_and_pool_lru_follows(
    src: TieredStore, master: InProcMaster, peers: dict[str, Peer]
) -> None:
    """A stale view: c looked to have room but is full. The spare-only hand-off is refused
    (c drops nothing of its own for it) and pool LRU then hands the block to b, whose
    coldest is older."""
    _fill_peer(peers["b"], cold_age_s=100.0)
    _fill_peer(peers["c"], cold_age_s=200.0)  # full, and even colder than b: never dropped
    _full_src(src)
    sp = _spiller(src, master)
    sp.peers = [PeerRoom("b", peers["b"].address, 0, 100.0),
                PeerRoom("c", peers["c"].address, 0, 0.0, full_room_bytes=4 * BLOCK)]
    c, b = peers["c"].store, peers["b"].store
    try:
        assert sp.hand_off(BLOCK) == 0 and b.exists([key(0)]) == [True]  # b took it
        master.report_added("b", [key(0)])
        assert sp.confirm_moved() == 1
    finally:
        sp.close()
    assert c.exists([key(0), key(1000)]) == [False, True] and c.evictions_for_good == 0
    assert b.exists([key(0), key(1000)]) == [True, False]  # pool LRU: b's colder block went
    assert (sp.counters.handoffs_sent, sp.counters.handoffs_accepted,
            sp.counters.handoffs_refused) == (2, 1, 1)
