"""Reads through a full node: how many blocks the pool keeps (the tester's scenario).

Cluster: a real master and two real DRAM-only nodes c and d (``--ssd-size 0``, spill on,
default watermarks). ``--blocks`` blocks of 1 MiB are put through c two at a time (c spills
the excess to d and never evicts for a put), then c reads all of them in batches of 8.
Reported: hits, misses and wrong bytes of those reads, c's DRAM evictions during them, the
blocks held by neither node afterwards (their own listings), and ``exists`` through c once
the master has heard of both nodes. Not a timing: the figure is blocks, so it is exact.

Before the fix (docs/cluster.md, "A read never costs the pool a block") c evicted its own
unique blocks to make room for copies of d's: 46 of 110 were gone from the pool.

Usage:  python bench/bench_fill_pool.py [--dram-mib 64] [--blocks 110]
        [--out bench/results/bench_fill_pool.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from cluster_helpers import _wait  # noqa: E402 (the e2e cluster helpers)
from test_e2e_cluster_fill import _held, _value  # noqa: E402
from test_e2e_cluster_put import _cluster, _settled, _used_fraction  # noqa: E402

from kvstored import Client  # noqa: E402
from kvstored.client.master import MasterClient  # noqa: E402


def _dram_evictions(node: Any) -> int:
    with Client(node.unix_address) as c:
        return int(next(t for t in c.stats()["tiers"] if t["tier"] == "DRAM")["evictions"])


def run(dram_mib: int, num_blocks: int) -> dict[str, Any]:
    """Run the scenario once; returns the figures (see the module docstring)."""
    workdir = Path(tempfile.mkdtemp(prefix="kvbf", dir="/tmp"))
    procs: list[Any] = []
    try:
        master, nodes = _cluster(workdir, procs, {"c": (f"{dram_mib}MiB", "0"),
                                                   "d": (f"{dram_mib}MiB", "0")})
        c, d = nodes["c"], nodes["d"]
        keys = [os.urandom(16) for _ in range(num_blocks)]
        with Client(c.unix_address) as cl:
            for i in range(0, num_blocks, 2):
                chunk = keys[i : i + 2]
                cl.put(chunk, [_value(k) for k in chunk])
                _wait("c at or below its high watermark", lambda: _used_fraction(c) <= 0.9)
        held_c, held_d = len(_held(c) & set(keys)), len(_held(d) & set(keys))
        ev0 = _dram_evictions(c)
        hits = wrong = 0
        with Client(c.unix_address) as cl:
            for i in range(0, num_blocks, 8):
                chunk = keys[i : i + 8]
                for k, got in zip(chunk, cl.get(chunk, timeout_s=30), strict=True):
                    hits += got is not None
                    wrong += got is not None and got != _value(k)
        evictions = _dram_evictions(c) - ev0
        lost = len(set(keys) - (_held(c) | _held(d)))
        with MasterClient(master.address) as m:
            try:
                _wait("the master indexes every block where it is",
                      lambda: _settled(m, nodes, keys, "c"))
            except AssertionError:
                pass  # lost blocks never settle: exists below shows them
        with Client(c.unix_address) as cl:
            exists = sum(cl.exists(keys))
        return {"dram_mib": dram_mib, "blocks": num_blocks, "held_c": held_c, "held_d": held_d,
                "hits": hits, "misses": num_blocks - hits, "wrong": wrong,
                "c_evictions": evictions, "lost": lost, "exists_via_c": exists}
    finally:
        for p in reversed(procs):
            p.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dram-mib", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=110)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench_fill_pool.json"))
    args = ap.parse_args()
    got = run(args.dram_mib, args.blocks)
    cols = list(got)
    print("| " + " | ".join(cols) + " |")
    print("|" + "---:|" * len(cols))
    print("| " + " | ".join(str(got[k]) for k in cols) + " |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(got, indent=2) + "\n")


if __name__ == "__main__":
    main()
