"""kvstored.security: certificate -> Principal (the one mapping every listener uses), the
``[tls]`` files' checks, ``kvstored certs init``'s layout, and the role table of every
NodeService method. No network: certificates are made in memory with ``cryptography``."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kvstored.auth import TRUSTED_LOCAL, require_role
from kvstored.config import load_config
from kvstored.errors import ConfigInvalid, InvalidArgument, PermissionDenied, Unauthenticated
from kvstored.security.certs import Issued, init_cluster_certs, issue_certificate, make_ca
from kvstored.security.identity import (
    principal_from_auth_context,
    principal_from_certificate,
    principal_from_pem,
    principal_of,
)
from kvstored.security.tls import TlsFiles, tls_from_env


@pytest.fixture(scope="module")
def ca() -> Issued:
    return make_ca()


def _with_uris(ca: Issued, uris: list[str]) -> x509.Certificate:
    """A certificate with exactly these SAN URIs (issue_certificate only writes valid ones)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "odd")]))
            .issuer_name(ca.cert.subject).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(u) for u in uris]), critical=False)
            .sign(ca.key, hashes.SHA256()))


def test_roles_and_tenant_come_from_the_san_uris(ca: Issued) -> None:
    p = principal_from_certificate(issue_certificate(ca, "engine-e1", roles=["engine"], tenant="t1").cert)
    assert (p.roles, p.tenant, p.name, p.authenticated) == (frozenset({"engine"}), "t1", "engine-e1", True)
    both = principal_from_certificate(issue_certificate(ca, "ops", roles=["admin", "node"]).cert)
    assert both.roles == frozenset({"admin", "node"}) and both.tenant == ""
    none = principal_from_certificate(issue_certificate(ca, "master").cert)
    assert none.roles == frozenset() and none.authenticated
    # a foreign URI (SPIFFE) is not ours: ignored
    spiffe = principal_from_certificate(_with_uris(ca, ["spiffe://x/y", "kvstored://role/node"]))
    assert spiffe.roles == frozenset({"node"})


@pytest.mark.parametrize(("uris", "message"), [
    (["kvstored://role/root"],
     "names unknown role 'root' in SAN URI 'kvstored://role/root'; roles are node, engine, admin"),
    (["kvstored://tenant/a", "kvstored://tenant/b"], "names 2 tenants ['a', 'b']; at most one"),
    (["kvstored://roles/node"], "has SAN URI 'kvstored://roles/node'; expected kvstored://role/<role>"),
    (["kvstored://tenant/"], "has SAN URI 'kvstored://tenant/'"),
])
def test_a_malformed_kvstored_uri_is_refused_not_ignored(ca: Issued, uris: list[str], message: str) -> None:
    with pytest.raises(Unauthenticated, match=message.replace("[", r"\[").replace("]", r"\]")):
        principal_from_certificate(_with_uris(ca, uris))


def test_the_grpc_auth_context_maps_to_a_principal(ca: Issued) -> None:
    issued = issue_certificate(ca, "node-a", roles=["node"])
    assert principal_from_auth_context({}) is TRUSTED_LOCAL  # a plaintext port
    assert principal_from_auth_context({"transport_security_type": [b"insecure"]}) is TRUSTED_LOCAL
    with pytest.raises(Unauthenticated, match="carries no client certificate"):
        principal_from_auth_context({"transport_security_type": [b"ssl"]})  # never trusted
    got = principal_from_auth_context({"transport_security_type": [b"ssl"],
                                       "x509_pem_cert": [issued.cert_pem()]})
    assert got == principal_from_pem(issued.cert_pem()) and got.roles == frozenset({"node"})
    with pytest.raises(Unauthenticated, match="cannot be parsed"):
        principal_from_pem(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")

    class Ctx:
        def auth_context(self) -> dict[str, list[bytes]]:
            return {"x509_pem_cert": [issued.cert_pem()]}

    assert principal_of(Ctx()).name == "node-a"
    assert principal_of(object()) is TRUSTED_LOCAL  # a test double without auth_context


def test_require_role_names_the_action_the_roles_and_the_caller(ca: Issued) -> None:
    engine = principal_from_certificate(issue_certificate(ca, "engine-e1", roles=["engine"]).cert)
    require_role(engine, "engine", "node", action="NodeService.Get")
    with pytest.raises(PermissionDenied,
                       match=r"NodeService.Remove needs role admin; caller 'engine-e1' has \['engine'\]"):
        require_role(engine, "admin", action="NodeService.Remove")
    require_role(TRUSTED_LOCAL, "admin", action="NodeService.Remove")  # no TLS: today's behaviour


def test_every_node_method_has_a_role_decision() -> None:
    from kvstored.node.service import _METHODS, METHOD_ROLES

    assert set(METHOD_ROLES) == set(_METHODS) | {"OpenSession"}
    assert METHOD_ROLES["Remove"] == ("admin",)
    assert METHOD_ROLES["ConnectRdma"] == ("node",)  # an rkey READs every tenant's blocks
    assert "engine" in METHOD_ROLES["Get"] and "engine" in METHOD_ROLES["ReservePut"]


def test_tls_files_are_checked_and_errors_name_the_file(tmp_path: Path) -> None:
    written = init_cluster_certs(tmp_path, nodes=["a"], engines=["e1"], admins=["ops"], tenant="t1")
    assert [p.name for p in written] == [
        "ca.pem", "ca.key", "master.pem", "master.key", "node-a.pem", "node-a.key",
        "engine-e1.pem", "engine-e1.key", "admin-ops.pem", "admin-ops.key"]
    assert (tmp_path / "node-a.key").stat().st_mode & 0o777 == 0o600
    assert principal_from_pem((tmp_path / "engine-e1.pem").read_bytes()).tenant == "t1"
    ok = TlsFiles.load(tmp_path / "node-a.pem", tmp_path / "node-a.key", tmp_path / "ca.pem")
    assert ok.server_context().verify_mode.name == "CERT_REQUIRED"
    assert ok.client_context().check_hostname
    with pytest.raises(ConfigInvalid, match=r"cannot read tls key_file .*missing.key: No such file"):
        TlsFiles.load(tmp_path / "node-a.pem", tmp_path / "missing.key", tmp_path / "ca.pem")
    (tmp_path / "junk.pem").write_text("hello\n")
    with pytest.raises(ConfigInvalid, match=r"tls ca_file .*junk.pem is not a PEM file"):
        TlsFiles.load(tmp_path / "node-a.pem", tmp_path / "node-a.key", tmp_path / "junk.pem")
    with pytest.raises(ConfigInvalid, match=r"node-a.pem and key_file .*engine-e1.key do not load as a pair"):
        TlsFiles.load(tmp_path / "node-a.pem", tmp_path / "engine-e1.key", tmp_path / "ca.pem")
    with pytest.raises(InvalidArgument, match="ca.pem exists; certs init never overwrites a CA"):
        init_cluster_certs(tmp_path)
    with pytest.raises(InvalidArgument, match="node name 'a/b' must be"):
        init_cluster_certs(tmp_path / "x", nodes=["a/b"])


def test_tls_config_takes_all_three_files_or_none(tmp_path: Path) -> None:
    assert not load_config(environ={}).tls.enabled
    with pytest.raises(ConfigInvalid, match=r"tls.*missing tls.key_file, tls.ca_file"):
        load_config(environ={"KVSTORED_TLS__CERT_FILE": "/x.pem"})
    assert tls_from_env({}) is None
    with pytest.raises(ConfigInvalid, match="missing KVSTORED_TLS__CA_FILE"):
        tls_from_env({"KVSTORED_TLS__CERT_FILE": "a", "KVSTORED_TLS__KEY_FILE": "b"})


def test_every_master_method_has_a_role_decision() -> None:
    from kvstored.master.service import MasterServicer
    from kvstored.v1 import master_pb2

    methods = master_pb2.DESCRIPTOR.services_by_name["MasterService"].methods_by_name
    roles = {name: getattr(MasterServicer, name).roles for name in methods}
    node_only = {"RegisterNode", "UnregisterNode", "Heartbeat", "SyncInventory", "ReportEvents",
                 "ReportTransfer", "WaitCommands"}
    assert {n for n, r in roles.items() if r == ("node",)} == node_only
    assert {n for n, r in roles.items() if r == ("admin",)} == {"DrainNode", "SetReplication"}
    assert all("admin" not in r for n, r in roles.items()
               if not n.startswith("List") and r != ("admin",))
    assert all(set(r) == {"node", "engine", "admin"} for n, r in roles.items() if n.startswith("List"))


def test_a_client_without_tenant_takes_its_certificates(tmp_path: Path) -> None:
    from kvstored.client._state import ClientState, default_tenant

    init_cluster_certs(tmp_path, engines=["e1"], admins=["ops"], tenant="t1")
    engine = TlsFiles.load(tmp_path / "engine-e1.pem", tmp_path / "engine-e1.key", tmp_path / "ca.pem")
    admin = TlsFiles.load(tmp_path / "admin-ops.pem", tmp_path / "admin-ops.key", tmp_path / "ca.pem")
    assert default_tenant(None, engine) == "t1"  # the certificate's kvstored://tenant/t1
    assert default_tenant("", engine) == ""  # an explicit tenant= wins (the servers judge it)
    assert default_tenant("x", engine) == "x"
    assert default_tenant(None, admin) == ""  # a certificate without a tenant
    assert default_tenant(None, None) == ""  # no TLS
    st = ClientState("127.0.0.1:1", timeout_s=1.0, namespace=None, transport="grpc", tls=engine)
    assert (st.tenant, st.stored_namespace_id) == ("t1", b"\xff\x02t1")
    plain = ClientState("127.0.0.1:1", timeout_s=1.0, namespace=None, transport="grpc", tls=False)
    assert plain.tenant == ""
