"""A small CA and the certificates of a test cluster (``kvstored certs init``), with
``cryptography`` (no hand-rolled crypto).

Every certificate is ECDSA P-256 / SHA-256, signed by the CA, usable as a TLS server and
client (both extended key usages: a node serves gRPC and its data plane, and calls the
master and its peers). Roles and tenant are SAN URIs (kvstored/security/identity.py); the
host names and IP addresses the certificate is valid for (``hosts``) are SAN DNS / IP
entries, which gRPC and ``ssl`` check against the address a client dials.

Layout written by :func:`init_cluster_certs` (keys mode 0600)::

    DIR/ca.pem  ca.key                 the CA (keep ca.key offline in production)
    DIR/master.pem  master.key         no role (the master only serves)
    DIR/node-<N>.pem  node-<N>.key     kvstored://role/node
    DIR/engine-<E>.pem  ...key         kvstored://role/engine [+ kvstored://tenant/<T>]
    DIR/admin-<A>.pem  ...key          kvstored://role/admin
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvstored.auth import Role
from kvstored.errors import InvalidArgument
from kvstored.security.identity import role_uri, tenant_uri

DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
DEFAULT_VALID_DAYS = 365
_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        """The certificate, PEM."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The private key, unencrypted PKCS#8 PEM."""
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(common_name: str = "kvstored test CA", *, valid_days: int = DEFAULT_VALID_DAYS) -> Issued:
    """A self-signed CA certificate (path length 0: it signs only leaf certificates)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def _san_entry(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue_certificate(
    ca: Issued,
    common_name: str,
    *,
    roles: Sequence[Role] = (),
    tenant: str = "",
    hosts: Sequence[str] = DEFAULT_HOSTS,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> Issued:
    """A leaf certificate signed by ``ca``, for TLS server and client use.

    Args:
        common_name: the subject CN (the principal's name in logs and errors).
        roles: each becomes a SAN URI ``kvstored://role/<role>``.
        tenant: "" = none; else a SAN URI ``kvstored://tenant/<tenant>``.
        hosts: SAN DNS names / IP addresses it is valid for (what clients dial).
        not_before, not_after: validity (default: 5 minutes ago .. ``DEFAULT_VALID_DAYS``);
            tests make expired certificates with them.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    sans: list[x509.GeneralName] = [_san_entry(h) for h in hosts]
    sans += [x509.UniformResourceIdentifier(role_uri(r)) for r in roles]
    if tenant:
        sans.append(x509.UniformResourceIdentifier(tenant_uri(tenant)))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after or now + datetime.timedelta(days=DEFAULT_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                       critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def write_pair(directory: pathlib.Path, stem: str, issued: Issued) -> tuple[pathlib.Path, pathlib.Path]:
    """Write ``stem.pem`` (mode 0644) and ``stem.key`` (mode 0600) in ``directory``."""
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(issued.cert_pem())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(issued.key_pem())
    os.chmod(key_path, 0o600)
    return cert_path, key_path


def _check_names(what: str, names: Sequence[str]) -> None:
    for n in names:
        if not n or not set(n) <= _NAME_OK:
            raise InvalidArgument(
                f"{what} name {n!r} must be non-empty letters, digits, '-', '_' or '.' "
                "(it becomes a file name)"
            )


def init_cluster_certs(
    directory: str | os.PathLike[str],
    *,
    nodes: Sequence[str] = ("node1",),
    engines: Sequence[str] = ("engine1",),
    admins: Sequence[str] = ("admin",),
    tenant: str = "",
    hosts: Sequence[str] = DEFAULT_HOSTS,
    valid_days: int = DEFAULT_VALID_DAYS,
) -> list[pathlib.Path]:
    """Make a CA and the certificates of a test cluster in ``directory`` (the module
    docstring shows the layout). ``tenant`` goes into the engines' certificates.

    Returns:
        Every file written, CA first.

    Raises:
        InvalidArgument: a name is empty or not file-safe, ``valid_days`` < 1, or
            ``directory`` already holds a ``ca.pem`` (never overwritten: remove it first).
    """
    out = pathlib.Path(directory)
    if valid_days < 1:
        raise InvalidArgument(f"--valid-days must be >= 1; got {valid_days}")
    for what, names in (("node", nodes), ("engine", engines), ("admin", admins)):
        _check_names(what, names)
    if tenant:
        _check_names("tenant", [tenant])
    if (out / "ca.pem").exists():
        raise InvalidArgument(f"{out / 'ca.pem'} exists; certs init never overwrites a CA "
                              "(remove the directory's files or choose another directory)")
    out.mkdir(parents=True, exist_ok=True)
    ca = make_ca(valid_days=valid_days)
    not_after = _now() + datetime.timedelta(days=valid_days)
    written = list(write_pair(out, "ca", ca))
    written += write_pair(out, "master", issue_certificate(ca, "master", hosts=hosts, not_after=not_after))
    groups: tuple[tuple[Role, Sequence[str], str], ...] = (
        ("node", nodes, ""), ("engine", engines, tenant), ("admin", admins, ""))
    for role, names, t in groups:
        for n in names:
            issued = issue_certificate(ca, f"{role}-{n}", roles=[role], tenant=t, hosts=hosts,
                                       not_after=not_after)
            written += write_pair(out, f"{role}-{n}", issued)
    return written
