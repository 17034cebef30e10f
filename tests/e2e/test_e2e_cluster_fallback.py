"""Read fallback end to end (issue 17: "replicas=2, SIGKILL one holder: every block still
served"): a real master and three real node processes (SSD tier on). Blocks are put through
``a`` with ``replicas=2`` while only ``a`` and ``b`` run, so each has its replicas on exactly
``a`` and ``b``; then ``c`` joins and reads every block.

c's read is held (``KVSTORED_TEST_HOOKS`` ``remote_fill_before_copy``, see
kvstored/node/fault_hooks.py) after its master lookup named the holders and before the
copy; the holder the master named is SIGKILLed there and the read released: its copy fails
(connect refused) and falls back to the surviving replica within the same read. Every block
is served with its bytes, 0 misses. A second batch read right after (the master has not
necessarily noticed the death yet: its lease is 4 s) is served too; c now sends the dead
holder as ``avoid`` (suspect, kvstored/node/suspects.py).

Deterministic: the kill happens while the read is held at a known point, never after a
sleep; waits poll observable state with a deadline.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from cluster_helpers import NodeProcess, _keys, _wait, start_master, start_nodes, wait_healthy
from e2e_helpers import value_for

from kvstored import Client
from kvstored.client.master import MasterClient
from kvstored.client.master_admin import MasterAdminClient

N = 24  # blocks per batch (16-272 KiB each)


def test_a_sigkilled_holders_blocks_are_all_served_from_the_other_replica_at_once(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs)
    fifo = workdir / "fill.fifo"
    os.mkfifo(fifo)
    env = {"KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S": "0.25"}
    nodes = {n: NodeProcess(workdir / n, master.address, n, dram_size="16MiB") for n in "ab"}
    start_nodes(list(nodes.values()), procs, env)
    wait_healthy(master.address, {"a", "b"})
    held, later = _keys(N), _keys(N)
    with Client(nodes["a"].unix_address) as c:
        results = c.put(held + later, [value_for(k) for k in held + later], replicas=2)
    assert [(r.ok, r.replicas_written) for r in results] == [(True, 2)] * (2 * N)
    with MasterAdminClient(master.address) as m:
        _wait("every block readable on a and b", lambda: all(
            sorted(r["node_id"] for r in reps if r["readable"]) == ["a", "b"]
            for reps in m.list_replicas(b"", held + later)[0]))

    reader = NodeProcess(workdir / "c", master.address, "c", dram_size="32MiB")
    reader.env["KVSTORED_TEST_HOOKS"] = f"remote_fill_before_copy:{fifo}"
    # the held read keeps its deadline: time enough to kill a holder and fall back
    reader.env["KVSTORED_CLUSTER__REMOTE_FETCH_TIMEOUT_S"] = "30"
    start_nodes([reader], procs, env)
    wait_healthy(master.address, {"a", "b", "c"})

    got: list[Any] = []

    def read() -> None:
        with Client(reader.unix_address) as c:
            got.append(c.get(held, timeout_s=60))

    t = threading.Thread(target=read)
    t.start()
    try:
        _wait("c's read held after its lookup", lambda: Path(f"{fifo}.held").exists())
        with MasterClient(master.address) as m:  # what c's lookup was answered: nothing changed
            named = m.lookup_each(b"", held, local_node_id="c")
        assert named is not None and len(named[0]) == N
        victim, num_named = Counter(r.node_id for r in named[0].values()).most_common(1)[0]
        assert victim in nodes and num_named > 0
        nodes[victim].proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]  # started
        nodes[victim].proc.wait(timeout=30)  # type: ignore[union-attr]  # as above
    finally:
        open(fifo, "wb").close()  # release the held read
        t.join(60)
    assert got, "the read through c did not return"
    missed = [i for i, (k, v) in enumerate(zip(held, got[0], strict=True)) if v != value_for(k)]
    assert not missed, f"{len(missed)} of {N} blocks missed through c after {victim} died: {missed}"
    log = reader.log()
    assert "remote_fill_fallback" in log and "test_hook_released" in log

    with Client(reader.unix_address) as c:  # at once, whether the master noticed or not
        again = c.get(later, timeout_s=30)
    missed = [i for i, (k, v) in enumerate(zip(later, again, strict=True)) if v != value_for(k)]
    assert not missed, f"{len(missed)} of {N} later blocks missed through c: {missed}"
