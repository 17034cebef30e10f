"""Every Prometheus metric a node daemon exports, declared in one place (the master's are in
kvstored/master/metrics.py).

Names follow ``kvstored_<subsystem>_<what>_<unit>``; counters end in ``_total``. Each daemon
owns a :class:`NodeMetrics` with its own :class:`~prometheus_client.CollectorRegistry`, so
several daemons can live in one process (tests) without name clashes. Gauges over the block
store are not sampled into variables: :class:`StoreCollector` reads ``store.stats()`` once per
scrape, and ``kvstored_lease_active`` reads the lease book's counts at scrape time
(:meth:`NodeMetrics.watch_leases`).

Hot path: a request costs O(1) here, whatever the node holds. The labelled children
of the counters a node bumps per request are looked up once and cached (``.labels(...)`` costs
a few microseconds per call); a request's blocks and bytes are counted with one ``inc`` each,
never per block; no gauge is recomputed per request.

Exported by a node::

    kvstored_rpc_requests_total{method,code}          gRPC calls by method and ErrorCode name
    kvstored_rpc_duration_seconds{method}             gRPC handler latency
    kvstored_item_errors_total{code}                  per-item errors inside batched calls
    kvstored_transfer_bytes_total{transport,direction} payload bytes (shm|tcp|grpc, in|out)
    kvstored_transfer_blocks_total{transport,direction}
    kvstored_dataplane_connections                    open TCP data-plane connections
    kvstored_dataplane_requests_total{op,code}
    kvstored_lease_active{kind}                       pins / reservations held over gRPC
    kvstored_lease_expired_total{kind}                leases that lapsed into quarantine
    kvstored_quarantine_bytes                         lapsed pin/reservation space not yet
                                                      reusable (its client may still copy)
    kvstored_sessions_active                          open client sessions (OpenSession)
    kvstored_lookup_blocks_total / kvstored_lookup_hit_blocks_total   (with the lookups clients
                                                      answered one-sided, as they report them)
    kvstored_one_sided_blocks_total{outcome}          one-sided reads clients report (hit |
                                                      fallback | miss); hits also count in
                                                      kvstored_store_{gets,hits}_total and
                                                      kvstored_tier_hits_total{tier="DRAM"}
    kvstored_peer_transfers_total{peer,outcome}       this node's data-plane copies from a peer
                                                      (ok | failed), per peer node id
    kvstored_tier_capacity_bytes{tier} / kvstored_tier_used_bytes{tier} / kvstored_tier_blocks{tier}
    kvstored_tier_hits_total{tier} / kvstored_tier_evictions_total{tier}
    kvstored_store_{gets,hits,misses,puts,put_failures,checksum_failures}_total
    kvstored_store_pinned_blocks, kvstored_node_draining, kvstored_node_uptime_seconds
    kvstored_remote_reads_total{path}                 blocks peers delivered to this node's reads
                                                      (rdma | tcp; RdmaCollector)
    kvstored_rdma_fallbacks_total                     RDMA reads that went over TCP instead
    kvstored_rdma_sessions                            peers' queue pairs into this node's arena
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvstored.types import StoreStats

LEASE_KINDS = ("pin", "reservation", "slot")  # slot: a reserve-ahead slot (node/slots.py)

_LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
)


class NodeMetrics:
    """The metrics of one node daemon, registered in ``self.registry``.

    Args:
        registry: where to register; a fresh registry by default.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.rpc_requests = Counter(
            "kvstored_rpc_requests_total", "gRPC calls handled, by method and result code.",
            ["method", "code"], registry=r,
        )
        self.rpc_duration = Histogram(
            "kvstored_rpc_duration_seconds", "gRPC handler latency in seconds.", ["method"],
            buckets=_LATENCY_BUCKETS_S, registry=r,
        )
        self.item_errors = Counter(
            "kvstored_item_errors_total", "Per-item errors inside batched calls, by code.",
            ["code"], registry=r,
        )
        self.transfer_bytes = Counter(
            "kvstored_transfer_bytes_total",
            "Block payload bytes moved, by transport (shm, tcp, grpc) and direction (in = put).",
            ["transport", "direction"], registry=r,
        )
        self.transfer_blocks = Counter(
            "kvstored_transfer_blocks_total",
            "Blocks moved, by transport (shm, tcp, grpc) and direction (in = put).",
            ["transport", "direction"], registry=r,
        )
        self.dataplane_connections = Gauge(
            "kvstored_dataplane_connections", "Open TCP data-plane connections.", registry=r,
        )
        self.dataplane_requests = Counter(
            "kvstored_dataplane_requests_total", "TCP data-plane requests, by op and result code.",
            ["op", "code"], registry=r,
        )
        self.lease_active = Gauge(
            "kvstored_lease_active", "Pins and reservations held by gRPC clients.", ["kind"],
            registry=r,
        )
        self.lease_expired = Counter(
            "kvstored_lease_expired_total",
            "Pins and reservations whose lease lapsed before their client released them "
            "(their space went to quarantine).",
            ["kind"], registry=r,
        )
        self.quarantined_bytes = Gauge(
            "kvstored_quarantine_bytes",
            "Bytes of lapsed pins and reservations held until their client's session ends or "
            "it acknowledges (never reused while the client may still copy).",
            registry=r,
        )
        self.sessions_active = Gauge(
            "kvstored_sessions_active", "Open client sessions (OpenSession streams).", registry=r,
        )
        self.remote_blocks = Counter(
            "kvstored_remote_blocks_total",
            "Blocks a read copied from peers, by outcome: fetched (copied, verified, "
            "committed), dropped (the source changed during the copy), failed (the transfer "
            "failed or timed out on every holder tried), fallback (a copy tried again on "
            "another holder after one failed), skipped (no room for the copy without dropping a block the "
            "pool holds nowhere else: a miss), hedged (a copy also asked of the next holder because "
            "its holder stayed silent past hedge_after_ms), hedge_won (a hedged copy that "
            "served the block first; the silent holder's copy was discarded). Fallbacks and "
            "hedges of the master's COPY commands count too.",
            ["outcome"], registry=r,
        )
        self.one_sided_blocks = Counter(
            "kvstored_one_sided_blocks_total",
            "Blocks clients tried to read through the shared slots with no round trip, as "
            "their clients report them: outcome hit (kept; also counted as store and DRAM "
            "hits), fallback (the version check failed) or miss (not in the shared index); "
            "fallbacks and misses were then read through the node, which counts that read.",
            ["outcome"], registry=r,
        )
        self._one_sided = {o: self.one_sided_blocks.labels(outcome=o) for o in ("hit", "fallback", "miss")}
        self.lookup_blocks = Counter(
            "kvstored_lookup_blocks_total", "Blocks asked for by prefix lookups.", registry=r,
        )
        self.lookup_hit_blocks = Counter(
            "kvstored_lookup_hit_blocks_total", "Leading blocks found by prefix lookups.",
            registry=r,
        )
        self.peer_transfers = Counter(
            "kvstored_peer_transfers_total",
            "Data-plane copies this node made from a peer's blocks, by peer node id and "
            "outcome (ok, failed: the transfer failed or ran past its deadline).",
            ["peer", "outcome"], registry=r,
        )
        for kind in LEASE_KINDS:
            self.lease_active.labels(kind=kind)
        self._lease_expired = {k: self.lease_expired.labels(kind=k) for k in LEASE_KINDS}
        # labelled children, created on first use (a series appears once it has counted)
        self._transfer: dict[tuple[str, str], tuple[Counter, Counter]] = {}
        self._item_errors: dict[str, Counter] = {}
        self._rpc: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._remote_blocks: dict[str, Counter] = {}
        self._dataplane: dict[tuple[str, str], Counter] = {}
        self._peer_transfers: dict[tuple[str, str], Counter] = {}

    # ---- per-request counting, O(1) (cached children) ------------------------------------
    def count_transfer(
        self, transport: str, direction: str, num_blocks: int, num_bytes: int
    ) -> None:
        """Count one request's payload: ``num_blocks`` blocks of ``num_bytes`` in all.

        Args:
            transport: ``shm``, ``tcp`` or ``grpc``.
            direction: ``in`` (put) or ``out`` (get).
            num_blocks: blocks moved by the request; 0 counts nothing.
            num_bytes: their payload bytes.
        """
        if not num_blocks:
            return
        children = self._transfer.get((transport, direction))
        if children is None:
            labels = {"transport": transport, "direction": direction}
            children = self._transfer[(transport, direction)] = (
                self.transfer_blocks.labels(**labels), self.transfer_bytes.labels(**labels)
            )
        children[0].inc(num_blocks)
        children[1].inc(num_bytes)

    def count_item_error(self, code: str) -> None:
        """Count one per-item error of a batched call by its ``ErrorCode`` name."""
        child = self._item_errors.get(code)
        if child is None:
            child = self._item_errors[code] = self.item_errors.labels(code=code)
        child.inc()

    def count_rpc(self, method: str, code: str, duration_s: float) -> None:
        """Count one gRPC call of ``method`` that ended with ``code`` after ``duration_s`` s."""
        children = self._rpc.get((method, code))
        if children is None:
            children = self._rpc[(method, code)] = (
                self.rpc_requests.labels(method=method, code=code),
                self.rpc_duration.labels(method=method),
            )
        children[0].inc()
        children[1].observe(duration_s)

    def count_remote_blocks(self, outcome: str, n: int = 1) -> None:
        """Count ``n`` blocks a read copied from peers with ``outcome`` (fetched, dropped,
        failed, fallback, skipped, hedged, hedge_won); 0 counts nothing."""
        if not n:
            return
        child = self._remote_blocks.get(outcome)
        if child is None:
            child = self._remote_blocks[outcome] = self.remote_blocks.labels(outcome=outcome)
        child.inc(n)

    def count_dataplane_request(self, op: str, code: str) -> None:
        """Count one TCP data-plane request of ``op`` (get | put | unknown) ending in ``code``."""
        child = self._dataplane.get((op, code))
        if child is None:
            child = self._dataplane[(op, code)] = self.dataplane_requests.labels(op=op, code=code)
        child.inc()

    def count_peer_transfer(self, peer: str, ok: bool) -> None:
        """Count one data-plane copy from node ``peer`` that succeeded (``ok``) or failed."""
        outcome = "ok" if ok else "failed"
        child = self._peer_transfers.get((peer, outcome))
        if child is None:
            child = self._peer_transfers[(peer, outcome)] = self.peer_transfers.labels(
                peer=peer, outcome=outcome)
        child.inc()

    def count_lookup(self, num_keys: int, num_hits: int) -> None:
        """Count one prefix lookup: ``num_keys`` asked for, ``num_hits`` leading ones found."""
        self.lookup_blocks.inc(num_keys)
        self.lookup_hit_blocks.inc(num_hits)

    def count_one_sided(self, hit_blocks: int, hit_bytes: int, fallback_blocks: int, miss_blocks: int) -> None:
        """Count a client's report of one-sided reads (kvstored_one_sided_blocks_total by
        outcome; the hits' bytes as shm transfers out)."""
        if hit_blocks:
            self._one_sided["hit"].inc(hit_blocks)
            self.count_transfer("shm", "out", hit_blocks, hit_bytes)
        if fallback_blocks:
            self._one_sided["fallback"].inc(fallback_blocks)
        if miss_blocks:
            self._one_sided["miss"].inc(miss_blocks)

    def count_lease_expired(self, kind: str, n: int = 1) -> None:
        """Count ``n`` leases of ``kind`` (``pin`` | ``reservation`` | ``slot``) that lapsed."""
        self._lease_expired[kind].inc(n)

    def watch_leases(self, num_active: Callable[[str], int]) -> None:
        """Export ``kvstored_lease_active{kind}`` as ``num_active(kind)``, read at scrape time.

        Nothing is set per pin or release: the lease book keeps the counts (O(1) to read).

        Args:
            num_active: active (not quarantined) leases of a kind; thread-safe.
        """
        for kind in LEASE_KINDS:
            self.lease_active.labels(kind=kind).set_function(functools.partial(num_active, kind))

    def add_store_collector(
        self, stats_fn: Callable[[], StoreStats], extra_fn: Callable[[], tuple[bool, float]]
    ) -> StoreCollector:
        """Export the store's gauges and counters, read at scrape time.

        Args:
            stats_fn: returns the store's current :class:`StoreStats` (thread-safe).
            extra_fn: returns ``(draining, uptime_s)`` of the node.
        """
        collector = StoreCollector(stats_fn, extra_fn)
        self.registry.register(collector)
        return collector


    def add_tenant_collector(
        self, snapshot_fn: Callable[[], dict[str, dict[str, int]]]
    ) -> TenantCollector:
        """Export per-tenant usage, quotas and refusals (``TenantUsage.snapshot``), read at
        scrape time (docs/tenants.md)."""
        collector = TenantCollector(snapshot_fn)
        self.registry.register(collector)
        return collector


class TenantCollector(Collector):
    """``kvstored_tenant_used_bytes{tenant,tier}``, ``kvstored_tenant_quota_bytes{tenant,tier}``
    (only where a quota is set) and ``kvstored_tenant_quota_refusals_total{tenant,tier}``; the
    shared tenant is ``tenant=""``."""

    def __init__(self, snapshot_fn: Callable[[], dict[str, dict[str, int]]]) -> None:
        self._snapshot_fn = snapshot_fn

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        try:
            snap = dict(self._snapshot_fn())
        except Exception:  # closed store, or a dict changed under the read: skip this scrape
            return
        used = GaugeMetricFamily("kvstored_tenant_used_bytes",
                                 "Payload bytes of a tenant's blocks in a tier.",
                                 labels=["tenant", "tier"])
        quota = GaugeMetricFamily("kvstored_tenant_quota_bytes",
                                  "A tenant's quota of a tier, bytes.", labels=["tenant", "tier"])
        refused = CounterMetricFamily(
            "kvstored_tenant_quota_refusals",
            "Puts (DRAM) or demotions (SSD) refused by a tenant's quota.",
            labels=["tenant", "tier"])
        for tenant, row in snap.items():
            for tier in ("dram", "ssd"):
                label = [tenant, tier.upper()]
                used.add_metric(label, row[f"{tier}_used_bytes"])
                if row[f"{tier}_quota_bytes"] >= 0:
                    quota.add_metric(label, row[f"{tier}_quota_bytes"])
                refused.add_metric(label, row[f"{tier}_refusals"])
        yield from (used, quota, refused)


class StoreCollector(Collector):
    """Reads ``store.stats()`` once per scrape and exports it (tiers, counters, pins)."""

    def __init__(
        self, stats_fn: Callable[[], StoreStats], extra_fn: Callable[[], tuple[bool, float]]
    ) -> None:
        self._stats_fn = stats_fn
        self._extra_fn = extra_fn

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # metrics are produced at scrape time only; avoids a stats() at register

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        try:
            s = self._stats_fn()
        except Exception:  # the store is closed (shutdown): export nothing rather than fail
            return
        cap = GaugeMetricFamily("kvstored_tier_capacity_bytes", "Hard cap of a tier.", labels=["tier"])
        used = GaugeMetricFamily("kvstored_tier_used_bytes", "Bytes used in a tier.", labels=["tier"])
        blocks = GaugeMetricFamily("kvstored_tier_blocks", "Blocks stored in a tier.", labels=["tier"])
        hits = CounterMetricFamily("kvstored_tier_hits", "Reads served from a tier.", labels=["tier"])
        evictions = CounterMetricFamily(
            "kvstored_tier_evictions", "Blocks evicted from a tier.", labels=["tier"]
        )
        for t in s.tiers:
            name = t.tier.name
            cap.add_metric([name], t.capacity_bytes)
            used.add_metric([name], t.used_bytes)
            blocks.add_metric([name], t.num_blocks)
            hits.add_metric([name], t.hits)
            evictions.add_metric([name], t.evictions)
        yield from (cap, used, blocks, hits, evictions)
        for name, value, doc in (
            ("gets", s.gets, "Blocks asked for by reads."),
            ("hits", s.hits, "Reads that found their block."),
            ("misses", s.misses, "Reads that did not find their block."),
            ("puts", s.puts, "Blocks stored."),
            ("put_failures", s.put_failures, "Blocks that failed to be written to a tier."),
            ("checksum_failures", s.checksum_failures, "SSD blocks dropped for a bad checksum."),
        ):
            c = CounterMetricFamily(f"kvstored_store_{name}", doc)
            c.add_metric([], value)
            yield c
        yield GaugeMetricFamily(
            "kvstored_store_pinned_blocks", "Blocks pinned by readers.", value=s.pinned_blocks
        )
        draining, uptime_s = self._extra_fn()
        yield GaugeMetricFamily(
            "kvstored_node_draining", "1 while the node drains for shutdown.", value=int(draining)
        )
        yield GaugeMetricFamily(
            "kvstored_node_uptime_seconds", "Seconds since the node started.", value=uptime_s
        )


class TermCollector(Collector):
    """The node's view of the master's term (its :class:`~kvstored.transport.master_targets.
    TermFence`), read at scrape time: ``kvstored_master_term`` (the newest term seen) and
    ``kvstored_master_stale_answers_total`` (answers refused for an older term)."""

    def __init__(self, fence: object) -> None:
        self._fence = fence

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("kvstored_master_term", "Newest master term this node has seen.",
                                value=int(getattr(self._fence, "term", 0)))
        c = CounterMetricFamily("kvstored_master_stale_answers",
                                "Master answers refused for a term older than one seen.")
        c.add_metric([], int(getattr(self._fence, "num_refused", 0)))
        yield c


class RdmaCollector(Collector):
    """Reads across the pool by path (kvstored/node/rdma_peers.py), read at scrape time:
    ``kvstored_remote_reads_total{path}`` (blocks peers delivered to this node's reads, over
    ``rdma`` one-sided READs or ``tcp``), ``kvstored_rdma_fallbacks_total`` (RDMA reads that
    failed and went over TCP instead) and ``kvstored_rdma_sessions`` (peers' queue pairs
    into this node's arena).

    Args:
        counts: ``() -> (rdma blocks, tcp blocks, fallbacks, sessions)``.
    """

    def __init__(self, counts: Callable[[], tuple[int, int, int, int]]) -> None:
        self._counts = counts

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        rdma, tcp, fallbacks, sessions = self._counts()
        reads = CounterMetricFamily(
            "kvstored_remote_reads", "Blocks peers delivered to this node's reads, by path "
            "(rdma: one-sided READs checked by the peer's slot headers; tcp: the data plane).",
            labels=["path"])
        reads.add_metric(["rdma"], rdma)
        reads.add_metric(["tcp"], tcp)
        yield reads
        fb = CounterMetricFamily("kvstored_rdma_fallbacks",
                                 "RDMA reads of a peer that failed and went over TCP instead.")
        fb.add_metric([], fallbacks)
        yield fb
        yield GaugeMetricFamily("kvstored_rdma_sessions",
                                "Peers' RDMA queue pairs connected to this node's arena.",
                                value=sessions)
