"""MasterLink against an in-process MasterService over loopback gRPC, one round at a time.

Everything runs on one event loop and the test drives the link with ``run_once()`` and the
master's lease with a FakeClock, so every step (events, a gap and its resync, a master
restart, a lapsed lease) happens exactly where the test puts it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers import key

from kvstored.clock import FakeClock
from kvstored.config import ClusterConfig
from kvstored.errors import ErrorCode
from kvstored.master.membership import Membership
from kvstored.master.service import MasterServicer, WireRequest, add_master_service
from kvstored.master.state import MasterState
from kvstored.master.types import BlockEvent, BlockRef, EventKind
from kvstored.node.cluster import MasterLink
from kvstored.rpc_status import ERROR_CODE_METADATA_KEY
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Tier
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc

NS = b"\x33" * 16
LEASE_S = 10.0


class Master:
    """A MasterServicer whose state can be thrown away (a master restart)."""

    def __init__(self, servicer: type[MasterServicer] = MasterServicer) -> None:
        self.clock = FakeClock()
        self.servicer = servicer(self._fresh())

    def _fresh(self) -> MasterState:
        return MasterState(epoch=1, clock=self.clock, node_lease_s=LEASE_S, initial_blocks=16,
                           first_generation=10, rng=random.Random(1))

    def restart(self) -> None:
        self.servicer.set_state(self._fresh())

    @property
    def members(self) -> Membership:
        return self.servicer.membership

    def where(self, keys: list[int]) -> list[tuple[str, Tier]]:
        got = self.servicer.index.lookup_prefix(NS, [key(i) for i in keys])
        out = []
        for r in got:
            rec = self.members.record_of_holder(r.holder)
            assert rec is not None
            out.append((rec.spec.node_id, r.tier))
        return out


Scenario = Callable[[Master, MasterLink, TieredStore, str], Awaitable[None]]


def _run(tmp_path: Path, scenario: Scenario,
         servicer: type[MasterServicer] = MasterServicer) -> None:
    async def main() -> None:
        master = Master(servicer)
        server = grpc.aio.server()
        add_master_service(server, master.servicer)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        store = TieredStore(dram_size_bytes=1 << 20, arena_dir=None, node_id="n1",
                            ssd_dir=tmp_path / "ssd", ssd_size_bytes=8 << 20)
        link = MasterLink(ClusterConfig(master_address=f"127.0.0.1:{port}"), node_id="n1",
                          epoch=77, grpc_address="127.0.0.1:9000", data_address="127.0.0.1:9001",
                          store=store, load=lambda: 2.0)
        try:
            await scenario(master, link, store, f"127.0.0.1:{port}")
        finally:
            await link.stop(unregister=False)
            await server.stop(grace=0)
            store.close()

    asyncio.run(main())


def test_puts_and_removals_reach_the_master_as_ordered_events(tmp_path: Path) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, _: str) -> None:
        await link.run_once()
        assert link.registered and link.synced and link.lease_s == LEASE_S
        rec = master.members.node("n1")
        assert rec is not None and rec.load == 2.0 and rec.spec.epoch == 77
        assert master.where([0]) == []
        for i in range(3):
            store.put(key(i), bytes([i]) * 1000, namespace_id=NS)
        await link.run_once()
        assert link.seq == 3 and rec.applied_seq == 3
        assert master.where([0, 1, 2]) == [("n1", Tier.DRAM)] * 3
        store.remove([key(1)], namespace_id=NS)
        await link.run_once()
        assert link.seq == 4
        assert master.where([0, 1, 2]) == [("n1", Tier.DRAM)]
        dram = master.members.node("n1").tiers[Tier.DRAM]  # type: ignore[union-attr]
        assert dram.num_blocks == 2 and dram.capacity_bytes == store.arena_size_bytes

    _run(tmp_path, scenario)


def test_an_event_gap_hides_the_node_until_its_resync(tmp_path: Path) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, _: str) -> None:
        store.put(key(0), b"x" * 100, namespace_id=NS)
        await link.run_once()
        assert master.where([0]) == [("n1", Tier.DRAM)]
        # an event from the future arrives (events lost in between): the master knows it
        # no longer knows what n1 holds
        lost = BlockEvent(link.seq + 5, EventKind.ADDED, BlockRef(NS, key(9), Tier.DRAM, 1))
        master.members.report_events("n1", 77, [lost])
        assert master.where([0]) == []
        store.put(key(1), b"y" * 100, namespace_id=NS)
        await link.run_once()  # its events are refused: RESYNC
        assert not link.synced and master.where([0]) == []
        await link.run_once()  # full inventory
        assert link.synced
        assert master.where([0, 1]) == [("n1", Tier.DRAM)] * 2
        assert master.where([9]) == []

    _run(tmp_path, scenario)


def test_a_restarted_master_is_rebuilt_from_the_node(tmp_path: Path) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, _: str) -> None:
        for i in range(4):
            store.put(key(i), b"z" * 100, namespace_id=NS)
        await link.run_once()
        assert master.where([0, 1, 2, 3]) == [("n1", Tier.DRAM)] * 4
        master.restart()
        assert master.where([0]) == []  # knows nothing: answers nothing (no stale entries)
        await link.run_once()  # events and heartbeat answered REREGISTER
        assert not link.registered
        await link.run_once()  # register + inventory
        assert link.registered and link.synced
        assert master.where([0, 1, 2, 3]) == [("n1", Tier.DRAM)] * 4

    _run(tmp_path, scenario)


def test_a_lapsed_lease_makes_the_node_register_again(tmp_path: Path) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, _: str) -> None:
        store.put(key(0), b"q" * 100, namespace_id=NS)
        await link.run_once()
        master.clock.advance(LEASE_S + 0.5)  # the node was paused past its lease
        assert master.members.expire_lapsed() == ["n1"]
        assert master.where([0]) == []
        await link.run_once()
        assert not link.registered
        await link.run_once()
        assert master.where([0]) == [("n1", Tier.DRAM)]

    _run(tmp_path, scenario)


def test_inventory_is_sent_in_chunks_and_lists_ssd_copies(tmp_path: Path) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, _: str) -> None:
        link.cfg = ClusterConfig(master_address=link.cfg.master_address, inventory_chunk_blocks=3)
        for i in range(10):
            store.put(key(i), bytes(200 << 10), namespace_id=NS)  # 2 MiB: > 1 MiB of DRAM
        await link.run_once()
        on_ssd = {b.key for b in store.list_blocks()[0] if Tier.SSD in b.tiers}
        only_ssd = {b.key for b in store.list_blocks()[0] if b.tiers == (Tier.SSD,)}
        assert only_ssd and on_ssd
        rec = master.members.node("n1")
        assert rec is not None
        expected = sum(len(b.tiers) for b in store.list_blocks()[0])
        assert master.servicer.index.num_holder_replicas(rec.holder) == expected
        for i in range(10):
            want = Tier.SSD if key(i) in only_ssd else Tier.DRAM
            assert master.where([i]) == [("n1", want)]

    _run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("grpc_address", "nohost", "grpc_address"), ("node_id", "", "node_id")],
)
def test_bad_registrations_get_invalid_argument_with_the_error_code(
    tmp_path: Path, field: str, value: str, match: str
) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, addr: str) -> None:
        async with grpc.aio.insecure_channel(addr) as ch:
            stub = pb_grpc.MasterServiceStub(ch)
            info = pb.NodeInfo(node_id="n9", epoch=1, grpc_address="127.0.0.1:1",
                               data_address="127.0.0.1:2")
            setattr(info, field, value)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.RegisterNode(pb.RegisterNodeRequest(node=info))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert match in (err.value.details() or "")
            md = dict(err.value.trailing_metadata() or ())
            assert md[ERROR_CODE_METADATA_KEY] == str(int(ErrorCode.INVALID_ARGUMENT))
            # a stale end of a write over the wire: NOT_FOUND, nothing finalised
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.PutEnd(pb.PutEndRequest(namespace_id=NS, key=key(1), generation=5,
                                                   commit=True))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            resp = await stub.ListNodes(pb.ListNodesRequest())
            assert list(resp.nodes) == []

    _run(tmp_path, scenario)


def _indexed_generations(master: Master, i: int) -> dict[Tier, int]:
    return {r.tier: r.generation
            for r in master.servicer.index.replicas(NS, key(i), readable_only=True)}


def _store_generations(store: TieredStore, i: int) -> dict[Tier, int]:
    blocks, _ = store.list_blocks(namespace_id=NS, limit=1 << 20)
    b = next(b for b in blocks if b.key == key(i))
    return dict(zip(b.tiers, b.generations, strict=True))


def test_the_master_indexes_the_generations_the_node_stamped_and_a_restart_renews_them(
    tmp_path: Path,
) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, addr: str) -> None:
        store.put(key(0), b"a" * 100, namespace_id=NS)
        store.spill_to_ssd()  # block 0 in DRAM and on SSD: one generation, two replicas
        await link.run_once()  # inventory
        g0 = _store_generations(store, 0)
        assert set(g0) == {Tier.DRAM, Tier.SSD} and len(set(g0.values())) == 1
        assert _indexed_generations(master, 0) == g0
        store.put(key(1), b"b" * 100, namespace_id=NS)
        await link.run_once()  # an event
        g1 = _store_generations(store, 1)
        assert _indexed_generations(master, 1) == g1
        store.remove([key(1)], namespace_id=NS)
        store.put(key(1), b"c" * 100, namespace_id=NS)  # a re-put within one round
        await link.run_once()
        assert _indexed_generations(master, 1) == _store_generations(store, 1) != g1
        # a restart: the SSD replica is recovered by a new store, under a new generation
        await link.stop(unregister=False)
        store.close()
        again = TieredStore(dram_size_bytes=1 << 20, arena_dir=None, node_id="n1",
                            ssd_dir=tmp_path / "ssd", ssd_size_bytes=8 << 20)
        link2 = MasterLink(ClusterConfig(master_address=addr), node_id="n1", epoch=78,
                           grpc_address="127.0.0.1:9000", data_address="127.0.0.1:9001",
                           store=again, load=lambda: 0.0)
        try:
            await link2.run_once()
            renewed = _store_generations(again, 0)
            assert set(renewed) == {Tier.SSD} and renewed[Tier.SSD] > max(g0.values())
            assert _indexed_generations(master, 0) == renewed
        finally:
            await link2.stop(unregister=False)
            again.close()
        # a generation no data plane can carry is refused, naming the field
        async with grpc.aio.insecure_channel(addr) as ch:
            stub = pb_grpc.MasterServiceStub(ch)
            bad = pb.BlockRef(namespace_id=NS, key=key(5), tier=1, size_bytes=1,
                              generation=1 << 63)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ReportEvents(pb.ReportEventsRequest(
                    node_id="n1", epoch=78, events=[pb.BlockEvent(seq=1, kind=1, block=bad)]))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "generation must be < 2**63" in (err.value.details() or "")

    _run(tmp_path, scenario)


def test_a_duplicate_node_id_is_refused_while_the_live_daemon_answers(tmp_path: Path) -> None:
    import socket

    from kvstored.errors import AlreadyExists

    async def scenario(master: Master, link: MasterLink, store: TieredStore, addr: str) -> None:
        with socket.socket() as live_data:  # the live daemon's data port, listening
            live_data.bind(("127.0.0.1", 0))
            live_data.listen()
            data = f"127.0.0.1:{live_data.getsockname()[1]}"
            async with grpc.aio.insecure_channel(addr) as ch:
                await pb_grpc.MasterServiceStub(ch).RegisterNode(pb.RegisterNodeRequest(
                    node=pb.NodeInfo(node_id="n1", epoch=5, grpc_address="127.0.0.1:9100",
                                     data_address=data)))
            await link.start()  # epoch 77 from other addresses: a second daemon
            with pytest.raises(AlreadyExists, match=r"'n1'.*epoch 5.*127\.0\.0\.1:9100") as err:
                await link.wait_first_registration(5.0)
            assert "127.0.0.1:9001" in str(err.value) and "s left" in str(err.value)
            await link.stop(unregister=False)
            rec = master.members.node("n1")
            assert rec is not None and rec.spec.epoch == 5 and not link.registered
        # the live daemon's port closed (it is gone): the same start is a restart now
        await link.run_once()
        rec = master.members.node("n1")
        assert link.registered and rec is not None and rec.spec.epoch == 77

    _run(tmp_path, scenario)


def test_an_unreachable_master_is_no_error_at_start(tmp_path: Path) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, _: str) -> None:
        with socket_closed_port() as port:
            link.cfg = ClusterConfig(master_address=f"127.0.0.1:{port}")
            link.address = link.cfg.master_address  # the address the link talks to
            await link.start()
            await link.wait_first_registration(5.0)  # UNAVAILABLE: answered, not refused
            assert link.refused is None and not link.registered

    _run(tmp_path, scenario)


def socket_closed_port() -> Any:
    """A context giving a loopback port nothing listens on."""
    import contextlib
    import socket

    @contextlib.contextmanager
    def ctx() -> Any:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield port

    return ctx()


def _events_in(request: Any) -> int:
    """Events a request carries (a WireRequest from the server: counted in its bytes)."""
    if isinstance(request, WireRequest):
        return len(type(request.msg).FromString(request.data).events)
    return len(request.events)


class CountingServicer(MasterServicer):
    """The master, counting the node RPCs it is sent (and the events they carry)."""

    def __init__(self, state: MasterState) -> None:
        super().__init__(state)
        self.calls: list[tuple[str, int]] = []  # (method, events carried)

    async def ReportEvents(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append(("ReportEvents", _events_in(request)))
        return await super().ReportEvents(request, context)

    async def Heartbeat(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append(("Heartbeat", _events_in(request)))
        return await super().Heartbeat(request, context)


class PreviousVersionServicer(CountingServicer):
    """A master of the previous version: it does not offer events in heartbeats and, like
    any reader of a message with a field it does not know, ignores HeartbeatRequest.events."""

    async def RegisterNode(self, request: Any, context: Any) -> Any:  # noqa: N802
        resp = await super().RegisterNode(request, context)
        resp.heartbeat_carries_events = False
        return resp

    async def Heartbeat(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls.append(("Heartbeat", _events_in(request)))
        msg = pb.HeartbeatRequest.FromString(request.data)
        msg.ClearField("events")
        return await MasterServicer.Heartbeat(self, msg, context)


def _calls(master: Master) -> list[tuple[str, int]]:
    got = master.servicer.calls  # type: ignore[attr-defined]
    out = list(got)
    got.clear()
    return out


def test_a_round_is_one_heartbeat_carrying_the_events(tmp_path: Path) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, _: str) -> None:
        await link.run_once()  # register, inventory, then the heartbeat (no events yet)
        assert link.heartbeat_carries_events
        assert _calls(master) == [("Heartbeat", 0)]
        for i in range(3):
            store.put(key(i), bytes([i]) * 1000, namespace_id=NS)
        master.clock.advance(LEASE_S / 2)
        await link.run_once()
        assert _calls(master) == [("Heartbeat", 3)]  # one RPC: the events in the heartbeat
        rec = master.members.node("n1")
        assert rec is not None and rec.applied_seq == link.seq == 3 and not link._unacked
        assert rec.last_heartbeat_s == master.clock() and rec.load == 2.0  # the lease renewed
        assert master.where([0, 1, 2]) == [("n1", Tier.DRAM)] * 3
        store.remove([key(1)], namespace_id=NS)
        await link.run_once()
        assert _calls(master) == [("Heartbeat", 1)]
        assert master.where([0, 1, 2]) == [("n1", Tier.DRAM)]
        assert link.num_report_events_calls == 0
        # a gap (events the master never got): the heartbeat's answer says RESYNC, as
        # ReportEvents' would, and the next round rebuilds the node's replicas
        lost = BlockEvent(link.seq + 5, EventKind.ADDED, BlockRef(NS, key(9), Tier.DRAM, 1))
        master.members.report_events("n1", 77, [lost])
        store.put(key(3), b"y" * 100, namespace_id=NS)
        await link.run_once()
        assert not link.synced and master.where([0]) == []
        await link.run_once()
        assert link.synced and master.where([0, 2, 3]) == [("n1", Tier.DRAM)] * 3
        # the master restarted: the heartbeat with events is answered REREGISTER
        store.put(key(4), b"z" * 100, namespace_id=NS)
        master.restart()
        master.servicer.calls = []  # type: ignore[attr-defined]
        await link.run_once()
        assert not link.registered
        await link.run_once()
        assert master.where([0, 2, 3, 4]) == [("n1", Tier.DRAM)] * 4

    _run(tmp_path, scenario, CountingServicer)


def test_a_backlog_goes_as_report_events_then_the_last_batch_in_the_heartbeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kvstored.node.cluster as cluster

    async def scenario(master: Master, link: MasterLink, store: TieredStore, _: str) -> None:
        await link.run_once()
        _calls(master)
        monkeypatch.setattr(cluster, "_MAX_EVENTS_PER_CALL", 2)
        for i in range(5):
            store.put(key(i), b"b" * 100, namespace_id=NS)
        await link.run_once()
        assert _calls(master) == [("ReportEvents", 2), ("ReportEvents", 2), ("Heartbeat", 1)]
        rec = master.members.node("n1")
        assert rec is not None and rec.applied_seq == 5 and not link._unacked
        assert master.where(list(range(5))) == [("n1", Tier.DRAM)] * 5

    _run(tmp_path, scenario, CountingServicer)


def test_a_master_of_the_previous_version_gets_report_events_then_heartbeat(
    tmp_path: Path,
) -> None:
    async def scenario(master: Master, link: MasterLink, store: TieredStore, _: str) -> None:
        await link.run_once()
        assert not link.heartbeat_carries_events
        _calls(master)
        for i in range(3):
            store.put(key(i), b"o" * 100, namespace_id=NS)
        await link.run_once()
        assert _calls(master) == [("ReportEvents", 3), ("Heartbeat", 0)]
        assert master.where([0, 1, 2]) == [("n1", Tier.DRAM)] * 3
        # safe even if a node wrongly sent events to such a master: it ignores them, sees
        # last_seq ahead of what it applied (a gap) and asks for a resync
        link.heartbeat_carries_events = True
        store.put(key(3), b"o" * 100, namespace_id=NS)
        await link.run_once()
        assert _calls(master) == [("Heartbeat", 1)]
        assert not link.synced and master.where([0]) == []
        await link.run_once()  # the resync: the full inventory
        assert master.where([0, 1, 2, 3]) == [("n1", Tier.DRAM)] * 4

    _run(tmp_path, scenario, PreviousVersionServicer)
