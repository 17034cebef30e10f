"""A master whose node table is incomplete never says "no room" (fail17, issue 17 §1).

A new leader (or a restarted master) rebuilds its node table as the nodes come back: they
register, then sync their inventories. Until every one has (and for the rejoin grace) a
placement that finds no candidate is the master's incompleteness, not a full pool: it
answers Unavailable, so a spiller or a put's replicas use the node's cached peer view
instead of evicting or reporting NoCapacity while peers are nearly empty (the tester's
puts said NoCapacity("no other node has room") for seconds after a failover; main did so
here). A synced, full pool is NoCapacity as before.
"""

from __future__ import annotations

import pytest
from helpers import key
from master_helpers import NS, Cluster, MiB, spec

from kvstored.errors import NoCapacity, Unavailable
from kvstored.master.types import PutStartOutcome


def _rebuilding() -> Cluster:
    c = Cluster()
    c.join("a")  # the writer is back and synced; b and c registered, not yet synced
    for n in ("b", "c"):
        c.members.register(spec(n, 1))
    return c


def test_a_top_up_with_no_synced_candidate_is_unavailable_naming_the_rebuild() -> None:
    c = _rebuilding()
    with pytest.raises(Unavailable, match=r"rebuilding .*1 of 3 registered nodes synced"):
        c.placement.start_replicas(NS, key(1), MiB, writer_node_id="a", replicas=2)
    assert c.placement.num_open_writes == 0
    out = c.placement.start_put_batch([(NS, key(1), MiB)], factors=[2], top_up=True,
                                      writer_node_id="a", exclude_writer=True)
    assert isinstance(out[0], Unavailable)  # per item, over the batch path as well
    c.sync("b", 1, [])
    got = c.placement.start_replicas(NS, key(1), MiB, writer_node_id="a", replicas=2)
    assert isinstance(got, PutStartOutcome) and [r.node_id for r in got.replicas] == ["b"]


def test_a_spill_start_with_no_synced_candidate_is_unavailable_not_no_capacity() -> None:
    c = _rebuilding()
    with pytest.raises(Unavailable, match="rebuilding"):
        c.placement.start_put(NS, key(1), MiB, writer_node_id="a", exclude_writer=True,
                              max_used_fraction=0.9)


def test_a_synced_full_pool_is_no_capacity_as_before() -> None:
    c = Cluster()
    c.join("a")
    c.join("b")
    out = c.placement.start_replicas(NS, key(1), MiB, writer_node_id="a", replicas=3)
    assert len(out.replicas) == 1  # b: the only other node
    c.placement.end_put(NS, key(1), out.generation, commit=False)
    with pytest.raises(NoCapacity):  # more than b's 64 MiB of DRAM
        c.placement.start_put(NS, key(2), 128 * MiB, writer_node_id="a", exclude_writer=True)
