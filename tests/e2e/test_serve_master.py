"""``kvstored serve --master-listen``: one process hosts the master and a node; another
``kvstored node --master`` joins it and reads the first one's blocks. Plain ``serve`` opens
no master port. SIGTERM stops the combined process cleanly (node first, then master)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from e2e_helpers import ServeProcess, value_for

from kvstored import Client
from kvstored.client.master_admin import MasterAdminClient


def _master_line(p: ServeProcess) -> str:
    return next((ln.split()[2] for ln in p.lines if ln.startswith("listening master ")), "")


def test_serve_hosts_the_master_and_a_node_joins_it(workdir: Path) -> None:
    (workdir / "one").mkdir()
    (workdir / "two").mkdir()
    one = ServeProcess(workdir / "one", node_id="one",
                       extra=["--master-listen", "127.0.0.1:0"],
                       env={"KVSTORED_MASTER__DATA_DIR": str(workdir / "master")})
    procs = [one]
    try:
        one.start()
        master = _master_line(one)
        assert master and not master.endswith(":0")
        assert any(ln.startswith("kvstored master epoch ") for ln in one.lines)
        two = ServeProcess(workdir / "two", node_id="two", extra=["--master", master])
        two.args[two.args.index("serve")] = "node"
        procs.append(two)
        two.start()
        deadline = time.monotonic() + 30
        with MasterAdminClient(master) as m:
            while sorted((n["node_id"], n["health"]) for n in m.list_nodes()["nodes"]) != [
                    ("one", "healthy"), ("two", "healthy")]:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        key = os.urandom(16)
        with Client(one.unix_address) as c:
            assert c.put([key], [value_for(key)])[0].stored
        with Client(two.unix_address) as c:
            while not c.exists([key])[0]:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert c.get([key]) == [value_for(key)]
        assert two.terminate() == 0
        assert one.terminate() == 0
        assert "master_stopped" in one.log() and "node_stopped" in one.log()
    finally:
        for p in procs:
            p.kill()


def test_plain_serve_has_no_master(workdir: Path) -> None:
    p = ServeProcess(workdir, node_id="plain")
    try:
        p.start()
        assert _master_line(p) == "" and p.lines[0].startswith("kvstored node plain epoch ")
        assert "master_started" not in p.log()
        assert p.terminate() == 0
    finally:
        p.kill()
