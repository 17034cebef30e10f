"""A live holder that reaches the new leader only after it says ``complete=true`` (fail17b).

A new leader answers ``complete=true`` once the nodes registered with it have synced and one
node lease (its rejoin grace) has passed since its term began: a timer. A loaded node can
be later than that (the fail17 tester's run missed 328 reads after ``complete=true``; the
kept logs of later runs had the last node synced 1.8-2.7 s into a 3 s grace). Here the
lateness is made certain, not timed: n1's MasterLink is held by the
``master_link_before_reregister`` test hook (kvstored/node/fault_hooks.py; n1 goes on
serving its data plane) until the test has seen the new leader complete without n1.

Real processes: etcd, two ``kvstored master --etcd``, three nodes through ``etcd://``.
Blocks are put through n1 (one replica: n1 only), the leader SIGKILLed; with n1 held, the
new leader answers ``complete=true`` and names nobody for them; every one of them read
through n2 and n0 is a hit with the right bytes (the readers ask n1, which that term has
not listed healthy: ``RemoteReads.view_peers``). Released, n1 registers and its blocks are
named again. On main (b23b5f2) every such read missed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import WAIT_S, NodeProcess, _wait, leader_of, start_nodes, wait_healthy
from cluster_helpers import ha_master as cluster_ha_master
from e2e_helpers import small_value_for
from etcd_helpers import EtcdServer

from kvstored import Client
from kvstored.client.master_admin import MasterAdminClient
from kvstored.errors import DeadlineExceeded, NotLeader, Unavailable

pytestmark = pytest.mark.etcd
PREFIX = "/kvlate"
NUM_BLOCKS = 48



def test_a_holder_late_to_the_new_leader_is_asked_directly_after_complete(
        workdir: Path, procs: list[Any], etcd: EtcdServer) -> None:
    masters = [cluster_ha_master(workdir, n, etcd.url(i), prefix=PREFIX, election_lease_s=3,
                                 lease_s=3.0) for i, n in enumerate(("ma", "mb"))]
    for m in masters:
        procs.append(m)
        m.start()
    both = ",".join(m.address for m in masters)
    leader_address, old_term = _wait("a leader", lambda: leader_of(both)[0] and leader_of(both))
    leader = next(m for m in masters if m.address == leader_address)
    via_etcd = f"etcd://{etcd.endpoints[0]},{etcd.endpoints[1]}{PREFIX}"
    nodes = [NodeProcess(workdir / f"n{i}", via_etcd, f"n{i}", dram_size="32MiB")
             for i in range(3)]
    fifo = workdir / "rereg.fifo"
    os.mkfifo(fifo)
    nodes[1].env["KVSTORED_TEST_HOOKS"] = f"master_link_before_reregister:{fifo}"
    start_nodes(nodes, procs, {"KVSTORED_CLUSTER__REMOTE_FETCH_TIMEOUT_S": "10"})
    wait_healthy(both, {"n0", "n1", "n2"})
    keys = [os.urandom(16) for _ in range(NUM_BLOCKS)]
    with Client(nodes[1].unix_address, timeout_s=20) as c:
        assert all(r.stored for r in c.put(keys, [small_value_for(k) for k in keys]))
    with MasterAdminClient(both) as adm:  # indexed on n1 only, before the kill
        _wait("n1's blocks indexed", lambda: all(
            [r["node_id"] for r in reps] == ["n1"] for reps in adm.list_replicas(b"", keys)[0]))
    # every node's cached view lists n1 healthy under the old term (a ListNodes round)
    _wait("n0's and n2's views list n1", lambda: all(any(
        "spill_peer_view" in line and "n1" in line.split("peers=")[-1].split()[0]
        for line in n.log().splitlines()) for n in (nodes[0], nodes[2])))
    released = False
    try:
        leader.kill()
        _wait("n1 held before it registers with the new leader",
              lambda: Path(f"{fifo}.held").exists())
        with MasterAdminClient(both, timeout_s=2) as adm:
            deadline = time.monotonic() + WAIT_S
            while True:  # the new leader: complete, and n1's blocks named nowhere
                try:
                    per_key, complete = adm.list_replicas(b"", keys)
                    if complete:
                        break
                except (Unavailable, NotLeader, DeadlineExceeded):
                    pass
                assert time.monotonic() < deadline, "no new leader answered complete"
                time.sleep(0.05)  # polling pace only
            assert adm.fence.term > old_term
            assert all(reps == [] for reps in per_key), per_key[:3]
        assert Path(f"{fifo}.held").exists()  # n1 is still held: the leader does not know it
        hits, missed, wrong = 0, [], []
        for reader, part in ((nodes[2], keys[0::2]), (nodes[0], keys[1::2])):
            with Client(reader.unix_address, timeout_s=20) as c:
                for k, v in zip(part, c.get(part, timeout_s=15), strict=True):
                    if v is None:
                        missed.append(k.hex()[:12])
                    elif v != small_value_for(k):
                        wrong.append(k.hex()[:12])
                    else:
                        hits += 1
        assert not wrong, wrong
        assert (hits, missed) == (NUM_BLOCKS, []), (hits, missed)
        open(fifo, "wb").close()  # release n1: it registers with the new leader
        released = True
        with MasterAdminClient(both) as adm:
            _wait("n1's blocks named again", lambda: all(
                "n1" in {r["node_id"] for r in reps} for reps in adm.list_replicas(b"", keys)[0]))
    finally:
        if not released:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK) if Path(f"{fifo}.held").exists() \
                else None
            if fd is not None:
                os.close(fd)
