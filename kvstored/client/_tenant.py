"""The client's tenant on the wire: gRPC metadata ``kvstored-tenant`` on every call.

The node scopes each request's namespace id by the tenant it acts for (kvstored/node/tenants.py,
docs/tenants.md); a client of tenant ``t`` declares it here, on the sync channel and the asyncio
one alike. The TCP data plane carries stored namespace ids instead
(``ClientState.stored_namespace_id``), since a peer node addresses blocks that way too.
"""

from __future__ import annotations

import collections
from typing import Any

import grpc

TENANT_METADATA_KEY = "kvstored-tenant"
"""The same key as kvstored.node.tenants.TENANT_METADATA_KEY (client/ does not import node/)."""


class _Details(
    collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


def _with_tenant(metadata: Any, tenant: str) -> list[tuple[str, str]]:
    return [*(metadata or ()), (TENANT_METADATA_KEY, tenant)]


class TenantInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
):
    """Adds the tenant to every unary and server-streaming call of a sync channel."""

    def __init__(self, tenant: str) -> None:
        self._tenant = tenant

    def _details(self, d: Any) -> _Details:
        return _Details(d.method, d.timeout, _with_tenant(d.metadata, self._tenant),
                        d.credentials, d.wait_for_ready, getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:  # noqa: D102
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:  # noqa: D102
        return continuation(self._details(details), request)


def _aio_details(d: Any, tenant: str) -> Any:
    return grpc.aio.ClientCallDetails(
        d.method, d.timeout, grpc.aio.Metadata(*_with_tenant(d.metadata, tenant)),
        d.credentials, d.wait_for_ready,
    )


class AioTenantUnary(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds the tenant to every unary call of an asyncio channel."""

    def __init__(self, tenant: str) -> None:
        self._tenant = tenant

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:  # noqa: D102
        return await continuation(_aio_details(details, self._tenant), request)


class AioTenantStream(grpc.aio.UnaryStreamClientInterceptor):
    """Adds the tenant to every server-streaming call (OpenSession) of an asyncio channel."""

    def __init__(self, tenant: str) -> None:
        self._tenant = tenant

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:  # noqa: D102
        return await continuation(_aio_details(details, self._tenant), request)


def sync_channel(channel: grpc.Channel, tenant: str) -> grpc.Channel:
    """``channel`` declaring ``tenant`` on every call ("" = the shared tenant: unchanged)."""
    if not tenant:
        return channel
    return grpc.intercept_channel(channel, TenantInterceptor(tenant))


def aio_interceptors(tenant: str) -> list[Any] | None:
    """Interceptors for ``grpc.aio.insecure_channel`` declaring ``tenant`` (None for "")."""
    if not tenant:
        return None
    return [AioTenantUnary(tenant), AioTenantStream(tenant)]
