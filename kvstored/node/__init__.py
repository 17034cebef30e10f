"""The node daemon: one per GPU host, owning the bytes of its DRAM and SSD tiers.

Layers inside the package: the thin adapters (service.py, control.py) call the facade
(core.py), which composes the components below it; daemon.py wires them to a process. The
fencing rule lives in grants.py and sessions.py (docs/architecture.md#fencing-and-sessions).

- ``cluster.py``: MasterLink, the node's membership (register, inventory, events, heartbeats).
- ``control.py``: the lean control channel, a local client's hot operations on a unix socket.
- ``core.py``: NodeCore, request handling without gRPC; implements the transports' BlockServer.
- ``daemon.py``: NodeDaemon, wiring and lifecycle of one node process (start, drain, stop).
- ``fault_hooks.py``: test-only fault hooks armed from ``KVSTORED_TEST_HOOKS`` (no-op unless set).
- ``flights.py``: single-flight for reads across the pool (one copy per missing block at a time).
- ``grants.py``: every lease-bearing operation (pin, reserve, commit, release, orphans,
  quarantine); a grant needs a session.
- ``limits.py``: request limits and the drain gate.
- ``local_put.py``: put paths without a lease (reserve, copy in, commit or abort, per batch).
- ``metrics.py``: the node's Prometheus metrics, declared in one place.
- ``rdma_node.py``: the node's RDMA device ([rdma]), its arena as one memory region, peers' QPs.
- ``rdma_peers.py``: which transport a read of a peer uses (RDMA when both ends advertise it,
  TCP otherwise and on any error), counted by path.
- ``rdma_slots.py``: one-sided READs of a peer's DRAM blocks checked by its slot headers.
- ``reads.py``: read paths (pins, chunked reads, a peer's export read, the inline Get, probes).
- ``remote.py``: reads across the pool (find through the master, copy from the holder's data plane).
- ``service.py``: NodeService, the thin grpc.aio adapter over NodeCore.
- ``sessions.py``: client sessions, the lease book and quarantine.
- ``spill.py``: moves the coldest blocks to peers with room past the high watermark.
- ``tenants.py``: which tenant a request acts for, session tenants, node.shm_tenants (docs/tenants.md).
"""
