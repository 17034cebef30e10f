"""Client library of kvstored: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

Both share one implementation of every operation (kvstored.client._ops); bulk bytes go
through the node's shared-memory arena (same host) or its TCP data plane, gRPC carries
control and small values.

- ``_args.py``: argument checks and batching helpers (buffers, keys, chunks).
- ``_control.py``: the client end of the lean control channel (node end: node/control.py).
- ``_fastget.py``: get_into's batch fast path over shared memory (one pass, one copy).
- ``_hooks.py``: the test hook seam (named points where a test observes or holds an operation).
- ``_ops.py``: the I/O-free operation core shared by both drivers.
- ``_orphans.py``: acks for orphaned grants (ReservePut/PinBlocks whose answer never arrived).
- ``_rdma.py``: a remote node's DRAM hits by one-sided RDMA READs (when both ends have a device).
- ``_put.py``: the put operation: checks, then a path (shared memory, data plane, inline).
- ``_shm.py``: the shared-memory path (the mapped arena; get and put through it).
- ``_state.py``: what a client knows about its node (ClientState), retries, Describe.
- ``_tenant.py``: the client's tenant as gRPC metadata on every call (docs/tenants.md).
- ``_steps.py``: the steps an operation yields, and driving them.
- ``aio.py``: the asyncio driver (``kvstored.AsyncClient``).
- ``master.py``: the master's client, public as ``kvstored.client.master.MasterClient``.
- ``master_admin.py``: MasterAdminClient, the master's admin views and a cluster-wide evict.
- ``sync.py``: the blocking driver (``kvstored.Client``).
- ``torch.py``: put and get tensors of any dtype as blocks (imports torch; nothing else does).
- ``types.py``: result types (Block, NodeInfo, PutResult).
"""

from kvstored.client.aio import AsyncClient
from kvstored.client.sync import Client
from kvstored.client.types import Block, NodeInfo, PutResult

__all__ = ["AsyncClient", "Block", "Client", "NodeInfo", "PutResult"]
