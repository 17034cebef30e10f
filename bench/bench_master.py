"""Master block index: bytes per replica and 512-key prefix lookup at 10k, 1M (and 10M) blocks.

Each size runs in a fresh subprocess (clean RSS). It indexes N blocks with one COMMITTED
replica each, spread over 8 holders (node incarnations), 16-byte random keys, then times
``BlockIndex.lookup_prefix`` of 512 present keys (a full walk: nothing stops early), asked
from one of the holders so locality ranking is exercised.

Memory is reported two ways: the growth of the process RSS over the build (after
``malloc_trim``, so freed build temporaries do not count; allocator slack does) and
``BlockIndex.memory_bytes()`` (its numpy columns and key tables, spare capacity included).

Reference measured in the same run: a plain-Python index (``dict[bytes, list[tuple]]``, one
tuple per replica, ranking in a Python loop) at the same sizes up to ``--naive-max``.
Ratios printed: lookup p50 at N / at 10k (target ~1: the cost does not grow with N), and
packed / naive for bytes and lookup time.

Targets (issue 7): <= 300 bytes per replica at 10M; 512-key lookup the same at 10k and 10M.

``--impl python`` runs the packed index with its numpy loops (``KVSTORED_NATIVE=0``) instead
of the C ones (native/master.c, the default).

Usage:  python bench/bench_master.py [--sizes 10000,1000000,10000000] [--naive-max 1000000]
        [--lookups 2000] [--impl native|python] [--out bench/results/bench_master.json]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HOLDERS = 8
PREFIX = 512
NS = b"\x42" * 16
CHUNK = 1 << 20


def rss_bytes() -> int:
    """Resident bytes after handing freed heap back to the OS (build transients excluded)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _keys(rng: np.random.Generator, n: int) -> list[bytes]:
    buf = rng.bytes(16 * n)
    return [buf[i : i + 16] for i in range(0, 16 * n, 16)]


def _percentiles(samples_ns: list[int]) -> dict[str, float]:
    a = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "lookups_per_s": float(1e6 / a.mean())}


def run_packed(n: int, lookups: int) -> dict[str, Any]:
    from kvstored.master.index import BlockIndex
    from kvstored.types import Tier

    rng = np.random.default_rng(n)
    gc.collect()
    rss0 = rss_bytes()
    ix = BlockIndex(initial_blocks=1024)
    holders = [ix.add_holder() for _ in range(HOLDERS)]
    for h in holders:
        ix.set_readable(h, True)
        ix.set_load(h, float(h))
    prefixes: list[list[bytes]] = []
    t0 = time.perf_counter()
    done = 0
    while done < n:
        m = min(CHUNK, n - done)
        keys = _keys(rng, m)
        h = holders[(done // CHUNK) % HOLDERS]
        tiers = np.where(rng.random(m) < 0.5, int(Tier.DRAM), int(Tier.SSD))
        ix.add_replicas_bulk(NS, keys, holder=h, tiers=tiers, sizes=np.full(m, 1 << 20),
                             generation=done + 1)
        if len(prefixes) < 64 and m >= PREFIX:
            for s in range(0, m - PREFIX, max(PREFIX, (m - PREFIX) // 8))[:8]:
                prefixes.append(keys[s : s + PREFIX])
        del keys, tiers
        done += m
    build_s = time.perf_counter() - t0
    gc.collect()
    rss1 = rss_bytes()
    acct = ix.memory_bytes()
    samples = []
    for i in range(lookups):
        p = prefixes[i % len(prefixes)]
        t = time.perf_counter_ns()
        got = ix.lookup_prefix(NS, p, local_holder=holders[i % HOLDERS])
        samples.append(time.perf_counter_ns() - t)
        assert len(got) == PREFIX
    return {"impl": "packed", "num_replicas": ix.num_replicas, "build_s": round(build_s, 2),
            "rss_bytes_per_replica": (rss1 - rss0) / n, "accounted_bytes_per_replica": acct / n,
            **_percentiles(samples)}


def run_naive(n: int, lookups: int) -> dict[str, Any]:
    """The reference: one Python tuple per replica in a dict of lists."""
    rng = np.random.default_rng(n)
    gc.collect()
    rss0 = rss_bytes()
    index: dict[bytes, list[tuple[int, int, int, int, int]]] = {}
    readable = [True] * HOLDERS
    load = [float(h) for h in range(HOLDERS)]
    prefixes: list[list[bytes]] = []
    done = 0
    t0 = time.perf_counter()
    while done < n:
        m = min(CHUNK, n - done)
        keys = _keys(rng, m)
        h = (done // CHUNK) % HOLDERS
        tiers = np.where(rng.random(m) < 0.5, 1, 2).tolist()
        for k, t in zip(keys, tiers, strict=True):
            index[k] = [(h, t, 1 << 20, done + 1, 2)]
        if len(prefixes) < 64 and m >= PREFIX:
            for s in range(0, m - PREFIX, max(PREFIX, (m - PREFIX) // 8))[:8]:
                prefixes.append(keys[s : s + PREFIX])
        del keys, tiers
        done += m
    build_s = time.perf_counter() - t0
    gc.collect()
    rss1 = rss_bytes()

    def lookup(keys: list[bytes], local: int) -> list[tuple[int, int, int, int, int]]:
        out = []
        for k in keys:
            reps = index.get(k)
            best = None
            best_score = None
            for r in reps or ():
                if r[4] != 2 or not readable[r[0]]:
                    continue
                score = ((0 if r[0] == local else 2) + (r[1] == 2), load[r[0]], r[0])
                if best_score is None or score < best_score:
                    best, best_score = r, score
            if best is None:
                break
            out.append(best)
        return out

    samples = []
    for i in range(lookups):
        p = prefixes[i % len(prefixes)]
        t = time.perf_counter_ns()
        got = lookup(p, i % HOLDERS)
        samples.append(time.perf_counter_ns() - t)
        assert len(got) == PREFIX
    return {"impl": "naive", "num_replicas": n, "build_s": round(build_s, 2),
            "rss_bytes_per_replica": (rss1 - rss0) / n, "accounted_bytes_per_replica": None,
            **_percentiles(samples)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,1000000,10000000")
    ap.add_argument("--naive-max", type=int, default=1_000_000)
    ap.add_argument("--lookups", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=Path("bench/results/bench_master.json"))
    ap.add_argument("--impl", choices=("native", "python"), default="native",
                    help="the index's loops: C (native/master.c) or the numpy fallback "
                         "(KVSTORED_NATIVE=0 in the subprocesses)")
    ap.add_argument("--one", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        impl, n = args.one[0], int(args.one[1])
        fn = run_packed if impl == "packed" else run_naive
        print(json.dumps(fn(n, args.lookups)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        for impl in ("packed", "naive"):
            if impl == "naive" and n > args.naive_max:
                continue
            env = dict(os.environ, KVSTORED_NATIVE="0") if args.impl == "python" else None
            out = subprocess.run(
                [sys.executable, __file__, "--one", impl, str(n), "--lookups", str(args.lookups)],
                capture_output=True, text=True, check=True, env=env,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["index_impl"] = args.impl
            rows.append(row)
            print(f"{impl:6} N={n:>10,}  rss {row['rss_bytes_per_replica']:7.1f} B/replica"
                  + (f"  accounted {row['accounted_bytes_per_replica']:6.1f}"
                     if row["accounted_bytes_per_replica"] else "")
                  + f"  lookup512 p50 {row['p50_us']:8.1f} us  p99 {row['p99_us']:8.1f} us"
                  + f"  ({row['lookups_per_s']:,.0f}/s)  build {row['build_s']} s", flush=True)
    base = {r["impl"]: r for r in rows if r["num_replicas"] == sizes[0]}
    print(f"\nratios (p50 at N / p50 at {sizes[0]:,}; packed / naive at the same N)")
    for r in rows:
        if r["impl"] != "packed":
            continue
        n = r["num_replicas"]
        naive = next((x for x in rows if x["impl"] == "naive" and x["num_replicas"] == n), None)
        line = f"  N={n:>10,}  lookup p50 x{r['p50_us'] / base['packed']['p50_us']:.2f}"
        line += f"  p99 x{r['p99_us'] / base['packed']['p99_us']:.2f}"
        if naive:
            line += (f"  | vs naive: bytes x{r['rss_bytes_per_replica'] / naive['rss_bytes_per_replica']:.2f}"
                     f"  lookup x{r['p50_us'] / naive['p50_us']:.2f}")
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "sizes": sizes}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
