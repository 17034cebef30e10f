"""Master GC with the promotion hook: cost per unlinked row, with and without it.

A retired holder's rows are unlinked by ``BlockIndex.collect_garbage`` in batches of 8192
(the daemon's tick). With ``on_only_copies`` (what ``Membership.collect_garbage`` passes)
GC also finds the blocks left with copies only. Two cases, N blocks each held by a retired
holder (an original) and one live holder:

- ``original``: the live replica is an original (a resync: the common case), no callback;
- ``copy``: the live replica is a copy (a dead node whose every block was copied), one
  callback per block (here a list append; the membership queues a promotion).

Reference measured in the same run: the same GC without the hook. Printed: us per row
(best of ``--repeat``) and the ratio hook / no hook (target: close to 1 for ``original``).

Usage:  python bench/bench_master_gc_promote.py [--blocks 200000] [--repeat 3]
        [--out bench/results/bench_master_gc_promote.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from kvstored.master.index import BlockIndex

NS = b"n" * 16
BATCH_ROWS = 8192


def _index(n: int, *, live_copy: bool) -> BlockIndex:
    ix = BlockIndex(n)
    keys = [i.to_bytes(16, "little") for i in range(n)]
    dead, live = ix.add_holder(), ix.add_holder()
    ix.set_readable(live, True)
    ix.add_replicas_bulk(NS, keys, holder=dead, tiers=[1] * n, sizes=[1] * n, generation=5)
    ix.add_replicas_bulk(NS, keys, holder=live, tiers=[1] * n, sizes=[1] * n, generation=6,
                         copies=[live_copy] * n)
    ix.retire_holder(dead)
    return ix


def _gc_s(n: int, *, live_copy: bool, hook: bool, repeat: int) -> tuple[float, int]:
    best, calls = float("inf"), 0
    for _ in range(repeat):
        ix = _index(n, live_copy=live_copy)
        found: list[bytes] = []
        cb: Callable[[bytes, bytes], None] | None = (
            (lambda _ns, k, found=found: found.append(k)) if hook else None)  # bound now, not at call
        t0 = time.perf_counter()
        while ix.collect_garbage(BATCH_ROWS, on_only_copies=cb):
            pass
        best = min(best, time.perf_counter() - t0)
        calls = len(found)
    return best, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/results/bench_master_gc_promote.json"))
    args = ap.parse_args()
    n = args.blocks
    rows = []
    for live_copy in (False, True):
        plain_s, _ = _gc_s(n, live_copy=live_copy, hook=False, repeat=args.repeat)
        hook_s, calls = _gc_s(n, live_copy=live_copy, hook=True, repeat=args.repeat)
        rows.append({"live_replica": "copy" if live_copy else "original", "blocks": n,
                     "no_hook_us_per_row": round(plain_s * 1e6 / n, 3),
                     "hook_us_per_row": round(hook_s * 1e6 / n, 3),
                     "ratio": round(hook_s / plain_s, 3), "callbacks": calls})
    print(f"{'live replica':<13}{'blocks':>9}{'no hook us/row':>16}{'hook us/row':>13}"
          f"{'ratio':>7}{'callbacks':>11}")
    for r in rows:
        print(f"{r['live_replica']:<13}{r['blocks']:>9}{r['no_hook_us_per_row']:>16.2f}"
              f"{r['hook_us_per_row']:>13.2f}{r['ratio']:>7.2f}{r['callbacks']:>11}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
