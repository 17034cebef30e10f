"""The node's side of the master's command queue: copy, promote, drop, leave.

The master puts commands on its Heartbeat answers (kvstored/master/commands.py) until the
node acknowledges them; the MasterLink hands each answer's commands to
:meth:`Replicator.submit` and sends :meth:`Replicator.take_acks` on its next Heartbeat::

    submit(commands)   for each: another epoch's -> ignored (a restarted node drops an
                       older daemon's commands); a term older than the newest seen ->
                       refused (fencing by term; 0 = no election); an id applied already
                       -> acknowledged again, not applied (the ack was lost); an id being
                       applied -> ignored; else queued for the worker
    worker task        splits each answer's COPYs into parts of at most
                       :data:`COPY_PART_BYTES` and applies up to ``max_in_flight`` parts at
                       once (several transfers in flight, each one batched get per source);
                       a LEAVE waits for every part before it and goes alone
                       PROMOTE: keep the remote-fill copy as an original (store.keep_copies)
                       COPY:    already here as a copy -> kept as an original (no transfer);
                                else pulled from the named source replica through the peer
                                data plane (RemoteReads.copy_from: GET_FLAG_PEER_EXPORT,
                                verified against the named generation, committed as an
                                original and reported to the master like any put; a
                                source that fails or stays silent past the hedge delay
                                is replaced by another holder the master names)
                       DROP:    removed here (a pinned block stays: a later DROP may follow)
                       LEAVE:   the node unregisters and stops heartbeating (drained)
                       PEER_LEFT: applied in submit, before any later command runs: the
                                named node left, so replicas marked redundant because it
                                keeps them are sole copies again (``peer_left``)
                       then its id is acknowledged (also when the copy failed: the master's
                       repair sees the block still short and asks again, maybe elsewhere),
                       and ``on_applied`` is called (the MasterLink runs a round at once:
                       the new replicas' ADDED events and the acks reach the master now,
                       not a heartbeat interval later)

Each command id is applied at most once per daemon start (ids are unique per master term;
the last :data:`MAX_REMEMBERED` applied ids are remembered, keyed by (term, id)).

Loop only (``submit``/``take_acks``); the blocking work runs on the given executor.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from kvstored.transport.master_rpc import ClusterReplica
from kvstored.types import Tier
from kvstored.v1 import master_pb2 as pb

if TYPE_CHECKING:
    from kvstored.node.remote import FetchResult

log = structlog.get_logger(__name__)

MAX_REMEMBERED = 65536
"""Applied command ids a node remembers (a resend older than that is applied again: harmless,
every kind is idempotent on the store)."""

COPY_PART_BYTES = 16 << 20
"""Bytes of COPY commands applied as one part (one ``copy_from``: one batched get per source)."""
MAX_PARTS_IN_FLIGHT = 4
"""Parts a node applies at once by default (each holds an executor thread while it copies)."""

CopyFromFn = Callable[[Sequence[tuple[bytes, ClusterReplica]], bytes], "FetchResult | None"]
"""``copy_from(items, namespace_id)``: pull ``(key, source)`` items as originals (blocking);
None when the node cannot copy (no remote reads configured)."""


@dataclass(slots=True)
class ReplicatorCounts:
    """Commands this node handled since it started, by what happened."""

    applied: int = 0
    duplicates: int = 0
    other_epoch: int = 0
    stale_term: int = 0
    copied: int = 0
    kept: int = 0
    copy_failed: int = 0
    dropped: int = 0


class Replicator:
    """Applies the master's commands to this node (see the module docstring).

    Args:
        epoch: this daemon start's epoch (commands for another are ignored).
        copy_from: pulls blocks as originals (see :data:`CopyFromFn`).
        keep_copies: ``store.keep_copies``: unmark remote-fill copies; returns how many.
        remove: ``core.remove(keys, namespace_id)``: per key, removed.
        leave: called once on LEAVE (the MasterLink unregisters and stops).
        executor: where blocking store and data-plane work runs (never the loop).
        on_applied: called (on the loop) after each part is applied and its acks queued.
        max_in_flight: parts applied at once (at most the executor's threads are useful).
        peer_left: called (on the loop, inside :meth:`submit`) with the node id of each
            PEER_LEFT command (``store.forget_keeper``).

    Raises:
        ValueError: ``max_in_flight`` below 1.
    """

    def __init__(
        self,
        *,
        epoch: int,
        copy_from: CopyFromFn,
        keep_copies: Callable[[Sequence[tuple[bytes, bytes]]], int],
        remove: Callable[[Sequence[bytes], bytes], list[bool]],
        leave: Callable[[], None],
        executor: Executor | None = None,
        on_applied: Callable[[], None] | None = None,
        max_in_flight: int = MAX_PARTS_IN_FLIGHT,
        peer_left: Callable[[str], object] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.epoch = int(epoch)
        self.on_applied = on_applied
        self.max_in_flight = int(max_in_flight)
        self._parts_left = 0  # parts taken from the queue and not applied yet
        self._parts: set[asyncio.Task[None]] = set()  # parts being applied
        self.copy_from = copy_from
        self.keep_copies = keep_copies
        self.remove = remove
        self.leave = leave
        self.executor = executor
        self.peer_left = peer_left
        self.newest_term = 0
        self.counts = ReplicatorCounts()
        self._applied: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._running: set[tuple[int, int]] = set()
        self._acks: list[int] = []
        self._queue: asyncio.Queue[list[pb.NodeCommand]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.idle = asyncio.Event()  # set while nothing is queued or running (tests)
        self.idle.set()

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Start the worker task."""
        if self._task is None:
            self._task = asyncio.create_task(self._work(), name="kvstored-replicator")

    async def stop(self) -> None:
        """Cancel the worker (a command being applied is not acknowledged: the master
        sends it again to the next epoch, which ignores it; its repair asks again)."""
        for t in list(self._parts):
            t.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- the link's side -----------------------------------------------------------------
    def observe_term(self, term: int) -> None:
        """The newest master term this node has seen (every answer carries one once leader
        election runs): commands of older terms are refused from now on."""
        self.newest_term = max(self.newest_term, int(term))

    def submit(self, commands: Sequence[pb.NodeCommand]) -> int:
        """Take one heartbeat answer's commands (loop only; returns at once).

        Returns:
            Commands queued for the worker (the rest were ignored, refused or re-acked).
        """
        fresh: list[pb.NodeCommand] = []
        for c in commands:
            if c.target_epoch != self.epoch:
                self.counts.other_epoch += 1
                continue
            if c.term < self.newest_term:
                self.counts.stale_term += 1
                log.warning("command_refused_stale_term", command_id=c.command_id,
                            term=c.term, newest_term=self.newest_term)
                continue
            self.observe_term(c.term)
            cid = (c.term, c.command_id)
            if cid in self._applied:
                self.counts.duplicates += 1
                self._acks.append(c.command_id)  # our ack was lost: say it again
                continue
            if cid in self._running:
                continue  # still being applied: acked when done
            if c.kind == pb.NODE_COMMAND_KIND_PEER_LEFT and self.peer_left is not None:
                # at once, on the loop: before any COPY or eviction that follows it
                self.peer_left(bytes(c.key).decode("utf-8", "replace"))
            self._running.add(cid)
            fresh.append(c)
        if fresh:
            self.idle.clear()
            self._queue.put_nowait(fresh)
        return len(fresh)

    def take_acks(self) -> list[int]:
        """The ids to acknowledge on the next Heartbeat (taken: give them back with
        :meth:`restore_acks` if that heartbeat fails)."""
        out, self._acks = self._acks, []
        return out

    def restore_acks(self, ids: Sequence[int]) -> None:
        """A heartbeat carrying these acks failed: send them on the next one."""
        self._acks[:0] = list(ids)

    @property
    def num_parts_in_flight(self) -> int:
        """Parts being applied now (at most ``max_in_flight``)."""
        return len(self._parts)

    # ---- the worker ----------------------------------------------------------------------
    @staticmethod
    def split(batch: Sequence[pb.NodeCommand], part_bytes: int = COPY_PART_BYTES
              ) -> list[list[pb.NodeCommand]]:
        """One answer's commands as parts applied concurrently: the first part holds every
        non-COPY command and the first COPYs, each further part COPYs of at most
        ``part_bytes`` together (one COPY larger than that goes alone). A batch with a
        LEAVE is one part (the node leaves only after the rest is applied)."""
        if any(c.kind == pb.NODE_COMMAND_KIND_LEAVE for c in batch):
            return [list(batch)]
        parts: list[list[pb.NodeCommand]] = [[c for c in batch
                                              if c.kind != pb.NODE_COMMAND_KIND_COPY]]
        size = 0
        for c in batch:
            if c.kind != pb.NODE_COMMAND_KIND_COPY:
                continue
            if size and size + c.size_bytes > part_bytes:
                parts.append([])
                size = 0
            parts[-1].append(c)
            size += c.size_bytes
        return [p for p in parts if p]

    async def _work(self) -> None:
        slots = asyncio.Semaphore(self.max_in_flight)
        running = self._parts
        while True:
            batch = await self._queue.get()
            parts = self.split(batch)
            self._parts_left += len(parts)  # before any await: idle stays clear meanwhile
            for part in parts:
                if any(c.kind == pb.NODE_COMMAND_KIND_LEAVE for c in part) and running:
                    await asyncio.gather(*running, return_exceptions=True)
                await slots.acquire()
                t = asyncio.create_task(self._apply_part(part, slots))
                running.add(t)
                t.add_done_callback(running.discard)

    async def _apply_part(self, part: list[pb.NodeCommand], slots: asyncio.Semaphore) -> None:
        try:
            await self.apply(part)
        except Exception:  # a bug must not stop the queue: the master resends
            log.exception("replicator_bug", num_commands=len(part))
            for c in part:
                self._running.discard((c.term, c.command_id))
        finally:
            slots.release()
            self._parts_left -= 1
            if self._parts_left == 0 and self._queue.empty():
                self.idle.set()
        if self.on_applied is not None:
            self.on_applied()

    async def apply(self, batch: Sequence[pb.NodeCommand]) -> None:
        """Apply one batch of accepted commands, then queue their acks (worker only)."""
        loop = asyncio.get_running_loop()
        promote = [c for c in batch if c.kind == pb.NODE_COMMAND_KIND_PROMOTE]
        copies = [c for c in batch if c.kind == pb.NODE_COMMAND_KIND_COPY]
        drops = [c for c in batch if c.kind == pb.NODE_COMMAND_KIND_DROP]
        if promote or copies:  # a COPY of a block held here as a copy: keep it, no transfer
            blocks = [(bytes(c.namespace_id), bytes(c.key)) for c in promote + copies]
            n = await loop.run_in_executor(self.executor, self.keep_copies, blocks)
            self.counts.kept += n
        by_ns: dict[bytes, list[pb.NodeCommand]] = {}
        for c in copies:
            by_ns.setdefault(bytes(c.namespace_id), []).append(c)
        for ns, cmds in by_ns.items():
            items = [(bytes(c.key), ClusterReplica(
                node_id=c.source_node_id, epoch=c.source_epoch, tier=Tier.DRAM,
                size_bytes=c.size_bytes, generation=c.generation,
                data_address=c.source_data_address)) for c in cmds]
            got = await loop.run_in_executor(self.executor, self.copy_from, items, ns)
            if got is None:
                self.counts.copy_failed += len(cmds)
                continue
            self.counts.copied += got.num_fetched
            self.counts.copy_failed += got.num_failed + got.num_dropped
            log.info("replica_copies_applied", namespace_id=ns.hex()[:16], num_asked=len(cmds),
                     num_fetched=got.num_fetched, num_failed=got.num_failed,
                     num_dropped=got.num_dropped)
        for c in drops:
            removed = await loop.run_in_executor(self.executor, self.remove, [bytes(c.key)],
                                                 bytes(c.namespace_id))
            self.counts.dropped += sum(removed)
        for c in batch:
            cid = (c.term, c.command_id)
            self._running.discard(cid)
            self._applied[cid] = None
            if len(self._applied) > MAX_REMEMBERED:
                self._applied.popitem(last=False)
            self._acks.append(c.command_id)
            self.counts.applied += 1
        if any(c.kind == pb.NODE_COMMAND_KIND_LEAVE for c in batch):
            log.info("node_leaving_drained", epoch=self.epoch)
            self.leave()


__all__ = ["COPY_PART_BYTES", "MAX_PARTS_IN_FLIGHT", "MAX_REMEMBERED", "CopyFromFn", "Replicator", "ReplicatorCounts"]
