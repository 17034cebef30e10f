"""A nearly full replicated pool loses no block when a holder dies (issue 17: a block is
dropped only when the whole pool is full), real processes: one master, three nodes of
8 MiB DRAM + 16 MiB SSD.

``put(replicas=2)`` of 240 x 100 kB through node a: 480 replicas, 98 % of what the two
survivors hold. SIGKILL b while a reader reads every block through c in a loop; the
master re-creates b's replicas on a and c from the survivors. Repair copies may use only
spare room (free space, remote-fill copies, demotions into free SSD space), never a sole
copy's; an eviction for good drops a redundant replica (another live node keeps it) before
a sole copy. Then every block is read through a, else through c: 0 lost, 0 wrong bytes.
Main lost 52 of 1920 at the same fill in the tester's larger version of this run
(/tmp/briefs/repro/killrepro.sh): repair copies evicted the survivors' sole copies.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

from cluster_helpers import NodeProcess, start_master, start_nodes, wait_healthy

from kvstored import Client
from kvstored.client.master_admin import MasterAdminClient

LEASE_S = 3.0
NUM_BLOCKS = 240
SIZE = 100_000
REPAIR_WAIT_S = 40.0


def _key(i: int) -> bytes:
    return hashlib.blake2b(f"evict-{i}".encode(), digest_size=16).digest()


def _value(i: int) -> bytes:
    seed = hashlib.sha256(f"v-{i}".encode()).digest()
    return (seed * (SIZE // 32 + 1))[: SIZE - 8] + i.to_bytes(8, "little")


def _at_two(m: MasterAdminClient, keys: list[bytes]) -> int:
    per, _ = m.list_replicas(b"", keys)
    return sum(1 for reps in per
               if len({r["node_id"] for r in reps if not r["copy"] and r["readable"]
                       and r["state"] == "committed"}) >= 2)


def test_replicas_2_nearly_full_pool_sigkill_a_holder_loses_no_block(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs, lease_s=LEASE_S)
    nodes = [NodeProcess(workdir / n, master.address, n, dram_size="8MiB", ssd_size="16MiB")
             for n in "abc"]
    start_nodes(nodes, procs, {})
    wait_healthy(master.address, {"a", "b", "c"})
    keys = [_key(i) for i in range(NUM_BLOCKS)]
    with Client(nodes[0].unix_address) as c:
        for j in range(0, NUM_BLOCKS, 8):
            got = c.put(keys[j : j + 8], [_value(i) for i in range(j, min(j + 8, NUM_BLOCKS))],
                        replicas=2)
            assert all(r.ok for r in got)
    stop = threading.Event()
    wrong: list[int] = []

    def read_through_c() -> None:  # reads during the repair: copies on c churn
        with Client(nodes[2].unix_address) as c:
            while not stop.is_set():
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
        with MasterAdminClient(master.address, timeout_s=10) as m:
            at_two = 0
            while time.monotonic() - t0 < REPAIR_WAIT_S:
                at_two = _at_two(m, keys)
                if at_two == NUM_BLOCKS:
                    break
                time.sleep(0.5)
        print(f"{at_two} of {NUM_BLOCKS} blocks at 2 originals "
              f"{time.monotonic() - t0:.1f} s after the SIGKILL")
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
    assert lost == [], f"{len(lost)} of {NUM_BLOCKS} blocks lost: {lost[:20]}"
