"""put(replicas=2) end to end: a real master and three real node processes, each in its
own zone (``kvstored node --zone``).

The engine's node holds the first replica; it writes the second to a peer (two-phase
through the master, kvstored/node/put_replicas.py) before put returns. ``kvstorectl where``
shows two readable holders on distinct nodes and the factor; after the engine's own node
is SIGKILLed every block is still served, with identical bytes, through a survivor, and a
restarted master learns every block's factor again from the survivors' inventories.
(Re-creating the lost replica is the repair's job, not tested here.)

Waits poll observable state with a deadline, never sleeps.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

from cluster_helpers import (
    MasterProcess,
    NodeProcess,
    _ctl,
    _keys,
    _nodes,
    _wait,
    start_each,
    wait_healthy,
)
from e2e_helpers import value_for

from kvstored import AsyncClient, Client
from kvstored.client.master_admin import MasterAdminClient

ZONES = {"r1": "z1", "r2": "z2", "r3": "z3"}


def _where(master: str, keys: list[bytes]) -> list[dict[str, Any]]:
    out = _ctl(master, "where", "--output", "json", *(k.hex() for k in keys))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["blocks"]  # type: ignore[no-any-return]  # kvstorectl's JSON


def _readable_holders(b: dict[str, Any]) -> list[str]:
    return sorted(r["node_id"] for r in b["replicas"] if r["readable"])


def test_put_with_two_replicas_survives_a_sigkill_of_the_engines_node(
    workdir: Path, procs: list[Any]
) -> None:
    master = MasterProcess(workdir)
    procs.append(master)
    master.start()
    nodes = {n: NodeProcess(workdir / n, master.address, n, dram_size="8MiB", ssd_size="0")
             for n in ZONES}
    for n, zone in ZONES.items():
        nodes[n].args += ["--zone", zone]
        nodes[n].env["KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S"] = "0.25"
    nodes["r2"].env["KVSTORED_CLUSTER__DEFAULT_REPLICAS"] = "2"  # a put naming none gets 2
    start_each(list(nodes.values()), procs)
    wait_healthy(master.address, set(ZONES))
    assert {n: v["zone"] for n, v in _nodes(master.address).items()} == ZONES

    keys = _keys(24)
    with Client(nodes["r1"].unix_address) as c:
        results = c.put(keys, [value_for(k) for k in keys], replicas=2)
    assert [(r.ok, r.replicas_written, r.replicas_wanted, r.short) for r in results] == \
        [(True, 2, 2, False)] * len(keys), [r.replica_error for r in results]

    with MasterAdminClient(master.address) as m:  # polled in-process, shown by kvstorectl
        _wait("two readable holders per block", lambda: all(
            sum(r["readable"] for r in reps) == 2 for reps in m.list_replicas(b"", keys)[0]))
    blocks = _where(master.address, keys)
    assert all(x["replication_factor"] == 2 for x in blocks)
    holders = [_readable_holders(x) for x in blocks]
    assert all("r1" in h for h in holders)  # the engine's node stays the first replica
    seconds = {h[0] if h[1] == "r1" else h[1] for h in holders}
    assert seconds <= {"r2", "r3"}  # distinct nodes, never r1 twice

    # r2's [cluster] default_replicas = 2: a put naming no factor gets two replicas too
    # (through the AsyncClient: the same operation, the asyncio driver)
    extra = _keys(2)

    async def put_async() -> list[Any]:
        async with AsyncClient(nodes["r2"].unix_address) as c:
            return await c.put(extra, [value_for(k) for k in extra])

    got2 = asyncio.run(put_async())
    assert [(r.replicas_written, r.replicas_wanted) for r in got2] == [(2, 2)] * 2

    nodes["r1"].proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]  # started above
    nodes["r1"].proc.wait(timeout=30)  # type: ignore[union-attr]  # as above
    _wait("r1's lease lapsed", lambda: "r1" not in _nodes(master.address))
    for reader in ("r2", "r3"):
        with Client(nodes[reader].unix_address) as c:
            got = c.get(keys)
        bad = [i for i, (k, v) in enumerate(zip(keys, got, strict=True)) if v != value_for(k)]
        assert not bad, f"{len(bad)} blocks not served through {reader}: {bad[:8]}"

    # the factor is soft state: a new master learns it from the survivors' inventories (each
    # peer learned it from the replica's PUT), never from its own disk
    master.kill()
    restarted = MasterProcess(workdir)
    restarted.args[restarted.args.index("--listen") + 1] = master.address  # the same port
    procs.append(restarted)
    restarted.start()
    with MasterAdminClient(master.address) as m:
        _wait("the new master knows every block's factor again", lambda: (
            (got := m.list_replicas_and_factors(b"", keys)) and got[2]
            and got[1] == [2] * len(keys)))
