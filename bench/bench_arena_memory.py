"""Why a one-sided get of small blocks trails the working-set memcpy: the memory it reads.

Usage: python bench/bench_arena_memory.py [--size-kib 256] [--reps 3] [--json FILE]

Copies batches of 16 blocks (one native ``copy_many`` call, as a one-sided get copies) out of
three working sets of the same size, each batch cold (a 64 MiB copy evicts the caches first),
interleaved so load drift hits all alike, and prints the median batch time of each:

  * thp     numpy anonymous memory (what bench_one_sided.py's ws memcpy reference reads):
            transparent huge pages where /sys/kernel/mm/transparent_hugepage/enabled allows
  * nothp   anonymous memory with MADV_NOHUGEPAGE (4 KiB pages)
  * shm     a MAP_SHARED mapping of a /dev/shm file, as the node's arena (tmpfs: 4 KiB pages
            unless .../shmem_enabled gives tmpfs huge pages)

Ratios are to ``thp`` of the same run. Never collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvstored.native import copy_many  # noqa: E402

BATCH = 16
GROUPS = 30


def _thp_modes() -> dict[str, str]:
    out = {}
    for f in ("enabled", "shmem_enabled"):
        try:
            out[f] = pathlib.Path(f"/sys/kernel/mm/transparent_hugepage/{f}").read_text().strip()
        except OSError:
            out[f] = "unknown"
    return out


def run(size: int, reps: int) -> dict[str, object]:
    total = size * BATCH * GROUPS
    thp = np.ones(total, dtype=np.uint8)
    anon = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(anon, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        anon.madvise(mmap.MADV_NOHUGEPAGE)
    nothp = np.frombuffer(anon, dtype=np.uint8)
    nothp[:] = 1
    fd, path = tempfile.mkstemp(prefix="kvstored-bench-mem-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.ftruncate(fd, total)
        shm_map = mmap.mmap(fd, total, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)
        os.unlink(path)
    shm = np.frombuffer(shm_map, dtype=np.uint8)
    shm[:] = 1
    bufs = [np.empty(size, dtype=np.uint8) for _ in range(BATCH)]
    flush, sink = np.ones(64 << 20, dtype=np.uint8), np.empty(64 << 20, dtype=np.uint8)
    times: dict[str, list[float]] = {"thp": [], "nothp": [], "shm": []}
    for _ in range(reps):
        for g in range(GROUPS):
            for name, src in (("thp", thp), ("nothp", nothp), ("shm", shm)):
                np.copyto(sink, flush)
                pairs = [(bufs[k], src[(g * BATCH + k) * size:(g * BATCH + k + 1) * size]) for k in range(BATCH)]
                t0 = time.perf_counter()
                copy_many(pairs)
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    res: dict[str, object] = {f"{k}_batch_us": v * 1e6 for k, v in med.items()}
    res.update({f"{k}_vs_thp": med["thp"] / v for k, v in med.items() if k != "thp"})
    res.update({"block_bytes": size, "batch": BATCH, "batches_each": reps * GROUPS, "thp_modes": _thp_modes()})
    del thp, nothp, shm
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-kib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    res = run(args.size_kib << 10, args.reps)
    print(f"cold 16 x {args.size_kib} KiB batch: anonymous THP {res['thp_batch_us']:.0f} us, "
          f"anonymous 4 KiB pages {res['nothp_batch_us']:.0f} us ({res['nothp_vs_thp']:.2f}x), "
          f"/dev/shm like the arena {res['shm_batch_us']:.0f} us ({res['shm_vs_thp']:.2f}x); "
          f"THP modes {res['thp_modes']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
