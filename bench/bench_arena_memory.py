"""What a one-sided get of small blocks can reach: the memory it reads, and where it writes.

Usage: python bench/bench_arena_memory.py [--size-kib 256] [--reps 3] [--json FILE]

Copies batches of 16 blocks (one native ``copy_many`` call, as a one-sided get copies) out of
working sets of the same size, each batch cold (a 64 MiB copy evicts the caches first),
interleaved so load drift hits all alike, and prints the median batch time of each source:

  * thp        numpy anonymous memory (what bench_one_sided.py's ws memcpy reference reads):
               transparent huge pages where /sys/kernel/mm/transparent_hugepage/enabled allows
  * nothp      anonymous memory with MADV_NOHUGEPAGE (4 KiB pages)
  * shm        a MAP_SHARED mapping of a /dev/shm file, as the node's arena (tmpfs: 4 KiB pages
               unless the mount's ``huge=`` option gives it huge pages)
  * memfd_thp  a memfd with MADV_HUGEPAGE (shmem THP: 2 MiB pages only where .../shmem_enabled
               is ``advise``, ``within_size`` or ``always``; listed with ``huge: false`` else)
  * hugetlb    a memfd with MFD_HUGETLB (2 MiB pages; only where pages are reserved:
               /proc/sys/vm/nr_hugepages; skipped, saying so, else)

into three sets of destinations: ``np.empty`` buffers (wherever the heap puts them: the
fields kept from the first version of this bench, ``<kind>_batch_us``, ``<kind>_vs_thp``),
buffers on a page (``page+0``) and buffers 16 bytes past a page (``page+16``, where a fresh
large numpy array starts). Every source block starts on a page except numpy's (16 bytes past
one), so ``page+16`` puts the destination 16 bytes past the source modulo 4 KiB for
all but ``thp``: the case where glibc's ``rep movsb`` meets 4 KiB aliasing on the AMD VM of
docs/performance.md ("The 256 KiB get is not bound by the page size"); native/copy.c's
copy_bytes takes a vector loop there. The page size of each source is read back from
/proc/self/smaps. Ratios are to ``thp`` of the same run and destinations. Never collected by
pytest.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import pathlib
import re
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
HUGE = 2 << 20


def _thp_modes() -> dict[str, str]:
    out = {}
    for f in ("enabled", "shmem_enabled"):
        try:
            out[f] = pathlib.Path(f"/sys/kernel/mm/transparent_hugepage/{f}").read_text().strip()
        except OSError:
            out[f] = "unknown"
    return out


def _huge_kib(addr: int, size: int) -> int:
    """KiB of ``[addr, addr + size)`` this process maps with 2 MiB pages (THP or hugetlb)."""
    total = 0
    try:
        text = pathlib.Path("/proc/self/smaps").read_text()
    except OSError:
        return -1
    for blk in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in blk.split(None, 1)[0].split("-"))
        if hi <= addr or lo >= addr + size:
            continue
        for field in ("AnonHugePages", "ShmemPmdMapped", "FilePmdMapped", "Private_Hugetlb", "Shared_Hugetlb"):
            m = re.search(field + r":\s+(\d+) kB", blk)
            total += int(m.group(1)) if m else 0
    return total


def _sources(total: int) -> tuple[dict[str, np.ndarray], dict[str, str], list[mmap.mmap]]:
    """Each working set (filled), the kinds not available here and why, the mappings."""
    srcs: dict[str, np.ndarray] = {"thp": np.ones(total, dtype=np.uint8)}
    missing: dict[str, str] = {}
    maps: list[mmap.mmap] = []
    anon = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(anon, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        anon.madvise(mmap.MADV_NOHUGEPAGE)
    maps.append(anon)
    srcs["nothp"] = np.frombuffer(anon, dtype=np.uint8)
    fd, path = tempfile.mkstemp(prefix="kvstored-bench-mem-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.ftruncate(fd, total)
        maps.append(mmap.mmap(fd, total, flags=mmap.MAP_SHARED))
    finally:
        os.close(fd)
        os.unlink(path)
    srcs["shm"] = np.frombuffer(maps[-1], dtype=np.uint8)
    for kind, flags in (("memfd_thp", 0), ("hugetlb", getattr(os, "MFD_HUGETLB", None))):
        if flags is None or not hasattr(os, "memfd_create"):
            missing[kind] = "no memfd_create / MFD_HUGETLB in this Python"
            continue
        try:
            fd = os.memfd_create(f"kvstored-bench-{kind}", os.MFD_CLOEXEC | flags)
            try:
                os.ftruncate(fd, total)
                m = mmap.mmap(fd, total, flags=mmap.MAP_SHARED)
            finally:
                os.close(fd)
            if kind == "memfd_thp":
                m.madvise(mmap.MADV_HUGEPAGE)
            a = np.frombuffer(m, dtype=np.uint8)
            a[:] = 1  # hugetlb: SIGBUS-free only because ftruncate + mmap reserved the pages
        except OSError as e:
            missing[kind] = f"{e} (hugetlb: reserve pages with /proc/sys/vm/nr_hugepages)"
            continue
        maps.append(m)
        srcs[kind] = a
    for a in srcs.values():
        a[:] = 1
    return srcs, missing, maps


def _bufs(size: int, offset: int) -> list[np.ndarray]:
    out = []
    for _ in range(BATCH):
        raw = np.empty(size + 8192, dtype=np.uint8)
        start = (-raw.ctypes.data) % 4096 + offset
        out.append(raw[start : start + size])
    return out


def run(size: int, reps: int) -> dict[str, object]:
    total = -(-size * BATCH * GROUPS // HUGE) * HUGE
    srcs, missing, _maps = _sources(total)
    dsts = {"np.empty": [np.empty(size, dtype=np.uint8) for _ in range(BATCH)],
            "page+0": _bufs(size, 0), "page+16": _bufs(size, 16)}
    flush, sink = np.ones(64 << 20, dtype=np.uint8), np.empty(64 << 20, dtype=np.uint8)
    times: dict[tuple[str, str], list[float]] = {(d, k): [] for d in dsts for k in srcs}
    order = list(times)
    for _ in range(reps):
        for g in range(GROUPS):
            for d, name in order[g % len(order):] + order[:g % len(order)]:
                np.copyto(sink, flush)
                src, bufs = srcs[name], dsts[d]
                pairs = [(bufs[k], src[(g * BATCH + k) * size:(g * BATCH + k + 1) * size]) for k in range(BATCH)]
                t0 = time.perf_counter()
                copy_many(pairs)
                times[(d, name)].append(time.perf_counter() - t0)
    med = {key: statistics.median(v) for key, v in times.items()}
    res: dict[str, object] = {f"{k}_batch_us": med[("np.empty", k)] * 1e6 for k in ("thp", "nothp", "shm")}
    res.update({f"{k}_vs_thp": med[("np.empty", "thp")] / med[("np.empty", k)] for k in ("nothp", "shm")})
    res["by_dst"] = {d: {k: {"batch_us": med[(d, k)] * 1e6, "vs_thp": med[(d, "thp")] / med[(d, k)]}
                         for k in srcs} for d in dsts}
    res["dst_page_offsets"] = {d: sorted({b.ctypes.data % 4096 for b in bufs}) for d, bufs in dsts.items()}
    res["src_page_offsets"] = {k: a.ctypes.data % 4096 for k, a in srcs.items()}
    res["huge_kib"] = {k: _huge_kib(a.ctypes.data, total) for k, a in srcs.items()}
    res["unavailable"] = missing
    res.update({"block_bytes": size, "batch": BATCH, "batches_each": reps * GROUPS, "thp_modes": _thp_modes(),
                "nr_hugepages": _read("/proc/sys/vm/nr_hugepages")})
    del srcs, dsts
    return res


def _read(path: str) -> str:
    try:
        return pathlib.Path(path).read_text().strip()
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-kib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    res = run(args.size_kib << 10, args.reps)
    by_dst = res["by_dst"]
    assert isinstance(by_dst, dict)
    print(f"cold 16 x {args.size_kib} KiB batches, us (x of thp into the same destinations); "
          f"THP modes {res['thp_modes']}, nr_hugepages {res['nr_hugepages']}")
    kinds = list(next(iter(by_dst.values())))
    huge = res["huge_kib"]
    assert isinstance(huge, dict)
    print(f"{'destinations':>12} | " + " | ".join(f"{k} ({'2 MiB' if huge[k] > 0 else '4 KiB'} pages)" for k in kinds))
    for d, row in by_dst.items():
        print(f"{d:>12} | " + " | ".join(f"{row[k]['batch_us']:.0f} ({row[k]['vs_thp']:.2f}x)" for k in kinds))
    for k, why in dict(res["unavailable"]).items():  # type: ignore[call-overload]
        print(f"{k}: not run ({why})")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
