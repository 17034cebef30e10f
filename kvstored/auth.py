"""Who is calling: the :class:`Principal` every request is judged by (a leaf module: no I/O).

A principal has a role (what it may do) and a tenant (which blocks it may touch). Where it
comes from is the transport's business: with mutual TLS, the peer certificate names both
(kvstored.security); on a unix socket or a listener without TLS, the caller is
:data:`TRUSTED_LOCAL` (today's behaviour: the network is trusted). Enforcement lives in the
services, which ask :func:`require_role`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvstored.errors import PermissionDenied

Role = Literal["node", "engine", "admin"]
ROLES: tuple[Role, ...] = ("node", "engine", "admin")


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request.

    Attributes:
        roles: the roles it holds (a certificate may carry several).
        tenant: its tenant ("" = the shared, untenanted space; an admin may act across tenants).
        name: a human-readable name for logs (certificate subject, or "local").
        authenticated: True when the identity came from a verified certificate.
    """

    roles: frozenset[Role]
    tenant: str = ""
    name: str = "local"
    authenticated: bool = False

    def has(self, role: Role) -> bool:
        """Whether the principal holds ``role``."""
        return role in self.roles


TRUSTED_LOCAL = Principal(roles=frozenset(ROLES), tenant="", name="local", authenticated=False)
"""A caller on a listener without TLS: every role, no tenant (the cluster network is trusted)."""


def require_role(principal: Principal, *allowed: Role, action: str) -> None:
    """Raise unless ``principal`` holds one of ``allowed``.

    Raises:
        PermissionDenied: naming the action, the roles it needs and the caller's roles.
    """
    if not any(principal.has(r) for r in allowed):
        raise PermissionDenied(
            f"{action} needs role {' or '.join(allowed)}; caller {principal.name!r} has "
            f"{sorted(principal.roles) or 'no role'}"
        )
