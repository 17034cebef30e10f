"""The metadata master: block index, membership, placement, MasterService (never payloads).

One :class:`~kvstored.master.state.MasterState` per term holds everything below; the gRPC
servicer is a thin adapter over it (docs/architecture.md#cluster).

- ``admin.py``: admin views of the index (``kvstorectl where|blocks|evict --address MASTER``).
- ``columns.py``: IndexColumns, the packed numpy storage of the index and its primitives.
- ``copies.py``: promotion of remote-fill copies when a block's last original leaves.
- ``daemon.py``: MasterDaemon, wiring and lifecycle of the ``kvstored master`` process.
- ``departed.py``: nodes that left recently, for the operator's view (``kvstorectl nodes``).
- ``generations.py``: the source of write generations, and the rows of one write.
- ``health.py``: node health rules (the data-plane circuit breaker, registration checks).
- ``holders.py``: HolderRows, the index's holders (readability, load, retirement, GC).
- ``index.py``: BlockIndex, (namespace id, block hash) -> replicas.
- ``keytable.py``: KeyTable, a bucketized numpy hash table from 16-byte keys to slots.
- ``membership.py``: nodes, epochs, node leases, data-plane health and inventory reconcile.
- ``metrics.py``: the master's Prometheus metrics.
- ``placement.py``: placement of new replicas and the two-phase put's generations.
- ``ranking.py``: which of a block's replicas a lookup returns (vectorized).
- ``service.py``: MasterService, the thin grpc.aio adapter over the term's MasterState.
- ``state.py``: MasterState, everything one term owns, built together.
- ``types.py``: value types (replica state, replicas, lookup answers, node reports, actions).
"""
