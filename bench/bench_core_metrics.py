"""What Prometheus metrics cost the node per hot request (issue 9), in process, no sockets.

Times NodeCore's own handling of the shared-memory control ops with metrics on and, as the
reference of the same run, with ``metrics=None``; the difference is what metrics cost:

  * get     pin_blocks of 1 block + release_pins (one single-block shm get, node side)
  * put     reserve_put of 1 block + commit_put (one single-block shm put, node side)
  * lookup  lookup_prefix of 16 keys

each while ``--held`` other pins are active (a busy node: many readers hold pins; a per-call
count over all leases grows with it). The two nodes' rounds of ``--iters`` calls alternate;
each figure is the fastest round's mean per call, microseconds. Before/after
a change: run it with PYTHONPATH set to each checkout, e.g.
``PYTHONPATH=/path/to/old python bench/bench_core_metrics.py --json old.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable

from kvstored import log as kvlog
from kvstored.config import NodeConfig
from kvstored.node.core import NodeCore
from kvstored.node.metrics import NodeMetrics
from kvstored.tiers.tiered import TieredStore

BLOCK_BYTES = 4 << 10


def _key(i: int) -> bytes:
    return i.to_bytes(8, "big") * 2


class _Node:
    """A NodeCore over a private store, holding ``held`` other pins; its three timed ops."""

    def __init__(self, with_metrics: bool, held: int) -> None:
        cfg = NodeConfig(
            node_id="bench", dram_size_bytes=256 << 20, ssd_size_bytes=0,
            max_block_bytes=64 << 10, pin_lease_s=600.0,
        )
        self.store = TieredStore(
            dram_size_bytes=cfg.dram_size_bytes, arena_dir=None, max_block_bytes=cfg.max_block_bytes
        )
        metrics = NodeMetrics() if with_metrics else None
        self.core = NodeCore(self.store, cfg, epoch=1, metrics=metrics)
        self.keys = [_key(i) for i in range(16)]
        self.core.put_inline([(k, b"x" * BLOCK_BYTES, b"") for k in self.keys], b"")
        self.sid = self.core.open_session("bench")
        for _ in range(held):
            self.core.pin_blocks([self.keys[1]], b"", session_id=self.sid)
        self.ops: dict[str, Callable[[int], None]] = {
            "get": self.get, "put": self.put, "lookup": self.lookup,
        }

    def get(self, _: int) -> None:
        pin_id, _got = self.core.pin_blocks([self.keys[0]], b"", session_id=self.sid)
        self.core.release_pins([pin_id])

    def put(self, i: int) -> None:
        rid, _ = self.core.reserve_put(
            [(_key(1_000_000 + i), BLOCK_BYTES, b"")], b"", session_id=self.sid
        )
        self.core.commit_put(rid, abort=True)

    def lookup(self, _: int) -> None:
        self.core.lookup_prefix(self.keys, b"")

    def close(self) -> None:
        self.core.release_all()
        self.store.close()


def _round_us(fn: Callable[[int], None], start: int, iters: int) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter()
        for i in range(start, start + iters):
            fn(i)
        return (time.perf_counter() - t0) / iters * 1e6
    finally:
        gc.enable()


def measure(held: int, iters: int, rounds: int) -> dict[str, dict[str, float]]:
    """Per-op node-side latency (us), metrics off and on, with ``held`` other pins active.

    Rounds of the two nodes alternate; each figure is the fastest round's mean per call (the
    least disturbed by other processes on a shared machine).
    """
    nodes = {"off": _Node(False, held), "on": _Node(True, held)}
    try:
        best: dict[str, dict[str, float]] = {op: {} for op in ("get", "put", "lookup")}
        for r in range(rounds + 1):  # round 0 warms up
            for name, node in nodes.items():
                for op, fn in node.ops.items():
                    t = _round_us(fn, r * iters, iters)
                    if r:
                        best[op][name] = min(best[op].get(name, t), t)
        return best
    finally:
        for node in nodes.values():
            node.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--iters", type=int, default=500, help="calls per timed round")
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds per node and op")
    ap.add_argument("--held", type=int, nargs="+", default=[0, 1000], help="other pins held")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    kvlog.configure(level="warning")
    res: dict[str, dict[str, float]] = {}
    print(
        f"{'held pins':>9} {'op':>7} {'no metrics us':>14} {'metrics us':>11} "
        f"{'metrics cost us':>16} {'ratio':>6}"
    )
    for held in args.held:
        best = measure(held, args.iters, args.rounds)
        for op in ("get", "put", "lookup"):
            a, b = best[op]["off"], best[op]["on"]
            res[f"{op}_held{held}"] = {
                "no_metrics_us": a, "metrics_us": b, "cost_us": b - a, "ratio": b / a,
            }
            print(f"{held:>9} {op:>7} {a:>14.2f} {b:>11.2f} {b - a:>16.2f} {b / a:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
