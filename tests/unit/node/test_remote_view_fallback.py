"""RemoteReads.fill while no master can tell where a block is (fail17, issue 17 §1): the
master unreachable (Unavailable, NotLeader), or a new leader still rebuilding its index
(``complete = false``). A block the master names nobody for is then asked of the peers of
the node's cached view, in parallel and bounded; the copy is verified by its holder (a
whole block with the generation of the replica it pinned; a holder that sends 0 is not
used). A master that answers complete never makes a read fan out.

Real source data planes in-process; the master is a stub the test controls. On main
(ac3888e) every read here with the master down or rebuilding was a miss.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from remote_helpers import DataPlanes, PerKeyMaster, key, local_bytes, make_core, with_generations

from kvstored.errors import NotLeader, Unavailable
from kvstored.node.core import NodeCore
from kvstored.node.remote import Found, Prefix, RemoteReads
from kvstored.node.spill import PeerRoom
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.types import Tier

BLOCK = 16 << 10


def value(i: int) -> bytes:
    return bytes([i % 251]) * (BLOCK // 2 + i)


class FailoverMaster(PerKeyMaster):
    """``mode``: "down" (lookups raise Unavailable), "notleader", "rebuilding" (answers
    ``complete = false`` and names what it has), "complete" (a plain, complete answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = "down"
        self.term = 0  # the answering leader's term (0: a master without terms)

    def lookup_each(self, namespace_id: bytes, keys: Sequence[bytes], local: str,
                    timeout_s: float, avoid: Sequence[str] = (), max_alternates: int = 0,
                    ) -> dict[int, ClusterReplica] | None:
        self.each_lookups += 1
        if self.mode == "down":
            raise Unavailable("UNAVAILABLE: failed to connect to all addresses (test)")
        if self.mode == "notleader":
            raise NotLeader("not the leader (test)")
        got = {i: self.replicas[k] for i, k in enumerate(keys) if k in self.replicas}
        return Found(got, complete=self.mode != "rebuilding", term=self.term)

    def lookup(self, namespace_id: bytes, keys: Sequence[bytes], local: str, timeout_s: float
               ) -> list[ClusterReplica]:
        if self.mode == "down":
            raise Unavailable("UNAVAILABLE: failed to connect to all addresses (test)")
        if self.mode == "notleader":
            raise NotLeader("not the leader (test)")
        return Prefix(super().lookup(namespace_id, keys, local, timeout_s),
                      complete=self.mode != "rebuilding", term=self.term)


@pytest.fixture
def planes() -> Iterator[DataPlanes]:
    p = DataPlanes()
    yield p
    p.close()


@pytest.fixture
def local() -> Iterator[NodeCore]:
    core = make_core("dst", block_bytes=BLOCK)
    yield core
    core.store.close()


def _source(planes: DataPlanes, name: str, ids: list[int], gens: dict[bytes, int] | None
            ) -> tuple[NodeCore, str]:
    src = make_core(name, block_bytes=BLOCK)
    for i in ids:
        src.put_inline([(key(i), value(i), b"")], b"")
    if gens is not None:
        with_generations(src, gens)
    return src, planes.serve(src)


def _reads(local: NodeCore, master: FailoverMaster, view: list[PeerRoom]) -> RemoteReads:
    return RemoteReads(local, node_id="dst", lookup=master.lookup, report=master.report,
                       lookup_each=master.lookup_each, peer_view=lambda: view)


@pytest.mark.parametrize("mode", ["down", "notleader", "rebuilding"])
def test_a_read_with_no_master_to_tell_finds_the_blocks_on_the_cached_peers(
        planes: DataPlanes, local: NodeCore, mode: str) -> None:
    _, a = _source(planes, "a", [0, 1, 2], None)  # the store's own generations
    _, b = _source(planes, "b", [3, 4], None)
    master = FailoverMaster()
    master.mode = mode
    view = [PeerRoom("a", a, 1 << 20), PeerRoom("b", b, 1 << 20), PeerRoom("dst", "x:1", 0)]
    reads = _reads(local, master, view)
    try:
        r = reads.fill([key(i) for i in range(6)], b"")
        assert (r.num_found, r.num_fetched) == (5, 5)
        assert local_bytes(local, list(range(6))) == [value(i) for i in range(5)] + [None]
        assert reads.num_view_fetched == 5
    finally:
        reads.close()


def test_a_complete_master_answer_never_fans_out(planes: DataPlanes, local: NodeCore) -> None:
    _, a = _source(planes, "a", [0], None)
    master = FailoverMaster()
    master.mode = "complete"  # the master names nobody for key 0: a miss, no peer asked
    exported: list[bytes] = []
    src_b, b = _source(planes, "b", [1], {})
    with_generations(src_b, {}, exported)
    reads = _reads(local, master, [PeerRoom("a", a, 1 << 20), PeerRoom("b", b, 1 << 20)])
    try:
        r = reads.fill([key(0), key(1)], b"")
        assert (r.num_found, r.num_fetched) == (0, 0)
        assert local_bytes(local, [0, 1]) == [None, None]
        assert exported == [] and reads.num_view_fetched == 0
    finally:
        reads.close()


def test_a_holder_that_sends_no_generation_is_not_used_and_each_block_comes_once(
        planes: DataPlanes, local: NodeCore) -> None:
    # a: an older node (generation 0 for everything): its copies are not verified by their
    # holder, so not used; b and c both hold block 1: one copy lands, none twice
    _, a = _source(planes, "a", [0], {})
    _, b = _source(planes, "b", [1], {key(1): 41})
    _, c = _source(planes, "c", [1, 2], {key(1): 42, key(2): 43})
    master = FailoverMaster()
    reads = _reads(local, master, [PeerRoom(n, addr, 1 << 20)
                                   for n, addr in (("a", a), ("b", b), ("c", c))])
    try:
        r = reads.fill([key(0), key(1), key(2)], b"")
        assert r.num_fetched == 2
        assert local_bytes(local, [0, 1, 2]) == [None, value(1), value(2)]
    finally:
        reads.close()


def test_the_fan_out_is_bounded_and_a_dead_peer_costs_only_itself(
        planes: DataPlanes, local: NodeCore) -> None:
    _, a = _source(planes, "a", [0], None)
    master = FailoverMaster()
    dead = PeerRoom("dead", "127.0.0.1:9", 1 << 20)  # connection refused
    view = [dead, PeerRoom("a", a, 1 << 20)]
    reads = _reads(local, master, view)
    try:
        assert reads.fill([key(0)], b"").num_fetched == 1
        assert "dead" in reads.suspects.current()  # tried last next time
        reads.max_view_peers = 1  # only the first (non-suspect) peer is asked
        view.insert(0, PeerRoom("b", "127.0.0.1:9", 1 << 20))
        assert reads.fill([key(5)], b"").num_fetched == 0
    finally:
        reads.close()


def _exports(core: NodeCore) -> list[bytes]:
    """The keys peers' GETs read from ``core`` (its own generations kept)."""
    seen: list[bytes] = []
    inner = core.store.read_for_export

    def read_for_export(keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[Any]:
        seen.extend(keys)
        return inner(keys, namespace_id=namespace_id)

    core.store.read_for_export = read_for_export  # type: ignore[method-assign]
    return seen


def test_a_complete_answer_of_a_new_leader_asks_the_peers_it_has_not_listed_healthy(
        planes: DataPlanes, local: NodeCore) -> None:
    # The fail17 miss: the new leader said complete=true once its rejoin grace (one node
    # lease) ran out, while a live holder (loaded, slow to follow the failover) had not
    # re-registered yet; its blocks were named nowhere and, the answer being complete, no
    # read asked anyone. On main this read fetched nothing (num_fetched 0).
    src_a, a = _source(planes, "a", [0], None)  # listed healthy by term 7: its word holds
    src_b, b = _source(planes, "b", [1], None)  # listed healthy by term 6 only (old leader)
    src_c, c = _source(planes, "c", [2], None)  # carried: term 7 lists it syncing / not yet
    asked = {"a": _exports(src_a), "b": _exports(src_b), "c": _exports(src_c)}
    master = FailoverMaster()
    master.mode, master.term = "complete", 7
    view = [PeerRoom("a", a, 1 << 20, synced_term=7), PeerRoom("b", b, 1 << 20, synced_term=6),
            PeerRoom("c", c, 1 << 20, synced_term=0)]
    reads = _reads(local, master, view)
    try:
        r = reads.fill([key(0), key(1), key(2)], b"")
        assert (r.num_found, r.num_fetched) == (2, 2)
        assert local_bytes(local, [0, 1, 2]) == [None, value(1), value(2)]
        assert asked["a"] == []  # term 7 has a's inventory: its "nobody" stands for a
        assert asked["b"] and asked["c"]
        # a suspect peer (it failed lately: maybe dead) is not asked past a complete answer
        reads.suspects.mark("c")
        asked["b"].clear()
        asked["c"].clear()
        local.store.remove([key(1), key(2)], namespace_id=b"")
        r = reads.fill([key(1), key(2)], b"")
        assert (r.num_fetched, asked["c"]) == (1, []) and asked["b"]
        reads.suspects.clear("c")
        # every peer listed healthy by the answering term: a true miss asks nobody
        for p in view:
            p.synced_term = 7
        asked["b"].clear()
        asked["c"].clear()
        r = reads.fill([key(3)], b"")
        assert (r.num_found, r.num_fetched) == (0, 0)
        assert asked == {"a": [], "b": [], "c": []}
    finally:
        reads.close()


@pytest.mark.parametrize("mode", ["down", "notleader", "rebuilding", "complete"])
def test_probes_ask_the_cached_peers_the_master_cannot_speak_for_and_read_nothing(
        planes: DataPlanes, local: NodeCore, mode: str) -> None:
    # Issue 17 item 2 (fail17b): on main an Exists or LookupPrefix during a failover answered
    # this node's blocks only, so the vLLM connector recomputed prefixes the pool held.
    # "complete": a new leader of term 7 that has not listed b healthy yet.
    src_a, a = _source(planes, "a", [0, 1], None)
    src_b, b = _source(planes, "b", [2, 3], None)
    read = {"a": _exports(src_a), "b": _exports(src_b)}
    master = FailoverMaster()
    master.mode, master.term = mode, 7
    view = [PeerRoom("a", a, 1 << 20, synced_term=7), PeerRoom("b", b, 1 << 20, synced_term=6)]
    if mode == "complete":  # term 7 has a's inventory: it names a's blocks itself
        for i in (0, 1):
            master.replicas[key(i)] = ClusterReplica("a", 1, Tier.DRAM, len(value(i)), 5, a)
    reads = _reads(local, master, view)
    keys = [key(i) for i in range(5)]
    try:
        present, tiers = reads.exists(b"", keys, [False] * 5, [None] * 5)
        assert present == [True, True, True, True, False]
        assert tiers == [Tier.DRAM] * 4 + [None]
        assert reads.extend_prefix(b"", keys, []) == [Tier.DRAM] * 4
        assert read == {"a": [], "b": []}  # a probe pins and reads nothing on the peers
        assert local_bytes(local, [0, 1, 2, 3]) == [None] * 4  # nor copies anything here
        if mode == "complete":  # every peer listed healthy by term 7: nobody is probed
            view[1].synced_term = 7
            before = reads.num_view_probed
            assert reads.exists(b"", keys, [False] * 5, [None] * 5)[0] == [True, True] + [False] * 3
            assert reads.num_view_probed == before
    finally:
        reads.close()


def test_a_probe_of_a_dead_peer_costs_only_itself(planes: DataPlanes, local: NodeCore) -> None:
    _, a = _source(planes, "a", [0], None)
    master = FailoverMaster()  # down
    view = [PeerRoom("dead", "127.0.0.1:9", 1 << 20), PeerRoom("a", a, 1 << 20)]
    reads = _reads(local, master, view)
    try:
        assert reads.exists(b"", [key(0), key(1)], [False, False], [])[0] == [True, False]
        assert "dead" in reads.suspects.current()
    finally:
        reads.close()
