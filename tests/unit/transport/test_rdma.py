"""RDMA through pyverbs (kvstored/transport/rdma.py), on the fake verbs layer of tests/fake_verbs.py.

Negotiation both ways, the TCP fallback on a failed work request and on a deadline, a READ
racing an eviction (the generation check drops the bytes), MR/QP bookkeeping (nothing left
open after close, nor after a failed open or handshake), and the WRITE fencing rule (a
lapsed write grant stays quarantined until the peer's QP is torn down). The last tests
build the verbs attributes with the real pyverbs classes when python3-pyverbs is installed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from kvstored.errors import DeadlineExceeded, InvalidArgument, LeaseExpired, TransferFailed
from kvstored.transport.base import GetItem, RemoteRegion
from kvstored.transport.rdma import (
    RdmaAdvert,
    RdmaEndpoint,
    RdmaOrTcp,
    RdmaServer,
    RdmaTransport,
    connect,
    discover_device,
    load_pyverbs,
    negotiate,
    read_granted,
    read_versioned,
)
from tests.fake_verbs import E, Fabric

NS = b"ns"
BLOCK = 4096
ARENA = 64 * BLOCK


class Store:
    """A node's DRAM index over its arena: key -> (offset, size, generation)."""

    def __init__(self, arena: bytearray) -> None:
        self.arena = arena
        self.index: dict[bytes, tuple[int, int, int]] = {}
        self.next_gen = 1
        self.num_checks = 0

    def put(self, key: bytes, offset: int, data: bytes) -> None:
        self.arena[offset:offset + len(data)] = data
        self.index[key] = (offset, len(data), self.next_gen)
        self.next_gen += 1

    def evict(self, key: bytes) -> None:
        del self.index[key]

    def locate_blocks(self, keys: Sequence[bytes], namespace_id: bytes) -> list[RemoteRegion | None]:
        out: list[RemoteRegion | None] = []
        for k in keys:
            e = self.index.get(k)
            out.append(None if e is None else RemoteRegion(e[0], e[1], e[2]))
        return out

    def check_generations(self, keys: Sequence[bytes], namespace_id: bytes,
                          regions: Sequence[RemoteRegion]) -> list[bool]:
        self.num_checks += 1
        return [self.index.get(k) == (r.offset, r.size_bytes, r.generation)
                for k, r in zip(keys, regions, strict=True)]


class TcpStub:
    """The two-sided transport: serves from the store (records every call)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: list[tuple[list[bytes], float]] = []
        self.closed = False

    def get(self, keys: Sequence[bytes], namespace_id: bytes, sink: Any, *, deadline: float) -> list[GetItem]:
        self.calls.append((list(keys), deadline))
        out = []
        for i, k in enumerate(keys):
            e = self.store.index.get(k)
            if e is None:
                out.append(GetItem(0, "", False, 0, 0, b""))
                continue
            view = sink(i, e[1], b"m")
            if view is not None:
                view[:] = self.store.arena[e[0]:e[0] + e[1]]
            out.append(GetItem(0, "", True, 1, e[1], b"m", e[2]))
        return out

    def put(self, *a: Any, **kw: Any) -> list[Any]:
        return []

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fab() -> Fabric:
    return Fabric(devices=["fake0"])


def block(tag: int) -> bytes:
    return bytes([tag]) * BLOCK


def setup(fab: Fabric, *, session_id: int = 7) -> SimpleNamespace:
    verbs = fab.verbs()
    arena = bytearray(ARENA)
    store = Store(arena)
    node_ep = RdmaEndpoint(verbs, "fake0", arena, remote_access=True)
    server = RdmaServer(node_ep)
    reader_ep = RdmaEndpoint(verbs, "fake0", bytearray(8 * BLOCK), remote_access=False, max_send_wr=4)
    rdma = connect(reader_ep, lambda b: server.accept_json(session_id, b))
    return SimpleNamespace(verbs=verbs, arena=arena, store=store, node_ep=node_ep, server=server,
                           reader_ep=reader_ep, rdma=rdma)


def collect() -> tuple[dict[int, bytearray], Any]:
    got: dict[int, bytearray] = {}

    def sink(i: int, size: int, meta: bytes) -> memoryview:
        got[i] = bytearray(size)
        return memoryview(got[i])
    return got, sink


def close_all(s: SimpleNamespace) -> None:
    s.rdma.close()
    s.server.close()
    s.reader_ep.close()
    s.node_ep.close()


# ---- discovery and negotiation ------------------------------------------------------------------


def test_no_device_reads_as_none(fab: Fabric) -> None:
    fab.devices = []
    assert discover_device(fab.verbs()) is None  # get_device_list raised, not returned []
    assert discover_device(None) is None
    fab.devices = ["fake0"]
    assert discover_device(fab.verbs()) == "fake0"


def test_load_pyverbs_leaves_sys_path_alone() -> None:
    before = list(sys.path)
    verbs = load_pyverbs()
    assert sys.path == before
    assert load_pyverbs("/nonexistent") is None or verbs is not None
    if verbs is not None:  # this machine has python3-pyverbs but no RDMA device
        assert discover_device(verbs) is None or isinstance(discover_device(verbs), str)


def test_negotiate_both_ways(fab: Fabric) -> None:
    s = setup(fab)
    _, local = s.reader_ep.create_qp()
    peer = s.rdma.peer
    assert negotiate(local, peer) == "rdma"
    assert negotiate(None, peer) == "tcp"
    assert negotiate(local, None) == "tcp"
    assert negotiate(local, RdmaAdvert(peer.device, peer.gid, 0, 1, 1, 0, 0, 0)) == "tcp"  # no region
    close_all(s)


def test_both_advertise_reads_over_rdma_and_misses_over_tcp(fab: Fabric) -> None:
    s = setup(fab)
    s.store.put(b"a", 0, block(1))
    s.store.put(b"b", 3 * BLOCK, block(2))
    tcp = TcpStub(s.store)
    t = RdmaOrTcp(tcp, s.rdma, s.store)
    assert t.path == "rdma"
    got, sink = collect()
    items = t.get([b"a", b"zz", b"b"], NS, sink, deadline=time.monotonic() + 5)
    assert [it.found for it in items] == [True, False, True]
    assert got[0] == block(1) and got[2] == block(2)
    assert items[0].size_bytes == BLOCK
    assert (items[0].generation, items[2].generation) == (s.store.index[b"a"][2], s.store.index[b"b"][2])
    assert tcp.calls and tcp.calls[0][0] == [b"zz"]  # only the miss went through TCP
    assert t.num_rdma_blocks == 2 and t.num_fallbacks == 0
    close_all(s)


def test_one_side_without_device_uses_tcp(fab: Fabric) -> None:
    store = Store(bytearray(ARENA))
    store.put(b"a", 0, block(5))
    tcp = TcpStub(store)
    t = RdmaOrTcp(tcp, None, store)  # negotiate() said tcp: no RdmaTransport made
    got, sink = collect()
    assert [it.found for it in t.get([b"a"], NS, sink, deadline=time.monotonic() + 5)] == [True]
    assert got[0] == block(5) and t.path == "tcp" and len(tcp.calls) == 1


# ---- fallback ---------------------------------------------------------------------------------


def test_rdma_error_mid_transfer_falls_back_to_tcp_within_deadline(fab: Fabric) -> None:
    s = setup(fab)
    for n in range(6):
        s.store.put(bytes([65 + n]), n * BLOCK, block(10 + n))
    keys = [bytes([65 + n]) for n in range(6)]
    seen: list[int] = []
    fab.fail_wr = lambda wr: (seen.append(wr.wr_id), E.IBV_WC_RETRY_EXC_ERR if len(seen) == 3 else 0)[1]
    tcp = TcpStub(s.store)
    t = RdmaOrTcp(tcp, s.rdma, s.store)
    deadline = time.monotonic() + 5
    got, sink = collect()
    items = t.get(keys, NS, sink, deadline=deadline)
    assert all(it.found for it in items)
    assert [got[i] for i in range(6)] == [block(10 + n) for n in range(6)]
    assert t.num_fallbacks == 1 and t.last_error.startswith("rdma:")
    assert tcp.calls == [(keys, deadline)]  # the whole get, under the caller's deadline
    assert t.path == "tcp"  # the QP is in error: later gets go straight to TCP
    t.get(keys[:1], NS, sink, deadline=deadline)
    assert len(seen) == 3 and len(tcp.calls) == 2
    close_all(s)


def test_completions_missing_at_deadline_fall_back(fab: Fabric) -> None:
    s = setup(fab)
    s.store.put(b"a", 0, block(3))
    s.rdma.cq.poll = lambda n: (0, [])  # the NIC never completes
    tcp = TcpStub(s.store)
    t = RdmaOrTcp(tcp, s.rdma, s.store)
    with pytest.raises(DeadlineExceeded):
        s.rdma.read_regions([RemoteRegion(0, BLOCK)], lambda *a: None, deadline=time.monotonic() + 0.01)
    assert s.reader_ep.num_qps == 0  # destroyed at once: no late READ response lands in the bounce MR
    got, sink = collect()
    assert t.get([b"a"], NS, sink, deadline=time.monotonic() + 5)[0].found
    assert got[0] == block(3) and len(tcp.calls) == 1


# ---- the version check ------------------------------------------------------------------------


def _race(s: SimpleNamespace, fab: Fabric) -> None:
    """At the READ of key b"b": evict it and put other bytes at its offset (a new generation)."""
    def before(qp: Any, wr: Any) -> None:
        if wr.opcode == E.IBV_WR_RDMA_READ and wr.remote_addr == s.node_ep.addr + BLOCK:
            s.store.evict(b"b")
            s.store.put(b"c", BLOCK, block(0xEE))
            fab.before_wr = None
    fab.before_wr = before


def test_read_racing_eviction_is_dropped(fab: Fabric) -> None:
    s = setup(fab)
    s.store.put(b"a", 0, block(1))
    s.store.put(b"b", BLOCK, block(2))
    _race(s, fab)
    got, sink = collect()
    found = read_versioned(s.store, s.rdma, [b"a", b"b"], NS, sink, deadline=time.monotonic() + 5)
    assert found == [True, False]
    assert 1 not in got  # the racing block's bytes never reached the sink
    assert got[0] == block(1)
    close_all(s)


def test_race_without_the_check_serves_wrong_bytes(fab: Fabric) -> None:
    """The mutation: a source whose check always passes serves the other block's bytes."""
    s = setup(fab)
    s.store.put(b"a", 0, block(1))
    s.store.put(b"b", BLOCK, block(2))
    _race(s, fab)
    s.store.check_generations = lambda keys, ns, regions: [True] * len(keys)
    got, sink = collect()
    found = read_versioned(s.store, s.rdma, [b"a", b"b"], NS, sink, deadline=time.monotonic() + 5)
    assert found == [True, True] and got[1] == block(0xEE) != block(2)
    close_all(s)


def test_granted_read_and_lapsed_pin(fab: Fabric) -> None:
    s = setup(fab)
    s.store.put(b"a", 2 * BLOCK, block(9))
    lapsed: list[int] = []
    released: list[int] = []

    class Granting:
        def pin_blocks(self, keys: Sequence[bytes], ns: bytes, **kw: Any) -> tuple[int, list[Any]]:
            e = s.store.index[keys[0]]
            return 41, [SimpleNamespace(offset=e[0], size_bytes=e[1], generation=e[2]), None]

        def release_pins_report(self, ids: Sequence[int]) -> tuple[int, list[int]]:
            released.extend(ids)
            return len(ids), list(lapsed)

    got, sink = collect()
    found = read_granted(Granting(), s.rdma, [b"a", b"x"], NS, sink,  # type: ignore[arg-type]
                         session_id=7, deadline=time.monotonic() + 5)
    assert found == [True, False] and got[0] == block(9) and released == [41]
    lapsed.append(41)
    got, sink = collect()
    with pytest.raises(LeaseExpired):
        read_granted(Granting(), s.rdma, [b"a", b"x"], NS, sink,  # type: ignore[arg-type]
                     session_id=7, deadline=time.monotonic() + 5)
    assert got == {} and released == [41, 41]
    close_all(s)


# ---- bookkeeping ------------------------------------------------------------------------------


def test_registrations_are_undone_on_close(fab: Fabric) -> None:
    s = setup(fab)
    assert fab.num_open == {"ctx": 2, "pd": 2, "cq": 2, "mr": 2, "qp": 2}
    assert s.node_ep.num_registered_regions == 1 and s.server.num_sessions == 1
    close_all(s)
    close_all(s)  # idempotent
    assert fab.num_open == {"ctx": 0, "pd": 0, "cq": 0, "mr": 0, "qp": 0}
    assert s.node_ep.num_registered_regions == 0 and s.server.num_sessions == 0
    with pytest.raises(TransferFailed, match="closed"):
        s.rdma.read_regions([RemoteRegion(0, 1)], lambda *a: None, deadline=time.monotonic() + 1)


def test_transports_of_one_endpoint_have_their_own_cq_and_share_its_lock(fab: Fabric) -> None:
    s = setup(fab)
    other = connect(s.reader_ep, lambda b: s.server.accept_json(8, b))
    assert other.cq is not s.rdma.cq and other._lock is s.rdma._lock is s.reader_ep.transfer_lock
    s.store.put(b"a", 0, block(4))
    got, sink = collect()
    assert read_versioned(s.store, other, [b"a"], NS, sink, deadline=time.monotonic() + 5) == [True]
    assert got[0] == block(4)
    other.close()
    close_all(s)
    assert fab.num_open == {"ctx": 0, "pd": 0, "cq": 0, "mr": 0, "qp": 0}


def test_failed_open_and_handshake_leak_nothing(fab: Fabric) -> None:
    verbs = fab.verbs()
    with pytest.raises(TransferFailed, match="nope"):
        RdmaEndpoint(verbs, "nope", bytearray(BLOCK), remote_access=False)
    assert fab.num_open == {"ctx": 0, "pd": 0, "cq": 0, "mr": 0, "qp": 0}
    ep = RdmaEndpoint(verbs, "fake0", bytearray(BLOCK), remote_access=False)
    with pytest.raises(InvalidArgument, match="gid"):
        connect(ep, lambda b: b'{"device":"x","gid":"zz","lid":0,"qpn":1,"psn":1,"rkey":1,'
                              b'"addr":0,"length_bytes":1}')
    assert ep.num_qps == 0 and fab.num_open["qp"] == 0
    ep.close()
    assert fab.num_open == {"ctx": 0, "pd": 0, "cq": 0, "mr": 0, "qp": 0}


@pytest.mark.parametrize(("data", "match"), [
    (b"not json", "not JSON"),
    (b"[]", "expected an object"),
    (b'{"device":"d"}', "missing field 'gid'"),
    (b'{"device":"d","gid":"fe80:0000:0000:0000:0000:0000:0000:0001","lid":0,"qpn":-1,'
     b'"psn":0,"rkey":0,"addr":0,"length_bytes":0}', "qpn must be an int >= 0, received -1"),
    (b'{"device":"d","gid":"fe80:0000:0000:0000:0000:0000:0000:0001","lid":0,"qpn":16777216,'
     b'"psn":0,"rkey":0,"addr":0,"length_bytes":0}', "qpn must fit 24 bits"),
])
def test_bad_advert_names_field_and_value(data: bytes, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        RdmaAdvert.from_json(data)


def test_advert_round_trip() -> None:
    a = RdmaAdvert("mlx5_0", "fe80:0000:0000:0000:0000:0000:0000:0001", 3, 77, 5, 9, 1 << 40, 1 << 30)
    assert RdmaAdvert.from_json(a.to_json()) == a


def test_region_outside_peer_region_is_refused(fab: Fabric) -> None:
    s = setup(fab)
    with pytest.raises(InvalidArgument, match="outside"):
        s.rdma.read_regions([RemoteRegion(ARENA - 1, 2)], lambda *a: None, deadline=time.monotonic() + 1)
    with pytest.raises(InvalidArgument, match="bounce buffer"):
        s.rdma.read_regions([RemoteRegion(0, 9 * BLOCK)], lambda *a: None, deadline=time.monotonic() + 1)
    assert not s.rdma.broken
    close_all(s)


# ---- WRITE fencing ----------------------------------------------------------------------------


def test_lapsed_write_grant_stays_quarantined_until_teardown(fab: Fabric) -> None:
    now = [100.0]
    verbs = fab.verbs()
    arena = bytearray(ARENA)
    node_ep = RdmaEndpoint(verbs, "fake0", arena, remote_access=True)
    server = RdmaServer(node_ep, clock=lambda: now[0])
    reader_ep = RdmaEndpoint(verbs, "fake0", bytearray(2 * BLOCK), remote_access=False)
    rdma: RdmaTransport = connect(reader_ep, lambda b: server.accept_json(9, b))
    region = RemoteRegion(4 * BLOCK, BLOCK)
    server.grant_write(9, 1, [region], lease_s=1.0)
    rdma.write_regions([region], [memoryview(block(0x11))], deadline=time.monotonic() + 5)
    assert arena[4 * BLOCK:5 * BLOCK] == block(0x11)
    now[0] += 2.0  # the lease lapses before the writer's commit
    assert server.expire() == [1]
    with pytest.raises(LeaseExpired, match="quarantined"):
        server.commit_write(1)
    assert server.quarantined_regions() == [region]  # not free: the NIC may still write
    rdma.write_regions([region], [memoryview(block(0x22))], deadline=time.monotonic() + 5)
    assert arena[4 * BLOCK:5 * BLOCK] == block(0x22)  # a late write lands in held space only
    order: list[str] = []
    destroy = node_ep.destroy_qp
    node_ep.destroy_qp = lambda qp: (order.append("qp destroyed"), destroy(qp))[1]  # type: ignore[method-assign]
    freed = server.end_session(9)
    order.append("regions returned")
    assert freed == [region] and order == ["qp destroyed", "regions returned"]
    assert server.quarantined_regions() == [] and server.end_session(9) == []
    arena[4 * BLOCK:5 * BLOCK] = block(0x33)  # the node reuses the space
    with pytest.raises(TransferFailed):
        rdma.write_regions([region], [memoryview(block(0x44))], deadline=time.monotonic() + 5)
    assert arena[4 * BLOCK:5 * BLOCK] == block(0x33)  # nothing written after teardown
    rdma.close()
    reader_ep.close()
    node_ep.close()
    assert fab.num_open == {"ctx": 0, "pd": 0, "cq": 0, "mr": 0, "qp": 0}


def test_write_grant_in_time_commits(fab: Fabric) -> None:
    s = setup(fab, session_id=3)
    region = RemoteRegion(0, BLOCK)
    with pytest.raises(InvalidArgument, match="session 4 has no QP"):
        s.server.grant_write(4, 1, [region], lease_s=1.0)
    s.server.grant_write(3, 1, [region], lease_s=60.0)
    assert s.server.commit_write(1) == [region] and s.server.quarantined_regions() == []
    with pytest.raises(InvalidArgument, match="session id 0"):
        s.server.accept(0, s.rdma.peer)
    close_all(s)


# ---- the real pyverbs classes (python3-pyverbs), no device needed -------------------------------

REAL = load_pyverbs()


@pytest.mark.skipif(REAL is None, reason="python3-pyverbs not installed (scripts/setup-system.sh)")
def test_attributes_build_with_real_pyverbs(fab: Fabric) -> None:
    """connect_qp and a READ's work request, built from the real pyverbs classes."""
    assert REAL is not None
    fake = fab.verbs()
    ep = RdmaEndpoint(fake, "fake0", bytearray(BLOCK), remote_access=False)
    ep.verbs = REAL  # from here on: the real QPAttr, GID, GlobalRoute, AHAttr, SendWR, SGE
    attrs: list[Any] = []
    posted: list[Any] = []
    qp = SimpleNamespace(to_rts=attrs.append, post_send=posted.append)
    local = RdmaAdvert("fake0", "fe80:0000:0000:0000:0000:0000:0000:0001", 0, 5, 6, 1, ep.addr, BLOCK)
    peer = RdmaAdvert("fake0", "fe80:0000:0000:0000:0000:0000:0000:0002", 0, 8, 9, 2, 1 << 20, ARENA)
    ep.connect_qp(qp, local, peer)
    assert attrs[0].dest_qp_num == 8 and attrs[0].rq_psn == 9 and attrs[0].sq_psn == 6
    wc = SimpleNamespace(status=REAL.enums.IBV_WC_SUCCESS, wr_id=0)
    ep._cqs[id(qp)] = SimpleNamespace(poll=lambda n: (1, [wc]), close=lambda: None)
    t = RdmaTransport(ep, qp, peer)
    t.read_regions([RemoteRegion(BLOCK, 64)], lambda *a: None, deadline=time.monotonic() + 1)
    assert posted[0].opcode == REAL.enums.IBV_WR_RDMA_READ
    ep.verbs = fake
    ep.close()
    assert fab.num_open == {"ctx": 0, "pd": 0, "cq": 0, "mr": 0, "qp": 0}


# ---- the slot-header check (kvstored/tiers/slots.py layout, FaRM-style) ------------------------


def _slot_setup(fab: Fabric) -> SimpleNamespace:
    from kvstored.tiers.slots import Layout, SlotTable
    lay = Layout(ARENA)
    buf = bytearray(lay.total_bytes)  # the arena FILE: blocks, region header, slots, index
    table = SlotTable(buf, lay)
    verbs = fab.verbs()
    node_ep = RdmaEndpoint(verbs, "fake0", buf, remote_access=True)
    server = RdmaServer(node_ep)
    reader_ep = RdmaEndpoint(verbs, "fake0", bytearray(8 * BLOCK), remote_access=False)
    rdma = connect(reader_ep, lambda b: server.accept_json(5, b))
    for n, key in enumerate((b"a", b"b")):
        buf[n * BLOCK:(n + 1) * BLOCK] = block(1 + n)
        table.publish(n * BLOCK, BLOCK, NS, key, 10 + n, b"")
    regions = [RemoteRegion(0, BLOCK, 10), RemoteRegion(BLOCK, BLOCK, 11)]
    return SimpleNamespace(lay=lay, buf=buf, table=table, rdma=rdma, regions=regions,
                           close=lambda: (rdma.close(), server.close(), reader_ep.close(), node_ep.close()))


def _rewrite_b(s: SimpleNamespace) -> None:
    """The node frees b's slot and rewrites it with another block (odd, bytes, even again)."""
    s.table.unpublish(BLOCK)
    s.buf[BLOCK:2 * BLOCK] = block(0xEE)
    s.table.publish(BLOCK, BLOCK, NS, b"c", 12, b"")


def test_slot_checked_read_keeps_stable_blocks(fab: Fabric) -> None:
    from kvstored.node.rdma_slots import read_slots_checked
    s = _slot_setup(fab)
    got, sink = collect()
    assert read_slots_checked(s.rdma, s.lay, [b"a", b"b"], NS, s.regions, sink,
                              deadline=time.monotonic() + 5) == [True, True]
    assert got[0] == block(1) and got[1] == block(2)
    got, sink = collect()  # a stale generation (b was re-put since it was located): dropped
    stale = [s.regions[0], RemoteRegion(BLOCK, BLOCK, 99)]
    assert read_slots_checked(s.rdma, s.lay, [b"a", b"b"], NS, stale, sink,
                              deadline=time.monotonic() + 5) == [True, False]
    assert 1 not in got
    s.close()


@pytest.mark.parametrize("step", ["rewritten during the payload READ", "held odd during the payload READ"])
def test_slot_checked_read_racing_the_node_is_dropped(fab: Fabric, step: str) -> None:
    from kvstored.node.rdma_slots import read_slots_checked
    s = _slot_setup(fab)

    def before(qp: Any, wr: Any) -> None:  # holds the step at b's payload READ
        if wr.opcode == E.IBV_WR_RDMA_READ and wr.sg[0].length == BLOCK and wr.wr_id == 1:
            if step.startswith("rewritten"):
                _rewrite_b(s)
            else:
                s.table.unpublish(BLOCK)  # mid-free: odd, bytes being reused
                s.buf[BLOCK:2 * BLOCK] = block(0xEE)
            fab.before_wr = None
    fab.before_wr = before
    got, sink = collect()
    assert read_slots_checked(s.rdma, s.lay, [b"a", b"b"], NS, s.regions, sink,
                              deadline=time.monotonic() + 5) == [True, False]
    assert got == {0: bytearray(block(1))}
    s.close()


def test_slot_check_disabled_serves_wrong_bytes(fab: Fabric) -> None:
    """The mutation: ignoring the second header READ keeps the rewritten block's bytes."""
    from kvstored.node.rdma_slots import read_slots_checked, slot_check
    s = _slot_setup(fab)
    real = slot_check(NS, [b"a", b"b"], s.regions)
    got, sink = collect()
    assert read_slots_checked(s.rdma, s.lay, [b"a", b"b"], NS, s.regions, sink,
                              deadline=time.monotonic() + 5,
                              check=lambda i, before, after: real(i, before, before)) == [True, True]

    def before(qp: Any, wr: Any) -> None:
        if wr.wr_id == 1 and wr.sg[0].length == BLOCK:
            _rewrite_b(s)
            fab.before_wr = None
    fab.before_wr = before
    got, sink = collect()
    read_slots_checked(s.rdma, s.lay, [b"a", b"b"], NS, s.regions, sink, deadline=time.monotonic() + 5,
                       check=lambda i, before, after: real(i, before, before))
    assert got[1] == block(0xEE) != block(2)  # wrong bytes served
    s.close()


def test_peer_blocks_found_through_the_index_by_one_sided_reads(fab: Fabric) -> None:
    from kvstored.node.rdma_slots import lookup_slots, read_peer_blocks
    s = _slot_setup(fab)
    got, sink = collect()
    assert read_peer_blocks(s.rdma, s.lay, [b"b", b"missing", b"a"], NS, sink,
                            deadline=time.monotonic() + 5) == [True, False, True]
    assert got == {0: bytearray(block(2)), 2: bytearray(block(1))}
    assert lookup_slots(s.rdma, s.lay, [b"a"], NS, deadline=time.monotonic() + 5) == [RemoteRegion(0, BLOCK, 10)]
    held: list[Any] = []

    def hold_bucket_odd(step: str, slot: int) -> None:  # the node held mid-rewrite of b's bucket
        if step == "bucket" and not held:
            held.append(slot)
            assert lookup_slots(s.rdma, s.lay, [b"b"], NS, deadline=time.monotonic() + 5) == [None]
    s.table.hook = hold_bucket_odd
    s.table.publish(BLOCK, BLOCK, NS, b"b", 13, b"")  # b re-put: a new generation
    assert held
    s.table.hook = None
    assert lookup_slots(s.rdma, s.lay, [b"b"], NS, deadline=time.monotonic() + 5) == [RemoteRegion(BLOCK, BLOCK, 13)]
    s.close()
