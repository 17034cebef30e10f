"""Followers answer NotLeader naming the leader; every answer carries its term; nodes and
clients follow the leader and refuse answers from an older term (no etcd: a fake gate)."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from kvstored.clock import FakeClock
from kvstored.config import ClusterConfig
from kvstored.errors import InvalidArgument, NotLeader, StaleTerm
from kvstored.master.service import MasterServicer, add_master_service
from kvstored.master.state import MasterState
from kvstored.node.cluster import MasterLink
from kvstored.rpc_status import error_from_rpc
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.master_rpc import MasterClient
from kvstored.transport.master_targets import (
    LEADER_METADATA_KEY,
    TERM_METADATA_KEY,
    TermFence,
    leader_hint,
    parse_master_targets,
)
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc


class FakeGate:
    """A LeaderGate the test sets; ``script`` (if any) answers is_leading() call by call."""

    def __init__(self, *, leading: bool, leader: str = "", term: int = 0) -> None:
        self.leading = leading
        self.leader_address = leader
        self.leader_term = term
        self.script: list[bool] = []

    def is_leading(self) -> bool:
        return self.script.pop(0) if self.script else self.leading


class Master:
    """An in-process MasterService over loopback gRPC with a term and an optional gate."""

    def __init__(self, term: int, gate: FakeGate | None = None) -> None:
        self.state = MasterState(epoch=1000 + term, clock=FakeClock(), initial_blocks=16,
                                 rng=random.Random(1), term=term)
        self.servicer = MasterServicer(self.state, gate=gate)
        self.server = grpc.aio.server()
        add_master_service(self.server, self.servicer)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"


def _run(terms: list[tuple[int, FakeGate | None]],
         scenario: Callable[[list[Master]], Awaitable[None]]) -> None:
    async def main() -> None:
        masters = [Master(t, g) for t, g in terms]
        for m in masters:
            await m.server.start()
        try:
            await scenario(masters)
        finally:
            for m in masters:
                await m.server.stop(None)

    asyncio.run(main())


def _in_thread(fn: Callable[[], object]) -> Awaitable[object]:
    return asyncio.get_running_loop().run_in_executor(None, fn)


def test_a_follower_answers_not_leader_with_the_leader_in_metadata_and_message() -> None:
    async def scenario(ms: list[Master]) -> None:
        async with grpc.aio.insecure_channel(ms[0].address) as ch:
            with pytest.raises(grpc.RpcError) as got:
                await pb_grpc.MasterServiceStub(ch).ListNodes(pb.ListNodesRequest())
        meta = dict(got.value.trailing_metadata() or ())  # type: ignore[attr-defined]  # an aio RpcError is an AioRpcError
        assert meta[LEADER_METADATA_KEY] == "10.1.2.3:7080" and meta[TERM_METADATA_KEY] == "9"
        err = error_from_rpc(got.value)
        assert isinstance(err, NotLeader) and "the leader is 10.1.2.3:7080" in str(err)

    _run([(3, FakeGate(leading=False, leader="10.1.2.3:7080", term=9))], scenario)


def test_every_answer_carries_the_term_and_a_single_address_client_does_not_move() -> None:
    async def scenario(ms: list[Master]) -> None:
        def calls() -> None:
            with MasterClient(ms[0].address) as c:
                c.list_nodes()
                assert c.fence.term == 42
            with MasterClient(ms[1].address) as c, pytest.raises(NotLeader, match="no leader"):
                c.list_nodes()

        await _in_thread(calls)

    _run([(42, None), (7, FakeGate(leading=False))], scenario)


def test_a_leadership_that_ends_during_a_call_answers_not_leader() -> None:
    gate = FakeGate(leading=True, leader="", term=5)
    gate.script = [True, False]  # leading when the call starts, not when it answers

    async def scenario(ms: list[Master]) -> None:
        def call() -> None:
            with MasterClient(ms[0].address) as c, pytest.raises(NotLeader):
                c.list_nodes()

        await _in_thread(call)

    _run([(5, gate)], scenario)


def test_a_client_follows_the_followers_hint_to_the_leader() -> None:
    async def scenario(ms: list[Master]) -> None:
        follower, leader = ms
        assert follower.servicer.gate is not None
        follower.servicer.gate.leader_address = leader.address  # type: ignore[misc]  # FakeGate's field is settable

        def calls() -> None:
            with MasterClient(f"{follower.address},{leader.address}") as c:
                assert c.list_nodes()["nodes"] == []
                assert c.address == leader.address and c.fence.term == 8

        await _in_thread(calls)

    _run([(1, FakeGate(leading=False, term=8)), (8, None)], scenario)


def test_a_client_refuses_an_answer_from_an_older_term_than_it_has_seen() -> None:
    async def scenario(ms: list[Master]) -> None:
        new, old = ms
        fence = TermFence()

        def calls() -> None:
            with MasterClient(new.address, fence=fence) as c:
                c.list_nodes()
            with MasterClient(old.address, fence=fence) as c, \
                    pytest.raises(StaleTerm, match="term 3, older than term 8"):
                c.lookup_prefix(b"ns", [b"k"])
            assert fence.num_refused == 1 and fence.term == 8
            with MasterClient(f"{old.address},{new.address}", fence=fence) as c:
                c.lookup_prefix(b"ns", [b"k"])  # the stale one refused, the next one answers
                assert c.address == new.address

        await _in_thread(calls)

    _run([(8, None), (3, None)], scenario)


def _link(tmp_path: Path, address: str, fence: TermFence) -> MasterLink:
    store = TieredStore(dram_size_bytes=1 << 20, arena_dir=None, node_id="n1",
                        ssd_dir=tmp_path / "ssd", ssd_size_bytes=8 << 20)
    return MasterLink(ClusterConfig(master_address=address, heartbeat_interval_s=0.02),
                      node_id="n1", epoch=77, grpc_address="127.0.0.1:9000",
                      data_address="127.0.0.1:9001", store=store, load=lambda: 0.0, fence=fence)


def test_a_node_refuses_a_stale_term_answer_and_acts_on_nothing_in_it(tmp_path: Path) -> None:
    async def scenario(ms: list[Master]) -> None:
        new, old = ms
        fence = TermFence()
        link = _link(tmp_path, new.address, fence)
        await link.run_once()
        assert link.registered and link.synced and fence.term == 8
        # the deposed master (term 3) still answers: it does not know n1 (REREGISTER)
        link.address = old.address
        link._stub = None  # noqa: SLF001 (point the link at the old master)
        with pytest.raises(StaleTerm, match="older than term 8"):
            await link.run_once()
        assert link.registered and link.synced  # its REREGISTER was not acted on
        assert fence.num_refused == 1
        await link.stop(unregister=False)

    _run([(8, None), (3, None)], scenario)


def test_a_node_follows_not_leader_to_the_leader_and_registers_there(tmp_path: Path) -> None:
    async def scenario(ms: list[Master]) -> None:
        follower, leader = ms
        assert follower.servicer.gate is not None
        follower.servicer.gate.leader_address = leader.address  # type: ignore[misc]  # settable
        link = _link(tmp_path, f"{follower.address},{leader.address}", TermFence())
        await link.start()
        try:
            async with asyncio.timeout(20):
                while not (link.registered and link.synced):
                    await asyncio.sleep(0.01)
            assert link.address == leader.address and link.fence.term == 8
            assert leader.state.membership.node("n1") is not None
            assert follower.state.membership.node("n1") is None
        finally:
            await link.stop(unregister=False)

    _run([(1, FakeGate(leading=False, term=8)), (8, None)], scenario)


def test_master_addresses_parse_and_bad_ones_are_named() -> None:
    t = parse_master_targets("a:1, b:2")
    assert t.addresses == ("a:1", "b:2") and not t.uses_etcd
    t = parse_master_targets("etcd://127.0.0.1:2379,127.0.0.1:2380/kv/prod")
    assert t.etcd_endpoints == ("127.0.0.1:2379", "127.0.0.1:2380")
    assert t.election_prefix == "/kv/prod" and t.first() == ""
    with pytest.raises(InvalidArgument, match=r"cluster.master_address.*bad entry 'nope'"):
        parse_master_targets("a:1,nope", "cluster.master_address")
    with pytest.raises(InvalidArgument, match=r"etcd://HOST:PORT\[,HOST:PORT\]/PREFIX, got"):
        parse_master_targets("etcd://127.0.0.1:2379")
    with pytest.raises(InvalidArgument, match="not be only '/', got '/'"):
        parse_master_targets("etcd://127.0.0.1:2379/")


def test_leader_hint_is_empty_without_metadata() -> None:
    class Bare(grpc.RpcError):
        pass

    assert leader_hint(Bare()) == ""


@pytest.mark.parametrize(("endpoints", "prefix", "message"), [
    (["https://127.0.0.1:2379"], "/kvstored",
     r"master.etcd: TLS to etcd is not supported yet, got 'https://127.0.0.1:2379'"),
    (["127.0.0.1"], "/kvstored",
     r"master.etcd: etcd endpoint must be http://HOST:PORT or HOST:PORT, got '127.0.0.1'"),
    (["http://127.0.0.1:2379"], "kvstored",
     r"master.election_prefix: election prefix must start with '/'.*got 'kvstored'"),
])
def test_a_master_with_bad_election_settings_refuses_to_start_naming_them(
        tmp_path: Path, endpoints: list[str], prefix: str, message: str) -> None:
    from kvstored.config import MasterConfig
    from kvstored.errors import ConfigInvalid
    from kvstored.master.daemon import MasterDaemon

    cfg = MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path, etcd=endpoints,
                       election_prefix=prefix)
    daemon = MasterDaemon(cfg)

    async def main() -> None:
        try:
            with pytest.raises(ConfigInvalid, match=message):
                await daemon.start()
        finally:
            await daemon.stop()

    asyncio.run(main())


def test_a_node_moves_on_from_a_master_that_never_answers(tmp_path: Path) -> None:
    silent = socket.socket()  # accepts TCP, never speaks HTTP/2: every call passes its deadline
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)

    async def scenario(ms: list[Master]) -> None:
        leader = ms[0]
        link = _link(tmp_path, f"127.0.0.1:{silent.getsockname()[1]},{leader.address}",
                     TermFence())
        link.cfg = link.cfg.model_copy(update={"rpc_timeout_s": 0.3})
        await link.start()
        try:
            async with asyncio.timeout(20):
                while not (link.registered and link.synced):
                    await asyncio.sleep(0.01)
            assert link.address == leader.address
        finally:
            await link.stop(unregister=False)

    try:
        _run([(4, None)], scenario)
    finally:
        silent.close()


def test_the_nodes_term_and_refused_answers_are_exported() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from kvstored.node.metrics import TermCollector

    fence = TermFence()
    registry = CollectorRegistry()
    registry.register(TermCollector(fence))
    fence.observe(9, "test")
    with pytest.raises(StaleTerm):
        fence.observe(4, "test")
    text = generate_latest(registry).decode()
    assert "kvstored_master_term 9.0" in text
    assert "kvstored_master_stale_answers_total 1.0" in text
