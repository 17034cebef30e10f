"""The master knows which replicas are remote-fill copies, end to end (real processes).

A master and two nodes: 4 blocks are put through a, then read through b, which copies them
into its DRAM (remote fill). ``kvstorectl where --output json`` against the master then
shows b's replicas with ``"copy": true`` and a's with ``false`` (the table marks "copy"),
and a lookup asked for a third party names a's original, never b's copy. A local put of
the same blocks through b makes them originals there: ``where`` says ``false`` for both.
And when a removes blocks whose only other replicas are b's copies, the master asks b (on
its heartbeat answer) to keep them: they turn into originals, not "evict first" duplicates.
Waits poll observable state with a deadline, never sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_e2e_cluster import (  # the cluster helpers and fixtures
    _wait,
)
from test_e2e_cluster_put import _cluster, _value

from kvstored import Client
from kvstored.client.master import MasterClient


def _ctl(address: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "kvstored.cli.kvstorectl", "--address", address, *args],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _copies(address: str, keys: list[bytes]) -> list[dict[str, bool]]:
    """Per key: {node id: copy} of its readable replicas, from ``where --output json``."""
    where = json.loads(_ctl(address, "where", *[k.hex() for k in keys], "--output", "json"))
    return [{r["node_id"]: r["copy"] for r in b["replicas"] if r["readable"]}
            for b in where["blocks"]]


def test_a_fill_copy_shows_as_a_copy_in_where_and_a_local_put_makes_it_an_original(
    workdir: Path, procs: list[Any]
) -> None:
    master, nodes = _cluster(workdir, procs, {"a": ("16MiB", "0"), "b": ("16MiB", "0")})
    keys = [os.urandom(16) for _ in range(4)]
    with Client(nodes["a"].unix_address) as cl:
        assert all(r.stored for r in cl.put(keys, [_value(k) for k in keys]))
    _wait("a's blocks indexed", lambda: _copies(master.address, keys) == [{"a": False}] * 4)
    with Client(nodes["b"].unix_address) as cl:  # a remote get fills copies into b's DRAM
        assert cl.get(keys, timeout_s=30) == [_value(k) for k in keys]
    _wait("b's copies indexed as copies",
          lambda: _copies(master.address, keys) == [{"a": False, "b": True}] * 4)
    table = _ctl(master.address, "where", keys[0].hex())
    assert "copy" in table, table
    with MasterClient(master.address) as m:  # a third party is sent to the original
        got, _ = m.lookup_prefix(b"", keys, local_node_id="")
        assert [r.node_id for r in got] == ["a"] * 4
    with Client(nodes["b"].unix_address) as cl:  # the engine on b made them too
        assert [r.stored for r in cl.put(keys, [_value(k) for k in keys])] == [False] * 4
    _wait("b's replicas indexed as originals",
          lambda: _copies(master.address, keys) == [{"a": False, "b": False}] * 4)


def test_removing_the_original_promotes_the_remaining_copy(
    workdir: Path, procs: list[Any]
) -> None:
    master, nodes = _cluster(workdir, procs, {"a": ("16MiB", "0"), "b": ("16MiB", "0")})
    keys = [os.urandom(16) for _ in range(3)]
    with Client(nodes["a"].unix_address) as cl:
        assert all(r.stored for r in cl.put(keys, [_value(k) for k in keys]))
    _wait("a's blocks indexed", lambda: _copies(master.address, keys) == [{"a": False}] * 3)
    with Client(nodes["b"].unix_address) as cl:
        assert cl.get(keys, timeout_s=30) == [_value(k) for k in keys]
    _wait("b's copies indexed as copies",
          lambda: _copies(master.address, keys) == [{"a": False, "b": True}] * 3)
    with Client(nodes["a"].unix_address) as cl:
        assert cl.remove(keys[:2]) == [True, True]
    # b's own ADDED(copy=False) re-reports: it unmarked them (the master only asked)
    _wait("b keeps the last replicas as originals", lambda: _copies(master.address, keys)
          == [{"b": False}] * 2 + [{"a": False, "b": True}])
