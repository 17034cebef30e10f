"""Pool LRU when the whole pool is full (issue 17 section 3), real processes.

Two DRAM-only nodes, c and d, each full of 1 MiB blocks (the spill watermark at 1.0: no
node spills on its own, so the pool stays full; every PutStart for room answers
NoCapacity). d's blocks were put first, and are older than c's by more than
``cluster.pool_lru_margin_s``. One more put into c must evict an original: with pool LRU,
c hands its coldest block to d (a data-plane PUT with PUT_FLAG_HANDOFF carrying its age),
d evicts its own coldest (older) block to take it, and the put lands on c. So the block
gone from the pool is d's coldest, the coldest cluster-wide, and c's survives on d, where
a read through c still finds it. Without pool LRU (``pool_lru_enabled = false``) c would
evict its own coldest block and d's older one would stay.

Waits poll observable state (ListNodes, the nodes' listings) with a deadline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cluster_helpers import _wait
from test_e2e_cluster_nodrop import _held, _value
from test_e2e_cluster_put import _cluster

from kvstored import Client
from kvstored.client.master import MasterClient

BLOCKS_PER_NODE = 8  # 8 x 1 MiB fill an 8 MiB DRAM tier exactly
POOL_FULL_ENV = {
    "KVSTORED_CLUSTER__SPILL_HIGH_WATERMARK": "1.0",  # no spill on its own: the pool stays full
    "KVSTORED_CLUSTER__SPILL_LOW_WATERMARK": "0.9",
    "KVSTORED_CLUSTER__SPILL_PEER_VIEW_S": "0.2",  # the peers' coldest ages, fresh
    "KVSTORED_CLUSTER__POOL_LRU_MARGIN_S": "0.5",
}
D_OLDER_BY_S = 2.0  # d's coldest is this much older than anything on c, at least


def _put_one_by_one(node: Any, keys: list[bytes]) -> None:
    """One put per key, so the first key is the node's coldest (least recently used)."""
    with Client(node.unix_address) as c:
        for k in keys:
            assert c.put([k], [_value(k)])[0].stored


def _coldest_age_s(m: MasterClient, node_id: str) -> float:
    return next(n["coldest_age_s"] for n in m.list_nodes()["nodes"] if n["node_id"] == node_id)


def test_a_full_pool_drops_the_coldest_block_cluster_wide_not_the_writers_own(
    workdir: Path, procs: list[Any]
) -> None:
    master, nodes = _cluster(workdir, procs, {"c": ("8MiB", "0"), "d": ("8MiB", "0")},
                             env={"c": POOL_FULL_ENV, "d": POOL_FULL_ENV})
    c, d = nodes["c"], nodes["d"]
    keys_d = [os.urandom(16) for _ in range(BLOCKS_PER_NODE)]
    keys_c = [os.urandom(16) for _ in range(BLOCKS_PER_NODE)]
    extra = os.urandom(16)
    _put_one_by_one(d, keys_d)
    with MasterClient(master.address) as m:
        _wait(f"d's coldest block is {D_OLDER_BY_S} s old (its heartbeat says so)",
              lambda: _coldest_age_s(m, "d") >= D_OLDER_BY_S)
        _put_one_by_one(c, keys_c)  # the pool is full now
        _wait("the master hears c's coldest age", lambda: _coldest_age_s(m, "c") > 0)
        assert _coldest_age_s(m, "d") > _coldest_age_s(m, "c") + 0.5
        _put_one_by_one(c, [extra])  # c must make room: pool LRU hands keys_c[0] to d
    held_c, held_d = _held(c), _held(d)
    assert keys_d[0] not in held_c | held_d, "d's coldest block (the pool's coldest) stayed"
    assert keys_c[0] in held_d, "c's coldest block was dropped instead of handed to d"
    assert extra in held_c
    kept = set(keys_d[1:]) | set(keys_c) | {extra}
    assert kept <= held_c | held_d, f"{len(kept - (held_c | held_d))} other blocks lost"
    with MasterClient(master.address) as m:
        _wait("the master names d for the handed-off block", lambda: [
            r.node_id for r in m.lookup_prefix(b"", [keys_c[0]], local_node_id="c")[0]] == ["d"])
    # a read through c finds it on d (c, full, streams it through its gRPC answer)
    with Client(c.tcp_address, transport="grpc") as cl:
        assert cl.get([keys_c[0]], timeout_s=30)[0] == _value(keys_c[0])
    assert any("pool_lru_handoff" in line and "num_taken=1" in line
               for line in c.log_path.read_text().splitlines())
