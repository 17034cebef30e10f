"""The scheduler on the master (kvstored/master/scheduling.py): block locations from the
master's index, planned copies carried out through a copier, NotLeader on a follower.

The servicer runs in an in-process grpc.aio server; the copier is a fake whose copy is held
at a known step by the servicer's ``copy_hook`` (an asyncio.Event), so PENDING -> DONE is
observed deterministically, never by sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import grpc
import pytest
from helpers import key
from master_helpers import NS, Cluster, blocks

from kvstored.errors import ErrorCode
from kvstored.master.scheduling import IndexBlockLocator, NodePrefetcher
from kvstored.rpc_status import ERROR_CODE_METADATA_KEY
from kvstored.scheduler.config import AdmissionMode, Policy, SchedulerConfig
from kvstored.scheduler.service import CopyOutcome, SchedulerServicer, add_scheduler_service
from kvstored.transport.master_targets import LEADER_METADATA_KEY
from kvstored.types import Tier
from kvstored.v1 import scheduler_pb2 as pb
from kvstored.v1 import scheduler_pb2_grpc

KEYS = [key(i) for i in range(8)]


def _cluster() -> Cluster:
    """Node a holds blocks 0..5 (DRAM), node b blocks 0..1 (SSD)."""
    c = Cluster()
    c.join("a", inventory=blocks(range(6)))
    c.join("b", inventory=blocks(range(2), Tier.SSD), port=7100)
    return c


def test_the_locator_names_every_holder_of_each_leading_block() -> None:
    c = _cluster()
    got = IndexBlockLocator(lambda: c.state)(KEYS, NS)
    assert len(got) == 6  # blocks 6 and 7 are nowhere
    assert sorted(got[0]) == [("a", Tier.DRAM), ("b", Tier.SSD)]
    assert got[2:] == [[("a", Tier.DRAM)]] * 4
    assert IndexBlockLocator(lambda: c.state)(KEYS, b"\x22" * 16) == []  # another namespace
    assert IndexBlockLocator(lambda: c.state).block_bytes(KEYS[:3], NS) == 3 * 4096


class FakeCopier:
    """Records each prefetch; answers every key fetched unless ``missing`` says otherwise."""

    def __init__(self, missing: int = 0) -> None:
        self.calls: list[tuple[str, bytes, list[bytes]]] = []
        self.missing = missing

    async def prefetch(self, node_id: str, namespace_id: bytes, keys: Sequence[bytes],
                       timeout_s: float) -> CopyOutcome:
        self.calls.append((node_id, namespace_id, list(keys)))
        n = len(keys) - self.missing
        return CopyOutcome(n, self.missing, 0.002, n * 4096,
                           f"{self.missing} missing" if self.missing else "")


class FakeGate:
    def __init__(self, leading: bool) -> None:
        self.leading = leading
        self.leader_address = "10.0.0.9:7070"
        self.leader_term = 7

    def is_leading(self) -> bool:
        return self.leading


Scenario = Callable[[scheduler_pb2_grpc.SchedulerServiceStub, SchedulerServicer],
                    Awaitable[None]]


def _run(c: Cluster, copier: FakeCopier, scenario: Scenario, gate: FakeGate | None = None,
         ) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        cfg = SchedulerConfig(policy=Policy.KVCACHE_CENTRIC,
                              admission=AdmissionMode.PREDICTED_LENGTH, block_tokens=16)
        servicer = add_scheduler_service(server, cfg, block_locator=IndexBlockLocator(
            lambda: c.state), copier=copier, gate=gate, clock=lambda: 100.0)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                await scenario(scheduler_pb2_grpc.SchedulerServiceStub(ch), servicer)
        finally:
            await servicer.close()
            await server.stop(None)

    asyncio.run(main())


async def _register(stub: scheduler_pb2_grpc.SchedulerServiceStub) -> None:
    """Prefill on node a (busy: a 20 s queue) and on node b; decode on node b."""
    for iid, node, role in (("pa", "a", pb.INSTANCE_ROLE_PREFILL),
                            ("pb", "b", pb.INSTANCE_ROLE_PREFILL),
                            ("db", "b", pb.INSTANCE_ROLE_DECODE)):
        await stub.RegisterInstance(pb.RegisterInstanceRequest(
            instance=pb.InstanceInfo(instance_id=iid, node_id=node, role=role)))
    await stub.ReportLoad(pb.ReportLoadRequest(instance_id="pa", queued_prefill_ms=20_000))
    await stub.ReportLoad(pb.ReportLoadRequest(instance_id="pb", queued_prefill_ms=0))


def _schedule(rid: str, wait_ms: int = 0) -> pb.ScheduleRequest:
    return pb.ScheduleRequest(request_id=rid, block_keys=KEYS, input_tokens=8 * 16,
                              namespace_id=NS, copy_wait_ms=wait_ms)


def test_a_busy_holder_sends_the_prefill_elsewhere_and_the_copy_runs_there() -> None:
    c, copier = _cluster(), FakeCopier()

    async def scenario(stub: scheduler_pb2_grpc.SchedulerServiceStub,
                       servicer: SchedulerServicer) -> None:
        release = asyncio.Event()
        reached: list[str] = []

        async def hold(rid: str) -> None:  # the copy task stops here until released
            reached.append(rid)
            await release.wait()

        servicer.copy_hook = hold
        await _register(stub)
        resp = await stub.Schedule(_schedule("r1"))
        assert resp.admitted and resp.prefill_instance_id == "pb"
        assert resp.prefix_node_id == "a"  # the real holder, from the index
        assert resp.local_blocks == 2 and resp.fetched_blocks == 4
        assert list(resp.replicate_block_keys) == KEYS[2:6]
        assert resp.copy_state == pb.COPY_STATE_PENDING
        got = await stub.AwaitCopy(pb.AwaitCopyRequest(request_id="r1"))  # no wait
        assert got.copy_state == pb.COPY_STATE_PENDING and got.node_id == "b"
        waiter = asyncio.ensure_future(stub.AwaitCopy(pb.AwaitCopyRequest(
            request_id="r1", timeout_ms=30_000)))
        while not reached:
            await asyncio.sleep(0)
        assert copier.calls == []  # held before the copy
        release.set()
        got = await waiter
        assert got.copy_state == pb.COPY_STATE_DONE, got
        assert (got.copied_blocks, got.missing_blocks, got.copied_bytes) == (4, 0, 4 * 4096)
        assert copier.calls == [("b", NS, KEYS[2:6])]
        assert (await stub.AwaitCopy(pb.AwaitCopyRequest(request_id="nope"))).copy_state == (
            pb.COPY_STATE_UNSPECIFIED)
        # Schedule itself may wait: the copy is done when the answer comes
        servicer.copy_hook = None
        resp = await stub.Schedule(_schedule("r2", wait_ms=30_000))
        assert resp.copy_state == pb.COPY_STATE_DONE and resp.copied_blocks == 4
        reg = servicer.metrics.registry
        assert reg.get_sample_value("kvstored_scheduler_copies_total", {"outcome": "done"}) == 2
        assert reg.get_sample_value("kvstored_scheduler_copied_blocks_total") == 8

    _run(c, copier, scenario)


def test_a_copy_that_leaves_blocks_missing_is_failed_with_the_reason() -> None:
    c, copier = _cluster(), FakeCopier(missing=1)

    async def scenario(stub: scheduler_pb2_grpc.SchedulerServiceStub,
                       servicer: SchedulerServicer) -> None:
        await _register(stub)
        resp = await stub.Schedule(_schedule("r1", wait_ms=30_000))
        assert resp.copy_state == pb.COPY_STATE_FAILED
        assert (resp.copied_blocks, resp.missing_blocks) == (3, 1)
        assert resp.copy_message == "1 missing"

    _run(c, copier, scenario)


def test_no_copy_when_the_prefill_runs_on_the_holder() -> None:
    c, copier = _cluster(), FakeCopier()

    async def scenario(stub: scheduler_pb2_grpc.SchedulerServiceStub,
                       servicer: SchedulerServicer) -> None:
        await _register(stub)
        await stub.ReportLoad(pb.ReportLoadRequest(instance_id="pa", queued_prefill_ms=0))
        resp = await stub.Schedule(_schedule("r1", wait_ms=1000))
        assert resp.prefill_instance_id == "pa" and resp.local_blocks == 6
        assert resp.copy_state == pb.COPY_STATE_UNSPECIFIED and copier.calls == []

    _run(c, copier, scenario)


def test_a_follower_answers_not_leader_naming_the_leader() -> None:
    c, copier = _cluster(), FakeCopier()

    async def scenario(stub: scheduler_pb2_grpc.SchedulerServiceStub,
                       servicer: SchedulerServicer) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _register(stub)
        md = dict(e.value.trailing_metadata() or ())
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert int(md[ERROR_CODE_METADATA_KEY]) == ErrorCode.NOT_LEADER
        assert md[LEADER_METADATA_KEY] == "10.0.0.9:7070"
        assert "10.0.0.9:7070" in (e.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Schedule(_schedule("r1"))

    _run(c, copier, scenario, gate=FakeGate(leading=False))


def test_the_prefetcher_reports_an_unknown_node_as_failed_not_raising() -> None:
    c = _cluster()
    out = asyncio.run(NodePrefetcher(lambda: c.state).prefetch("zz", NS, KEYS[:2], 1.0))
    assert (out.num_fetched, out.num_missing) == (0, 2)
    assert "'zz' is not registered" in out.message


def test_per_layer_keys_are_grouped_into_blocks_and_a_partial_block_is_not_cached() -> None:
    """4 keys per block: node a holds blocks 0-2 whole and half of block 3, node b block 0."""
    c, copier = Cluster(), FakeCopier()
    c.join("a", inventory=blocks(range(14)))
    c.join("b", inventory=blocks(range(4), Tier.SSD), port=7100)
    layer_keys = [key(i) for i in range(16)]

    async def scenario(stub: scheduler_pb2_grpc.SchedulerServiceStub,
                       servicer: SchedulerServicer) -> None:
        await _register(stub)
        resp = await stub.Schedule(pb.ScheduleRequest(
            request_id="r1", block_keys=layer_keys, input_tokens=4 * 16, namespace_id=NS,
            keys_per_block=4, copy_wait_ms=30_000))
        assert resp.prefill_instance_id == "pb" and resp.prefix_node_id == "a", resp
        assert (resp.num_blocks, resp.local_blocks, resp.fetched_blocks) == (4, 1, 2)
        assert list(resp.replicate_block_keys) == layer_keys[4:12]  # every key of blocks 1-2
        assert copier.calls == [("b", NS, layer_keys[4:12])]
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Schedule(pb.ScheduleRequest(request_id="r2", block_keys=layer_keys[:6],
                                                   input_tokens=64, keys_per_block=4))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "6 block keys are not a whole number of blocks" in (e.value.details() or "")

    _run(c, copier, scenario)


def test_a_request_finished_while_its_copy_is_held_cancels_the_copy() -> None:
    c, copier = _cluster(), FakeCopier()

    async def scenario(stub: scheduler_pb2_grpc.SchedulerServiceStub,
                       servicer: SchedulerServicer) -> None:
        never = asyncio.Event()
        held: list[str] = []

        async def hold(rid: str) -> None:
            held.append(rid)
            await never.wait()  # held until cancelled

        servicer.copy_hook = hold
        await _register(stub)
        assert (await stub.Schedule(_schedule("r1"))).copy_state == pb.COPY_STATE_PENDING
        while not held:
            await asyncio.sleep(0)
        job = servicer._copies["r1"]
        await stub.ReportRequestFinished(pb.ReportRequestFinishedRequest(request_id="r1"))
        with pytest.raises(asyncio.CancelledError):
            await job.task
        assert copier.calls == []  # cancelled before it copied anything
        got = await stub.AwaitCopy(pb.AwaitCopyRequest(request_id="r1"))
        assert got.copy_state == pb.COPY_STATE_UNSPECIFIED  # forgotten with the request
        # the id is free again: a new request under it plans (and runs) a new copy
        servicer.copy_hook = None
        resp = await stub.Schedule(_schedule("r1", wait_ms=30_000))
        assert resp.copy_state == pb.COPY_STATE_DONE and len(copier.calls) == 1

    _run(c, copier, scenario)
