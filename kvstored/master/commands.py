"""The master's one command queue to nodes: copy, promote, drop and leave, each with an id.

Commands ride on the node's ``Heartbeat`` answer (``HeartbeatResponse.commands``), not on a
dedicated RPC: the master never dials a node (nodes may sit behind NAT or in another network
namespace; only they know where the master is), the heartbeat already runs every interval on
a live channel, and its answer already carried the one command that existed before
(``promote_copies``). The cost is latency: a command waits for the node's next heartbeat
(at most ``heartbeat_interval_s``, 1 s by default), which repair and drain can afford::

    add(node, kind, block)     queued (idempotent: the same (kind, block) for a node is one
                               command; asking again returns the queued one)
    Heartbeat answer           every command never sent, or sent ``resend_after_s`` ago and
                               not acknowledged (at most ``max_sends`` sends, then dropped:
                               its owner, e.g. the repair, asks again if still needed)
    next Heartbeat request     ``acked_command_ids``: the node applied them -> removed
    settle(node, kind, block)  an event made it moot (a promotion's ADDED copy=False) -> removed
    forget(node)               the node left or registered a new epoch -> its queue is dropped

**The long poll** (``WaitCommands``, :meth:`CommandQueue.wait`): a node also keeps one call
open that the master answers as soon as a command is queued for it (or after ``wait_ms``,
empty), and that carries the node's acks of what it applied. The master still never dials a
node (the node holds the call open); commands no longer wait for the next heartbeat, which
is what bounded repair throughput (a heartbeat interval per command round). Both paths take
from the same queue (:meth:`take` marks a command sent, so it goes on one of them, and again
only after ``resend_after_s``).

Idempotency is on both sides: ids are unique per master term (a counter), and a node
applies an id once (kvstored/node/replicate.py remembers the ids it applied), so a re-sent
command that crossed its ack does nothing twice. Every command names the node epoch it is
for (``target_epoch``): a restarted node (a new epoch) ignores an older epoch's commands,
and the master drops that epoch's queue when the new epoch registers.

Fencing by term: every command carries the master's term (``term``: :attr:`CommandQueue.term`,
a callable; 0 until leader election gives terms). The node refuses a command of a term older
than the newest it has seen; that check lives on the node (kvstored/node/replicate.py).

Not thread-safe: the master's event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum

from kvstored.errors import InvalidArgument

MAX_PENDING_PER_NODE = 65536
"""Commands queued for one node before the oldest are dropped."""
MAX_SENDS = 5
"""Heartbeat answers one command is sent on at most before the master gives up on it."""
MAX_COMMANDS_PER_ANSWER = 4096
"""Commands one heartbeat answer carries at most (the rest wait for the next one)."""
MAX_WAIT_S = 5.0
"""The longest the master holds one ``WaitCommands`` call (a longer ``wait_ms`` is capped)."""


class CommandKind(IntEnum):
    """What a node is asked to do (mirrors ``kvstored.v1.NodeCommandKind``)."""

    COPY = 1
    """Pull the block from the named source replica, verified, as an original."""
    PROMOTE = 2
    """Keep a remote-fill copy of the block as an original."""
    DROP = 3
    """Remove the block (an extra replica no longer wanted)."""
    LEAVE = 4
    """Drained: unregister and stop heartbeating."""
    PEER_LEFT = 5
    """The node named by the key (utf-8 node id) left the pool: replicas the receiver
    marked redundant because that node keeps them are sole copies again. Never given up
    nor dropped for room (a node's marks are safe only if it hears every departure)."""


@dataclass(frozen=True, slots=True)
class CopySource:
    """The replica a COPY pulls from (as the index names it when the command is queued).

    Attributes:
        node_id / epoch / data_address: the source node's incarnation and data plane.
        size_bytes: the block's size (a source sending another size is not copied).
        generation: the source replica's generation (the copy is verified against it).
    """

    node_id: str
    epoch: int
    data_address: str
    size_bytes: int
    generation: int


@dataclass(frozen=True, slots=True)
class Command:
    """One command to one node epoch.

    Attributes:
        command_id: unique per master term (a node applies it once).
        kind: what to do.
        node_id / epoch: the node incarnation it is for.
        term: the master's term when it was queued (0: no election).
        namespace_id / key: the block (empty for LEAVE).
        source: COPY only: where to pull from.
    """

    command_id: int
    kind: CommandKind
    node_id: str
    epoch: int
    term: int
    namespace_id: bytes = b""
    key: bytes = b""
    source: CopySource | None = None


_Slot = tuple[CommandKind, bytes, bytes]  # (kind, namespace_id, key): one command per node


@dataclass(slots=True)
class _Entry:
    cmd: Command
    sent_s: float | None = None
    sends: int = 0


class CommandQueue:
    """Per node: the commands it has not acknowledged yet (see the module docstring).

    Args:
        clock: monotonic seconds (the membership's clock).
        resend_after_s: a command sent this long ago and not acknowledged is sent again.
        term: the master's current term (0 until leader election provides one).
        max_sends: sends of one command before it is dropped.
        max_pending_per_node: queued commands per node before the oldest are dropped.

    Raises:
        InvalidArgument: a negative resend time, or a max_sends / max_pending below 1.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        resend_after_s: float = 10.0,
        *,
        term: Callable[[], int] = lambda: 0,
        max_sends: int = MAX_SENDS,
        max_pending_per_node: int = MAX_PENDING_PER_NODE,
    ) -> None:
        if not resend_after_s >= 0:
            raise InvalidArgument(f"resend_after_s must be >= 0, got {resend_after_s}")
        if max_sends < 1 or max_pending_per_node < 1:
            raise InvalidArgument(
                f"max_sends and max_pending_per_node must be >= 1, got {max_sends} and "
                f"{max_pending_per_node}")
        self.clock = clock
        self.resend_after_s = float(resend_after_s)
        self.term = term
        self.max_sends = int(max_sends)
        self.max_pending_per_node = int(max_pending_per_node)
        self._ids = itertools.count(1)
        self._queues: dict[str, OrderedDict[_Slot, _Entry]] = {}
        self._by_id: dict[int, tuple[str, _Slot]] = {}
        self._by_slot: dict[_Slot, set[str]] = {}  # which nodes have a command for a slot
        self._wakers: dict[str, asyncio.Event] = {}  # node id -> a WaitCommands call waits
        # counters since this master started (kvstored.master.metrics)
        self.num_queued = 0
        self.num_sent = 0
        self.num_resent = 0
        self.num_acked = 0
        self.num_given_up = 0

    def add(self, node_id: str, epoch: int, kind: CommandKind, namespace_id: bytes = b"",
            key: bytes = b"", source: CopySource | None = None) -> Command:
        """Queue a command for ``(node_id, epoch)``; idempotent per (node, kind, block).

        Returns:
            The command queued now, or the one already queued for the same (kind, block)
            and epoch (its source is not changed). A queued command for an older epoch of
            the node is replaced.

        Raises:
            InvalidArgument: a COPY without a source.
        """
        if kind is CommandKind.COPY and source is None:
            raise InvalidArgument(f"a COPY command needs a source replica (block {key.hex()[:16]})")
        q = self._queues.setdefault(node_id, OrderedDict())
        slot: _Slot = (kind, namespace_id, key)
        old = q.get(slot)
        if old is not None:
            if old.cmd.epoch == epoch:
                return old.cmd
            self._remove(node_id, slot)
            q = self._queues.setdefault(node_id, OrderedDict())
        cmd = Command(next(self._ids), kind, node_id, int(epoch), int(self.term()),
                      namespace_id, key, source)
        q[slot] = _Entry(cmd)
        self._by_id[cmd.command_id] = (node_id, slot)
        self._by_slot.setdefault(slot, set()).add(node_id)
        self.num_queued += 1
        waker = self._wakers.pop(node_id, None)
        if waker is not None:
            waker.set()  # every call waiting for this node wakes; the next waits on a new one
        while len(q) > self.max_pending_per_node:
            oldest = next((s for s in q if s[0] is not CommandKind.PEER_LEFT), None)
            if oldest is None:
                break  # only departures queued (at most one per node that left)
            self._remove(node_id, oldest)
            self.num_given_up += 1
        return cmd

    def take(self, node_id: str, epoch: int, *, limit: int = MAX_COMMANDS_PER_ANSWER,
             kinds: frozenset[CommandKind] | None = None) -> list[Command]:
        """The commands to put on ``(node_id, epoch)``'s heartbeat answer now: never sent, or
        sent ``resend_after_s`` ago and not acknowledged. They stay queued until acked.

        Commands queued for another epoch of the node are dropped (that daemon is gone; a
        node ignores commands for another epoch anyway). A command sent ``max_sends``
        times is dropped instead of sent again.
        """
        q = self._queues.get(node_id)
        if not q:
            return []
        now = self.clock()
        out: list[Command] = []
        for slot, e in list(q.items()):
            if e.cmd.epoch != epoch:
                self._remove(node_id, slot)
                continue
            if kinds is not None and e.cmd.kind not in kinds:
                continue
            if e.sent_s is not None and now - e.sent_s < self.resend_after_s:
                continue
            if e.sends >= self.max_sends and e.cmd.kind is not CommandKind.PEER_LEFT:
                self._remove(node_id, slot)
                self.num_given_up += 1
                continue
            if len(out) >= limit:
                break
            self.num_resent += e.sends > 0
            self.num_sent += 1
            e.sent_s, e.sends = now, e.sends + 1
            out.append(e.cmd)
        return out

    async def wait(self, node_id: str, epoch: int, timeout_s: float, *,
                   limit: int = MAX_COMMANDS_PER_ANSWER) -> list[Command]:
        """:meth:`take`, or if nothing is due, wait up to ``timeout_s`` (at most
        :data:`MAX_WAIT_S`) for a command to be queued for ``node_id`` and take then.

        Returns:
            The commands due (empty: none came within the wait). Several waiters of one node
            (a retried call) all wake; :meth:`take` hands each command to one of them.

        Raises:
            InvalidArgument: a negative or non-finite ``timeout_s``.
        """
        if not 0 <= timeout_s < float("inf"):
            raise InvalidArgument(f"wait timeout must be finite and >= 0 s, got {timeout_s}")
        got = self.take(node_id, epoch, limit=limit)
        if got or timeout_s == 0:
            return got
        waker = self._wakers.get(node_id)
        if waker is None:
            waker = self._wakers[node_id] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waker.wait(), min(timeout_s, MAX_WAIT_S))
        return self.take(node_id, epoch, limit=limit)

    def ack(self, node_id: str, epoch: int, command_ids: Iterable[int]) -> list[Command]:
        """``(node_id, epoch)`` applied these commands: stop sending them.

        Unknown ids, and ids of another node or epoch, are ignored (an ack that crossed a
        resend, or a node that restarted).

        Returns:
            The commands acknowledged now (each once).
        """
        done: list[Command] = []
        for cid in command_ids:
            where = self._by_id.get(int(cid))
            if where is None or where[0] != node_id:
                continue
            e = self._queues[node_id][where[1]]
            if e.cmd.epoch != epoch:
                continue
            self._remove(node_id, where[1])
            self.num_acked += 1
            done.append(e.cmd)
        return done

    def settle(self, node_id: str, kind: CommandKind, namespace_id: bytes, key: bytes) -> bool:
        """Drop a command an event made moot (e.g. a promotion the node already reported).

        Returns:
            True if one was queued.
        """
        q = self._queues.get(node_id)
        slot: _Slot = (kind, namespace_id, key)
        if not q or slot not in q:
            return False
        self._remove(node_id, slot)
        return True

    def forget(self, node_id: str) -> None:
        """Drop a node's whole queue (it left, or registered a new epoch)."""
        waker = self._wakers.pop(node_id, None)
        if waker is not None:
            waker.set()  # a call waiting for it answers now (empty)
        for slot, e in self._queues.pop(node_id, {}).items():
            self._by_id.pop(e.cmd.command_id, None)
            self._unslot(slot, node_id)

    def pending(self, node_id: str, kind: CommandKind | None = None) -> list[Command]:
        """The node's queued commands (sent or not), oldest first; of one kind if given."""
        return [e.cmd for e in self._queues.get(node_id, {}).values()
                if kind is None or e.cmd.kind is kind]

    def has(self, node_id: str, kind: CommandKind, namespace_id: bytes, key: bytes) -> bool:
        """Whether such a command is queued for the node."""
        return (kind, namespace_id, key) in self._queues.get(node_id, {})

    def nodes_with(self, kind: CommandKind, namespace_id: bytes, key: bytes) -> list[str]:
        """The nodes a command of this kind for this block is queued for (sorted; O(them))."""
        return sorted(self._by_slot.get((kind, namespace_id, key), ()))

    def is_waited(self, node_id: str) -> bool:
        """Whether a ``WaitCommands`` call of ``node_id`` is waiting for a command now."""
        return node_id in self._wakers

    def num_pending(self, node_id: str | None = None) -> int:
        """Commands queued for ``node_id`` (every node when None), not acknowledged yet."""
        if node_id is not None:
            return len(self._queues.get(node_id, ()))
        return len(self._by_id)

    def _remove(self, node_id: str, slot: _Slot) -> None:
        q = self._queues.get(node_id)
        if q is None:
            return
        e = q.pop(slot, None)
        if e is not None:
            self._by_id.pop(e.cmd.command_id, None)
            self._unslot(slot, node_id)
        if not q:
            del self._queues[node_id]

    def _unslot(self, slot: _Slot, node_id: str) -> None:
        nodes = self._by_slot.get(slot)
        if nodes is not None:
            nodes.discard(node_id)
            if not nodes:
                del self._by_slot[slot]


__all__ = ["MAX_COMMANDS_PER_ANSWER", "MAX_PENDING_PER_NODE", "MAX_SENDS", "MAX_WAIT_S", "Command",
           "CommandKind", "CommandQueue", "CopySource"]
