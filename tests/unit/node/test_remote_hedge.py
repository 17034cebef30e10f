"""Hedged copies (kvstored/node/remote.py ``hedge_after_s``): a holder that accepted the
request but stays silent past the hedge delay has the same copy asked of the block's next
holder; the first verified copy commits, the silent holder's copy is discarded (its bytes
are never received into a slot, let alone committed), and the silent holder becomes suspect.
The master's COPY commands (``copy_from``) fall back or hedge to another surviving replica
the master names on a lookup that avoids the failed source.

Real source data planes in-process; the silent holder is a transport hook the test holds
(it answers only once the test releases it, or fails at the deadline like a SIGSTOPped
process), never a sleep. The hedge delay is short, but nothing asserts a time: the held
holder never answers before the read returns, so the outcome does not depend on it.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from remote_helpers import (
    DataPlanes,
    PerKeyMaster,
    key,
    local_bytes,
    make_core,
    make_reads,
    with_generations,
)

from kvstored.errors import DeadlineExceeded
from kvstored.node.core import NodeCore
from kvstored.node.metrics import NodeMetrics
from kvstored.transport.base import GetItem, Sink, Transport
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp import DataPlaneClient
from kvstored.types import Tier

BLOCK = 16 << 10
IDS = list(range(6))
HEDGE_S = 0.02


def value(i: int, *, holder: str = "b") -> bytes:
    """Block ``i``'s bytes on ``holder``: a's differ, so a byte of a's would show."""
    return bytes([(i + (100 if holder == "a" else 0)) % 251]) * (BLOCK // 2 + i)


@pytest.fixture
def planes() -> Iterator[DataPlanes]:
    p = DataPlanes()
    yield p
    p.close()


@pytest.fixture
def local() -> Iterator[NodeCore]:
    core = make_core("dst", block_bytes=BLOCK)
    core.metrics = NodeMetrics()
    yield core
    core.store.close()


def _holder(planes: DataPlanes, node_id: str, gen: int) -> ClusterReplica:
    """A live source ``node_id`` holding every block of IDS under generation ``gen + i``."""
    core = make_core(node_id, block_bytes=BLOCK)
    with_generations(core, {key(i): gen + i for i in IDS})
    for i in IDS:
        core.put_inline([(key(i), value(i, holder=node_id), b"")], b"")
    return ClusterReplica(node_id, 7, Tier.DRAM, 0, gen, planes.serve(core))


def _per_key(r: ClusterReplica, i: int) -> ClusterReplica:
    return dataclasses.replace(r, size_bytes=len(value(i)), generation=r.generation + i)


def _name(master: PerKeyMaster, first: ClusterReplica, *others: ClusterReplica) -> None:
    for i in IDS:
        master.replicas[key(i)] = dataclasses.replace(
            _per_key(first, i), alternates=tuple(_per_key(o, i) for o in others))


class Silent:
    """Peer transports by address; the one to ``silent_address`` holds its GET (accepted,
    never answered) until :attr:`release` is set, then forwards it, recording what the
    read's sink gave it for each block; unreleased at the deadline it fails like a silent
    peer (DeadlineExceeded)."""

    def __init__(self, silent_address: str) -> None:
        self.silent_address = silent_address
        self.release = threading.Event()
        self.entered = threading.Event()
        self.finished = threading.Event()
        self.sink_gave: list[bool] = []  # per block the silent holder sent: a view given
        self._clients: dict[str, DataPlaneClient] = {}

    def transport_for(self, address: str) -> Transport:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = DataPlaneClient(
                address, max_block_bytes=BLOCK, peer_export=True)
        if address != self.silent_address:
            return client
        return _Held(self, client)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()


class _Held:
    def __init__(self, silent: Silent, inner: DataPlaneClient) -> None:
        self.silent, self.inner = silent, inner

    def get(self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *,
            deadline: float) -> list[GetItem]:
        s = self.silent
        s.entered.set()
        try:
            if not s.release.wait(max(0.0, deadline - time.monotonic())):
                raise DeadlineExceeded("the silent holder did not answer within the deadline")

            def recording(i: int, size: int, meta: bytes) -> memoryview | None:
                view = sink(i, size, meta)
                s.sink_gave.append(view is not None)
                return view

            return self.inner.get(keys, namespace_id, recording, deadline=time.monotonic() + 10)
        finally:
            s.finished.set()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def _remote_blocks(core: NodeCore, outcome: str) -> float:
    assert core.metrics is not None
    v = core.metrics.registry.get_sample_value("kvstored_remote_blocks_total",
                                               {"outcome": outcome})
    return v or 0.0


def test_a_silent_holders_read_is_served_by_the_hedge_and_its_late_bytes_are_discarded(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    a, b = _holder(planes, "a", 100), _holder(planes, "b", 200)
    _name(master, a, b)
    silent = Silent(a.data_address)
    reads = make_reads(local, master, lookup_each=master.lookup_each, fetch_timeout_s=30,
                       transport_for=silent.transport_for, hedge_after_s=HEDGE_S)
    try:
        got = reads.fill([key(i) for i in IDS], b"")
        assert silent.entered.is_set()  # a was asked first, and never answered
        assert (got.num_fetched, got.num_failed, got.num_fallbacks, got.num_hedged,
                got.num_hedge_won) == (6, 0, 0, 6, 6)
        assert local_bytes(local, IDS) == [value(i) for i in IDS]  # b's bytes
        assert reads.suspects.current() == ["a"]  # the silent holder is suspect at once
        assert (_remote_blocks(local, "hedged"), _remote_blocks(local, "hedge_won"),
                _remote_blocks(local, "fetched")) == (6, 6, 6)
        # a answers now, after the read returned: every block it sends is discarded
        silent.release.set()
        assert silent.finished.wait(30)
        assert silent.sink_gave == [False] * 6  # no slot for a's bytes, none committed
        assert local_bytes(local, IDS) == [value(i) for i in IDS]
        assert not local.store._state.pending  # no reservation left behind  # noqa: SLF001
        assert reads.wait_reports()
        assert ("a", 7, False) not in master.reports  # a answered in the end: not failed
    finally:
        reads.close()
        silent.close()


def test_without_hedging_the_silent_holder_costs_the_read_its_deadline(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    a, b = _holder(planes, "a", 100), _holder(planes, "b", 200)
    _name(master, a, b)
    silent = Silent(a.data_address)
    reads = make_reads(local, master, lookup_each=master.lookup_each, fetch_timeout_s=0.5,
                       transport_for=silent.transport_for, hedge_after_s=0.0)
    try:
        got = reads.fill([key(i) for i in IDS], b"")
        assert (got.num_fetched, got.num_failed, got.num_hedged) == (0, 6, 0)
        assert local_bytes(local, IDS) == [None] * 6
        assert _remote_blocks(local, "hedged") == 0
    finally:
        silent.release.set()
        reads.close()
        silent.close()


def test_a_hedged_read_of_healthy_holders_takes_the_first_copy_and_commits_each_block_once(
    planes: DataPlanes, local: NodeCore
) -> None:
    """a answers, only later than the hedge delay: both copies may arrive; one commits."""
    master = PerKeyMaster()
    a, b = _holder(planes, "a", 100), _holder(planes, "b", 200)
    _name(master, a, b)
    silent = Silent(a.data_address)
    reads = make_reads(local, master, lookup_each=master.lookup_each, fetch_timeout_s=30,
                       transport_for=silent.transport_for, hedge_after_s=HEDGE_S)
    # a answers once b's copy is under way: b's first block is announced
    inner = silent.transport_for(b.data_address)

    class ReleaseOnB:
        def get(self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *,
                deadline: float) -> list[GetItem]:
            def s(i: int, size: int, meta: bytes) -> memoryview | None:
                silent.release.set()
                return sink(i, size, meta)
            return inner.get(keys, namespace_id, s, deadline=deadline)

        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

    reads._transport_for = lambda addr: (ReleaseOnB() if addr == b.data_address  # noqa: SLF001
                                         else silent.transport_for(addr))
    try:
        got = reads.fill([key(i) for i in IDS], b"")
        assert got.num_hedged == 6 and got.num_fetched == 6 and got.num_failed == 0
        assert silent.finished.wait(30)
        stored = local_bytes(local, IDS)
        # each block is one holder's whole copy, never a mix, and only once
        assert all(v in (value(i), value(i, holder="a")) for i, v in zip(IDS, stored, strict=True))
        assert not local.store._state.pending  # noqa: SLF001
    finally:
        reads.close()
        silent.close()


def _dead_address() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def _copy_items(source: ClusterReplica) -> list[tuple[bytes, ClusterReplica]]:
    return [(key(i), _per_key(source, i)) for i in IDS]


def test_a_copy_command_whose_source_is_dead_copies_from_another_replica(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    dead = ClusterReplica("a", 7, Tier.DRAM, 0, 100, _dead_address())
    c = _holder(planes, "c", 300)
    _name(master, c)  # what the master names on a lookup avoiding a: c
    reads = make_reads(local, master, lookup_each=master.lookup_each)
    try:
        got = reads.copy_from(_copy_items(dead), b"")
        assert (got.num_fetched, got.num_failed, got.num_fallbacks) == (6, 0, 6)
        assert master.avoids == [["a", "dst"]]  # the failed source and this node ranked last
        assert local_bytes(local, IDS) == [value(i, holder="c") for i in IDS]
        assert _remote_blocks(local, "fallback") == 6
    finally:
        reads.close()


def test_a_copy_command_whose_source_is_silent_is_hedged_to_another_replica(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    a, c = _holder(planes, "a", 100), _holder(planes, "c", 300)
    _name(master, c, a)
    silent = Silent(a.data_address)
    reads = make_reads(local, master, lookup_each=master.lookup_each, fetch_timeout_s=30,
                       transport_for=silent.transport_for, hedge_after_s=HEDGE_S)
    try:
        got = reads.copy_from(_copy_items(a), b"")
        assert (got.num_fetched, got.num_failed, got.num_hedged, got.num_hedge_won) == (6, 0, 6, 6)
        assert local_bytes(local, IDS) == [value(i, holder="c") for i in IDS]
        assert (_remote_blocks(local, "hedged"), _remote_blocks(local, "hedge_won")) == (6, 6)
    finally:
        silent.release.set()
        assert silent.finished.wait(30)
        assert silent.sink_gave == [False] * 6
        reads.close()
        silent.close()


def test_a_copy_command_without_hedging_does_not_hedge_and_misses_a_silent_source(
    planes: DataPlanes, local: NodeCore
) -> None:
    master = PerKeyMaster()
    a, c = _holder(planes, "a", 100), _holder(planes, "c", 300)
    _name(master, c)
    silent = Silent(a.data_address)
    reads = make_reads(local, master, lookup_each=master.lookup_each, fetch_timeout_s=0.5,
                       transport_for=silent.transport_for)
    try:
        got = reads.copy_from(_copy_items(a), b"")
        assert (got.num_fetched, got.num_failed, got.num_hedged) == (0, 6, 0)
    finally:
        silent.release.set()
        reads.close()
        silent.close()


def test_hedge_after_must_not_be_negative() -> None:
    from kvstored.config import ClusterConfig, load_config
    from kvstored.errors import ConfigInvalid

    with pytest.raises(ValueError, match=r"hedge_after_ms must be >= 0 milliseconds \(0 = off\)"):
        ClusterConfig(hedge_after_ms=-5)
    with pytest.raises(ConfigInvalid) as info:  # the value is named once, by the formatter
        load_config(overrides={"cluster": {"hedge_after_ms": -5}}, environ={})
    assert str(info.value).count("-5") == 1, str(info.value)
    assert "cluster.hedge_after_ms" in str(info.value) and "(got -5)" in str(info.value)
    assert ClusterConfig().hedge_after_ms == 100 and ClusterConfig(hedge_after_ms=0).hedge_after_ms == 0
    core = make_core("x", block_bytes=BLOCK)
    try:
        with pytest.raises(ValueError, match="hedge_after_s must be >= 0 seconds"):
            make_reads(core, PerKeyMaster(), hedge_after_s=-0.1)
    finally:
        core.store.close()


def test_a_hedge_to_a_dead_holder_goes_on_to_the_next_while_the_silent_one_stays_silent(
    planes: DataPlanes, local: NodeCore
) -> None:
    """The master names a dead x first for the other holders (its lease has not lapsed
    yet): the hedge to x fails at once and goes on to c, not at the silent a's deadline."""
    master = PerKeyMaster()
    a, c = _holder(planes, "a", 100), _holder(planes, "c", 300)
    dead = ClusterReplica("x", 7, Tier.DRAM, 0, 500, _dead_address())
    _name(master, dead, c)
    silent = Silent(a.data_address)
    reads = make_reads(local, master, lookup_each=master.lookup_each, fetch_timeout_s=30,
                       transport_for=silent.transport_for, hedge_after_s=HEDGE_S)
    try:
        got = reads.copy_from(_copy_items(a), b"")
        assert (got.num_fetched, got.num_failed, got.num_hedged, got.num_fallbacks,
                got.num_hedge_won) == (6, 0, 6, 6, 6)
        assert local_bytes(local, IDS) == [value(i, holder="c") for i in IDS]
        assert not silent.finished.is_set()  # a never answered: served without it
    finally:
        silent.release.set()
        assert silent.finished.wait(30)
        reads.close()
        silent.close()


def test_a_negative_hedge_after_ms_is_a_config_error_naming_the_setting() -> None:
    from kvstored.config import load_config
    from kvstored.errors import ConfigInvalid

    with pytest.raises(ConfigInvalid, match=r"cluster.hedge_after_ms.*\(got '-1'\)$"):
        load_config(environ={"KVSTORED_CLUSTER__HEDGE_AFTER_MS": "-1"})
    assert load_config(environ={"KVSTORED_CLUSTER__HEDGE_AFTER_MS": "0"}).cluster.hedge_after_ms == 0
