"""The client's unreported one-sided counts (kvstored/client/_control.py OneSidedCounts)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from kvstored.client._control import ControlChannel, NoAnswer, OneSidedCounts
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


def test_only_the_count_that_makes_counts_pending_says_so() -> None:
    """The hit path wakes the idle flusher (``note_report``, a lock and maybe a thread wake)
    only when its count made some pending where none were: the reads after it add to counts
    whoever made them pending has already seen to. Taking them (a request carries them)
    makes the next count the one again."""
    c = OneSidedCounts()
    assert not c.add(0, 0, 0, 0) and not c.add_lookup(0, 0)  # nothing counted: nothing pending
    assert c.add(2, 200, 0, 0)  # made them pending
    assert not c.add(1, 100, 0, 0) and not c.add_lookup(4, 4) and not c.add(0, 0, 1, 0)
    carried = c.take_into(pb.ControlRequest())
    assert carried is not None and not c.pending()
    assert c.add_lookup(3, 3)  # pending again: this one says so
    c.take_into(pb.ControlRequest())
    c.give_back(carried)  # pending again without a count (the channel calls note_report itself)
    assert c.pending() and not c.add(1, 1, 0, 0)


def test_counts_a_request_carried_without_an_answer_are_seen_to_again(tmp_path: Any) -> None:
    """A control request that got no answer gives its one-sided counts back and wakes the
    idle flusher for them (``note_report``): the reads that follow add to counts already
    pending and wake nobody, so without this a parked flusher would hold them until the
    next request. The node here accepts the connection and closes it unanswered."""
    path = str(tmp_path / "control.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    ch = ControlChannel(path)
    try:
        conn, _ = server.accept()
        conn.close()  # the node went away before answering
        counts = OneSidedCounts()
        ch.counts = counts
        woken: list[bool] = []
        ch.note_report = lambda: woken.append(counts.pending())  # type: ignore[method-assign]
        assert counts.add(2, 20, 0, 0)
        with pytest.raises(NoAnswer):
            ch.call("Exists", pb.ExistsRequest(), timeout_s=5.0)
        assert woken == [True] and counts.pending()  # given back, and seen to
        assert not counts.add(1, 10, 0, 0)  # the next read need not wake anyone
    finally:
        ch.close(timeout_s=0.1)
        server.close()
