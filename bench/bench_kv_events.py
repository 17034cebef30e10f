"""What KV events cost the master: index work with the publisher on, as a ratio to the same
work on a plain BlockIndex measured in the same run.

Two workloads on one index, each run with a plain :class:`BlockIndex` (the reference) and
with an :class:`ObservedBlockIndex` feeding a started :class:`KVEventPublisher` (sockets on
loopback port 0, nobody subscribed; its thread batches, encodes and sends):

- ``sync``: ``--nodes`` holders each get ``--blocks`` blocks in one ``add_replicas_bulk``
  (an inventory sync into an unreadable holder), then ``set_readable(True)``.
- ``events``: ``--events`` single ``add_replica`` then as many ``remove_replica`` calls on a
  readable holder (what ReportEvents applies).

Measured: process CPU seconds (``time.process_time``: the publisher's thread included)
until the publisher has sent everything (``flush``). Printed and written as JSON.

Usage:  python bench/bench_kv_events.py [--nodes 10] [--blocks 10000] [--events 20000]
        [--out bench/results/bench_kv_events.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from kvstored.master.events import KVEventPublisher, PublisherSettings
from kvstored.master.index import BlockIndex
from kvstored.master.observed import ObservedBlockIndex
from kvstored.types import Tier

NS = b"\x33" * 16


def _keys(n: int, salt: int) -> list[bytes]:
    return [salt.to_bytes(4, "big") + i.to_bytes(12, "big") for i in range(n)]


def _run(observed: bool, nodes: int, blocks: int, events: int) -> dict[str, float]:
    pub = None
    if observed:
        pub = KVEventPublisher(PublisherSettings(endpoint="tcp://127.0.0.1:0"),
                               node_of=lambda h: f"node-{h}")
        pub.start()
        ix: BlockIndex = ObservedBlockIndex(pub, 1024)
    else:
        ix = BlockIndex(1024)
    out = {}
    t0 = time.process_time()
    for n in range(nodes):
        h = ix.add_holder()
        keys = _keys(blocks, n)
        ix.add_replicas_bulk(NS, keys, holder=h, tiers=[int(Tier.DRAM)] * blocks,
                             sizes=[4096] * blocks, generation=1)
        ix.set_readable(h, True)
    if pub is not None:
        assert pub.flush(120)
    out["sync_cpu_s"] = time.process_time() - t0
    h = ix.add_holder()
    ix.set_readable(h, True)
    keys = _keys(events, 1 << 20)
    t0 = time.process_time()
    for k in keys:
        ix.add_replica(NS, k, holder=h, tier=Tier.DRAM, size_bytes=4096, generation=2)
    for k in keys:
        ix.remove_replica(NS, k, holder=h, tier=Tier.DRAM)
    if pub is not None:
        assert pub.flush(120)
        out["num_batches"] = pub.num_batches
        pub.stop()
    out["events_cpu_s"] = time.process_time() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=Path("bench/results/bench_kv_events.json"))
    a = ap.parse_args()
    plain = _run(False, a.nodes, a.blocks, a.events)
    observed = _run(True, a.nodes, a.blocks, a.events)
    res = {
        "nodes": a.nodes, "blocks_per_node": a.blocks, "events": a.events,
        "load_avg": os.getloadavg()[0], "plain": plain, "observed": observed,
        "sync_ratio": observed["sync_cpu_s"] / plain["sync_cpu_s"],
        "events_ratio": observed["events_cpu_s"] / plain["events_cpu_s"],
        "sync_us_per_block_extra": (observed["sync_cpu_s"] - plain["sync_cpu_s"])
        / (a.nodes * a.blocks) * 1e6,
        "events_us_per_event_extra": (observed["events_cpu_s"] - plain["events_cpu_s"])
        / (2 * a.events) * 1e6,
    }
    print(json.dumps(res, indent=2))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
