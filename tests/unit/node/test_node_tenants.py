"""Which tenant a node request acts for (kvstored/node/tenants.py) and the servicer's scoping
(kvstored/node/service.py), with injected contexts: no gRPC server."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from core_helpers import unit_core

from kvstored.auth import Principal
from kvstored.clock import FakeClock
from kvstored.config import NodeConfig
from kvstored.errors import InvalidArgument, PermissionDenied
from kvstored.node.core import NodeCore
from kvstored.node.metrics import NodeMetrics
from kvstored.node.service import NodeServicer
from kvstored.node.tenants import (
    SessionTenants,
    check_shm_tenant,
    declared_tenant,
    effective_tenant,
)
from kvstored.tenancy import scope_namespace
from kvstored.tiers.tiered import TieredStore
from kvstored.v1 import node_pb2 as pb

pytestmark = pytest.mark.usefixtures("pinned_reads")  # the pinned path's tests (PinBlocks)


class Ctx:
    """The part of a grpc.aio ServicerContext the servicer reads."""

    def __init__(self, tenant: str | None = None, principal: Principal | None = None) -> None:
        self._md = () if tenant is None else (("kvstored-tenant", tenant),)
        self.principal = principal

    def invocation_metadata(self) -> Any:
        return self._md

    def time_remaining(self) -> None:
        return None

    def peer(self) -> str:
        return "test"


ENGINE_A = Principal(roles=frozenset({"engine"}), tenant="a", name="engine-a", authenticated=True)
ADMIN = Principal(roles=frozenset({"admin"}), tenant="ops", name="admin", authenticated=True)


def test_the_declared_tenant_comes_from_metadata_and_a_bad_one_is_refused() -> None:
    assert declared_tenant(Ctx()) is None
    assert declared_tenant(Ctx("a")) == "a"
    with pytest.raises(InvalidArgument, match="kvstored-tenant"):
        declared_tenant(Ctx("no spaces"))


def test_a_certificate_tenant_wins_and_only_an_admin_may_act_for_another() -> None:
    assert effective_tenant(ENGINE_A, None) == "a"
    assert effective_tenant(ENGINE_A, "a") == "a"
    with pytest.raises(PermissionDenied, match="'engine-a' of tenant 'a' may not act for tenant 'b'"):
        effective_tenant(ENGINE_A, "b")
    assert effective_tenant(ADMIN, "b") == "b"


def test_a_session_is_usable_only_by_its_tenant() -> None:
    s = SessionTenants()
    s.bind(7, "a")
    s.check(7, "a")
    with pytest.raises(PermissionDenied, match="session 7 belongs to tenant 'a'"):
        s.check(7, "b")
    s.forget(7)
    assert s.tenant(7) is None


def test_shm_tenants_refuse_arena_grants_to_others() -> None:
    check_shm_tenant(None, "x", action="PinBlocks")
    check_shm_tenant(["a"], "a", action="PinBlocks")
    with pytest.raises(PermissionDenied, match="node.shm_tenants"):
        check_shm_tenant(["a"], "b", action="PinBlocks")


@pytest.fixture
def core() -> Iterator[NodeCore]:
    yield from unit_core(FakeClock())


def test_the_servicer_stores_each_tenant_under_its_own_scope(core: NodeCore) -> None:
    async def run() -> None:
        with ThreadPoolExecutor(1) as pool:
            svc = NodeServicer(core, pool, version="t")
            key = bytes(range(16))
            put = pb.PutRequest(namespace_id=b"ns", items=[pb.PutItem(key=key, value=b"A")])
            assert (await svc.Put(put, Ctx("a"))).results[0].stored
            exists = pb.ExistsRequest(namespace_id=b"ns", keys=[key])
            assert list((await svc.Exists(exists, Ctx("b"))).exists) == [False]
            assert list((await svc.Exists(exists, Ctx())).exists) == [False]
            assert list((await svc.Exists(exists, Ctx("a"))).exists) == [True]
            assert core.store.exists([key], namespace_id=scope_namespace("a", b"ns")) == [True]
            rm = pb.RemoveRequest(namespace_id=b"ns", keys=[key])
            assert list((await svc.Remove(rm, Ctx("b"))).removed) == [False]
            # listing: tenant b sees nothing, tenant a its own ids, the shared admin stored ids
            listing = pb.ListBlocksRequest()
            assert not (await svc.ListBlocks(listing, Ctx("b"))).blocks
            (mine,) = (await svc.ListBlocks(listing, Ctx("a"))).blocks
            assert mine.namespace_id == b"ns"
            (stored,) = (await svc.ListBlocks(listing, Ctx())).blocks
            assert stored.namespace_id == scope_namespace("a", b"ns")
            with pytest.raises(PermissionDenied):  # a certificate of a, declaring b
                await svc.Exists(exists, Ctx("b", principal=ENGINE_A))
            longest = "t" * 64  # its stored id is 82 bytes: past the client's 64-byte limit
            assert (await svc.Put(put, Ctx(longest))).results[0].stored
            assert list((await svc.Exists(exists, Ctx(longest))).exists) == [True]

    asyncio.run(run())


def test_another_tenant_may_not_close_a_session_or_ack_its_orphans(core: NodeCore) -> None:
    async def run() -> None:
        with ThreadPoolExecutor(1) as pool:
            svc = NodeServicer(core, pool, version="t")
            sid = core.open_session("a's client")
            svc.session_tenants.bind(sid, "a")
            with pytest.raises(PermissionDenied, match=f"session {sid} belongs to tenant 'a'"):
                await svc.CloseSession(pb.CloseSessionRequest(session_id=sid), Ctx("b"))
            orphans = pb.ReleasePinsRequest(session_id=sid, orphan_request_ids=[1])
            with pytest.raises(PermissionDenied):
                await svc.ReleasePins(orphans, Ctx("b"))
            assert core.leases.is_open(sid)
            await svc.CloseSession(pb.CloseSessionRequest(session_id=sid), Ctx("a"))
            assert not core.leases.is_open(sid) and svc.session_tenants.tenant(sid) is None

    asyncio.run(run())


def test_describe_hides_the_arena_from_tenants_outside_shm_tenants(tmp_path: pathlib.Path) -> None:
    cfg = NodeConfig(node_id="unit", dram_size_bytes=1 << 20, ssd_size_bytes=0,
                     max_block_bytes=64 << 10, shm_tenants=["a"])
    store = TieredStore(dram_size_bytes=cfg.dram_size_bytes, arena_dir=tmp_path,
                        max_block_bytes=cfg.max_block_bytes)
    core = NodeCore(store, cfg, epoch=1, metrics=NodeMetrics(), clock=FakeClock())

    async def run() -> None:
        with ThreadPoolExecutor(1) as pool:
            svc = NodeServicer(core, pool, version="t")
            a = await svc.Describe(pb.DescribeRequest(), Ctx("a"))
            b = await svc.Describe(pb.DescribeRequest(), Ctx("b"))
            assert a.arena_path == store.arena_path and a.arena_path
            assert b.arena_path == ""
            pin = pb.PinBlocksRequest(namespace_id=b"ns", keys=[bytes(16)], session_id=5)
            with pytest.raises(PermissionDenied, match="shared-memory arena"):
                await svc.PinBlocks(pin, Ctx("b"))

    try:
        asyncio.run(run())
    finally:
        store.close()


def test_an_inline_put_over_the_quota_answers_the_item_with_tenant_quota_exceeded() -> None:
    from kvstored.errors import ErrorCode
    from kvstored.tenancy import TenantQuota

    cfg = NodeConfig(node_id="unit", dram_size_bytes=1 << 20, ssd_size_bytes=0,
                     max_block_bytes=64 << 10)
    store = TieredStore(dram_size_bytes=cfg.dram_size_bytes, arena_dir=None,
                        tenant_quotas={"a": TenantQuota(dram_quota_bytes=4096)})
    core = NodeCore(store, cfg, epoch=1, metrics=NodeMetrics(), clock=FakeClock())

    async def run() -> None:
        with ThreadPoolExecutor(1) as pool:
            svc = NodeServicer(core, pool, version="t")
            items = [pb.PutItem(key=bytes([i]) * 16, value=bytes(4096)) for i in (1, 2)]
            got = (await svc.Put(pb.PutRequest(namespace_id=b"ns", items=items), Ctx("a"))).results
            assert got[0].stored and got[1].status.code == ErrorCode.TENANT_QUOTA_EXCEEDED
            assert "tenant 'a' is over its DRAM quota" in got[1].status.message
            other = (await svc.Put(pb.PutRequest(namespace_id=b"ns", items=items), Ctx("b"))).results
            assert [r.stored for r in other] == [True, True]

    try:
        asyncio.run(run())
    finally:
        store.close()
