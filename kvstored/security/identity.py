"""A verified peer certificate -> :class:`~kvstored.auth.Principal`, in one place.

Roles and tenant are SAN URIs of the certificate::

    kvstored://role/node      kvstored://role/engine      kvstored://role/admin
    kvstored://tenant/<T>     (at most one; none = the shared, untenanted space)

SAN URIs rather than subject OUs: a certificate carries several of them without an
ordering question, they are the form SPIFFE-style identities already use, the CA/Browser
Forum dropped OU from public certificates, and grpc and ``ssl`` both expose the whole
certificate, which :func:`principal_from_certificate` parses with ``cryptography`` (no
string matching on a printed subject). An unknown role or a malformed ``kvstored://`` URI
is refused (:class:`~kvstored.errors.Unauthenticated`), never ignored: a typo in a
certificate must not silently drop a role the operator meant, or keep one they did not.

Only certificates the TLS layer has already verified (chain to ``tls.ca_file``, validity
dates) reach this module; it never verifies signatures itself.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

from kvstored.auth import ROLES, TRUSTED_LOCAL, Principal, Role
from kvstored.errors import Unauthenticated

URI_PREFIX = "kvstored://"
ROLE_URI = URI_PREFIX + "role/"
TENANT_URI = URI_PREFIX + "tenant/"


def role_uri(role: Role) -> str:
    """The SAN URI that grants ``role`` (``kvstored://role/node``)."""
    return ROLE_URI + role


def tenant_uri(tenant: str) -> str:
    """The SAN URI that names ``tenant`` (``kvstored://tenant/T``)."""
    return TENANT_URI + tenant


def principal_from_uris(uris: Sequence[str], *, name: str) -> Principal:
    """The principal that a certificate's SAN URIs describe.

    Args:
        uris: every URI SAN of the certificate (others than ``kvstored://`` are ignored).
        name: the subject's common name (for logs and errors).

    Raises:
        Unauthenticated: an unknown role, an empty or second tenant, or another
            ``kvstored://`` URI; the message names the URI received and the forms accepted.
    """
    roles: set[Role] = set()
    tenants: list[str] = []
    for uri in uris:
        if not uri.startswith(URI_PREFIX):
            continue
        if uri.startswith(ROLE_URI):
            role = uri.removeprefix(ROLE_URI)
            if role not in ROLES:
                raise Unauthenticated(
                    f"certificate {name!r} names unknown role {role!r} in SAN URI {uri!r}; "
                    f"roles are {', '.join(ROLES)}"
                )
            roles.add(role)
        elif uri.startswith(TENANT_URI) and uri.removeprefix(TENANT_URI):
            tenants.append(uri.removeprefix(TENANT_URI))
        else:
            raise Unauthenticated(
                f"certificate {name!r} has SAN URI {uri!r}; expected {ROLE_URI}<role> or "
                f"{TENANT_URI}<tenant>"
            )
    if len(tenants) > 1:
        raise Unauthenticated(f"certificate {name!r} names {len(tenants)} tenants {tenants}; at most one")
    return Principal(roles=frozenset(roles), tenant=tenants[0] if tenants else "", name=name,
                     authenticated=True)


def principal_from_certificate(cert: x509.Certificate) -> Principal:
    """The principal of a verified certificate (see the module docstring for the URIs).

    Raises:
        Unauthenticated: as :func:`principal_from_uris`.
    """
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    name = str(cns[0].value) if cns else cert.subject.rfc4514_string()
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    return principal_from_uris(uris, name=name)


def principal_from_pem(pem: bytes) -> Principal:
    """:func:`principal_from_certificate` of a PEM certificate (gRPC's ``x509_pem_cert``).

    Raises:
        Unauthenticated: the bytes are no certificate, or as :func:`principal_from_uris`.
    """
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise Unauthenticated(f"the peer's certificate cannot be parsed: {exc}") from None
    return principal_from_certificate(cert)


def principal_from_auth_context(auth: Mapping[str, Sequence[bytes]]) -> Principal:
    """The principal of a gRPC call, from ``context.auth_context()``.

    A call on a plaintext port (a unix socket, or a server without TLS) is
    :data:`~kvstored.auth.TRUSTED_LOCAL`. A call over TLS is judged by its certificate only:
    every TLS port of a kvstored server requires one (``require_client_auth=True``,
    :func:`kvstored.security.tls.port_credentials`), and a TLS call without one is refused
    here as well, so a misconfigured port can never make a remote caller trusted.

    Raises:
        Unauthenticated: a TLS call without a peer certificate, or as :func:`principal_from_pem`.
    """
    pems = auth.get("x509_pem_cert")
    if pems:
        return principal_from_pem(pems[0])
    if b"ssl" in auth.get("transport_security_type", ()):
        raise Unauthenticated("the caller's TLS connection carries no client certificate; "
                              "present one signed by the cluster's CA (tls.cert_file)")
    return TRUSTED_LOCAL


def principal_of(context: Any) -> Principal:
    """The principal of the gRPC call behind ``context`` (a ``grpc.aio.ServicerContext``).

    A test double without ``auth_context`` is :data:`~kvstored.auth.TRUSTED_LOCAL`.

    Raises:
        Unauthenticated: as :func:`principal_from_pem`.
    """
    auth_context = getattr(context, "auth_context", None)
    if auth_context is None:
        return TRUSTED_LOCAL
    return principal_from_auth_context(auth_context())


def principal_of_call(context: Any) -> Principal:
    """The principal of a call: ``context.principal`` when the context carries one (a test
    injecting a caller), else :func:`principal_of` (the TLS certificate, or TRUSTED_LOCAL).

    Raises:
        Unauthenticated: as :func:`principal_of`.
    """
    injected = getattr(context, "principal", None)
    if isinstance(injected, Principal):
        return injected
    return principal_of(context)


def principal_of_socket(sock: ssl.SSLSocket) -> Principal:
    """The principal of a data-plane peer after its TLS handshake (CERT_REQUIRED).

    Raises:
        Unauthenticated: no peer certificate, or as :func:`principal_from_pem`.
    """
    der = sock.getpeercert(binary_form=True)
    if not der:
        raise Unauthenticated("the data-plane peer presented no certificate")
    return principal_from_certificate(x509.load_der_x509_certificate(der))
