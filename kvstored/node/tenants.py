"""Which tenant a node request acts for, and the scope it addresses (docs/tenants.md).

Every NodeService method that names a namespace maps the request's namespace id through
``scope_namespace(tenant, ns)`` (kvstored/tenancy.py) before the core sees it, so the store,
the master's index and the peers only ever see stored ids, and a request of tenant B cannot
address tenant A's blocks whatever id it sends. The tenant of a request:

1. the request's :class:`~kvstored.auth.Principal` (:func:`request_principal`): with mutual
   TLS, the certificate's tenant; a caller that is not an admin may act only for it;
2. otherwise the tenant it declares: gRPC metadata ``kvstored-tenant`` (the client sends it on
   every call), or, on the control channel, the tenant of the connection's session;
3. a request naming a session (pins, reservations) must act for that session's tenant,
   fixed when the session was opened (:class:`SessionTenants`).

A declared tenant is trusted: on a listener without TLS every caller is
:data:`~kvstored.auth.TRUSTED_LOCAL`, so isolation holds only between clients that do not lie
about their tenant (the engines of one operator). Against a hostile client, use TLS.
"""

from __future__ import annotations

from typing import Any

from kvstored.auth import Principal
from kvstored.errors import PermissionDenied
from kvstored.security.identity import principal_of
from kvstored.tenancy import check_tenant

TENANT_METADATA_KEY = "kvstored-tenant"
"""gRPC metadata key of a declared tenant (lower case, as gRPC requires)."""


def request_principal(ctx: Any) -> Principal:
    """The principal of a request: ``ctx.principal`` when the context carries one (the
    control channel, tests), else the gRPC peer's certificate
    (:func:`kvstored.security.identity.principal_of`: TRUSTED_LOCAL on a plaintext port).

    Raises:
        Unauthenticated: a TLS call without a usable certificate.
    """
    p = getattr(ctx, "principal", None)
    if isinstance(p, Principal):
        return p
    return principal_of(ctx)


def declared_tenant(ctx: Any) -> str | None:
    """The tenant a request declares (metadata ``kvstored-tenant``, or ``ctx.tenant`` on the
    control channel), None when it declares none.

    Raises:
        InvalidArgument: the declared name is not a tenant name (the message quotes it).
    """
    bound = getattr(ctx, "tenant", None)
    if isinstance(bound, str):
        return bound
    md = getattr(ctx, "invocation_metadata", None)
    for k, v in (md() if callable(md) else None) or ():
        if k == TENANT_METADATA_KEY:
            value = v.decode() if isinstance(v, bytes) else str(v)
            return check_tenant(value, what=f"gRPC metadata {TENANT_METADATA_KEY}")
    return None


def effective_tenant(principal: Principal, declared: str | None) -> str:
    """The tenant a request acts for (rules 1 and 2 of the module docstring).

    Raises:
        PermissionDenied: an authenticated caller that is not an admin declares a tenant
            other than its certificate's.
    """
    if declared is None:
        return principal.tenant
    if principal.authenticated and declared != principal.tenant and not principal.has("admin"):
        raise PermissionDenied(
            f"caller {principal.name!r} of tenant {principal.tenant!r} may not act for tenant "
            f"{declared!r} (only an admin may)"
        )
    return declared


class SessionTenants:
    """session id -> tenant, fixed at OpenSession (loop-only; one per servicer)."""

    def __init__(self) -> None:
        self._tenants: dict[int, str] = {}

    def bind(self, session_id: int, tenant: str) -> None:
        """Record the tenant of a new session."""
        self._tenants[session_id] = tenant

    def forget(self, session_id: int) -> None:
        """The session is closed."""
        self._tenants.pop(session_id, None)

    def tenant(self, session_id: int) -> str | None:
        """The tenant of an open session, None if unknown."""
        return self._tenants.get(session_id)

    def check(self, session_id: int, tenant: str) -> None:
        """Refuse a request of ``tenant`` that names another tenant's session.

        Raises:
            PermissionDenied: naming both tenants.
        """
        owner = self._tenants.get(session_id)
        if owner is not None and owner != tenant:
            raise PermissionDenied(
                f"session {session_id} belongs to tenant {owner!r}; a request of tenant "
                f"{tenant!r} may not use it"
            )


def check_shm_tenant(allowed: list[str] | None, tenant: str, *, action: str) -> None:
    """Refuse an arena grant (pin, reservation) to a tenant not in ``node.shm_tenants``.

    Raises:
        PermissionDenied: naming the tenant and the setting.
    """
    if allowed is not None and tenant not in allowed:
        raise PermissionDenied(
            f"{action}: tenant {tenant!r} may not use the shared-memory arena "
            f"(node.shm_tenants = {allowed}); use the TCP data plane or inline gRPC"
        )


__all__ = [
    "TENANT_METADATA_KEY", "SessionTenants", "check_shm_tenant",
    "declared_tenant", "effective_tenant", "request_principal",
]
