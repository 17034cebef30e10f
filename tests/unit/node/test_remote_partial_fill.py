"""RemoteReads.fill keeps the blocks of a peer GET that arrived whole before it failed.

A real source data plane in-process (one block per GET chunk, so its ``get_before_send``
hook runs before each block goes out) and a master the test controls. The source breaks
the connection after N of M blocks, holds it until the reader's deadline passed, or cuts
one block's payload in half; the reader must commit exactly the N blocks that arrived
whole (with the source's bytes), count the rest failed, and never commit the torn one.
No sleeps: the hold waits on an Event under a hang guard.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import key, tear_payload_at
from remote_helpers import (
    FakeMaster,
    local_bytes,
    local_fixture,
    make_core,
    make_reads,
    with_generations,
)

from kvstored.node.core import NodeCore
from kvstored.transport import tcp_server
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import Tier

BLOCK = 64 << 10
M = 24
N = 10
GEN = 5
HANG_GUARD_S = 10.0

local = local_fixture(BLOCK)


def value(i: int) -> bytes:
    return bytes([(i * 13 + 3) % 251]) * (BLOCK // 2 + i)


class Source:
    """Node ``src`` holding blocks 0..M-1 under generation GEN, each named by ``master``;
    ``on_before_send(start)`` runs on its connection thread before each block is sent."""

    def __init__(self, master: FakeMaster) -> None:
        self.core = make_core("src", block_bytes=BLOCK)
        with_generations(self.core, {key(i): GEN for i in range(M)})
        self.on_before_send: Any = None
        self.server = DataPlaneServer(self.core, "127.0.0.1:0", hook=self._hook)
        self.server.get_chunk_keys = 1
        self.server.export_chunk_keys = 1  # RemoteReads reads with GET_FLAG_PEER_EXPORT
        self.address = self.server.start()
        for i in range(M):
            self.core.put_inline([(key(i), value(i), b"m")], b"")
            master.replicas[key(i)] = ClusterReplica("src", 7, Tier.DRAM, len(value(i)), GEN,
                                                     self.address)

    def _hook(self, event: str, **fields: Any) -> None:
        if event == "get_before_send" and self.on_before_send is not None:
            self.on_before_send(fields["start"])

    def close(self) -> None:
        self.server.stop(0.0)
        self.core.store.close()


@pytest.fixture
def master() -> FakeMaster:
    return FakeMaster()


@pytest.fixture
def source(master: FakeMaster) -> Iterator[Source]:
    s = Source(master)
    yield s
    s.close()


def _dram(core: NodeCore) -> Any:
    return next(t for t in core.store.stats().tiers if t.tier == Tier.DRAM)


def _check_kept_then_rest(source: Source, local: NodeCore, master: FakeMaster,
                          got: Any) -> None:
    """N fetched with the source's bytes, M - N failed and absent, the peer reported; then
    a clean fill copies the rest, and the aborted reservations held no space."""
    assert (got.num_found, got.num_fetched, got.num_dropped, got.num_failed) == (M, N, 0, M - N)
    assert local_bytes(local, list(range(M))) == [value(i) for i in range(N)] + [None] * (M - N)
    assert _dram(local).num_blocks == N
    source.on_before_send = None
    reads = make_reads(local, master)
    try:
        again = reads.fill([key(i) for i in range(M)], b"")
    finally:
        reads.close()
    assert (again.num_fetched, again.num_failed) == (M - N, 0)
    assert local_bytes(local, list(range(M))) == [value(i) for i in range(M)]
    assert _dram(local).used_bytes == _dram(source.core).used_bytes


def test_a_connection_broken_after_n_blocks_keeps_those_n(
    source: Source, local: NodeCore, master: FakeMaster
) -> None:
    def break_at_n(start: int) -> None:
        if start == N:
            raise ConnectionResetError("test: connection broken after N blocks")

    source.on_before_send = break_at_n
    reads = make_reads(local, master)
    try:
        got = reads.fill([key(i) for i in range(M)], b"")
        assert reads.wait_reports()
        assert master.reports == [("src", 7, False)]  # the failure is reported as before
    finally:
        reads.close()
    _check_kept_then_rest(source, local, master, got)


def test_a_deadline_passing_after_n_blocks_keeps_those_n(
    source: Source, local: NodeCore, master: FakeMaster
) -> None:
    release = threading.Event()
    source.on_before_send = lambda start: release.wait(HANG_GUARD_S) if start == N else None
    reads = make_reads(local, master, fetch_timeout_s=0.5)  # the hold outlasts it
    try:
        got = reads.fill([key(i) for i in range(M)], b"")
    finally:
        release.set()
        reads.close()
    _check_kept_then_rest(source, local, master, got)


def test_a_block_torn_mid_payload_is_never_committed(
    source: Source, local: NodeCore, master: FakeMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    source.on_before_send = tear_payload_at(monkeypatch, tcp_server, N)
    reads = make_reads(local, master)
    try:
        got = reads.fill([key(i) for i in range(M)], b"")
    finally:
        reads.close()
    monkeypatch.undo()  # the real send_all again, for the clean second fill
    _check_kept_then_rest(source, local, master, got)
