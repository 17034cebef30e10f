"""A batch get through a node answers key by key, past blocks missing cluster-wide.

A real master and three real nodes: ten blocks, the second of them held only by n3; n3 is
SIGKILLed and leaves the pool. A get of the ten keys through n2 must return the nine blocks
n1 holds (as ``exists`` says, and as ten one-key gets do), not stop at the block that died
with n3: get, get_into and get_blocks are per key; only lookup_prefix is a prefix operation.
Waits poll the master's state with a deadline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster_helpers import (
    NodeProcess,
    _keys,
    _nodes,
    _put,
    _wait,
    start_each,
    start_master,
    wait_healthy,
)
from e2e_helpers import value_for

from kvstored import Client


def test_a_get_through_a_node_serves_every_block_present_past_one_lost_with_its_node(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs)
    n1, n2, n3 = (NodeProcess(workdir / name, master.address, name) for name in ("n1", "n2", "n3"))
    start_each([n1, n2, n3], procs)
    wait_healthy(master.address, {"n1", "n2", "n3"})
    keys = _keys(10)
    _put(n3, keys[1:2])  # only n3 holds block 1
    _put(n1, keys[:1] + keys[2:])
    with Client(n2.unix_address) as c:
        _wait("every block indexed", lambda: all(c.exists(keys)))
        n3.kill()
        _wait("n3 gone", lambda: "n3" not in _nodes(master.address))
        assert c.exists(keys) == [i != 1 for i in range(10)]
        got = c.get(keys)
        assert [g is not None for g in got] == [i != 1 for i in range(10)]
        assert [g for g in got if g is not None] == [value_for(k) for k in keys[:1] + keys[2:]]
        got_blocks = c.get_blocks(keys)
        assert [b is not None for b in got_blocks] == [i != 1 for i in range(10)]
