"""Puts and reads while the leading master fails over (issue 17, the tester's fail17 report).

etcd, two ``kvstored master --etcd`` and three nodes found through ``etcd://``: writer A puts
with ``replicas=2`` through n0, writer B with one replica through n1. The leader is SIGKILLed
mid-storm; from that moment readers read through n2 and n0 every block B had committed before
the kill (held only by n1, a live node; never read before, so no node has a copy), spread
over the failover, while the test waits for the new leader to answer ``complete=true``.

Asserted, with real processes:

- no wrong byte, ever;
- 0 misses: a node that misses locally while no master answers (or while the new leader is
  still rebuilding its index) finds the block on a peer of its cached view;
- no put reports ``NoCapacity`` while the peers are nearly empty: each put during the
  failover has its 2 replicas (the node placed the second through its cached peer view) or
  reports 1 with a reason naming the master's unavailability; and the new leader learns the
  replicas placed without it (the factor-2 blocks A put during the failover have 2 holders).

Before this change (main at ac3888e) the reads missed for the whole failover and the puts
reported NoCapacity("no other node has room") once the new leader answered.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import WAIT_S, NodeProcess, _wait, leader_of, start_nodes, wait_healthy
from cluster_helpers import ha_master as cluster_ha_master
from e2e_helpers import small_value_for
from etcd_helpers import EtcdServer

from kvstored import Client
from kvstored.client.master import MasterClient
from kvstored.client.master_admin import MasterAdminClient
from kvstored.errors import DeadlineExceeded, NotLeader, Unavailable

pytestmark = pytest.mark.etcd
HERE = Path(__file__).parent
PREFIX = "/kvfo"
ELECTION_LEASE_S = 3
NODE_LEASE_S = 3.0
READ_SPREAD_S = 12.0  # the pre-kill blocks are read over about this long (pacing, not a check)


def _lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().split("\n"):
        parts = line.split(" ", 5)
        if len(parts) >= 5 and len(parts[0]) == 32:
            out.append(parts)
    return out



def test_puts_and_reads_while_the_leader_is_sigkilled_find_the_live_peers(
        workdir: Path, procs: list[Any], etcd: EtcdServer) -> None:
    masters = [cluster_ha_master(workdir, n, etcd.url(i), prefix=PREFIX,
                                 election_lease_s=ELECTION_LEASE_S, lease_s=NODE_LEASE_S)
               for i, n in enumerate(("ma", "mb"))]
    for m in masters:
        procs.append(m)
        m.start()
    both = ",".join(m.address for m in masters)
    leader_address, old_term = _wait("a leader", lambda: leader_of(both)[0] and leader_of(both))
    leader = next(m for m in masters if m.address == leader_address)
    via_etcd = f"etcd://{etcd.endpoints[0]},{etcd.endpoints[1]}{PREFIX}"
    nodes = [NodeProcess(workdir / f"n{i}", via_etcd, f"n{i}", dram_size="32MiB")
             for i in range(3)]
    # a loaded runner's slow copies must not fail as deadlines (each failure is reported and
    # 3 make the new leader call the holder unhealthy: its blocks named nowhere for a while)
    start_nodes(nodes, procs, {"KVSTORED_CLUSTER__REMOTE_FETCH_TIMEOUT_S": "10"})
    wait_healthy(both, {"n0", "n1", "n2"})

    stop = workdir / "stop"
    outs = [workdir / "a.keys", workdir / "b.keys"]
    writers = [subprocess.Popen(
        [sys.executable, str(HERE / "e2e_failover_writer.py"), nodes[i].unix_address, str(i),
         str(2 - i), str(outs[i]), str(stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=nodes[i].env)
        for i in range(2)]
    wrong: list[str] = []
    reads = {"hits": 0, "misses": 0, "failed_calls": 0}
    missed: list[str] = []
    try:
        # both writers going, and every node's cached peer view filled (a ListNodes round)
        _wait("A and B committed 200 keys each",
              lambda: len(_lines(outs[0])) >= 200 and len(_lines(outs[1])) >= 200)
        leader.kill()  # SIGKILL mid-storm
        t_kill = time.monotonic()
        pre = [bytes.fromhex(p[0]) for p in _lines(outs[1])]  # B's blocks: on n1 only
        halves = [pre[0::2], pre[1::2]]

        def reader(node: NodeProcess, keys: list[bytes]) -> None:
            batch = 8
            pause = READ_SPREAD_S / max(1, len(keys) // batch)
            with Client(node.unix_address, timeout_s=20) as c:
                for j in range(0, len(keys), batch):
                    ks = keys[j:j + batch]
                    try:
                        got = c.get(ks, timeout_s=15)
                    except Exception:  # noqa: BLE001 (a failed call: every key a miss)
                        reads["failed_calls"] += 1
                        got = [None] * len(ks)
                    for k, v in zip(ks, got, strict=True):
                        if v is None:
                            reads["misses"] += 1
                            missed.append(f"{k.hex()[:12]}@{time.monotonic() - t_kill:.1f}s")
                        elif v != small_value_for(k):
                            wrong.append(k.hex())
                        else:
                            reads["hits"] += 1
                    time.sleep(pause)  # spreads the reads over the failover (pacing only)

        readers = [threading.Thread(target=reader, args=(nodes[n], h), daemon=True)
                   for n, h in ((2, halves[0]), (0, halves[1]))]
        for t in readers:
            t.start()
        with MasterClient(both, timeout_s=2) as m:
            while True:
                try:
                    _, complete = m.lookup_prefix(b"", [pre[0]])
                    if complete:
                        break
                except (Unavailable, NotLeader, DeadlineExceeded):
                    pass
                assert time.monotonic() - t_kill < WAIT_S, "no new leader answered complete"
                time.sleep(0.05)
            assert m.fence.term > old_term
        t_complete = time.monotonic()
        for t in readers:
            t.join(60)
        n_before = len(_lines(outs[0]))
        _wait("A goes on after the failover", lambda: len(_lines(outs[0])) >= n_before + 20)
        stop.touch()
        for w in writers:
            out, err = w.communicate(timeout=60)
            assert w.returncode == 0, err
        a = _lines(outs[0])
        during = [p for p in a if float(p[4]) >= t_kill]
        by: dict[str, int] = {}
        for p in during:
            k = f"{p[1]}/{p[2]} {p[3]}"
            by[k] = by.get(k, 0) + 1
        print(f"failover: complete {t_complete - t_kill:.2f} s after the SIGKILL; reads of "
              f"{len(pre)} pre-kill blocks: {reads}; puts since the kill: {by}; "
              f"first misses {missed[:8]}")
        assert not wrong, f"wrong bytes read for {wrong[:5]}"
        assert reads["misses"] == 0, (reads, missed[:20])
        bad = [p for p in during if p[3] == "NoCapacity"]
        assert not bad, f"{len(bad)} puts said NoCapacity while peers had room: {bad[:3]}"
        for p in during:
            assert p[1] == "2" or (p[1] == "1" and "master" in p[5].lower()), p
        # the new leader learned the replicas placed through the cached view
        direct = [bytes.fromhex(p[0]) for p in during if p[1] == "2"]
        with MasterAdminClient(both) as adm:
            def all_two() -> bool:
                for j in range(0, len(direct), 64):
                    per_key, _ = adm.list_replicas(b"", direct[j:j + 64])
                    if any(len({r["node_id"] for r in reps if r["readable"] and not r["copy"]})
                           < 2 for reps in per_key):
                        return False
                return True
            _wait("the new leader indexes both replicas of A's failover puts", all_two)
    finally:
        stop.touch()
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait(timeout=30)
