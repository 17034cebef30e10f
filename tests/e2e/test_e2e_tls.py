"""Mutual TLS refusals against real processes: one ``kvstored master`` and one ``kvstored node``
started with ``--tls-cert/--tls-key/--tls-ca`` (certificates from ``kvstored certs init``),
shared by the tests of this module.

Each refusal has a positive control in the same module (the right certificate gets through),
so a test cannot pass because nothing answers at all: no certificate, a certificate of
another CA and an expired certificate of the right CA are refused by the master's and the
node's gRPC listeners and by the node's data plane; an engine certificate cannot register
with the master or remove (evict) on a node; an engine certificate of one tenant cannot look
up or list another tenant's blocks on the master (an admin's may), and a client whose
certificate names a tenant acts for it without ``tenant=``; the node's unix socket stays
plaintext and trusted (TRUSTED_LOCAL).
"""

from __future__ import annotations

import asyncio
import datetime
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cluster_helpers import MasterProcess, NodeProcess, wait_healthy  # noqa: F401 (wait_healthy: docs)
from thread_helpers import wait_until

from kvstored import AsyncClient, Client
from kvstored.client.master import MasterClient
from kvstored.errors import DeadlineExceeded, PermissionDenied, TransferFailed, Unavailable
from kvstored.rpc_status import error_from_rpc
from kvstored.security.certs import Issued, issue_certificate, make_ca, write_pair
from kvstored.security.tls import TlsFiles, open_channel
from kvstored.tenancy import scope_namespace
from kvstored.transport.tcp import DataPlaneClient
from kvstored.v1 import master_pb2 as mpb
from kvstored.v1 import master_pb2_grpc as mgrpc
from kvstored.v1 import node_pb2 as npb
from kvstored.v1 import node_pb2_grpc as ngrpc

REFUSED = (Unavailable, DeadlineExceeded)
"""What a client sees when the server refuses its TLS handshake (gRPC reports a closed or
failed connection as UNAVAILABLE; a retry loop may run out of its deadline first)."""
KEY = bytes(range(16))
VALUE = b"tls" * 1000


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.certs = root / "certs"
        r = subprocess.run([sys.executable, "-m", "kvstored.cli.main", "certs", "init", str(self.certs),
                            "--nodes", "n1", "--engines", "e1", "--admins", "ops"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        # a certificate of another CA, and an expired one of the right CA
        other = make_ca("another CA")
        write_pair(self.certs, "other-ca", other)
        write_pair(self.certs, "stranger", issue_certificate(other, "stranger", roles=["engine"]))
        ca_pem = (self.certs / "ca.pem").read_bytes()
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        ca = Issued(x509.load_pem_x509_certificate(ca_pem),
                    serialization.load_pem_private_key((self.certs / "ca.key").read_bytes(), None))  # type: ignore[arg-type]
        now = datetime.datetime.now(datetime.UTC)
        write_pair(self.certs, "engine-a", issue_certificate(ca, "engine-a", roles=["engine"], tenant="a"))
        write_pair(self.certs, "engine-b", issue_certificate(ca, "engine-b", roles=["engine"], tenant="b"))
        write_pair(self.certs, "expired", issue_certificate(
            ca, "expired", roles=["admin"], not_before=now - datetime.timedelta(days=2),
            not_after=now - datetime.timedelta(days=1)))
        self.master = MasterProcess(root)
        self.master.args += self.flags("master")
        self.node: NodeProcess | None = None

    def flags(self, stem: str) -> list[str]:
        return ["--tls-cert", str(self.certs / f"{stem}.pem"), "--tls-key", str(self.certs / f"{stem}.key"),
                "--tls-ca", str(self.certs / "ca.pem")]

    def tls(self, stem: str, ca: str = "ca") -> TlsFiles:
        return TlsFiles.load(self.certs / f"{stem}.pem", self.certs / f"{stem}.key", self.certs / f"{ca}.pem")

    def start(self) -> None:
        self.master.start()
        self.node = NodeProcess(self.root / "n1", self.master.address, "n1")
        self.node.args += self.flags("node-n1")
        self.node.start()

    def stop(self) -> list[int]:
        codes = []
        if self.node is not None and self.node.proc is not None:
            codes.append(self.node.terminate())
        if self.master.proc is not None:
            self.master.proc.terminate()
            codes.append(self.master.proc.wait(timeout=60))
        return codes


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="kvtls", dir="/tmp"))
    c = Cluster(root)
    try:
        c.start()
        admin = MasterClient(c.master.address, timeout_s=5.0, tls=c.tls("admin-ops"))
        wait_until(lambda: any(n["node_id"] == "n1" and n["health"] == "healthy"
                               for n in admin.list_nodes()["nodes"]),  # type: ignore[attr-defined]
                   30.0, "n1 registered over mTLS (a node certificate may register)")
        admin.close()
        yield c
        assert c.stop() == [0, 0]
    finally:
        if c.node is not None:
            c.node.kill()
        c.master.kill()
        shutil.rmtree(root, ignore_errors=True)


def _node(c: Cluster) -> NodeProcess:
    assert c.node is not None
    return c.node


def test_master_refuses_no_cert_wrong_ca_and_expired(cluster: Cluster) -> None:
    addr = cluster.master.address
    with MasterClient(addr, timeout_s=5.0, tls=cluster.tls("admin-ops")) as ok:
        assert [n["node_id"] for n in ok.list_nodes()["nodes"]] == ["n1"]  # type: ignore[index]
    for tls in (None, cluster.tls("stranger", ca="other-ca"), cluster.tls("expired")):
        with MasterClient(addr, timeout_s=1.0, tls=tls) as m, pytest.raises(REFUSED):
            m.list_nodes()


def test_node_refuses_no_cert_wrong_ca_and_expired(cluster: Cluster) -> None:
    node = _node(cluster)
    with Client(node.tcp_address, timeout_s=5.0, transport="grpc", tls=cluster.tls("engine-e1")) as ok:
        assert ok.describe().node_id == "n1"
    hints = ["if it uses TLS, pass tls=", "with TLS: the node's certificate must name this host",
             "with TLS: the node's certificate must name this host"]
    for tls, hint in zip((False, cluster.tls("stranger", ca="other-ca"), cluster.tls("expired")), hints,
                         strict=True):
        with Client(node.tcp_address, timeout_s=1.0, transport="grpc", tls=tls) as c, \
                pytest.raises(REFUSED, match=hint):
            c.describe()


def test_engine_cert_can_put_and_get_but_not_register_or_evict(cluster: Cluster) -> None:
    node = _node(cluster)
    engine = cluster.tls("engine-e1")
    with Client(node.tcp_address, timeout_s=5.0, tls=engine) as c:
        assert c.put([KEY], [VALUE])[0].stored
        assert c.get([KEY]) == [VALUE]  # over the TLS data plane (transport auto -> tcp)
        with pytest.raises(PermissionDenied, match=r"NodeService.Remove needs role admin; caller 'engine-e1'"):
            c.remove([KEY])
    with open_channel(cluster.master.address, engine) as channel:
        req = mpb.RegisterNodeRequest(node=mpb.NodeInfo(node_id="evil", epoch=1, grpc_address="127.0.0.1:1",
                                                        data_address="127.0.0.1:2"))
        with pytest.raises(grpc.RpcError) as info:
            mgrpc.MasterServiceStub(channel).RegisterNode(req, timeout=5.0)
    err = error_from_rpc(info.value)
    assert isinstance(err, PermissionDenied), err
    assert "MasterService.RegisterNode needs role node; caller 'engine-e1' has ['engine']" in str(err)
    # ConnectRdma hands out the rkey of the whole arena: a node's call only (docs/rdma.md)
    rdma_req = npb.ConnectRdmaRequest(advert=b"{}", node_id="evil", epoch=1)
    for who, want in (("engine-e1", "NodeService.ConnectRdma needs role node; caller 'engine-e1'"),
                      ("node-n1", "has no RDMA device")):  # allowed, but this node has none
        with open_channel(node.tcp_address, cluster.tls(who)) as channel:
            with pytest.raises(grpc.RpcError) as info:
                ngrpc.NodeServiceStub(channel).ConnectRdma(rdma_req, timeout=5.0)
        assert want in str(error_from_rpc(info.value))
    # the unix socket is a local caller: trusted with every role, as before TLS
    with Client(node.unix_address, timeout_s=5.0, tls=False) as local:
        assert local.exists([KEY]) == [True]
    with Client(node.tcp_address, timeout_s=5.0, tls=cluster.tls("admin-ops")) as admin:
        assert admin.remove([KEY]) == [True]  # an admin may


def test_async_client_speaks_mtls_too(cluster: Cluster) -> None:
    node = _node(cluster)

    async def main() -> None:
        async with AsyncClient(node.tcp_address, timeout_s=5.0, tls=cluster.tls("engine-e1")) as c:
            assert (await c.put([KEY], [VALUE]))[0].error is None
            assert await c.get([KEY]) == [VALUE]
            with pytest.raises(PermissionDenied):
                await c.remove([KEY])
        async with AsyncClient(node.tcp_address, timeout_s=1.0, tls=False) as plain:
            with pytest.raises(REFUSED):
                await plain.describe()

    asyncio.run(main())


def _dp_get(node: NodeProcess, ctx: Any, namespace_id: bytes = b"") -> list[Any]:
    import time

    client = DataPlaneClient(node.data, ssl_context=ctx)
    bufs: list[bytearray] = []

    def sink(i: int, size: int, meta: bytes) -> memoryview:
        bufs.append(bytearray(size))
        return memoryview(bufs[-1])

    try:
        return client.get([KEY], namespace_id, sink, deadline=time.monotonic() + 2.0)
    finally:
        client.close()


def test_data_plane_refuses_a_peer_without_a_valid_cert(cluster: Cluster) -> None:
    node = _node(cluster)
    with Client(node.unix_address, timeout_s=5.0, tls=False) as local:
        assert local.put([KEY], [VALUE])[0].error is None  # (stored now or already)
    got = _dp_get(node, cluster.tls("node-n1").client_context())  # positive control
    assert [g.found for g in got] == [True]
    no_cert = ssl.create_default_context(cadata=(cluster.certs / "ca.pem").read_text())  # TLS, no client cert
    for ctx in (None, cluster.tls("stranger", ca="other-ca").client_context(),
                cluster.tls("expired").client_context(), no_cert):
        with pytest.raises((Unavailable, TransferFailed, DeadlineExceeded)):
            _dp_get(node, ctx)
    wait_until(lambda: node.log().count("data_plane_handshake_refused") >= 4, 10.0,
               "the node logged each refused handshake")
    # a certificate the CA signed but that names no role (the master's) is verified, then
    # its first request is answered PERMISSION_DENIED
    with pytest.raises(PermissionDenied,
                       match="the data plane needs role node or engine or admin; caller .master."):
        _dp_get(node, cluster.tls("master").client_context())
    # tenant a's engine may not address the shared tenant's stored ids on the data plane
    with pytest.raises(PermissionDenied, match="data-plane GET: a caller of tenant 'a' may not address tenant ''"):
        _dp_get(node, cluster.tls("engine-a").client_context())
    assert [g.found for g in _dp_get(node, cluster.tls("engine-a").client_context(),
                                     scope_namespace("a", b""))] == [False]  # its own: a miss


TENANT_KEY = bytes(range(100, 116))


def _master_call(c: Cluster, stem: str, method: str, request: Any) -> Any:
    """One MasterService call with ``stem``'s certificate; a refusal is raised as its
    KvstoredError (kvstored.rpc_status.error_from_rpc)."""
    with open_channel(c.master.address, c.tls(stem)) as channel:
        try:
            return getattr(mgrpc.MasterServiceStub(channel), method)(request, timeout=5.0)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None


def test_master_refuses_an_engine_probing_another_tenants_stored_ids(cluster: Cluster) -> None:
    node = _node(cluster)
    a_ns = scope_namespace("a", b"")
    # no tenant=: the client acts for its certificate's tenant 'a' (the TLS data plane
    # would refuse its put under the shared tenant's id)
    with Client(node.tcp_address, timeout_s=5.0, tls=cluster.tls("engine-a")) as c:
        assert c._st.tenant == "a"
        assert c.put([TENANT_KEY], [VALUE])[0].stored
    lookup = mpb.MasterLookupPrefixRequest(namespace_id=a_ns, keys=[TENANT_KEY])
    where = mpb.ListReplicasRequest(namespace_id=a_ns, keys=[TENANT_KEY])
    # an admin may look across tenants (LookupPrefix itself is for nodes and engines)
    wait_until(lambda: len(_master_call(cluster, "admin-ops", "ListReplicas", where).blocks[0].replicas) == 1,
               15.0, "tenant a's block reached the master's index")
    # tenant a's engine: answered, for its own stored id
    assert len(_master_call(cluster, "engine-a", "LookupPrefix", lookup).node_index) == 1
    (mine,) = _master_call(cluster, "engine-a", "ListReplicas", where).blocks
    assert [r.node_id for r in mine.replicas] == ["n1"]
    # tenant b's engine, naming a's stored id: refused, naming both tenants and the caller
    for method, req in (("LookupPrefix", lookup), ("ListReplicas", where)):
        with pytest.raises(PermissionDenied, match=f"MasterService.{method}: caller 'engine-b' of "
                                                   "tenant 'b' may not address tenant 'a'"):
            _master_call(cluster, "engine-b", method, req)
    # ... and the shared tenant's engine too; its own (b's) id is answered: a miss
    with pytest.raises(PermissionDenied, match="caller 'engine-e1' of tenant '' may not address tenant 'a'"):
        _master_call(cluster, "engine-e1", "LookupPrefix", lookup)
    own = mpb.MasterLookupPrefixRequest(namespace_id=scope_namespace("b", b""), keys=[TENANT_KEY])
    assert len(_master_call(cluster, "engine-b", "LookupPrefix", own).node_index) == 0
    # every namespace of a node: only the caller's tenant's blocks
    listing = mpb.ListNodeBlocksRequest(node_id="n1", any_namespace=True, limit=1000)
    b_seen = _master_call(cluster, "engine-b", "ListNodeBlocks", listing).blocks
    assert all(bytes(e.namespace_id) != a_ns for e in b_seen)
    all_seen = _master_call(cluster, "admin-ops", "ListNodeBlocks", listing).blocks
    assert any(bytes(e.namespace_id) == a_ns and e.key == TENANT_KEY for e in all_seen)
