"""SchedulerService role checks (issue 20): instances (node or engine certificates) register
and report; every authenticated caller reads; TRUSTED_LOCAL (no TLS) may do everything.
An injected principal (``ctx.principal``) stands in for the TLS certificate."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from kvstored.auth import TRUSTED_LOCAL, Principal
from kvstored.scheduler.service import METHOD_ROLES, SchedulerServicer
from kvstored.v1 import scheduler_pb2 as pb

ENGINE = Principal(roles=frozenset({"engine"}), tenant="a", name="engine-e1", authenticated=True)
NODE = Principal(roles=frozenset({"node"}), name="node-n1", authenticated=True)
ADMIN = Principal(roles=frozenset({"admin"}), name="ops", authenticated=True)
NO_ROLE = Principal(roles=frozenset(), name="master", authenticated=True)


class Refused(Exception):
    pass


class Ctx:
    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Refused(code, details)

    def set_trailing_metadata(self, md: Any) -> None:
        pass


def _register(instance_id: str = "p1") -> pb.RegisterInstanceRequest:
    return pb.RegisterInstanceRequest(instance=pb.InstanceInfo(
        instance_id=instance_id, node_id="n1", role=pb.INSTANCE_ROLE_PREFILL))


def test_every_scheduler_method_has_a_role_decision() -> None:
    from kvstored.v1 import scheduler_pb2

    methods = set(scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].methods_by_name)
    assert set(METHOD_ROLES) == methods
    assert {getattr(SchedulerServicer, m).roles for m in methods} == {("node", "engine"), ()}
    assert METHOD_ROLES["DescribeScheduler"] == ()


def test_instances_register_and_report_and_others_are_refused() -> None:
    svc = SchedulerServicer()

    async def run() -> None:
        await svc.RegisterInstance(_register("p1"), Ctx(ENGINE))
        await svc.RegisterInstance(_register("p2"), Ctx(NODE))
        await svc.ReportLoad(pb.ReportLoadRequest(instance_id="p1", queued_prefill_ms=5), Ctx(ENGINE))
        for who in (ADMIN, NO_ROLE):
            with pytest.raises(Refused) as info:
                await svc.RegisterInstance(_register("evil"), Ctx(who))
            code, details = info.value.args
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert details.startswith("SchedulerService.RegisterInstance needs role node or engine; "
                                      f"caller {who.name!r}")
        with pytest.raises(Refused, match="SchedulerService.ReportLoad needs role node or engine"):
            await svc.ReportLoad(pb.ReportLoadRequest(instance_id="p1"), Ctx(ADMIN))
        with pytest.raises(Refused, match="SchedulerService.UnregisterInstance needs role"):
            await svc.UnregisterInstance(pb.UnregisterInstanceRequest(instance_id="p1"), Ctx(NO_ROLE))
        with pytest.raises(Refused, match="SchedulerService.Schedule needs role"):
            await svc.Schedule(pb.ScheduleRequest(request_id="r1", input_tokens=16), Ctx(ADMIN))
        # reads: anyone authenticated, with a role or none
        for who in (ENGINE, NODE, ADMIN, NO_ROLE, TRUSTED_LOCAL):
            out = await svc.DescribeScheduler(pb.DescribeSchedulerRequest(), Ctx(who))
            assert sorted(i.instance.instance_id for i in out.instances) == ["p1", "p2"]
        await svc.UnregisterInstance(pb.UnregisterInstanceRequest(instance_id="p2"), Ctx(TRUSTED_LOCAL))
        await svc.Schedule(pb.ScheduleRequest(request_id="r1", input_tokens=16), Ctx(ENGINE))

    asyncio.run(run())
