"""Daemon memory per stored block: TieredStore metadata at N blocks (default 1M).

Commits N small blocks (reserve + commit; the arena pages are never touched, so the anonymous
arena adds no RSS) and reports the growth of the process RSS and of the Python heap
(tracemalloc is too slow at 1M, so the heap figure comes from sys.getsizeof over the index).
The keys (16-byte block hashes) are counted: the store keeps them. Also measures the SSD
tier's in-memory index (SsdEntry records in its OrderedDict) without writing files.

Target: <= 300 bytes per block at 1M blocks.

Usage:  python bench/bench_store_memory.py [--num-blocks 1000000] [--block-bytes 4096]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections import OrderedDict

import structlog

from kvstored.tiers.ssd_format import SsdEntry
from kvstored.tiers.tiered import TieredStore

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-blocks", type=int, default=1_000_000)
    ap.add_argument("--block-bytes", type=int, default=4096)
    args = ap.parse_args()
    n = args.num_blocks
    block = args.block_bytes
    ns = b"N" * 16
    meta = b'{"dtype":"bfloat16","shape":[2,32,8,256,128]}'

    store = TieredStore(dram_size_bytes=n * ((block + 4095) // 4096) * 4096, arena_dir=None)
    rnd = os.urandom(8 * n)
    gc.collect()
    base = rss_bytes()
    t0 = time.perf_counter()
    for i in range(n):
        k = i.to_bytes(8, "little") + rnd[8 * i : 8 * i + 8]  # a 16-byte block hash
        # fresh ns/meta objects per block, as decoded from each request
        r = store.reserve(k, block, namespace_id=bytes(ns), meta=bytes(meta))
        assert r is not None
        store.commit(r)
    dt = time.perf_counter() - t0
    gc.collect()
    grown = rss_bytes() - base
    key_bytes = sys.getsizeof(next(iter(store._state.dram.entries)))
    st = store.stats()
    assert st.tiers[0].num_blocks == n

    entries = store._state.dram.entries
    sample = next(iter(entries.values()))
    heap_od = sys.getsizeof(entries) / n
    print(f"blocks committed: {n} x {block} B in {dt:.1f} s ({n / dt / 1e3:.0f}k commits/s)")
    print(f"DRAM tier: RSS growth incl. keys = {grown / n:.0f} bytes/block "
          f"(keys alone ~{key_bytes:.0f} B each)")
    print(f"  breakdown: DramEntry {sys.getsizeof(sample)} B + offset int "
          f"{sys.getsizeof(sample.offset)} B, OrderedDict {heap_od:.0f} B/entry "
          f"(+ linked-list node), key {key_bytes:.0f} B; size int, ns and meta shared")
    del r, entries, sample
    store.close()
    del store
    gc.collect()

    # SSD tier index: the same per-block records as the SSD tier keeps, without files.
    base2 = rss_bytes()
    od: OrderedDict[bytes, SsdEntry] = OrderedDict()
    info = (ns, meta)  # interned (namespace_id, meta) pair, as the store shares it
    for i in range(n):
        k = i.to_bytes(8, "little") + os.urandom(8)
        od[k] = SsdEntry(block, (i * 0x9E3779B97F4A7C15) & (2**64 - 1), info)
    gc.collect()
    ssd_grown = rss_bytes() - base2
    print(f"SSD tier index: RSS growth incl. keys = {ssd_grown / n:.0f} bytes/block")
    print(f"RESULT dram_bytes_per_block={grown / n:.0f} ssd_index_bytes_per_block="
          f"{ssd_grown / n:.0f} target<=300 bytes (keys included"
          ")")


if __name__ == "__main__":
    main()
