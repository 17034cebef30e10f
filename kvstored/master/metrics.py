"""Prometheus metrics of the master (``[master] metrics_listen``, ``kvstored master --metrics-listen``).

Exported on ``http://METRICS_LISTEN/metrics`` (prometheus_client's WSGI server thread)::

    kvstored_master_lookups_total                      LookupPrefix calls answered
    kvstored_master_lookup_blocks_total                blocks asked for by those lookups
    kvstored_master_lookup_hit_blocks_total            blocks of the leading present prefixes
    kvstored_master_lookup_duration_seconds            LookupPrefix handler latency (histogram)
    kvstored_master_put_starts_total{result}           PutStart: placed | exists | <ErrorCode name>
    kvstored_master_put_ends_total{outcome,result}     PutEnd: commit|abort x ok|<ErrorCode name>
    kvstored_master_write_lease_expiries_total         writes aborted because their lease lapsed
    kvstored_master_admin_requests_total{method}       ListNodes / ListReplicas / ListNodeBlocks
    kvstored_master_nodes{state}                       live nodes: healthy | unhealthy |
                                                       probation | syncing
    kvstored_master_replicas                           replicas indexed (WRITING included)
    kvstored_master_blocks                             blocks indexed
    kvstored_master_garbage_rows                       rows of dropped nodes not yet unlinked
    kvstored_master_node_lease_expiries_total          nodes dropped because their lease lapsed
    kvstored_master_unhealthy_marks_total              nodes marked unhealthy (data plane failing)
    kvstored_master_inventory_syncs_total              full inventory syncs completed (resyncs)
    kvstored_master_event_gaps_total                   event gaps seen (each forces a resync)
    kvstored_master_epoch                              this master start's epoch

The membership and the index belong to the event loop and are not thread-safe, so the
scrape thread never reads them: the loop calls :meth:`MasterMetrics.sample` (on every
maintenance tick, ``gc_interval_s``) and the scrape exports the last sample. Counters
incremented by handlers (lookups, puts) are exact at scrape time: LookupPrefix's, counted
on every call of a busy master (~20,000 a second at 10,000 nodes), are plain numbers
(:class:`LookupTally`, a few additions per call instead of four locked prometheus_client
updates) that a collector exports.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kvstored.master.health import NODE_STATES, node_state
from kvstored.master.membership import Membership
from kvstored.master.repair import Repair

_LOOKUP_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)


class LookupTally:
    """LookupPrefix's counters and latency histogram as plain numbers (event loop only
    writes them; a scrape reads a snapshot: each field read is atomic under the GIL).

    Attributes:
        calls: LookupPrefix calls answered.
        blocks: blocks asked for by those calls.
        hit_blocks: blocks answered (leading present prefixes, or every present key).
        bucket_counts: calls per latency bucket (``_LOOKUP_BUCKETS_S`` upper bounds, then
            +Inf), not cumulative.
        sum_s: seconds spent in those calls.
    """

    __slots__ = ("blocks", "bucket_counts", "calls", "hit_blocks", "sum_s")

    def __init__(self) -> None:
        self.calls = 0
        self.blocks = 0
        self.hit_blocks = 0
        self.bucket_counts = [0] * (len(_LOOKUP_BUCKETS_S) + 1)
        self.sum_s = 0.0

    def observe(self, num_blocks: int, num_hit_blocks: int, duration_s: float) -> None:
        """Count one answered call: blocks asked, blocks answered, its latency in seconds."""
        self.calls += 1
        self.blocks += num_blocks
        self.hit_blocks += num_hit_blocks
        self.sum_s += duration_s
        self.bucket_counts[bisect_left(_LOOKUP_BUCKETS_S, duration_s)] += 1  # le: bound >= value


@dataclass(frozen=True, slots=True)
class MasterSample:
    """The master's state as of one :meth:`MasterMetrics.sample` call (read by scrapes)."""

    nodes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(NODE_STATES, 0))
    num_replicas: int = 0
    num_blocks: int = 0
    num_garbage_rows: int = 0
    lease_expiries: int = 0
    unhealthy_marks: int = 0
    inventory_syncs: int = 0
    event_gaps: int = 0
    epoch: int = 0
    # repair (kvstored/master/repair.py) and the command queue (commands.py)
    repair_under_replicated: int = 0
    repair_waiting: int = 0
    repair_copies_issued: int = 0
    repair_bytes_issued: int = 0
    repair_copies_acked: int = 0
    repair_rate_limited: int = 0
    repair_hot_copies: int = 0
    repair_drops_issued: int = 0
    commands_pending: int = 0
    commands_sent: int = 0
    commands_resent: int = 0
    commands_given_up: int = 0
    nodes_draining: int = 0


class MasterMetrics:
    """The metrics of one master daemon, registered in ``self.registry``.

    Args:
        registry: where to register; a fresh registry by default (several masters can live
            in one process, as in tests).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.lookup = LookupTally()
        """LookupPrefix's counters and latency (exported by :class:`_LookupCollector`)."""
        r.register(_LookupCollector(self.lookup))
        self.put_starts = Counter("kvstored_master_put_starts_total",
                                  "PutStart calls by result (placed, exists, error code).",
                                  ["result"], registry=r)
        self.put_ends = Counter("kvstored_master_put_ends_total",
                                "PutEnd calls by outcome (commit, abort) and result.",
                                ["outcome", "result"], registry=r)
        self.write_lease_expiries = Counter(
            "kvstored_master_write_lease_expiries_total",
            "Writes aborted because their write lease lapsed.", registry=r)
        self.admin_requests = Counter("kvstored_master_admin_requests_total",
                                      "Admin view calls by method.", ["method"], registry=r)
        self._sample = MasterSample()
        r.register(_SampleCollector(self))

    @property
    def last_sample(self) -> MasterSample:
        """What the next scrape exports for the state gauges."""
        return self._sample

    def sample(self, membership: Membership, *, epoch: int,
               repair: Repair | None = None) -> MasterSample:
        """Read the state gauges from the membership and the repair (event loop only).

        Returns:
            The new sample (also kept for scrapes).
        """
        nodes = dict.fromkeys(NODE_STATES, 0)
        for rec in membership.nodes():
            nodes[node_state(rec)] += 1
        index = membership.index
        self._sample = MasterSample(
            nodes=nodes, num_replicas=index.num_replicas, num_blocks=index.num_blocks,
            num_garbage_rows=index.num_garbage_rows,
            lease_expiries=membership.num_lease_expiries,
            unhealthy_marks=membership.num_unhealthy_marks,
            inventory_syncs=membership.num_inventory_syncs,
            event_gaps=membership.num_event_gaps, epoch=epoch,
            nodes_draining=sum(1 for r in membership.nodes() if r.draining),
            commands_pending=membership.commands.num_pending(),
            commands_sent=membership.commands.num_sent,
            commands_resent=membership.commands.num_resent,
            commands_given_up=membership.commands.num_given_up,
            **({} if repair is None else dict(
                repair_under_replicated=repair.num_under_replicated,
                repair_waiting=repair.num_waiting,
                repair_copies_issued=repair.num_copies_issued,
                repair_bytes_issued=repair.num_bytes_issued,
                repair_copies_acked=repair.num_copies_acked,
                repair_rate_limited=repair.num_rate_limited,
                repair_hot_copies=repair.num_hot_copies,
                repair_drops_issued=repair.num_drops_issued)),
        )
        return self._sample


class _LookupCollector(Collector):
    """Exports a :class:`LookupTally`: ``kvstored_master_lookups_total``,
    ``kvstored_master_lookup_blocks_total``, ``kvstored_master_lookup_hit_blocks_total`` and
    the ``kvstored_master_lookup_duration_seconds`` histogram."""

    def __init__(self, tally: LookupTally) -> None:
        self._tally = tally

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        t = self._tally
        counts = list(t.bucket_counts)  # one snapshot: the buckets and their count agree
        total_s = t.sum_s
        yield CounterMetricFamily("kvstored_master_lookups", "LookupPrefix calls answered.",
                                  value=t.calls)
        yield CounterMetricFamily("kvstored_master_lookup_blocks",
                                  "Blocks asked for by LookupPrefix calls.", value=t.blocks)
        yield CounterMetricFamily("kvstored_master_lookup_hit_blocks",
                                  "Blocks of the leading prefixes found present cluster-wide.",
                                  value=t.hit_blocks)
        cumulative, running = [], 0
        for bound, n in zip((*_LOOKUP_BUCKETS_S, float("inf")), counts, strict=True):
            running += n
            cumulative.append((floatToGoString(bound), running))
        yield HistogramMetricFamily("kvstored_master_lookup_duration_seconds",
                                    "LookupPrefix handler latency, seconds.",
                                    buckets=cumulative, sum_value=total_s)


class _SampleCollector(Collector):
    """Exports the last :class:`MasterSample` (never touches the loop's objects)."""

    def __init__(self, metrics: MasterMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._metrics.last_sample
        nodes = GaugeMetricFamily("kvstored_master_nodes", "Live nodes by state.",
                                  labels=["state"])
        for state, n in sorted(s.nodes.items()):
            nodes.add_metric([state], n)
        yield nodes
        yield GaugeMetricFamily("kvstored_master_replicas",
                                "Replicas indexed (WRITING included).", value=s.num_replicas)
        yield GaugeMetricFamily("kvstored_master_blocks", "Blocks indexed.", value=s.num_blocks)
        yield GaugeMetricFamily("kvstored_master_garbage_rows",
                                "Rows of dropped nodes not yet unlinked.",
                                value=s.num_garbage_rows)
        yield CounterMetricFamily("kvstored_master_node_lease_expiries",
                                  "Nodes dropped because their lease lapsed.",
                                  value=s.lease_expiries)
        yield CounterMetricFamily("kvstored_master_unhealthy_marks",
                                  "Nodes marked unhealthy (data plane failing).",
                                  value=s.unhealthy_marks)
        yield CounterMetricFamily("kvstored_master_inventory_syncs",
                                  "Full inventory syncs completed (first syncs and resyncs).",
                                  value=s.inventory_syncs)
        yield CounterMetricFamily("kvstored_master_event_gaps",
                                  "Event gaps seen (each forces a resync).", value=s.event_gaps)
        yield GaugeMetricFamily("kvstored_master_epoch", "This master start's epoch.",
                                value=s.epoch)
        yield GaugeMetricFamily("kvstored_master_repair_under_replicated_blocks",
                                "Blocks found short of their replication factor by the last "
                                "repair tick (no copy could be queued yet).",
                                value=s.repair_under_replicated)
        yield GaugeMetricFamily("kvstored_master_repair_waiting_blocks",
                                "Blocks marked for repair not looked at yet (rate limit).",
                                value=s.repair_waiting)
        yield CounterMetricFamily("kvstored_master_repair_copies",
                                  "Copy commands queued by repair, drain and hot blocks.",
                                  value=s.repair_copies_issued)
        yield CounterMetricFamily("kvstored_master_repair_bytes",
                                  "Bytes of the copy commands queued (repair_bytes_per_s paces it).",
                                  value=s.repair_bytes_issued)
        yield CounterMetricFamily("kvstored_master_repair_copies_acked",
                                  "Copy commands the target node acknowledged.",
                                  value=s.repair_copies_acked)
        yield CounterMetricFamily("kvstored_master_repair_rate_limited",
                                  "Copies held back for the repair rate limit.",
                                  value=s.repair_rate_limited)
        yield CounterMetricFamily("kvstored_master_repair_hot_copies",
                                  "Extra replicas queued for hot blocks.",
                                  value=s.repair_hot_copies)
        yield CounterMetricFamily("kvstored_master_repair_drops",
                                  "Drop commands queued for replicas above a block's factor.",
                                  value=s.repair_drops_issued)
        yield GaugeMetricFamily("kvstored_master_commands_pending",
                                "Commands to nodes not acknowledged yet.",
                                value=s.commands_pending)
        yield CounterMetricFamily("kvstored_master_commands_sent",
                                  "Commands put on heartbeat answers (resends included).",
                                  value=s.commands_sent)
        yield CounterMetricFamily("kvstored_master_commands_resent",
                                  "Commands sent again (not acknowledged in time).",
                                  value=s.commands_resent)
        yield CounterMetricFamily("kvstored_master_commands_given_up",
                                  "Commands dropped unacknowledged after the last send.",
                                  value=s.commands_given_up)
        yield GaugeMetricFamily("kvstored_master_nodes_draining", "Nodes being drained.",
                                value=s.nodes_draining)
