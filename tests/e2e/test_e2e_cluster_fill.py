"""A read never costs the pool a block: reading everything through one full node.

The tester's scenario at small scale, real processes: a master and two DRAM-only nodes
(``--ssd-size 0``, 16 MiB each), spill on. 24 blocks of 1 MiB are put through c, which
spills the excess to d. Then c reads all 24 in batches of 8 (shared memory): the blocks d
holds are copied into c's DRAM (remote fill) only where c has room without evicting a block
the pool holds nowhere else (tiers/spare.py); the others are streamed through (PinBlocks
marks them, the client reads them by the inline Get). Before the fix c evicted its own
unique blocks to make room for copies of d's, and those were gone cluster-wide. A read may
still miss a block: the copies push c past its high watermark, so c spills some of its
own blocks to d during the reads, and until c's next event reaches the master it names c
itself for such a block (its one answer per key; a lookup with no node ranked first can
still pick c's stale entry), so c finds nobody to copy from (docs/cluster.md, Limits).

Checked: every hit has the right bytes; afterwards every key is held by c or d (their own
listings) and, once the master has heard of both nodes' changes, ``exists`` through d says
True for every key. Waits poll observable state with a deadline, never sleeps.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from cluster_helpers import (  # the cluster helpers and fixtures
    _wait,
)
from test_e2e_cluster_put import _cluster, _settled, _used_fraction

from kvstored import Client
from kvstored.client.master import MasterClient

BLOCK = 1 << 20
NUM_BLOCKS = 24
HIGH = 0.9  # the default spill watermarks (0.9 / 0.8)


def _value(key: bytes) -> bytes:
    return np.random.default_rng(int.from_bytes(key[:8], "little")).integers(
        0, 256, BLOCK, dtype=np.uint8).tobytes()


def _held(node: Any) -> set[bytes]:
    with Client(node.unix_address) as c:
        return {b.key for b in c.list_blocks(limit=100000)[0]}


def test_reading_every_block_through_a_full_dram_only_node_drops_none_from_the_pool(
    workdir: Path, procs: list[Any]
) -> None:
    master, nodes = _cluster(workdir, procs, {"c": ("16MiB", "0"), "d": ("16MiB", "0")})
    c, d = nodes["c"], nodes["d"]
    keys = [os.urandom(16) for _ in range(NUM_BLOCKS)]
    with Client(c.unix_address) as cl:
        for i in range(0, len(keys), 2):  # 2 MiB at a time: c never evicts for a put
            chunk = keys[i : i + 2]
            assert all(r.stored for r in cl.put(chunk, [_value(k) for k in chunk]))
            _wait("c at or below its high watermark", lambda: _used_fraction(c) <= HIGH)
    held_c, held_d = _held(c), _held(d)
    assert held_c | held_d >= set(keys), "lost while putting (the test outpaced the spill)"
    assert held_d & set(keys), "nothing spilled to d: the scenario needs blocks on d"
    hits = 0
    with Client(c.unix_address) as cl:
        for i in range(0, len(keys), 8):
            chunk = keys[i : i + 8]
            for k, got in zip(chunk, cl.get(chunk, timeout_s=30), strict=True):
                assert got is None or got == _value(k), "wrong bytes"
                hits += got is not None
    assert hits >= len(held_c & set(keys)) // 2  # (c's own blocks are read at least)
    lost = set(keys) - (_held(c) | _held(d))
    assert not lost, f"{len(lost)} of {len(keys)} blocks gone from the pool after reads"
    with MasterClient(master.address) as m:
        _wait("the master indexes every block where it is", lambda: _settled(m, nodes, keys, "d"))
    with Client(d.unix_address) as cl:
        assert cl.exists(keys) == [True] * len(keys)
