"""Nodes that left the cluster recently, for the operator's view (``kvstorectl nodes``).

A node whose lease lapsed (it stopped heartbeating: killed, stalled, partitioned) or that
unregistered cleanly is dropped from the membership at once: its replicas leave the index
and nothing is placed on it. Without a record of it, it would simply vanish from
``kvstorectl nodes``, and an operator paged about misses could not tell a dead node from one
that was never there. :class:`DepartedNodes` keeps the last ones, bounded in number and in
age, until the node registers again. It is only ever read by the admin view: no lookup,
placement or promotion consults it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["DepartedNode", "DepartedNodes"]

EXPIRED = "expired"
"""Reason: the node's lease lapsed (no heartbeat for a whole node lease)."""
LEFT = "left"
"""Reason: the node unregistered (a clean shutdown)."""


@dataclass(frozen=True)
class DepartedNode:
    """One node that left: its last registration, why and when (master clock, seconds)."""

    spec: object  # the NodeSpec it last registered with
    reason: str  # EXPIRED or LEFT
    departed_s: float
    num_replicas: int  # replicas the master indexed for it when it left


class DepartedNodes:
    """The most recent departures, one per node id, newest last.

    Args:
        max_nodes: entries kept at most (the oldest are forgotten first); >= 1.
        keep_s: an entry older than this many seconds is forgotten; > 0.
    """

    def __init__(self, *, max_nodes: int = 256, keep_s: float = 3600.0) -> None:
        self.max_nodes = max(1, int(max_nodes))
        self.keep_s = float(keep_s)
        self._by_node: OrderedDict[str, DepartedNode] = OrderedDict()

    def add(self, node_id: str, spec: object, reason: str, now_s: float, num_replicas: int) -> None:
        """Record that ``node_id`` left at ``now_s`` (replaces an older record of it)."""
        self._by_node.pop(node_id, None)
        self._by_node[node_id] = DepartedNode(spec, reason, now_s, num_replicas)
        while len(self._by_node) > self.max_nodes:
            self._by_node.popitem(last=False)

    def forget(self, node_id: str) -> None:
        """The node registered again: it is no longer departed."""
        self._by_node.pop(node_id, None)

    def recent(self, now_s: float) -> list[tuple[str, DepartedNode]]:
        """``(node_id, record)`` of the departures within ``keep_s`` of ``now_s``, newest first."""
        while self._by_node:
            node_id, first = next(iter(self._by_node.items()))
            if now_s - first.departed_s <= self.keep_s:
                break
            del self._by_node[node_id]
        return list(reversed(self._by_node.items()))
