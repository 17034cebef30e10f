"""SchedulerService end to end: an in-process grpc.aio server hosting the servicer, two fake
engines registering instances, reporting load and cached blocks, and a router scheduling
requests through to completion; plus ``kvstorectl scheduler`` against it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from kvstored.cli.scheduler import scheduler as scheduler_cmd
from kvstored.errors import ErrorCode
from kvstored.rpc_status import ERROR_CODE_METADATA_KEY
from kvstored.scheduler.config import AdmissionMode, Policy, SchedulerConfig
from kvstored.scheduler.service import SchedulerServicer, add_scheduler_service
from kvstored.types import Tier
from kvstored.v1 import common_pb2, scheduler_pb2_grpc
from kvstored.v1 import scheduler_pb2 as pb

KEYS = [bytes([i]) * 16 for i in range(32)]


class ServerThread:
    """A grpc.aio server with the scheduler service, on its own event loop thread."""

    def __init__(self, locator: Callable[..., Any] | None) -> None:
        self.now = [100.0]
        self.registry = CollectorRegistry()
        self.locator = locator
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.servicer: SchedulerServicer | None = None

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        server = grpc.aio.server()
        cfg = SchedulerConfig(policy=Policy.KVCACHE_CENTRIC,
                              admission=AdmissionMode.PREDICTED_LENGTH, block_tokens=16)
        self.servicer = add_scheduler_service(server, cfg, block_locator=self.locator,
                                              registry=self.registry,
                                              clock=lambda: self.now[0])
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._ready.set()
        await self.stop_event.wait()
        await server.stop(0)

    def start(self) -> ServerThread:
        self._thread.start()
        assert self._ready.wait(10), "server did not start"
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self._thread.join(10)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    s = ServerThread(None).start()
    yield s
    s.stop()


def stub_for(s: ServerThread) -> scheduler_pb2_grpc.SchedulerServiceStub:
    return scheduler_pb2_grpc.SchedulerServiceStub(
        grpc.insecure_channel(f"127.0.0.1:{s.port}"))


def inst(iid: str, node: str, role: int) -> pb.RegisterInstanceRequest:
    return pb.RegisterInstanceRequest(instance=pb.InstanceInfo(instance_id=iid, node_id=node,
                                                               role=role))


def register_engines(stub: scheduler_pb2_grpc.SchedulerServiceStub) -> None:
    # engine A: one prefill instance on node-a; engine B: prefill + decode on node-b
    stub.RegisterInstance(inst("pa", "node-a", pb.INSTANCE_ROLE_PREFILL))
    stub.RegisterInstance(inst("pb", "node-b", pb.INSTANCE_ROLE_PREFILL))
    stub.RegisterInstance(inst("db", "node-b", pb.INSTANCE_ROLE_DECODE))


def error_code(exc: grpc.RpcError) -> int:
    md = dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
    return int(md[ERROR_CODE_METADATA_KEY])


def test_request_life_cycle(server: ServerThread) -> None:
    stub = stub_for(server)
    register_engines(stub)
    # engine A reports 8 cached blocks of the prompt and an idle queue; engine B an idle decode
    stub.ReportLoad(pb.ReportLoadRequest(instance_id="pa", queued_prefill_ms=0,
                                         added_block_keys=KEYS[:8]))
    stub.ReportLoad(pb.ReportLoadRequest(instance_id="pb", queued_prefill_ms=0))
    stub.ReportLoad(pb.ReportLoadRequest(instance_id="db", num_running_requests=0,
                                         num_context_tokens=0, step_time_us=20_000))
    resp = stub.Schedule(pb.ScheduleRequest(request_id="r1", block_keys=KEYS[:10],
                                            input_tokens=160, expected_output_tokens=20))
    assert resp.admitted and resp.reason == pb.REJECT_REASON_UNSPECIFIED
    assert (resp.prefill_instance_id, resp.decode_instance_id) == ("pa", "db")
    assert (resp.local_blocks, resp.reused_blocks, resp.num_blocks) == (8, 8, 10)
    assert resp.predicted_ttft_ms >= resp.predicted_prefill_ms > 0
    assert 0 < resp.predicted_decode_load < 1

    server.now[0] += 0.5
    done = stub.ReportPrefillFinished(pb.ReportPrefillFinishedRequest(request_id="r1",
                                                                      observed_ttft_ms=500))
    assert done.admitted and done.decode_instance_id == "db"
    desc = stub.DescribeScheduler(pb.DescribeSchedulerRequest())
    decode = next(i for i in desc.instances if i.instance.instance_id == "db")
    assert decode.num_running_requests == 1 and decode.load > 0
    server.now[0] += 2.0
    assert stub.ReportRequestFinished(pb.ReportRequestFinishedRequest(
        request_id="r1", num_output_tokens=20)).known
    assert not stub.ReportRequestFinished(pb.ReportRequestFinishedRequest(request_id="r1")).known

    desc = stub.DescribeScheduler(pb.DescribeSchedulerRequest())
    assert (desc.policy, desc.admission) == ("kvcache-centric", "predicted-length")
    assert (desc.num_admitted, desc.num_completed) == (1, 1)
    assert {i.instance.instance_id for i in desc.instances} == {"pa", "pb", "db"}
    reg = server.registry
    assert reg.get_sample_value("kvstored_scheduler_admissions_total") == 1
    assert reg.get_sample_value("kvstored_scheduler_observed_ttft_seconds_count") == 1
    # an empty decode instance still takes its base step (20 ms of the 100 ms SLO)
    assert reg.get_sample_value("kvstored_scheduler_instance_load_ratio",
                                {"instance": "db", "role": "decode"}) == pytest.approx(0.2)


def test_rejection_carries_reason_and_predictions(server: ServerThread) -> None:
    stub = stub_for(server)
    register_engines(stub)
    for iid in ("pa", "pb"):  # both prefill queues hold a minute of work: TTFT SLO is 30 s
        stub.ReportLoad(pb.ReportLoadRequest(instance_id=iid, queued_prefill_ms=60_000))
    resp = stub.Schedule(pb.ScheduleRequest(request_id="r1", block_keys=KEYS[:4],
                                            input_tokens=64))
    assert not resp.admitted and resp.reason == pb.REJECT_REASON_TTFT_SLO
    assert resp.predicted_ttft_ms > 30_000 and "TTFT" in resp.message
    assert server.registry.get_sample_value("kvstored_scheduler_rejections_total",
                                            {"reason": "ttft_slo"}) == 1
    # a tighter per-request SLO, and a decode instance that reports itself full
    stub.ReportLoad(pb.ReportLoadRequest(instance_id="pa", queued_prefill_ms=0))
    stub.ReportLoad(pb.ReportLoadRequest(instance_id="db", num_running_requests=400,
                                         num_context_tokens=5_000_000, step_time_us=190_000))
    resp = stub.Schedule(pb.ScheduleRequest(request_id="r2", input_tokens=64))
    assert not resp.admitted and resp.reason == pb.REJECT_REASON_TBT_SLO
    assert resp.predicted_decode_load > 1


def test_errors_map_to_status_and_code(server: ServerThread) -> None:
    stub = stub_for(server)
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportLoad(pb.ReportLoadRequest(instance_id="ghost", queued_prefill_ms=1))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert error_code(e.value) == ErrorCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        stub.RegisterInstance(inst("x", "n", pb.INSTANCE_ROLE_UNSPECIFIED))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "role" in e.value.details()  # type: ignore[attr-defined]
    register_engines(stub)
    with pytest.raises(grpc.RpcError) as e:
        stub.Schedule(pb.ScheduleRequest(request_id="r", input_tokens=0))
    assert error_code(e.value) == ErrorCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportPrefillFinished(pb.ReportPrefillFinishedRequest(request_id="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    stub.UnregisterInstance(pb.UnregisterInstanceRequest(instance_id="pb"))
    with pytest.raises(grpc.RpcError) as e:
        stub.UnregisterInstance(pb.UnregisterInstanceRequest(instance_id="pb"))
    assert error_code(e.value) == ErrorCode.NOT_FOUND


def test_block_locator_counts_the_hosting_store() -> None:
    calls: list[int] = []

    def locator(keys: list[bytes]) -> list[Tier]:  # the embedded store: 6 leading blocks
        calls.append(len(keys))
        return [Tier.DRAM] * 4 + [Tier.SSD] * 2

    s = ServerThread(locator).start()
    try:
        stub = stub_for(s)
        register_engines(stub)
        resp = stub.Schedule(pb.ScheduleRequest(request_id="r1", block_keys=KEYS[:10],
                                                input_tokens=160))
        assert resp.admitted and resp.local_blocks == 6 and calls == [10]
        # instance-reported blocks still count where they are longer
        stub.ReportLoad(pb.ReportLoadRequest(instance_id="pb", added_block_keys=KEYS[:9],
                                             added_tier=common_pb2.DRAM))
        resp = stub.Schedule(pb.ScheduleRequest(request_id="r2", block_keys=KEYS[:10],
                                                input_tokens=160))
        assert resp.prefill_instance_id == "pb" and resp.local_blocks == 9
    finally:
        s.stop()


def test_kvstorectl_scheduler_shows_instances(server: ServerThread) -> None:
    stub = stub_for(server)
    register_engines(stub)
    stub.ReportLoad(pb.ReportLoadRequest(instance_id="pa", queued_prefill_ms=1500))
    obj = SimpleNamespace(address=f"127.0.0.1:{server.port}", timeout_s=5.0, output="json")
    res = CliRunner().invoke(scheduler_cmd, [], obj=obj)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    pa = next(i for i in doc["instances"] if i["instance_id"] == "pa")
    assert pa["role"] == "prefill" and pa["queued_prefill_s"] == pytest.approx(1.5)
    assert doc["policy"] == "kvcache-centric"
    obj.output = "table"
    res = CliRunner().invoke(scheduler_cmd, [], obj=obj)
    assert res.exit_code == 0 and "pa" in res.output and "node-b" in res.output
    from kvstored.cli.kvstorectl import main as kvstorectl

    res = CliRunner().invoke(kvstorectl, ["--address", f"127.0.0.1:{server.port}", "--output",
                                          "json", "scheduler"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.output)["instances"]) == 3


def test_kvstorectl_scheduler_unreachable() -> None:
    obj = SimpleNamespace(address="127.0.0.1:1", timeout_s=0.5, output="json")
    res = CliRunner().invoke(scheduler_cmd, [], obj=obj)
    assert res.exit_code == 3


def test_daemon_hosts_the_scheduler_with_its_store(start_node: Any) -> None:
    """`kvstored serve`'s daemon hosts the real service; its store's blocks count as local."""
    from it_helpers import random_keys

    from kvstored import Client

    node = start_node(enable_scheduler=True)
    keys = random_keys(5)
    with Client(node.unix_address) as c:
        c.put(keys[:3], [b"a", b"b", b"c"])
    stub = scheduler_pb2_grpc.SchedulerServiceStub(grpc.insecure_channel(node.tcp_address))
    stub.RegisterInstance(inst("p", node.cfg.node_id, pb.INSTANCE_ROLE_PREFILL))
    stub.RegisterInstance(inst("d", node.cfg.node_id, pb.INSTANCE_ROLE_DECODE))
    resp = stub.Schedule(pb.ScheduleRequest(request_id="r", block_keys=keys, input_tokens=2000))
    assert resp.admitted and resp.local_blocks == 3 and resp.num_blocks == 5
