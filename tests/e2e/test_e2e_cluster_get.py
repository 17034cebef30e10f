"""Reads across the pool, with a real master and three real nodes on loopback ports.

Blocks put through one node are found (lookup_prefix, exists) and read (get) through another,
with identical bytes; probes copy nothing; a SIGKILLed holder's blocks are misses at once
and leave the index within its lease; a holder whose data port blackholes (SIGSTOP) is a
miss within the fetch deadline, turns unhealthy after the master's failure count, and the
other replica serves from then on.

Waits poll observable state (the master's node list and index) with a deadline; no sleeps
stand in for synchronisation. The copy-versus-generation races are pinned in-process by
tests/unit/node/test_remote_reads.py.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import (
    MasterProcess,
    NodeProcess,
    _indexed,
    _keys,
    _nodes,
    _put,
    _wait,
    start_each,
    start_master,
    wait_healthy,
)
from e2e_helpers import value_for

from kvstored import Client
from kvstored.client.master import MasterClient

FETCH_TIMEOUT_S = 1.0
SLACK_S = 3.0  # scheduling noise of a loaded 2-core machine, on top of the fetch deadline


def _cluster(workdir: Path, procs: list[Any], *, lease_s: float | None = None
             ) -> tuple[MasterProcess, list[NodeProcess]]:
    master = start_master(workdir, procs, lease_s=lease_s)
    nodes = [NodeProcess(workdir / name, master.address, name) for name in ("n1", "n2", "n3")]
    for n in nodes:
        n.env["KVSTORED_CLUSTER__REMOTE_FETCH_TIMEOUT_S"] = str(FETCH_TIMEOUT_S)
    start_each(nodes, procs)
    wait_healthy(master.address, {"n1", "n2", "n3"})
    return master, nodes


def test_put_through_one_node_get_through_another_and_a_killed_holder_misses(
    workdir: Path, procs: list[Any]
) -> None:
    master, (n1, n2, n3) = _cluster(workdir, procs)
    a, b, absent = _keys(4), _keys(4), _keys(1)
    _put(n1, a)
    _put(n2, b)
    with MasterClient(master.address) as m:
        _wait("a indexed on n1", lambda: _indexed(m, a, "n1"))
        _wait("b indexed on n2", lambda: _indexed(m, b, "n2"))
    with Client(n3.unix_address) as c:
        # the cluster's longest prefix, across two holders, through a third node
        assert c.lookup_prefix(a + b + absent) == 8
        assert c.lookup_prefix(b + absent + a) == 4
        assert c.exists(a + absent + b) == [True] * 4 + [False] + [True] * 4
        assert c.list_blocks()[0] == []  # probes never fetch
        got = c.get(a + b + absent)
        assert got == [value_for(k) for k in a + b] + [None]
        assert {blk.key for blk in c.list_blocks()[0]} == set(a + b)  # copies in n3's DRAM
        assert c.get(a) == [value_for(k) for k in a]  # now local hits
    g = _keys(3)  # the engine's zero-copy path (get_into) sees the pool too
    _put(n2, g)
    with MasterClient(master.address) as m:
        _wait("g indexed on n2", lambda: _indexed(m, g, "n2"))
    with Client(n3.unix_address) as c:
        bufs = [bytearray(len(value_for(k)) + 7) for k in g]
        assert c.get_into(g, bufs) == [len(value_for(k)) for k in g]
        assert [bytes(b[: len(value_for(k))]) for b, k in zip(bufs, g, strict=True)] == [
            value_for(k) for k in g]
    with MasterClient(master.address) as m:  # n3 reports its copies like any put
        _wait("the copies indexed on n3", lambda: _indexed(m, a + b, "n3"))

    # exists answers each key, however many cluster-wide misses lie between them (it used
    # to look up at most 8 runs: the keys after the 8th miss read False)
    many, gaps = _keys(12), _keys(12)
    _put(n2, many)
    with MasterClient(master.address) as m:
        _wait("many indexed on n2", lambda: _indexed(m, many, "n2"))
    with Client(n1.unix_address) as c:
        assert c.exists([k for pair in zip(many, gaps, strict=True) for k in pair]) == [
            True, False] * 12
        assert c.list_blocks()[0] and not set(many) & {x.key for x in c.list_blocks()[0]}

    # SIGKILL the only holder of c_keys: misses at once (never wrong bytes), and gone from
    # the index once its lease lapses
    c_keys = _keys(4)
    _put(n1, c_keys)
    with MasterClient(master.address) as m:
        _wait("c indexed on n1", lambda: _indexed(m, c_keys, "n1"))
    n1.kill()
    with Client(n3.unix_address) as c:
        t0 = time.monotonic()
        assert c.get(c_keys, timeout_s=30) == [None] * 4
        assert time.monotonic() - t0 < FETCH_TIMEOUT_S + SLACK_S
        _wait("n1 out of the cluster", lambda: "n1" not in _nodes(master.address))
        with MasterClient(master.address) as m:
            got, _ = m.lookup_prefix(b"", c_keys, local_node_id="n3")
            assert got == []
        assert c.get(c_keys) == [None] * 4
        assert c.get(a) == [value_for(k) for k in a]  # n3's own copies outlive their source
    assert "remote_fetch_failed" in n3.log()


def test_a_blackholed_holder_is_a_miss_within_the_deadline_then_unhealthy_then_heals(
    workdir: Path, procs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a long node lease: the stopped node stays a member, so only the transfer failures
    # can take it out of lookups; continued, it heartbeats and is tried again after 2 s
    monkeypatch.setenv("KVSTORED_MASTER__UNHEALTHY_RETRY_S", "2")
    master, (n1, n2, n3) = _cluster(workdir, procs, lease_s=120.0)
    only_n2, both = _keys(3), _keys(3)
    _put(n2, only_n2 + both)
    _put(n1, both)
    with MasterClient(master.address) as m:
        _wait("only_n2 indexed", lambda: _indexed(m, only_n2, "n2"))
        _wait("both indexed on n1", lambda: _indexed(m, both, "n1"))
        _wait("both indexed on n2", lambda: _indexed(m, both, "n2"))
    assert n2.proc is not None
    n2.proc.send_signal(signal.SIGSTOP)  # its kernel still accepts connections; nothing answers
    try:
        with Client(n3.unix_address) as c:
            for _ in range(3):  # unhealthy_after_failures (3) failed transfers
                t0 = time.monotonic()
                assert c.get(only_n2, timeout_s=30) == [None] * 3
                assert time.monotonic() - t0 < FETCH_TIMEOUT_S + SLACK_S
            _wait("n2 unhealthy (reports are sent in the background)",
                  lambda: _nodes(master.address)["n2"]["health"] == "unhealthy")
            # n2 is no longer chosen: the other replica serves
            assert c.get(both, timeout_s=30) == [value_for(k) for k in both]
            assert c.get(only_n2, timeout_s=30) == [None] * 3  # no readable replica: a miss
    finally:
        n2.proc.send_signal(signal.SIGCONT)
    # SIGCONT: n2 heartbeats, is put on probation after the retry time (its replicas are
    # named again), the read through n3 succeeds and that success heals it
    with Client(n3.unix_address) as c:
        _wait("n2's blocks readable through n3 again",
              lambda: c.get(only_n2, timeout_s=30) == [value_for(k) for k in only_n2])
    _wait("n2 healthy again", lambda: _nodes(master.address)["n2"]["health"] == "healthy")
    log = n3.log()
    assert "peer_transfer_reported" in log and "remote_fetch_failed" in log
    assert "node_on_probation" in master.log_path.read_text()
