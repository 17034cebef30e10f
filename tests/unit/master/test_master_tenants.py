"""The master scopes every RPC that names a namespace id by the caller's tenant (issue 20).

An injected principal (``ctx.principal``, as a TLS certificate would give) stands in for the
certificate: an engine of tenant ``a`` may name only tenant ``a``'s stored namespace ids
(:func:`kvstored.tenancy.scope_namespace`); another tenant's is ``PermissionDenied`` naming
the caller and both tenants; nodes and admins cross; TRUSTED_LOCAL (no TLS) keeps today's
behaviour.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from helpers import key
from master_helpers import Cluster

from kvstored.auth import TRUSTED_LOCAL, Principal
from kvstored.errors import PermissionDenied
from kvstored.master.service import MasterServicer, check_caller_namespace
from kvstored.master.types import BlockRef
from kvstored.tenancy import check_stored_namespace, scope_namespace
from kvstored.types import Tier
from kvstored.v1 import master_pb2 as pb

RAW = b"\x22" * 16
A_NS = scope_namespace("a", RAW)
B_NS = scope_namespace("b", RAW)
SHARED_NS = scope_namespace("", RAW)
ENGINE_A = Principal(roles=frozenset({"engine"}), tenant="a", name="engine-a", authenticated=True)
ENGINE_SHARED = Principal(roles=frozenset({"engine"}), tenant="", name="engine-s", authenticated=True)
NODE = Principal(roles=frozenset({"node"}), tenant="", name="node-n1", authenticated=True)
ADMIN = Principal(roles=frozenset({"admin"}), tenant="", name="ops", authenticated=True)


class Refused(Exception):
    """What the stand-in context's abort raises: the gRPC code and the details."""


class Ctx:
    """A stand-in ServicerContext carrying the caller's principal."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal
        self.trailing: Any = ()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Refused(code, details)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def set_trailing_metadata(self, md: Any) -> None:
        self.trailing = md


@pytest.fixture
def svc() -> MasterServicer:
    c = Cluster()
    c.join("n1", inventory=[BlockRef(ns, key(1), Tier.DRAM, 4096) for ns in (A_NS, B_NS, SHARED_NS)])
    return MasterServicer(c.state)


def _call(svc: MasterServicer, method: str, request: Any, principal: Principal) -> Any:
    return asyncio.run(getattr(svc, method)(request, Ctx(principal)))


def _requests(ns: bytes) -> list[tuple[str, Any]]:
    return [
        ("LookupPrefix", pb.MasterLookupPrefixRequest(namespace_id=ns, keys=[key(1)])),
        ("ListReplicas", pb.ListReplicasRequest(namespace_id=ns, keys=[key(1)])),
        ("ListNodeBlocks", pb.ListNodeBlocksRequest(node_id="n1", namespace_id=ns, limit=10)),
        ("PutStart", pb.PutStartRequest(namespace_id=ns, key=key(2), size_bytes=4096,
                                        writer_node_id="n1")),
        ("PutEnd", pb.PutEndRequest(namespace_id=ns, key=key(2), generation=1, commit=False)),
        ("PutStartBatch", pb.PutStartBatchRequest(
            items=[pb.PutStartItem(namespace_id=ns, key=key(3), size_bytes=4096)],
            writer_node_id="n1")),
        ("PutEndBatch", pb.PutEndBatchRequest(
            items=[pb.PutEndRequest(namespace_id=ns, key=key(3), generation=1, commit=False)])),
    ]


@pytest.mark.parametrize(("method", "index"), [(m, i) for i, (m, _) in enumerate(_requests(B_NS))])
def test_an_engine_of_tenant_a_is_refused_tenant_b_s_stored_ids(
        svc: MasterServicer, method: str, index: int) -> None:
    _, request = _requests(B_NS)[index]
    with pytest.raises(Refused) as info:
        _call(svc, method, request, ENGINE_A)
    code, details = info.value.args
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == (f"MasterService.{method}: caller 'engine-a' of tenant 'a' may not "
                       "address tenant 'b''s blocks")
    with pytest.raises(Refused, match="of tenant '' may not address tenant 'b'"):
        _call(svc, method, request, ENGINE_SHARED)  # the shared tenant is a tenant too


@pytest.mark.parametrize(("method", "index"), [(m, i) for i, (m, _) in enumerate(_requests(A_NS))])
def test_its_own_tenant_s_ids_are_answered(svc: MasterServicer, method: str, index: int) -> None:
    _, request = _requests(A_NS)[index]
    try:
        _call(svc, method, request, ENGINE_A)
    except Refused as exc:  # a put may fail on its own terms, never on the tenant
        assert exc.args[0] != grpc.StatusCode.PERMISSION_DENIED, exc


def test_lookups_answer_the_own_tenant_and_nodes_admins_and_local_callers_cross(
        svc: MasterServicer) -> None:
    lookup_a = pb.MasterLookupPrefixRequest(namespace_id=A_NS, keys=[key(1)])
    assert len(_call(svc, "LookupPrefix", lookup_a, ENGINE_A).node_index) == 1
    lookup_b = pb.MasterLookupPrefixRequest(namespace_id=B_NS, keys=[key(1)])
    assert len(_call(svc, "LookupPrefix", lookup_b, NODE).node_index) == 1  # a node's cluster get
    assert len(_call(svc, "LookupPrefix", lookup_b, TRUSTED_LOCAL).node_index) == 1  # no TLS
    where_b = pb.ListReplicasRequest(namespace_id=B_NS, keys=[key(1)])
    assert len(_call(svc, "ListReplicas", where_b, ADMIN).blocks[0].replicas) == 1


def test_list_node_blocks_of_every_namespace_keeps_the_callers_tenant_only(svc: MasterServicer) -> None:
    listing = pb.ListNodeBlocksRequest(node_id="n1", any_namespace=True, limit=10)
    assert [bytes(e.namespace_id) for e in _call(svc, "ListNodeBlocks", listing, ENGINE_A).blocks] == [A_NS]
    assert [bytes(e.namespace_id) for e in
            _call(svc, "ListNodeBlocks", listing, ENGINE_SHARED).blocks] == [SHARED_NS]
    assert sorted(bytes(e.namespace_id) for e in _call(svc, "ListNodeBlocks", listing, ADMIN).blocks) \
        == sorted([A_NS, B_NS, SHARED_NS])


def test_a_batch_naming_one_foreign_id_is_refused_whole(svc: MasterServicer) -> None:
    batch = pb.PutStartBatchRequest(items=[pb.PutStartItem(namespace_id=A_NS, key=key(5), size_bytes=1),
                                           pb.PutStartItem(namespace_id=B_NS, key=key(6), size_bytes=1)],
                                    writer_node_id="n1")
    with pytest.raises(Refused, match="PutStartBatch: caller 'engine-a' of tenant 'a' may not address tenant 'b'"):
        _call(svc, "PutStartBatch", batch, ENGINE_A)
    ends = pb.PutStartBatchRequest(ends=[pb.PutEndRequest(namespace_id=B_NS, key=key(6), generation=1)],
                                   writer_node_id="n1")
    with pytest.raises(Refused, match="PutStartBatch: caller 'engine-a'"):
        _call(svc, "PutStartBatch", ends, ENGINE_A)
    assert not svc.index.lookup_prefix(A_NS, [key(5)], local_holder=-1).holders.size  # nothing placed


def test_outside_a_call_the_caller_is_trusted_local() -> None:
    check_caller_namespace([A_NS, B_NS], action="test")  # TRUSTED_LOCAL: no refusal
    with pytest.raises(PermissionDenied, match="x: caller 'c' of tenant 'a' may not address tenant 'b'"):
        check_stored_namespace(B_NS, tenant="a", may_cross=False, action="x", caller="c")


def test_without_tls_the_servicer_keeps_todays_behaviour() -> None:
    c = Cluster()
    c.join("n1", inventory=[BlockRef(B_NS, key(1), Tier.DRAM, 4096)])
    svc = MasterServicer(c.state, check_roles=False)  # the daemon without [tls]
    lookup_b = pb.MasterLookupPrefixRequest(namespace_id=B_NS, keys=[key(1)])
    assert len(_call(svc, "LookupPrefix", lookup_b, ENGINE_A).node_index) == 1  # not judged
