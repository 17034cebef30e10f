"""The client's unreported one-sided counts (kvstored/client/_control.py OneSidedCounts)."""

from __future__ import annotations

from kvstored.client._control import OneSidedCounts
from kvstored.v1 import node_pb2 as pb


def test_counts_move_into_one_request_and_come_back_when_it_got_no_answer() -> None:
    c = OneSidedCounts()
    c.add(0, 0, 0, 0)  # nothing read: nothing to report, no bare request for it
    c.add_lookup(0, 0)
    assert not c.pending() and c.take_into(pb.ControlRequest()) is None
    c.add(3, 300, 1, 2)
    c.add(1, 100, 0, 0)
    c.add_lookup(5, 5)
    assert c.pending()
    req = pb.ControlRequest()
    carried = c.take_into(req)
    r = req.one_sided
    assert (r.hit_blocks, r.hit_bytes, r.fallback_blocks, r.miss_blocks, r.lookup_blocks,
            r.lookup_hit_blocks) == (4, 400, 1, 2, 5, 5)
    assert not c.pending() and c.take_into(pb.ControlRequest()) is None  # taken once
    c.add(1, 10, 0, 0)  # read while that request was in flight
    c.give_back(carried)  # it got no answer: reported with the next one
    again = pb.ControlRequest()
    c.take_into(again)
    assert (again.one_sided.hit_blocks, again.one_sided.hit_bytes, again.one_sided.lookup_blocks) == (5, 410, 5)
    bare = pb.ControlRequest()
    assert not bare.HasField("one_sided")  # a request without counts carries no report
