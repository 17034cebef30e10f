"""MasterLink per-round cost on a node with 10k and 1M blocks: listing + diff vs the change feed.

A node's MasterLink reports the store's changes to the master once per heartbeat round.
Before the change feed it listed every block of the store (under the store lock) and diffed
two listings; now it drains ``TieredStore.change_feed`` (kvstored/tiers/feed.py). This bench
builds a real TieredStore with N committed blocks (empty payloads: the arena's pages are
never touched, only the metadata is real), then runs rounds of ``MasterLink.run_once()``
against an in-process fake master stub (no gRPC: the figures are the link's own work), each
round after C store changes (C/2 puts of new blocks, C/2 removals of old ones).

Reported per mode and N: CPU ms per round (process time of the round), wall ms, and the
store-lock hold time per round (the listing, measured separately; 0 with the feed, which
has its own lock). Reference in the same run: the ``diff`` mode (the link with its feed
switched off, exactly the code path before the feed). Ratio printed: diff / feed.

Usage:  python bench/bench_master_link.py [--sizes 10000,1000000] [--changes 100]
        [--rounds 10] [--out bench/results/bench_master_link.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from pathlib import Path
from typing import Any

from kvstored import log as kvlog
from kvstored.config import ClusterConfig
from kvstored.node.cluster import MasterLink
from kvstored.tiers.tiered import TieredStore
from kvstored.v1 import master_pb2 as pb


class FakeMaster:
    """A stub that accepts every call (counts events; no index)."""

    def __init__(self) -> None:
        self.events = 0
        self.synced = 0
        self._applied = 0

    async def RegisterNode(self, req: Any, timeout: float) -> Any:  # noqa: N802 (gRPC names)
        return pb.RegisterNodeResponse(node_lease_ms=10000, master_epoch=1)

    async def SyncInventory(self, req: Any, timeout: float) -> Any:  # noqa: N802
        self.synced += len(req.blocks)
        if req.last_chunk:
            self._applied = req.seq
        return pb.SyncInventoryResponse()

    async def ReportEvents(self, req: Any, timeout: float) -> Any:  # noqa: N802
        self.events += len(req.events)
        if req.events:
            self._applied = req.events[-1].seq
        return pb.ReportEventsResponse(applied_seq=self._applied)

    async def Heartbeat(self, req: Any, timeout: float) -> Any:  # noqa: N802
        return pb.HeartbeatResponse(node_lease_ms=10000)


def _key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def run(n: int, mode: str, changes: int, rounds: int) -> dict[str, Any]:
    store = TieredStore(dram_size_bytes=4096 * (n + changes * rounds + 16), arena_dir=None,
                        node_id="bench", max_block_bytes=1 << 20)
    t0 = time.perf_counter()
    for i in range(n):
        store.put(_key(i), b"")
    build_s = time.perf_counter() - t0
    link = MasterLink(ClusterConfig(master_address="127.0.0.1:1"), node_id="n", epoch=1,
                      grpc_address="127.0.0.1:2", data_address="127.0.0.1:3", store=store,
                      load=lambda: 0.0)
    stub = FakeMaster()
    link._stub = stub  # type: ignore[assignment]
    if mode == "diff":
        link.feed = None
    cpu_ms, wall_ms, lock_ms = [], [], []

    async def main() -> None:
        await link.run_once()  # registers and takes the full inventory (not timed)
        nxt, old = n, 0
        for _ in range(rounds):
            for _ in range(changes // 2):
                store.put(_key(nxt), b"")
                nxt += 1
            store.remove([_key(old + j) for j in range(changes - changes // 2)])
            old += changes - changes // 2
            gc.collect()
            c, w = time.process_time(), time.perf_counter()
            await link.run_once()
            cpu_ms.append((time.process_time() - c) * 1e3)
            wall_ms.append((time.perf_counter() - w) * 1e3)
            if mode == "diff":  # what the round held the store lock for: one listing
                t = time.perf_counter()
                store.list_blocks(limit=1 << 40)
                lock_ms.append((time.perf_counter() - t) * 1e3)
            else:
                lock_ms.append(0.0)

    asyncio.run(main())
    expected = rounds * changes
    assert stub.events == expected, f"{mode}: {stub.events} events reported, {expected} made"
    store.close()
    med = sorted
    return {"mode": mode, "blocks": n, "changes_per_round": changes, "rounds": rounds,
            "build_s": round(build_s, 2), "listings": link.num_listings,
            "cpu_ms_p50": med(cpu_ms)[len(cpu_ms) // 2], "wall_ms_p50": med(wall_ms)[len(wall_ms) // 2],
            "lock_ms_p50": med(lock_ms)[len(lock_ms) // 2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,1000000")
    ap.add_argument("--changes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("bench/results/bench_master_link.json"))
    args = ap.parse_args()
    kvlog.configure(level="warning")  # no per-block info lines from the store
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        for mode in ("diff", "feed"):
            rows.append(run(n, mode, args.changes, args.rounds))
            gc.collect()
    print("\n| blocks | mode | CPU ms/round p50 | wall ms/round p50 | store lock ms/round | listings | diff/feed CPU |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        ref = next(x for x in rows if x["blocks"] == r["blocks"] and x["mode"] == "diff")
        ratio = ref["cpu_ms_p50"] / max(r["cpu_ms_p50"], 1e-6)
        print(f"| {r['blocks']:,} | {r['mode']} | {r['cpu_ms_p50']:.2f} | {r['wall_ms_p50']:.2f} | "
              f"{r['lock_ms_p50']:.1f} | {r['listings']} | {'' if r['mode'] == 'diff' else f'x{ratio:,.0f}'} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
