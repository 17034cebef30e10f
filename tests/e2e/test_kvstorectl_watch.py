"""``kvstorectl --watch`` against a real node: JSON refreshes of ``stats`` and ``status``
follow the node's counters, and a table watch redraws."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from e2e_helpers import ServeProcess, value_for
from helpers import key
from test_readme import README, read_blocks

from kvstored import Client


def _ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvstored.cli.kvstorectl", *args],
                          capture_output=True, text=True, timeout=60)


def test_watch_stats_follows_the_node_and_status_redraws(workdir: Path, procs: list[Any]) -> None:
    node = ServeProcess(workdir)
    procs.append(node)
    node.start()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "kvstored.cli.kvstorectl", "--address", node.unix_address,
         "--output", "json", "stats", "--watch", "--interval-s", "0.1", "--count", "40"],
        stdout=subprocess.PIPE, text=True)
    procs.append(watcher)
    assert watcher.stdout is not None
    first = json.loads(watcher.stdout.readline())
    keys = [key(i) for i in range(5)]
    with Client(node.unix_address) as c:
        c.put(keys, [value_for(k) for k in keys])
    docs = [first] + [json.loads(line) for line in watcher.stdout]
    assert watcher.wait(30) == 0
    assert [d["refresh"] for d in docs] == list(range(1, 41))
    assert docs[0]["data"]["node_id"] == "e2e"
    puts = [d["data"]["puts"] for d in docs]
    assert puts == sorted(puts) and puts[0] == 0 and puts[-1] == 5  # the put shows up, once
    uptimes = [d["data"]["uptime_s"] for d in docs]
    assert uptimes == sorted(uptimes) and uptimes[-1] > uptimes[0]
    # a table watch of status on the same node redraws each refresh
    res = _ctl("--address", node.unix_address, "--watch", "--interval-s", "0.05", "--count", "2",
               "status")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("kvstorectl --watch 0.05s") == 2
    assert res.stdout.count("e2e") >= 2


def test_readme_watch_commands_run(workdir: Path, procs: list[Any]) -> None:
    block = next(b for b in read_blocks(README.read_text())
                 if b.skip_reason and "test_kvstorectl_watch.py" in b.skip_reason)
    lines = [ln.split("#")[0].strip() for ln in block.code.splitlines() if ln.strip()]
    assert len(lines) == 2 and all(ln.startswith("kvstorectl ") for ln in lines)
    node = ServeProcess(workdir)
    procs.append(node)
    node.start()
    for ln in lines:
        args = ln.split()[1:]
        res = subprocess.run([sys.executable, "-m", "kvstored.cli.kvstorectl", *args],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "KVSTORED_ADDRESS": node.unix_address})
        assert res.returncode == 0, (ln, res.stderr)
        if "--output json" in ln:
            docs = [json.loads(x) for x in res.stdout.splitlines()]
            assert [d["refresh"] for d in docs] == [1, 2, 3]
            assert all(d["data"]["node_id"] == "e2e" for d in docs)
        else:
            assert res.stdout.count("refresh ") == 3
