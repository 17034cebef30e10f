"""The node's RDMA wiring (kvstored/node/rdma_node.py, kvstored/node/rdma_peers.py) on the fake
verbs layer of tests/fake_verbs.py, in one process.

A "peer" NodeRdma registers an arena file image (blocks + kvstored/tiers/slots.py headers and
index) as its MR; a "reader" PeerTransports negotiates with it through injected ListNodes /
ConnectRdma / DisconnectRdma calls. Checked: the transport choice (both ends advertise ->
RDMA; either lacks a device -> TCP), a READ served by RDMA with its meta and generation and
the rest over TCP, a QP that fails mid-read (TCP with the right bytes, TCP until
``reconnect_s`` on a fake clock, then a new QP), the slot version check against an ABA
rewrite held between the READs (and the mutation without it serving wrong bytes), a newer
reader epoch ending the older QP, a lapsed WRITE grant quarantined until its session ends,
an arena no peer can WRITE, and open_node_rdma's auto / on / off.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from kvstored.config import RdmaConfig
from kvstored.errors import ConfigInvalid, LeaseExpired, NoCapacity, TransferFailed
from kvstored.node.rdma_node import NodeRdma, open_node_rdma
from kvstored.node.rdma_peers import ConnectAnswer, PeerInfo, PeerTransports
from kvstored.node.rdma_slots import slot_check
from kvstored.tiers.slots import Layout, SlotTable
from kvstored.transport.base import GetItem, RemoteRegion
from kvstored.transport.rdma import RdmaEndpoint
from tests.fake_verbs import E, Fabric

NS = b"ns"
BLOCK = 4096
ARENA = 32 * BLOCK
PEER = "10.0.0.2:7000"


def block(tag: int) -> bytes:
    return bytes([tag]) * BLOCK


class Tcp:
    """The peer's TCP data plane: serves every key it holds (records the keys asked)."""

    def __init__(self, held: dict[bytes, tuple[bytes, bytes, int]]) -> None:
        self.held = held
        self.calls: list[list[bytes]] = []

    def get(self, keys: Sequence[bytes], namespace_id: bytes, sink: Any, *, deadline: float
            ) -> list[GetItem]:
        self.calls.append(list(keys))
        out = []
        for i, k in enumerate(keys):
            if k not in self.held:
                out.append(GetItem(0, "", False, 0, 0, b""))
                continue
            data, meta, gen = self.held[k]
            view = sink(i, len(data), meta)
            if view is not None:
                view[:] = data
            out.append(GetItem(0, "", True, 1, len(data), meta, gen))
        return out

    def put(self, *a: Any, **kw: Any) -> list[Any]:
        return []

    def close(self) -> None:
        pass


class World:
    """One peer node (arena image + NodeRdma) and one reader (NodeRdma + PeerTransports)."""

    def __init__(self, *, peer_transports: tuple[str, ...] = ("tcp", "rdma"),
                 reader_has_device: bool = True, check: Any = None) -> None:
        self.fab = Fabric()
        self.verbs = self.fab.verbs()
        self.lay = Layout(ARENA)
        self.buf = bytearray(self.lay.total_bytes)
        self.table = SlotTable(self.buf, self.lay)
        self.held: dict[bytes, tuple[bytes, bytes, int]] = {}
        for n, (key, meta) in enumerate(((b"a", b"m-a"), (b"b", b"m-b"), (b"c", b"x" * 100))):
            self.buf[n * BLOCK:(n + 1) * BLOCK] = block(1 + n)
            self.table.publish(n * BLOCK, BLOCK, NS, key, 10 + n, meta)
            self.held[key] = (block(1 + n), meta, 10 + n)
        self.held[b"ssd"] = (block(9), b"m-ssd", 20)  # on the peer's SSD only: not in DRAM
        ep = RdmaEndpoint(self.verbs, "fake0", self.buf, remote_access=True, remote_write=False)
        self.node = NodeRdma(self.verbs, "fake0", ep, arena_size_bytes=ARENA, arena_path="",
                             epoch=5)
        reader_buf = bytearray(Layout(ARENA).total_bytes)
        self.reader = NodeRdma(self.verbs, "fake0", RdmaEndpoint(
            self.verbs, "fake0", reader_buf, remote_access=True, remote_write=False),
            arena_size_bytes=ARENA, arena_path="", epoch=1) if reader_has_device else None
        self.tcp = Tcp(self.held)
        self.now = 100.0
        self.connects: list[int] = []
        self.disconnects: list[int] = []
        self.peer_info = PeerInfo("n", 5, "10.0.0.2:1", PEER, peer_transports)
        self.peers = PeerTransports(
            self.reader, RdmaConfig(reconnect_s=5.0, peer_view_s=2.0), node_id="r", epoch=1,
            tcp_for=lambda address: self.tcp, list_peers=lambda timeout_s: [self.peer_info],
            connect_peer=self._connect, disconnect_peer=self._disconnect,
            max_block_bytes=BLOCK, clock=lambda: self.now, check=check)

    def _connect(self, peer: PeerInfo, advert: bytes, timeout_s: float) -> ConnectAnswer:
        sid, answer = self.node.accept(advert, node_id="r", epoch=1)
        self.connects.append(sid)
        return ConnectAnswer(answer, sid, ARENA, "", 5)

    def _disconnect(self, peer: PeerInfo, session_id: int, timeout_s: float) -> None:
        self.disconnects.append(session_id)
        self.node.disconnect(session_id)

    def get(self, keys: list[bytes]) -> tuple[list[GetItem], dict[int, tuple[bytes, bytes]]]:
        got: dict[int, tuple[bytes, bytes]] = {}
        views: dict[int, bytearray] = {}

        def sink(i: int, size: int, meta: bytes) -> memoryview:
            views[i] = bytearray(size)
            got[i] = (b"", meta)
            return memoryview(views[i])
        items = self.peers.transport_for(PEER).get(keys, NS, sink, deadline=time.monotonic() + 5)
        return items, {i: (bytes(views[i]), got[i][1]) for i in views}

    def close(self) -> None:
        self.peers.close()
        self.node.close()
        if self.reader is not None:
            self.reader.close()


def test_both_ends_advertise_dram_hits_over_rdma_the_rest_over_tcp() -> None:
    w = World()
    items, got = w.get([b"a", b"c", b"ssd", b"b", b"none"])
    assert [it.found for it in items] == [True, True, True, True, False]
    assert got == {0: (block(1), b"m-a"), 1: (block(3), b"x" * 100), 2: (block(9), b"m-ssd"),
                   3: (block(2), b"m-b")}
    assert [(it.generation, it.meta) for it in items[:4]] == [
        (10, b"m-a"), (12, b"x" * 100), (20, b"m-ssd"), (11, b"m-b")]
    # a and b by one-sided READs; c (meta not inline), ssd and the miss over TCP
    assert w.tcp.calls == [[b"c", b"ssd", b"none"]]
    c = w.peers.counts
    assert (c.rdma_blocks, c.tcp_blocks, c.fallbacks) == (2, 2, 0)
    assert w.peers.path_of(PEER) == "rdma" and w.node.num_sessions == 1
    w.close()
    assert w.fab.num_open == {"ctx": 0, "pd": 0, "cq": 0, "mr": 0, "qp": 0}


@pytest.mark.parametrize("side", ["peer advertises tcp only", "reader has no device"])
def test_either_end_without_rdma_reads_over_tcp(side: str) -> None:
    w = World(peer_transports=("tcp",)) if side.startswith("peer") else World(reader_has_device=False)
    items, got = w.get([b"a", b"b"])
    assert got == {0: (block(1), b"m-a"), 1: (block(2), b"m-b")}
    assert w.tcp.calls == [[b"a", b"b"]] and w.connects == []
    assert (w.peers.counts.rdma_blocks, w.peers.counts.tcp_blocks) == (0, 2)
    w.close()


def test_qp_failing_mid_read_falls_back_to_tcp_then_reconnects_after_reconnect_s() -> None:
    w = World()
    assert w.get([b"a"])[1] == {0: (block(1), b"m-a")}
    assert w.connects == [1]

    def fail_payload(wr: Any) -> int:  # b's block READ: mid-read, headers already READ
        return E.IBV_WC_RETRY_EXC_ERR if wr.sg[0].length == BLOCK and wr.wr_id == 1 else 0
    w.fab.fail_wr = fail_payload
    items, got = w.get([b"a", b"b"])
    w.fab.fail_wr = None
    assert got == {0: (block(1), b"m-a"), 1: (block(2), b"m-b")}  # every byte from TCP
    assert w.tcp.calls == [[b"a", b"b"]] and w.peers.counts.fallbacks == 1
    assert w.peers.path_of(PEER) == "tcp"
    w.now += 4.9  # within reconnect_s: still TCP, no new handshake
    w.get([b"a"])
    assert w.connects == [1] and w.tcp.calls[-1] == [b"a"]
    w.now += 0.2  # past it: the broken QP is torn down (DisconnectRdma), a new one made
    w.tcp.calls.clear()
    assert w.get([b"a", b"b"])[1] == {0: (block(1), b"m-a"), 1: (block(2), b"m-b")}
    assert w.connects == [1, 2] and w.disconnects == [1] and w.tcp.calls == []
    assert w.node.num_sessions == 1
    w.close()


def _aba(w: World) -> None:
    """Hold a's slot between the READs: freed and reused (other bytes) during the payload
    READ, then a put back in the same slot with the same generation (a promotion keeps its
    generation) before the second header READ: only the version tells them apart."""
    def during_payload(qp: Any, wr: Any) -> None:
        if wr.opcode == E.IBV_WR_RDMA_READ and wr.sg[0].length == BLOCK and wr.wr_id == 0:
            w.table.unpublish(0)
            w.buf[0:BLOCK] = block(0xEE)
            w.fab.before_wr = None

    def after_payload() -> None:
        w.buf[0:BLOCK] = block(1)
        w.table.publish(0, BLOCK, NS, b"a", 10, b"m-a")
    w.fab.before_wr = during_payload
    w.peers.transport_for(PEER)
    conn = w.peers._conns[PEER]
    conn.reads.after_copy = after_payload


def test_block_rewritten_between_the_reads_is_dropped_and_read_over_tcp() -> None:
    w = World()
    _aba(w)
    items, got = w.get([b"a", b"b"])
    assert got[0] == (block(1), b"m-a") and got[1] == (block(2), b"m-b")
    assert w.tcp.calls == [[b"a"]]  # a dropped by the version check, b kept
    assert (w.peers.counts.rdma_blocks, w.peers.counts.tcp_blocks) == (1, 1)
    w.close()


def test_mutation_without_the_version_check_serves_wrong_bytes() -> None:
    """The same race with the second header READ ignored: the reused slot's bytes are served."""
    def no_version(ns: bytes, keys: Sequence[bytes], regions: Sequence[RemoteRegion]) -> Any:
        real = slot_check(ns, keys, regions)
        return lambda i, before, after: real(i, before, before)
    w = World(check=no_version)
    _aba(w)
    items, got = w.get([b"a", b"b"])
    assert got[0][0] == block(0xEE) != block(1)  # wrong bytes: the test above would be red
    assert w.tcp.calls == []
    w.close()


def test_newer_reader_epoch_ends_its_older_queue_pair() -> None:
    w = World()
    w.get([b"a"])
    old_qps = set(w.fab.qps)
    sid, _ = w.node.accept(w.reader.endpoint.create_qp()[1].to_json(), node_id="r", epoch=2)  # type: ignore[union-attr]
    assert sid == 2 and w.node.num_sessions == 1  # session 1 (epoch 1) is gone
    assert len(old_qps - set(w.fab.qps)) == 1  # its QP destroyed
    w.close()


def test_lapsed_write_grant_stays_quarantined_until_its_session_ends() -> None:
    w = World()
    w.get([b"a"])
    now = [0.0]
    w.node.server.clock = lambda: now[0]
    regions = [RemoteRegion(4 * BLOCK, BLOCK)]
    w.node.server.grant_write(1, 77, regions, lease_s=1.0)
    now[0] = 2.0
    assert w.node.server.expire() == [77]
    with pytest.raises(LeaseExpired):
        w.node.server.commit_write(77)
    assert w.node.server.quarantined_regions() == regions  # not handed back: a NIC may write
    qpn = w.node.server._sessions[1].qp.qp_num
    assert w.node.disconnect(1) == 1  # the QP first, then the region
    assert qpn not in w.fab.qps and w.node.server.quarantined_regions() == []
    w.close()


def test_peers_cannot_write_the_arena() -> None:
    w = World()
    w.get([b"a"])
    rdma = w.peers._conns[PEER].reads.rdma
    assert rdma is not None
    with pytest.raises(TransferFailed, match="status"):
        rdma.write_regions([RemoteRegion(0, BLOCK)], [memoryview(block(0xAB))],
                           deadline=time.monotonic() + 5)
    assert bytes(w.buf[:BLOCK]) == block(1)
    w.close()


def test_max_sessions_refuses_with_no_capacity() -> None:
    w = World()
    w.node.max_sessions = 1
    w.get([b"a"])
    with pytest.raises(NoCapacity, match="max_sessions"):
        w.node.accept(w.node.endpoint.create_qp()[1].to_json(), node_id="other", epoch=1)
    w.close()


def _store() -> Any:
    lay = Layout(ARENA)
    return SimpleNamespace(arena_mapping=lambda: bytearray(lay.total_bytes),
                           arena_size_bytes=ARENA, arena_path="/dev/shm/x")


@pytest.mark.parametrize("devices,enabled,want", [
    ("fake0", "auto", "fake0"), ("fake0", "off", None), ("", "auto", None),
    ("", "on", "no RDMA device is listed"), ("fake0", "on", "fake0"),
])
def test_open_node_rdma(monkeypatch: pytest.MonkeyPatch, devices: str, enabled: str,
                        want: str | None) -> None:
    monkeypatch.setenv("KVSTORED_TEST_FAKE_DEVICES", devices)
    env = {"KVSTORED_TEST_VERBS": "tests.fake_verbs:process_verbs"}
    cfg = RdmaConfig(enabled=enabled)  # type: ignore[arg-type]
    if want is not None and " " in want:
        with pytest.raises(ConfigInvalid, match=want):
            open_node_rdma(cfg, _store(), epoch=1, environ=env)
        return
    got = open_node_rdma(cfg, _store(), epoch=1, environ=env)
    assert (got.device if got is not None else None) == want
    if got is not None:
        got.close()


def test_open_node_rdma_names_a_missing_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORED_TEST_FAKE_DEVICES", "fake0")
    env = {"KVSTORED_TEST_VERBS": "tests.fake_verbs:process_verbs"}
    with pytest.raises(ConfigInvalid, match=r"rdma.device 'mlx5_0' is not among the devices listed \['fake0'\]"):
        open_node_rdma(RdmaConfig(enabled="on", device="mlx5_0"), _store(), epoch=1, environ=env)
    assert open_node_rdma(RdmaConfig(device="mlx5_0"), _store(), epoch=1, environ=env) is None


def test_without_a_device_auto_is_tcp_and_on_names_what_is_missing(tmp_path: Any) -> None:
    """This machine: no /sys/class/infiniband, and the real pyverbs (when installed) raises
    in get_device_list(). auto: None without importing pyverbs; on: ConfigInvalid."""
    from kvstored.node.rdma_node import list_devices
    from kvstored.transport.rdma import load_pyverbs
    empty = str(tmp_path)  # a sysfs class directory with no device in it
    assert open_node_rdma(RdmaConfig(), _store(), epoch=1, environ={}, sysfs=empty) is None
    verbs = load_pyverbs()
    if verbs is None:
        pytest.skip("python3-pyverbs is not installed")
    assert list_devices(verbs) == []  # get_device_list() raised PyverbsRDMAError
    with pytest.raises(ConfigInvalid, match="no RDMA device is listed"):
        open_node_rdma(RdmaConfig(enabled="on"), _store(), epoch=1, environ={}, sysfs=empty)


def test_path_counts_are_exported_by_the_collector() -> None:
    from prometheus_client import CollectorRegistry

    from kvstored.node.metrics import RdmaCollector
    w = World()
    w.get([b"a", b"ssd"])
    reg = CollectorRegistry()
    c = w.peers.counts
    reg.register(RdmaCollector(lambda: (c.rdma_blocks, c.tcp_blocks, c.fallbacks, w.node.num_sessions)))
    assert reg.get_sample_value("kvstored_remote_reads_total", {"path": "rdma"}) == 1
    assert reg.get_sample_value("kvstored_remote_reads_total", {"path": "tcp"}) == 1
    assert reg.get_sample_value("kvstored_rdma_fallbacks_total") == 0
    assert reg.get_sample_value("kvstored_rdma_sessions") == 1
    w.close()


def test_a_restarted_peer_gets_a_new_queue_pair_and_a_lagging_view_keeps_the_live_one() -> None:
    w = World()
    w.get([b"a"])
    w.peer_info = PeerInfo("n", 4, "10.0.0.2:1", PEER, ("tcp", "rdma"))  # an older epoch: lags
    w.now += 3.0  # past peer_view_s: the view is asked again
    w.get([b"a"])
    assert w.connects == [1] and w.peers.counts.rdma_blocks == 2
    w.peer_info = PeerInfo("n", 6, "10.0.0.2:1", PEER, ("tcp", "rdma"))  # restarted
    w.now += 3.0
    assert w.get([b"a"])[1] == {0: (block(1), b"m-a")}
    assert w.connects == [1, 2] and w.disconnects == []  # the old process took its QPs along
    w.close()


def test_daemon_with_rdma_on_and_no_device_refuses_before_mapping_the_arena(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from kvstored.config import NodeConfig
    from kvstored.node.daemon import NodeDaemon
    monkeypatch.setenv("KVSTORED_TEST_VERBS", "tests.fake_verbs:process_verbs")
    monkeypatch.setenv("KVSTORED_TEST_FAKE_DEVICES", "")
    from kvstored.tiers.tiered import TieredStore
    opened: list[Any] = []
    monkeypatch.setattr(TieredStore, "from_config", lambda *a, **kw: opened.append(a) or 1 / 0)
    cfg = NodeConfig(listen=[f"unix:{tmp_path}/n.sock"], data_address="", metrics_address="",
                     dram_size_bytes=1 << 20, ssd_size_bytes=0, arena_dir=tmp_path, node_id="x")
    with pytest.raises(ConfigInvalid, match=r'\[rdma\] enabled = "on" but no RDMA device is listed'):
        asyncio.run(NodeDaemon(cfg, rdma=RdmaConfig(enabled="on")).start())
    assert opened == []  # refused before the store (the arena) was opened
