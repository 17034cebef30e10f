"""Node health rules of the membership: the data-plane circuit breaker and registration checks.

A circuit breaker per node, fed by the transfers readers report (``ReportTransfer``) and
by the node's own heartbeats::

    N consecutive failures   unhealthy: unreadable and not placed on; one success heals it
    unhealthy_retry_s        a heartbeat after this long unhealthy puts it on probation
                             (half-open): readable again, still not placed on; one failure
                             -> unhealthy at once (retry doubled, up to unhealthy_retry_max_s);
                             one success heals it

A node's *state* as the views show it (``kvstorectl nodes``, ``kvstored_master_nodes``)
is one of :data:`NODE_STATES`: ``syncing`` until its inventory is complete (or while an
event gap is open), ``probation`` while unhealthy on probation, else ``healthy`` or
``unhealthy`` (``NodeStatus.health`` stays UNHEALTHY on probation; ``NodeStatus.probation``
says so).

Registration: a spec is checked here (:func:`check_spec`), and so is the rule that tells a
restart from a *duplicate* (:func:`may_duplicate`: a newer epoch of a live node with
neither of its addresses; the servicer probes the live one and, if it answers, the
registration is refused with :func:`duplicate_refused`).

These functions change the :class:`~kvstored.master.membership.NodeRecord` they are given
and nothing else: :class:`~kvstored.master.membership.Membership` owns the records, the
index and the counters. Not thread-safe: loop only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from kvstored.addresses import parse_host_port
from kvstored.config import node_id_problem
from kvstored.errors import AlreadyExists, InvalidArgument
from kvstored.master.types import NodeSpec, TierUsage
from kvstored.types import Tier

if TYPE_CHECKING:
    from kvstored.master.membership import NodeRecord

log = structlog.get_logger("kvstored.master.membership")  # node events share one logger name
NODE_STATES = ("healthy", "unhealthy", "probation", "syncing")
"""What :func:`node_state` answers (the ``state`` label of ``kvstored_master_nodes``)."""


def node_state(rec: NodeRecord) -> str:
    """The node's state for the views: one of :data:`NODE_STATES` (``probation``: unhealthy,
    on probation; see the module docstring)."""
    if rec.probation and not rec.healthy:
        return "probation"
    return rec.health.name.lower()


# ---- the circuit breaker -----------------------------------------------------------------
def on_heartbeat(rec: NodeRecord) -> bool:
    """Put an unhealthy node on probation once it has heartbeated ``retry_s`` after it was
    marked (call after ``rec.last_heartbeat_s`` is renewed).

    Returns:
        True if it went on probation now (its readability changed).
    """
    if (rec.healthy or rec.probation
            or rec.last_heartbeat_s - rec.unhealthy_since_s < rec.retry_s):
        return False
    rec.probation = True  # half-open: readable again; a transfer decides
    log.info("node_on_probation", node_id=rec.spec.node_id, epoch=rec.spec.epoch,
             unhealthy_s=round(rec.last_heartbeat_s - rec.unhealthy_since_s, 3))
    return True


def on_transfer(rec: NodeRecord, *, ok: bool, now_s: float, unhealthy_after_failures: int,
                retry_s: float, retry_max_s: float) -> bool:
    """Record one data-plane transfer with the node (see the module docstring).

    Args:
        now_s: the membership clock's time.
        unhealthy_after_failures: consecutive failures that make a healthy node unhealthy.
        retry_s: its retry time when newly marked unhealthy.
        retry_max_s: cap of the retry time, doubled by each failure on probation.

    Returns:
        True if the node was marked unhealthy by this report (counted by the caller).
    """
    node_id, epoch = rec.spec.node_id, rec.spec.epoch
    if ok:
        rec.consecutive_failures = 0
        if not rec.healthy:
            log.info("node_healthy_again", node_id=node_id, epoch=epoch,
                     probation=rec.probation)
        rec.healthy = True
        rec.probation = False
        return False
    rec.consecutive_failures += 1
    if rec.probation:  # the trial failed: open the breaker again, back off
        rec.probation = False
        rec.unhealthy_since_s = now_s
        rec.retry_s = min(2 * rec.retry_s, retry_max_s)
        log.warning("node_unhealthy", node_id=node_id, epoch=epoch,
                    num_failures=rec.consecutive_failures, on_probation=True,
                    retry_s=rec.retry_s)
        return True
    if rec.healthy and rec.consecutive_failures >= unhealthy_after_failures:
        rec.healthy = False
        rec.unhealthy_since_s = now_s
        rec.retry_s = retry_s
        log.warning("node_unhealthy", node_id=node_id, epoch=epoch,
                    num_failures=rec.consecutive_failures, retry_s=rec.retry_s)
        return True
    return False


# ---- registration ------------------------------------------------------------------------
def _check_host_port(what: str, value: str) -> None:
    try:
        port = parse_host_port(value)[1]
    except InvalidArgument:
        port = 0
    if port == 0:
        raise InvalidArgument(f"{what} must be HOST:PORT with a port in 1..65535, got {value!r}")


def check_spec(spec: NodeSpec) -> dict[Tier, TierUsage]:
    """Validate a registration's spec.

    Returns:
        Its tiers by tier (DRAM, SSD).

    Raises:
        InvalidArgument: empty or too long node id, epoch not a positive 64-bit integer,
            malformed address, or a bad tier (not DRAM/SSD, or a negative size).
    """
    problem = node_id_problem(spec.node_id)
    if problem is not None:
        raise InvalidArgument(f"node_id {problem}, got {spec.node_id!r}")
    if not 0 < spec.epoch < (1 << 64):
        raise InvalidArgument(f"epoch must be a positive 64-bit integer, got {spec.epoch}")
    _check_host_port("grpc_address", spec.grpc_address)
    _check_host_port("data_address", spec.data_address)
    tiers: dict[Tier, TierUsage] = {}
    for t in spec.tiers:
        if t.tier not in (Tier.DRAM, Tier.SSD) or t.capacity_bytes < 0 or t.used_bytes < 0:
            raise InvalidArgument(f"bad tier capacity {t!r} of node {spec.node_id!r}")
        tiers[t.tier] = t
    return tiers


def may_duplicate(live: NodeSpec, spec: NodeSpec) -> bool:
    """Whether ``spec`` may be a second daemon under the live node's id: a newer epoch with
    neither of the live epoch's addresses (else it is a restart: the old process must be
    gone, it held the port)."""
    if spec.epoch <= live.epoch:
        return False
    return spec.grpc_address != live.grpc_address and spec.data_address != live.data_address


def duplicate_refused(live: NodeSpec, spec: NodeSpec, lease_left_s: float) -> AlreadyExists:
    """The error refusing ``spec`` while the live daemon ``live`` answers (logged here)."""
    log.warning("node_id_duplicate_refused", node_id=spec.node_id, live_epoch=live.epoch,
                live_grpc=live.grpc_address, live_data=live.data_address,
                grpc=spec.grpc_address, data=spec.data_address,
                lease_left_s=round(lease_left_s, 3))
    return AlreadyExists(
        f"node id {spec.node_id!r} is held by a live daemon (epoch {live.epoch}, gRPC "
        f"{live.grpc_address}, data {live.data_address}, answering; its lease has "
        f"{lease_left_s:.1f} s left); this daemon (gRPC {spec.grpc_address}, data "
        f"{spec.data_address}) is refused: give it another --node-id, or stop the other "
        "daemon first"
    )


__all__ = ["NODE_STATES", "check_spec", "duplicate_refused", "may_duplicate",
           "node_state", "on_heartbeat", "on_transfer"]
