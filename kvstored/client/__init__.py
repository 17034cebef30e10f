"""Client library of kvstored: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

Both share one implementation of every operation (kvstored.client._ops); bulk bytes go
through the node's shared-memory arena (same host) or its TCP data plane, gRPC carries
control and small values.
"""

from kvstored.client.aio import AsyncClient
from kvstored.client.sync import Client
from kvstored.client.types import Block, NodeInfo, PutResult

__all__ = ["AsyncClient", "Block", "Client", "NodeInfo", "PutResult"]
