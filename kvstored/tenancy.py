"""Tenants: names, the tenant-scoped namespace id, quotas (a leaf module: no I/O, no gRPC).

Isolation by construction (docs/tenants.md): a node stores every block under a *stored
namespace id* that encodes its tenant, and every request's namespace id is mapped through
:func:`scope_namespace` with the request's tenant before it reaches the store, the master's
index or a peer. The encoding is injective, so no namespace id a client of tenant B can send
maps into tenant A's space: B addresses another key space and cannot read, probe, evict or
remove A's blocks even when it knows A's namespace id::

    stored id       = ns                      shared tenant "", ns[0] != 0xff (unchanged)
                    | 0xff 0x00 ns            shared tenant "", ns[0] == 0xff (escaped)
                    | 0xff len(t) t ns        tenant t (1..64 bytes, see TENANT_NAME_RE)

The shared tenant keeps today's ids (blocks stored before tenants existed stay readable by
untenanted clients). :func:`split_namespace` inverts it. A block moved between nodes (spill,
a cluster get) travels under its stored id, so it keeps its tenant everywhere.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from kvstored.errors import InvalidArgument, PermissionDenied

SHARED_TENANT = ""
"""The untenanted space (clients that declare no tenant; today's behaviour)."""
MAX_TENANT_BYTES = 64
TENANT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A tenant name: 1..64 characters of letters, digits, ``.``, ``_``, ``-``, not starting with
a punctuation mark (it appears in metric labels, config tables and certificates)."""
_ESC = 0xFF
MAX_NAMESPACE_ID_BYTES = 64
"""Longest namespace id a client may send, bytes (Namespace.id is 16)."""
MAX_STORED_NAMESPACE_BYTES = 2 + MAX_TENANT_BYTES + MAX_NAMESPACE_ID_BYTES
"""Longest stored namespace id (130 bytes): what node and master limits and the data plane's
frames admit (the store itself takes up to 255, tiers/ssd_format.py)."""


@functools.lru_cache(maxsize=1024)
def _is_tenant_name(tenant: str) -> bool:
    return not tenant or TENANT_NAME_RE.fullmatch(tenant) is not None


def check_tenant(tenant: object, *, what: str = "tenant") -> str:
    """Return ``tenant`` if it is a valid tenant name ("" = the shared tenant).

    Raises:
        InvalidArgument: not a str, or not matching :data:`TENANT_NAME_RE`; the message names
            ``what`` and the value received.
    """
    if type(tenant) is str and _is_tenant_name(tenant):  # the hot path: a name seen before
        return tenant
    if not isinstance(tenant, str):
        raise InvalidArgument(f"{what} must be a str, got {type(tenant).__name__} {tenant!r:.80}")
    if tenant and TENANT_NAME_RE.fullmatch(tenant) is None:
        raise InvalidArgument(
            f"{what} {tenant!r:.80} is not a tenant name: 1..{MAX_TENANT_BYTES} letters, digits, "
            "'.', '_' or '-', starting with a letter or digit"
        )
    return tenant


def scope_namespace(tenant: str, namespace_id: bytes) -> bytes:
    """The stored namespace id of ``namespace_id`` for ``tenant`` (the module's encoding).

    Args:
        tenant: a valid tenant name ("" = shared); checked.
        namespace_id: the id a client sent (any bytes).

    Raises:
        InvalidArgument: a bad tenant name, or a stored id longer than 255 bytes (the
            message gives both lengths).
    """
    if type(tenant) is str and type(namespace_id) is bytes:
        return _scoped(tenant, namespace_id)
    return _scope(check_tenant(tenant), bytes(namespace_id))


@functools.lru_cache(maxsize=4096)
def _scoped(tenant: str, ns: bytes) -> bytes:
    """:func:`_scope` of the few (tenant, namespace) pairs a node serves, remembered."""
    return _scope(check_tenant(tenant), ns)


def _scope(tenant: str, ns: bytes) -> bytes:
    if not tenant:
        out = ns if not ns or ns[0] != _ESC else b"\xff\x00" + ns
    else:
        t = tenant.encode()
        out = bytes((_ESC, len(t))) + t + ns
    if len(out) > MAX_STORED_NAMESPACE_BYTES:
        raise InvalidArgument(
            f"namespace_id of {len(ns)} bytes is too long for tenant {tenant!r}: its stored id "
            f"would be {len(out)} bytes, at most {MAX_STORED_NAMESPACE_BYTES}"
        )
    return out


def client_namespace_bytes(stored: bytes) -> int:
    """Length of the client's namespace id inside a stored id (the stored id's own length
    when it is not a valid encoding): what the 64-byte limit of a namespace id applies to."""
    n = len(stored)
    if n <= MAX_NAMESPACE_ID_BYTES:  # the common case: no split needed (raw <= stored)
        return n
    try:
        return len(split_namespace(stored)[1])
    except InvalidArgument:
        return n


def check_namespace_length(stored: bytes) -> None:
    """Refuse a stored id whose client namespace id is over 64 bytes, or that is over 130.

    Raises:
        InvalidArgument: naming the length received and the limit.
    """
    n = client_namespace_bytes(stored)
    if n > MAX_NAMESPACE_ID_BYTES or len(stored) > MAX_STORED_NAMESPACE_BYTES:
        raise InvalidArgument(
            f"namespace_id is {n} bytes; at most {MAX_NAMESPACE_ID_BYTES} "
            "(Namespace.id is 16 bytes)"
        )


def split_namespace(stored: bytes) -> tuple[str, bytes]:
    """``(tenant, namespace id)`` of a stored namespace id (inverse of :func:`scope_namespace`).

    Raises:
        InvalidArgument: ``stored`` is not a valid encoding (a truncated tenant, a bad name).
    """
    if not stored or stored[0] != _ESC:
        return SHARED_TENANT, bytes(stored)
    if len(stored) < 2:
        raise InvalidArgument(f"stored namespace id {stored.hex()} is truncated (0xff alone)")
    n = stored[1]
    if n == 0:
        return SHARED_TENANT, bytes(stored[2:])
    raw = bytes(stored[2 : 2 + n])
    try:
        tenant = raw.decode()
    except UnicodeDecodeError:
        tenant = ""
    if len(raw) != n or not tenant or TENANT_NAME_RE.fullmatch(tenant) is None:
        raise InvalidArgument(
            f"stored namespace id {stored[:80].hex()} names no valid tenant ({n} bytes announced)"
        )
    return tenant, bytes(stored[2 + n :])


def tenant_of(stored: bytes) -> str:
    """The tenant of a stored namespace id; a malformed one is the shared tenant's (it can
    only have been stored by a trusted peer, and is then accounted to nobody's quota)."""
    try:
        return split_namespace(stored)[0]
    except InvalidArgument:
        return SHARED_TENANT


def check_stored_namespace(stored: bytes, *, tenant: str, may_cross: bool, action: str,
                           caller: str = "") -> None:
    """Refuse a caller of ``tenant`` addressing a stored id of another tenant (data plane).

    Args:
        stored: the stored namespace id the caller sent (the TCP data plane carries them).
        tenant: the caller's tenant.
        may_cross: the caller may address every tenant (a node, an admin).
        action: for the message (e.g. ``"data-plane GET"``).
        caller: the caller's name for the message (its certificate's subject), if known.

    Raises:
        PermissionDenied: naming the caller (when given), its tenant and the one addressed.
    """
    if may_cross:
        return
    other = tenant_of(stored)
    if other != tenant:
        who = f"caller {caller!r} of tenant {tenant!r}" if caller else f"a caller of tenant {tenant!r}"
        raise PermissionDenied(f"{action}: {who} may not address tenant {other!r}'s blocks")


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """Byte quotas of one tenant on one node (payload bytes, as ``size_bytes`` counts them).

    Attributes:
        dram_quota_bytes: most DRAM bytes its blocks (reserved or committed) may hold;
            None = no quota.
        ssd_quota_bytes: most SSD bytes its blocks may hold; None = no quota.
    """

    dram_quota_bytes: int | None = None
    ssd_quota_bytes: int | None = None


__all__ = [
    "MAX_NAMESPACE_ID_BYTES", "MAX_STORED_NAMESPACE_BYTES", "MAX_TENANT_BYTES", "SHARED_TENANT",
    "TENANT_NAME_RE", "TenantQuota", "check_namespace_length", "check_stored_namespace",
    "check_tenant", "client_namespace_bytes", "scope_namespace", "split_namespace", "tenant_of",
]
