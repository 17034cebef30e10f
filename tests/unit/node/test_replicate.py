"""The node's side of the command queue (kvstored/node/replicate.py): each id applied once
(a resend while it runs or after it ran does nothing twice; the ack is repeated), another
epoch's commands ignored, an older term refused, copies kept in place before any transfer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from kvstored.node.remote import FetchResult
from kvstored.node.replicate import Replicator
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.v1 import master_pb2 as pb

NS = b"\x22" * 16


def copy_cmd(cid: int, key: bytes, *, epoch: int = 5, term: int = 0) -> pb.NodeCommand:
    return pb.NodeCommand(command_id=cid, kind=pb.NODE_COMMAND_KIND_COPY, target_epoch=epoch,
                          term=term, namespace_id=NS, key=key, source_node_id="a",
                          source_epoch=1, source_data_address="127.0.0.1:1", size_bytes=10,
                          generation=9)


class Fakes:
    def __init__(self, hold: threading.Event | None = None) -> None:
        self.hold = hold
        self.entered = threading.Event()
        self.copied: list[list[bytes]] = []
        self.kept: list[list[tuple[bytes, bytes]]] = []
        self.removed: list[bytes] = []
        self.left = 0
        self.keep_answer = 0

    def copy_from(self, items: Sequence[tuple[bytes, ClusterReplica]], ns: bytes
                  ) -> FetchResult:
        self.entered.set()
        if self.hold is not None:
            assert self.hold.wait(10)
        self.copied.append([k for k, _ in items])
        assert all(r.node_id == "a" and r.generation == 9 for _, r in items)
        return FetchResult(num_found=len(items), num_fetched=len(items))

    def keep_copies(self, blocks: Sequence[tuple[bytes, bytes]]) -> int:
        self.kept.append(list(blocks))
        return self.keep_answer

    def remove(self, keys: Sequence[bytes], ns: bytes) -> list[bool]:
        self.removed += keys
        return [True] * len(keys)

    def leave(self) -> None:
        self.left += 1

    def replicator(self) -> Replicator:
        return Replicator(epoch=5, copy_from=self.copy_from, keep_copies=self.keep_copies,
                          remove=self.remove, leave=self.leave)


def test_a_command_resent_while_it_runs_and_after_it_ran_is_applied_once() -> None:
    async def main() -> None:
        hold = threading.Event()
        f = Fakes(hold)
        r = f.replicator()
        await r.start()
        try:
            assert r.submit([copy_cmd(1, b"k1")]) == 1
            await asyncio.to_thread(f.entered.wait, 10)  # the copy is running, held
            assert r.submit([copy_cmd(1, b"k1")]) == 0  # resent meanwhile: ignored
            assert r.take_acks() == []  # not applied yet: no ack
            hold.set()
            await asyncio.wait_for(r.idle.wait(), 10)
            assert r.take_acks() == [1]
            assert r.submit([copy_cmd(1, b"k1")]) == 0  # our ack was lost: resent
            assert r.take_acks() == [1]  # acked again, not applied again
            assert f.copied == [[b"k1"]] and r.counts.duplicates == 1
        finally:
            await r.stop()

    asyncio.run(main())


def test_another_epochs_commands_are_ignored_and_older_terms_refused() -> None:
    async def main() -> None:
        f = Fakes()
        r = f.replicator()
        await r.start()
        try:
            assert r.submit([copy_cmd(1, b"k1", epoch=4)]) == 0  # an older daemon's
            r.observe_term(7)
            assert r.submit([copy_cmd(2, b"k2", term=6)]) == 0  # a deposed master's
            assert r.submit([copy_cmd(3, b"k3", term=7)]) == 1
            await asyncio.wait_for(r.idle.wait(), 10)
            assert f.copied == [[b"k3"]] and r.take_acks() == [3]
            assert (r.counts.other_epoch, r.counts.stale_term) == (1, 1)
        finally:
            await r.stop()

    asyncio.run(main())


def test_promote_drop_and_leave_and_copies_kept_first() -> None:
    async def main() -> None:
        f = Fakes()
        r = f.replicator()
        await r.start()
        try:
            cmds = [
                pb.NodeCommand(command_id=1, kind=pb.NODE_COMMAND_KIND_PROMOTE, target_epoch=5,
                               namespace_id=NS, key=b"p"),
                copy_cmd(2, b"c"),
                pb.NodeCommand(command_id=3, kind=pb.NODE_COMMAND_KIND_DROP, target_epoch=5,
                               namespace_id=NS, key=b"d"),
                pb.NodeCommand(command_id=4, kind=pb.NODE_COMMAND_KIND_LEAVE, target_epoch=5),
            ]
            assert r.submit(cmds) == 4
            await asyncio.wait_for(r.idle.wait(), 10)
            assert f.kept == [[(NS, b"p"), (NS, b"c")]]  # a copy held here is kept, first
            assert f.copied == [[b"c"]] and f.removed == [b"d"] and f.left == 1
            assert sorted(r.take_acks()) == [1, 2, 3, 4]
        finally:
            await r.stop()

    asyncio.run(main())


def test_acks_of_a_failed_heartbeat_are_sent_on_the_next_one() -> None:
    f = Fakes()
    r = f.replicator()
    r._acks = [1, 2]  # as if applied
    acks = r.take_acks()
    r.restore_acks(acks)
    assert r.take_acks() == [1, 2]


def test_copies_are_applied_in_parts_several_in_flight_and_each_part_wakes_the_link() -> None:
    big = 10 << 20  # two commands per 16 MiB part would not fit: one part each

    class Held(Fakes):
        def __init__(self) -> None:
            super().__init__()
            self.release = threading.Event()
            self.inside = threading.Semaphore(0)

        def copy_from(self, items: Sequence[tuple[bytes, ClusterReplica]], ns: bytes
                      ) -> FetchResult:
            self.inside.release()
            assert self.release.wait(10)
            self.copied.append([k for k, _ in items])
            return FetchResult(num_found=len(items), num_fetched=len(items))

    async def main() -> None:
        f = Held()
        woken: list[int] = []
        r = Replicator(epoch=5, copy_from=f.copy_from, keep_copies=f.keep_copies,
                       remove=f.remove, leave=f.leave, on_applied=lambda: woken.append(1),
                       max_in_flight=2)
        cmds = [copy_cmd(i, bytes([i])) for i in range(1, 4)]
        for c in cmds:
            c.size_bytes = big
        await r.start()
        try:
            assert r.submit(cmds) == 3
            for _ in range(2):  # two parts copy at once, both held
                assert await asyncio.to_thread(f.inside.acquire, True, 10)
            assert r.num_parts_in_flight == 2  # the third waits for a slot
            assert r.take_acks() == [] and not r.idle.is_set()
            f.release.set()
            await asyncio.wait_for(r.idle.wait(), 10)
            assert sorted(r.take_acks()) == [1, 2, 3] and len(woken) == 3
            assert sorted(f.copied) == [[b"\x01"], [b"\x02"], [b"\x03"]]
        finally:
            await r.stop()

    asyncio.run(main())


def test_a_batch_is_split_by_bytes_and_a_leave_goes_alone() -> None:
    cmds = [copy_cmd(i, bytes([i])) for i in range(1, 5)]
    for c in cmds:
        c.size_bytes = 6 << 20
    drop = pb.NodeCommand(command_id=9, kind=pb.NODE_COMMAND_KIND_DROP, target_epoch=5,
                          namespace_id=NS, key=b"d")
    parts = Replicator.split([drop, *cmds])
    assert [[c.command_id for c in p] for p in parts] == [[9, 1, 2], [3, 4]]
    leave = pb.NodeCommand(command_id=8, kind=pb.NODE_COMMAND_KIND_LEAVE, target_epoch=5)
    assert Replicator.split([*cmds, leave]) == [[*cmds, leave]]


def test_peer_left_forgets_that_keeper_at_submit_before_anything_after_it_runs() -> None:
    async def main() -> None:
        f = Fakes(hold=threading.Event())
        gone: list[str] = []
        r = Replicator(epoch=5, copy_from=f.copy_from, keep_copies=f.keep_copies,
                       remove=f.remove, leave=f.leave, peer_left=gone.append)
        await r.start()
        try:
            left = pb.NodeCommand(command_id=1, kind=pb.NODE_COMMAND_KIND_PEER_LEFT,
                                  target_epoch=5, key=b"b")
            assert r.submit([left, copy_cmd(2, b"k")]) == 2
            assert gone == ["b"]  # at once, on the loop: before the worker starts the COPY
            f.hold.set()  # type: ignore[union-attr]
            await asyncio.wait_for(r.idle.wait(), 10)
            assert sorted(r.take_acks()) == [1, 2]
            assert r.submit([left]) == 0 and gone == ["b"]  # a resend: acked, not applied
        finally:
            await r.stop()

    asyncio.run(main())
