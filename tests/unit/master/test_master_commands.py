"""The master's command queue (kvstored/master/commands.py): resend until acked, one command
per (node, kind, block), an older epoch's commands dropped, given up after max_sends."""

from __future__ import annotations

import asyncio

import pytest
from helpers import key
from master_helpers import NS, Cluster, blocks

from kvstored.clock import FakeClock
from kvstored.errors import InvalidArgument
from kvstored.master.commands import CommandKind, CommandQueue, CopySource

SRC = CopySource("a", 1, "127.0.0.1:7001", 4096, 77)


def test_a_command_is_resent_until_the_node_acknowledges_it() -> None:
    clock = FakeClock()
    q = CommandQueue(clock, resend_after_s=5.0)
    c = q.add("b", 1, CommandKind.COPY, NS, key(1), SRC)
    assert q.take("b", 1) == [c]
    assert q.take("b", 1) == []  # sent: not again before resend_after_s
    clock.advance(4.9)
    assert q.take("b", 1) == []
    clock.advance(0.2)
    assert q.take("b", 1) == [c]  # the answer (or the ack) was lost: sent again
    assert q.num_resent == 1
    assert q.ack("b", 1, [c.command_id]) == [c]
    assert q.ack("b", 1, [c.command_id]) == []  # a second ack of the same id: nothing
    clock.advance(60)
    assert q.take("b", 1) == [] and q.num_pending() == 0


def test_adding_the_same_command_twice_queues_it_once() -> None:
    q = CommandQueue(FakeClock())
    c1 = q.add("b", 1, CommandKind.COPY, NS, key(1), SRC)
    c2 = q.add("b", 1, CommandKind.COPY, NS, key(1), SRC)
    assert c1 == c2 and q.num_pending("b") == 1
    other = q.add("b", 1, CommandKind.PROMOTE, NS, key(1))  # another kind: another command
    assert other.command_id != c1.command_id
    assert q.nodes_with(CommandKind.COPY, NS, key(1)) == ["b"]


def test_an_ack_from_another_node_or_epoch_is_ignored() -> None:
    q = CommandQueue(FakeClock())
    c = q.add("b", 1, CommandKind.COPY, NS, key(1), SRC)
    assert q.ack("c", 1, [c.command_id]) == []
    assert q.ack("b", 2, [c.command_id]) == []
    assert q.pending("b") == [c]


def test_a_restarted_nodes_new_epoch_drops_the_old_epochs_commands() -> None:
    q = CommandQueue(FakeClock())
    q.add("b", 1, CommandKind.COPY, NS, key(1), SRC)
    assert q.take("b", 2) == []  # asked by epoch 2: epoch 1's command is gone
    assert q.num_pending("b") == 0


def test_the_membership_drops_a_nodes_queue_when_a_new_epoch_registers() -> None:
    c = Cluster()
    c.join("a", inventory=blocks([1]))
    c.join("b")
    cmd = c.state.commands.add("b", 1, CommandKind.COPY, NS, key(1), SRC)
    c.join("b", epoch=2)  # b restarted
    assert c.state.commands.num_pending("b") == 0
    assert c.state.commands.ack("b", 2, [cmd.command_id]) == []


def test_a_command_never_acknowledged_is_given_up_after_max_sends() -> None:
    clock = FakeClock()
    q = CommandQueue(clock, resend_after_s=1.0, max_sends=2)
    c = q.add("b", 1, CommandKind.DROP, NS, key(1))
    assert q.take("b", 1) == [c]
    clock.advance(1.0)
    assert q.take("b", 1) == [c]
    clock.advance(1.0)
    assert q.take("b", 1) == [] and q.num_given_up == 1 and q.num_pending() == 0


def test_commands_carry_the_masters_term() -> None:
    term = [3]
    q = CommandQueue(FakeClock(), term=lambda: term[0])
    assert q.add("b", 1, CommandKind.LEAVE).term == 3


def test_a_copy_without_a_source_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="needs a source replica"):
        CommandQueue(FakeClock()).add("b", 1, CommandKind.COPY, NS, key(1))


def test_a_waiting_call_answers_as_soon_as_a_command_is_queued() -> None:
    async def main() -> None:
        q = CommandQueue(FakeClock())
        waiter = asyncio.create_task(q.wait("b", 1, timeout_s=3600))  # capped at MAX_WAIT_S
        while not q.is_waited("b"):
            await asyncio.sleep(0)
        assert not waiter.done()
        c = q.add("b", 1, CommandKind.COPY, NS, key(1), SRC)
        assert await asyncio.wait_for(waiter, 1.0) == [c]  # woken, not after MAX_WAIT_S
        assert not q.is_waited("b")
        assert await q.wait("b", 1, timeout_s=0) == []  # sent: not again before resend
        again = asyncio.create_task(q.wait("b", 1, timeout_s=3600))
        while not q.is_waited("b"):
            await asyncio.sleep(0)
        q.forget("b")  # the node left: its waiting call answers at once, empty
        assert await asyncio.wait_for(again, 1.0) == []

    asyncio.run(main())


def test_a_wait_times_out_empty_and_bad_timeouts_are_refused() -> None:
    async def main() -> None:
        q = CommandQueue(FakeClock())
        assert await q.wait("b", 1, timeout_s=0.001) == []
        with pytest.raises(InvalidArgument, match="finite and >= 0 s, got -1"):
            await q.wait("b", 1, timeout_s=-1)

    asyncio.run(main())
