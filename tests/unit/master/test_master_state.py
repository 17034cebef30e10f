"""MasterState: one term's index, membership and placement, built together."""

from __future__ import annotations

from helpers import key
from master_helpers import NS, blocks, spec

from kvstored.clock import FakeClock
from kvstored.config import MasterConfig
from kvstored.master.state import MasterState
from kvstored.master.types import PlacementPolicy


def test_the_parts_of_a_term_share_one_index_and_generations_start_at_its_epoch() -> None:
    st = MasterState(epoch=500, clock=FakeClock(), initial_blocks=16)
    assert st.membership.index is st.index and st.placement.index is st.index
    assert st.placement.membership is st.membership
    assert st.membership.generations is st.generations
    st.membership.register(spec("a"))
    st.membership.sync_inventory("a", 1, sync_id=1, blocks=[], last_chunk=True)
    out = st.placement.start_put(NS, key(1), 4096, writer_node_id="a")
    assert out.generation == 501  # from the term's epoch on (the sync drew 500)
    assert MasterState(epoch=500, clock=FakeClock(), first_generation=7).generations.next() == 7


def test_a_new_term_starts_empty_and_a_restarted_one_is_incomplete_for_one_lease() -> None:
    clock = FakeClock()
    cfg = MasterConfig(node_lease_s=4.0, placement_policy="most-free", write_lease_s=3.0)
    old = MasterState.from_config(cfg, clock, epoch=10, restarted=False)
    old.membership.register(spec("a"))
    old.membership.sync_inventory("a", 1, sync_id=1, blocks=blocks([1, 2]), last_chunk=True)
    assert old.index.num_replicas == 2 and old.membership.is_complete()
    new = MasterState.from_config(cfg, clock, epoch=11, restarted=True)
    assert new.index.num_replicas == 0 and new.membership.nodes() == []
    assert new.placement.policy is PlacementPolicy.MOST_FREE
    assert new.placement.write_lease_s == 3.0 and new.membership.node_lease_s == 4.0
    assert not new.membership.is_complete()  # nodes of the last term may yet come back
    clock.advance(4.0)
    assert new.membership.is_complete()
    assert old.index.num_replicas == 2  # the old term's state is untouched (dropped whole)


def test_maintain_expires_leases_aborts_writes_and_collects_garbage() -> None:
    clock = FakeClock()
    st = MasterState(epoch=100, clock=clock, node_lease_s=5.0, write_lease_s=2.0)
    st.membership.register(spec("a"))
    st.membership.sync_inventory("a", 1, sync_id=1, blocks=blocks(range(3)), last_chunk=True)
    st.placement.start_put(NS, key(9), 10, writer_node_id="a")
    clock.advance(3.0)
    st.membership.heartbeat("a", 1)
    assert st.maintain(100) == ([], 1, 0)
    clock.advance(6.0)
    assert st.maintain(2) == (["a"], 0, 2)  # bounded: 2 of a's 3 rows per step
    assert st.maintain(2) == ([], 0, 1)
