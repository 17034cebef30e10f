"""A nearly full replicated pool loses no block when a holder dies (issue 17: a block is
dropped only when the whole pool is full), real processes: one master, three nodes of
64 MiB DRAM + 128 MiB SSD (the tester's setup).

``put(replicas=2)`` of 1920 x 100 kB through node a: 3840 replicas, 98 % of what the two
survivors hold. SIGKILL b while a reader reads every block through c; the
master re-creates b's replicas on a and c from the survivors. Repair copies may use only
spare room (free space, remote-fill copies, demotions into free SSD space), never a sole
copy's; an eviction for good drops a redundant replica (another live node keeps it) before
a sole copy. Then every block is read through a, else through c: 0 wrong bytes, and
no block lost that had an original on a survivor when b was killed (a block whose only
replica was b's goes with it: the put phase may leave a few, where a dropped its own
redundant replica for a later put). Main lost 52 of 1920 here (repair copies on c handed
a's coldest sole copies off, pool LRU, or evicted them).
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

from cluster_helpers import NodeProcess, _nodes, _wait, start_master, start_nodes, wait_healthy

from kvstored import Client
from kvstored.client.master_admin import MasterAdminClient

LEASE_S = 3.0
NUM_BLOCKS = 1920
SIZE = 100_000
REPAIR_WAIT_S = 40.0


def _key(i: int) -> bytes:
    return hashlib.blake2b(f"evict-{i}".encode(), digest_size=16).digest()


def _value(i: int) -> bytes:
    seed = hashlib.sha256(f"v-{i}".encode()).digest()
    return (seed * (SIZE // 32 + 1))[: SIZE - 8] + i.to_bytes(8, "little")


def _originals(m: MasterAdminClient, keys: list[bytes]) -> list[set[str]]:
    """Per key: the nodes holding a readable committed original (copies not counted)."""
    out: list[set[str]] = []
    for j in range(0, len(keys), 256):
        per, _ = m.list_replicas(b"", keys[j : j + 256])
        out += [{r["node_id"] for r in reps if not r["copy"] and r["readable"]
                 and r["state"] == "committed"} for reps in per]
    return out


def test_replicas_2_nearly_full_pool_sigkill_a_holder_loses_no_block(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs, lease_s=LEASE_S)
    nodes = [NodeProcess(workdir / n, master.address, n, dram_size="64MiB", ssd_size="128MiB")
             for n in "abc"]
    # no pool-LRU margin: a hand-off needs only the peer's coldest block to be older (here
    # a's, written first), not a second older, so this short run sees them as a long one does
    start_nodes(nodes, procs, {"KVSTORED_CLUSTER__POOL_LRU_MARGIN_S": "0"})
    wait_healthy(master.address, {"a", "b", "c"})
    keys = [_key(i) for i in range(NUM_BLOCKS)]
    with Client(nodes[0].unix_address) as c:
        for j in range(0, NUM_BLOCKS, 8):
            got = c.put(keys[j : j + 8], [_value(i) for i in range(j, min(j + 8, NUM_BLOCKS))],
                        replicas=2)
            assert all(r.ok for r in got)
    with MasterAdminClient(master.address, timeout_s=10) as m:
        # the index settles: the last puts' evictions reach it with the holders' next events
        before = _originals(m, keys)
        for _ in range(30):
            time.sleep(1.5)  # polling the master's view (events ride each heartbeat round)
            now = _originals(m, keys)
            if now == before:
                break
            before = now
    only_b = {i for i, h in enumerate(before) if h <= {"b"}}  # die with b: not the rule's
    stop = threading.Event()
    wrong: list[int] = []

    def read_through_c() -> None:  # reads during the repair: copies on c churn
        with Client(nodes[2].unix_address) as c:
            for _ in range(2):
                for i in range(NUM_BLOCKS):
                    v = c.get([keys[i]], timeout_s=30)[0]
                    if v is not None and v != _value(i):
                        wrong.append(i)
                    if stop.is_set():
                        return

    reader = threading.Thread(target=read_through_c, daemon=True)
    reader.start()
    try:
        nodes[1].kill()  # SIGKILL b
        t0 = time.monotonic()
        _wait("b's lease lapsed", lambda: "b" not in _nodes(master.address))
        with MasterAdminClient(master.address, timeout_s=10) as m:
            at_two = 0
            while time.monotonic() - t0 < REPAIR_WAIT_S:
                at_two = sum(1 for h in _originals(m, keys) if len(h) >= 2)
                if at_two == NUM_BLOCKS:
                    break
                time.sleep(1.0)  # polling the master's view, not synchronising
        print(f"{at_two} of {NUM_BLOCKS} blocks at 2 originals "
              f"{time.monotonic() - t0:.1f} s after the SIGKILL; {len(only_b)} held by b alone")
    finally:
        stop.set()
        reader.join(60)
    lost: list[int] = []
    with Client(nodes[0].unix_address) as a, Client(nodes[2].unix_address) as c:
        for i in range(NUM_BLOCKS):
            v = a.get([keys[i]], timeout_s=30)[0]
            if v is None:
                v = c.get([keys[i]], timeout_s=30)[0]
            if v is None:
                lost.append(i)
            elif v != _value(i):
                wrong.append(i)
    assert wrong == [], f"wrong bytes for blocks {wrong}"
    lost_held = [i for i in lost if i not in only_b]
    print(f"lost {len(lost)} of {NUM_BLOCKS}, {len(lost_held)} of them held by a survivor")
    assert lost_held == [], f"{len(lost_held)} blocks lost that a survivor held: {lost_held[:20]}"
