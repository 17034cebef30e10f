"""Replicas, repair and drain in a real cluster (issue 17 §2): one master and three nodes.

- ``put(replicas=2)`` through node a (a holds every block, b or c the second replica);
  SIGKILL a: every block is still served, with its bytes, through both survivors, and the
  master re-creates the lost replicas (each block on b and c; bounded by ``WAIT_S``, the
  time taken is printed). ``SetReplication`` (the admin path) is run by test_readme_repair.
- a holder that comes back: a (every block's first replica) is SIGSTOPped past its lease,
  the repair re-creates its replicas on b and c, then SIGCONT: a re-registers with its
  blocks (3 originals each) and the master DROPs one per block, back to 2, every block
  still served with its bytes.
- drain under read load: a reader thread reads every block in a loop through a small node
  (its copies churn, so it keeps copying from the holder) while ``kvstorectl drain``
  re-homes the drained node's blocks; the node is listed as draining, then leaves; 0 failed
  engine reads (every get returned every block's bytes).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import (
    WAIT_S,
    NodeProcess,
    _ctl,
    _indexed,
    _keys,
    _nodes,
    _put,
    _wait,
    start_master,
    start_nodes,
    wait_healthy,
)
from e2e_helpers import value_for

from kvstored import Client
from kvstored.client.master_admin import MasterAdminClient

LEASE_S = 3.0


def _originals(m: MasterAdminClient, keys: list[bytes]) -> list[list[str]]:
    """Per key: the nodes holding a readable, committed original (copies not counted)."""
    per, _ = m.list_replicas(b"", keys)
    return [sorted({r["node_id"] for r in reps
                    if not r["copy"] and r["readable"] and r["state"] == "committed"})
            for reps in per]


def test_replicas_2_sigkill_one_holder_every_block_served_and_lost_replicas_recreated(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs, lease_s=LEASE_S)
    nodes = [NodeProcess(workdir / n, master.address, n, dram_size="16MiB") for n in "abc"]
    start_nodes(nodes, procs, {})
    wait_healthy(master.address, {"a", "b", "c"})
    keys = _keys(24)
    with Client(nodes[0].unix_address) as c:  # a holds the first replica, writes the second
        got = c.put(keys, [value_for(k) for k in keys], replicas=2)
        assert [r.replicas_written for r in got] == [2] * len(keys)
    with MasterAdminClient(master.address, timeout_s=10) as m:
        _wait("2 originals per block", lambda: all(len(h) == 2 for h in _originals(m, keys)))
        assert all(h[0] == "a" for h in _originals(m, keys))
        nodes[0].kill()  # SIGKILL the holder of every block
        t0 = time.monotonic()
        _wait("a's lease lapsed", lambda: "a" not in _nodes(master.address))
        for n in nodes[1:]:
            with Client(n.unix_address) as c:
                assert c.get(keys, timeout_s=30) == [value_for(k) for k in keys], n.node_id
        _wait("lost replicas re-created on b and c",
              lambda: all(h == ["b", "c"] for h in _originals(m, keys)))
        print(f"repair: {len(keys)} lost replicas re-created {time.monotonic() - t0:.1f} s "
              f"after the SIGKILL (node lease {LEASE_S} s)")


def test_a_holder_that_comes_back_after_repair_has_the_extra_replicas_dropped(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs, lease_s=LEASE_S)
    nodes = [NodeProcess(workdir / n, master.address, n, dram_size="16MiB") for n in "abc"]
    start_nodes(nodes, procs, {})
    wait_healthy(master.address, {"a", "b", "c"})
    keys = _keys(16)
    want = [value_for(k) for k in keys]
    with Client(nodes[0].unix_address) as c:
        got = c.put(keys, want, replicas=2)
        assert [r.replicas_written for r in got] == [2] * len(keys)
    with MasterAdminClient(master.address, timeout_s=10) as m:
        _wait("2 originals per block", lambda: all(len(h) == 2 for h in _originals(m, keys)))
        nodes[0].proc.send_signal(signal.SIGSTOP)  # a is gone for the master, not dead
        try:
            _wait("a's lease lapsed", lambda: "a" not in _nodes(master.address))
            _wait("lost replicas re-created on b and c",
                  lambda: all(h == ["b", "c"] for h in _originals(m, keys)))
        finally:
            nodes[0].proc.send_signal(signal.SIGCONT)
        _wait("a re-registered", lambda: _nodes(master.address).get("a", {}).get("health")
              == "healthy")
        # the nodes' own stores (a kept all 16 through its pause: 48 replicas): one replica
        # of each block dropped (a's or a repaired one), none below 2
        _wait("one extra replica of each block dropped",
              lambda: sum(held(nodes, keys)) == 2 * len(keys))
        assert all(len(h) == 2 for h in _originals(m, keys))
        for n in nodes:
            with Client(n.unix_address) as c:
                assert c.get(keys, timeout_s=30) == want, n.node_id


def held(nodes: list[NodeProcess], keys: list[bytes]) -> list[int]:
    """How many of ``keys`` each node's own store lists (its truth, not the index)."""
    want = set(keys)
    out = []
    for n in nodes:
        with Client(n.unix_address) as c:
            listed, _ = c.list_blocks(None)
            out.append(len({b.key for b in listed} & want))
    return out


def test_drain_under_read_load_fails_no_engine_read(
    workdir: Path, procs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1 MiB/s of repair: most of a's ~13 MiB is re-homed by keeping the reader's copies
    # (no transfer) as it reads them, so a leaves only once the paced reader got there
    monkeypatch.setenv("KVSTORED_MASTER__REPAIR_BYTES_PER_S", "1MiB")
    master = start_master(workdir, procs, lease_s=LEASE_S)
    nodes = [NodeProcess(workdir / n, master.address, n, dram_size="32MiB") for n in "abc"]
    start_nodes(nodes, procs, {})
    wait_healthy(master.address, {"a", "b", "c"})
    keys = _keys(96)  # ~13 MiB, all on a
    _put(nodes[0], keys)
    want = [value_for(k) for k in keys]
    stop = threading.Event()
    reads = {"ok": 0, "failed": 0}
    errors: list[str] = []

    def reader() -> None:
        # passes alternate between c and b, 4 blocks per get: a pass through a node that
        # has not read the blocks yet copies each one from its holder (a, mid-move, or its
        # new holder once a left); later passes read their copies
        clients = [Client(nodes[2].unix_address), Client(nodes[1].unix_address)]
        try:
            n = 0
            while not stop.is_set():
                c = clients[n % 2]
                n += 1
                for i in range(0, len(keys), 4):
                    try:
                        got = c.get(keys[i:i + 4], timeout_s=10)
                    except Exception as exc:  # counted, shown below
                        errors.append(repr(exc))
                        reads["failed"] += 4
                        continue
                    for g, w in zip(got, want[i:i + 4], strict=True):
                        reads["ok" if g == w else "failed"] += 1
                    if stop.wait(0.05):  # an engine's pace, not a synchronisation
                        return
        finally:
            for c in clients:
                c.close()

    with MasterAdminClient(master.address, timeout_s=10) as m:
        _wait("a's blocks indexed", lambda: _indexed(m, keys, "a"))
        t = threading.Thread(target=reader, daemon=True)
        try:
            out = _ctl(master.address, "drain", "a", "--no-wait", "--output", "json")
            t.start()
            assert out.returncode == 0, out.stderr
            started = json.loads(out.stdout)
            assert started["num_blocks"] == len(keys) and started["num_blocks_to_move"] > 0
            listed = m.list_nodes()["nodes"]
            assert [n["draining"] for n in listed if n["node_id"] == "a"] == [True]
            at_drain = reads["ok"]
            out = _ctl(master.address, "drain", "a", "--wait-s", str(WAIT_S), "--output", "json")
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["left"] is True
            assert set(_nodes(master.address)) == {"b", "c"}
            assert reads["ok"] > at_drain  # the reads ran during the drain
            done = reads["ok"]
            _wait("two passes after a left", lambda: reads["ok"] >= done + 2 * len(keys))
        finally:
            stop.set()
            t.join(30)
        assert all(len(h) == 1 and h != ["a"] for h in _originals(m, keys))
    assert (reads["failed"], errors) == (0, [])
    assert "master_left_drained" in nodes[0].log()
