"""An engine's registration with the scheduler (kvstored/scheduler/ctl.py) and the vLLM
connector's ``scheduler_*`` keys (kvstored/integrations/blockio.py), against an in-process
SchedulerService."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import grpc
import pytest

from kvstored.errors import InvalidArgument, NotFound
from kvstored.integrations.blockio import ConnectorConfig
from kvstored.scheduler.ctl import (
    describe_scheduler,
    engine_instance_ids,
    register_engine,
    unregister_engine,
)
from kvstored.scheduler.service import add_scheduler_service


@pytest.fixture
def address() -> Iterator[str]:
    ready, box = threading.Event(), {}

    async def main() -> None:
        server = grpc.aio.server()
        add_scheduler_service(server)
        box["port"] = server.add_insecure_port("127.0.0.1:0")
        box["stop"] = stop = asyncio.Event()
        box["loop"] = asyncio.get_running_loop()
        await server.start()
        ready.set()
        await stop.wait()
        await server.stop(0)

    t = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    t.start()
    assert ready.wait(10)
    yield f"127.0.0.1:{box['port']}"
    box["loop"].call_soon_threadsafe(box["stop"].set)  # type: ignore[attr-defined]
    t.join(10)


def test_an_engine_registers_a_prefill_and_a_decode_instance_on_its_node(address: str) -> None:
    ids = register_engine(address, "e1", "node-a", ["prefill", "decode"], timeout_s=5)
    assert ids == {"prefill": "e1", "decode": "e1/decode"}
    got = {i["instance_id"]: (i["node_id"], i["role"])
           for i in describe_scheduler(address, 5)["instances"]}
    assert got == {"e1": ("node-a", "prefill"), "e1/decode": ("node-a", "decode")}
    assert register_engine(address, "e1", "node-a", ["prefill"], timeout_s=5) == {
        "prefill": "e1"}  # idempotent
    unregister_engine(address, ["e1", "e1/decode", "never-registered"], timeout_s=5)
    assert describe_scheduler(address, 5)["instances"] == []


def test_bad_roles_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match=r"some of \['prefill', 'decode'\], got \['both'\]"):
        engine_instance_ids("e1", ["both"])
    with pytest.raises(InvalidArgument, match="scheduler_roles"):
        ConnectorConfig.from_extra({"scheduler_roles": ["both"]})
    cfg = ConnectorConfig.from_extra({"scheduler_address": "127.0.0.1:7070"})
    assert cfg.scheduler_roles == ["prefill", "decode"] and cfg.scheduler_instance_id is None
    assert ConnectorConfig.from_extra({}).scheduler_address is None  # off by default


def test_reporting_for_an_unregistered_instance_is_not_found(address: str) -> None:
    from kvstored.rpc_status import error_from_rpc
    from kvstored.v1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.ReportLoad(scheduler_pb2.ReportLoadRequest(instance_id="ghost"))
    assert isinstance(error_from_rpc(e.value), NotFound)
