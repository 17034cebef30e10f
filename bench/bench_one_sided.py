"""One-sided shared-memory reads (issue 18 section 1): ratios to references of the same run.

Usage (standalone: starts its own daemon; bench/bench_blocks.py calls :func:`run_all` too):
    python bench/bench_one_sided.py [--json bench/results/bench_one_sided.json] [--iters 20]

Rows (each read measured one-sided, i.e. the default, and pinned, ``KVSTORED_ONE_SIDED=0``):
  * get_<size>   get_into of a batch of 16 blocks of 256 KiB / 4 MiB: GB/s next to the
                 working-set memcpy reference (a distinct slot per block of a prefaulted buffer
                 as large as the arena working set, as bench_blocks.py's memcpy_ws_get), and
                 next to the same copies from a /dev/shm mapping (memory of the arena's kind:
                 where tmpfs gets no transparent huge pages but numpy's anonymous memory does,
                 that reference is slower, and it is the ceiling of any reader of the arena).
                 The destination buffers start 2 KiB past a page (_page_bufs): with glibc
                 2.36 on the AMD VM, a 4 KiB+ memcpy whose destination sits 1-63 bytes past
                 its source modulo 4096 runs 3-8x slower (`rep movsb` and 4 KiB aliasing),
                 and plain np.empty buffers land wherever the heap puts them, so either side
                 of a ratio could hit that by chance; 2 KiB past a page is as far from it as
                 can be for page-aligned sources (the arena's, /dev/shm's) and numpy's (16
                 bytes past a page) alike. ``get_off16`` reads into buffers 16 bytes past a
                 page (a fresh large numpy array's, malloc's mmap'd chunks), the case that
                 hit it (native/copy.c copy_bytes)
  * put_<size>   shm put of the same batches next to memcpy_ws_put, measured interleaved
                 (reference, put, put again): with reserve-ahead slots (the default: one
                 CommitSlots per put) and without (``reserve_ahead_bytes=0``: ReservePut + copy
                 + CommitPut, the path before), each on keys of its own
  * single_get   one 64 KiB block, get_into, p50 in us
  * lookup_prefix_512   lookup_prefix of 512 DRAM keys, p50/p99 in ms (2000 calls), next to
                 a pure-Python CPU loop of the same p50 interleaved with them: the p99 that
                 scheduling alone gives a call that long on this machine
  * storm        reader gets while a writer's puts evict: the one-sided fallback rate
                 (copies whose version check failed / blocks tried one-sided)
Targets (issue 18): get 256 KiB >= 0.8x ws memcpy, 4 MiB >= 0.95x; single get p50 <= 25 us;
lookup_prefix(512) p99 <= 0.1 ms; put 256 KiB >= 0.6x, 4 MiB >= 0.9x.
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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvstored import Client  # noqa: E402
from kvstored.client import _shm  # noqa: E402

BATCH = 16


def _timed(fn: Callable[[int], None], iters: int, warmup: int = 2) -> list[float]:
    for i in range(warmup):
        fn(-1 - i)
    out = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def _p(lat: list[float], q: float) -> float:
    s = sorted(lat)
    return s[min(len(s) - 1, int(q * (len(s) - 1)))]


@contextmanager
def _pinned(on: bool) -> Iterator[None]:
    old = os.environ.get("KVSTORED_ONE_SIDED")
    if on:
        os.environ["KVSTORED_ONE_SIDED"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KVSTORED_ONE_SIDED", None)
        else:
            os.environ["KVSTORED_ONE_SIDED"] = old


def _keys(tag: str, size: int, i: int) -> list[bytes]:
    return [f"os:{tag}:{size}:{i}:{j}".encode().ljust(16, b".") for j in range(BATCH)]


def bench_size(c: Client, size: int, iters: int, c_reserve: Client | None = None) -> dict[str, float]:
    """Batch get/put GB/s next to the working-set memcpy references (see the module doc)."""
    rng = np.random.default_rng(size)
    values = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(BATCH)]
    bufs = _page_bufs(size, 2048)
    bufs16 = _page_bufs(size, 16)
    total = size * BATCH
    groups = iters + 2
    ws = np.ones(size * BATCH * groups, dtype=np.uint8)
    slots = [ws[k * size:(k + 1) * size] for k in range(BATCH * groups)]
    shm_map = _shm_working_set(size * BATCH * groups)  # memory of the arena's kind (freed on return)
    shm_ws = np.frombuffer(shm_map, dtype=np.uint8)
    shm_slots = [shm_ws[k * size:(k + 1) * size] for k in range(BATCH * groups)]

    def ws_get(i: int) -> None:
        g = i % groups
        for src, b in zip(slots[g * BATCH:(g + 1) * BATCH], bufs, strict=True):
            np.copyto(b, src)

    def shm_ws_get(i: int) -> None:
        g = i % groups
        for src, b in zip(shm_slots[g * BATCH:(g + 1) * BATCH], bufs, strict=True):
            np.copyto(b, src)

    def ws_put(i: int) -> None:
        g = i % groups
        for v, dst in zip(values, slots[g * BATCH:(g + 1) * BATCH], strict=True):
            np.copyto(dst, v)

    def put(i: int) -> None:
        r = c.put(_keys("b", size, i), values)
        assert all(x.ok for x in r), r

    def put_reserve(i: int) -> None:  # the ReservePut path (reserve-ahead off)
        assert c_reserve is not None
        r = c_reserve.put(_keys("r", size, i), values)
        assert all(x.ok and x.stored for x in r), r

    def get(i: int) -> None:
        n = c.get_into(_keys("b", size, i % iters), bufs)
        assert all(x == size for x in n), n

    def get_off16(i: int) -> None:  # keys last read iters // 2 reps before: cold again
        n = c.get_into(_keys("b", size, (i + iters // 2) % iters), bufs16)
        assert all(x == size for x in n), n

    def one(fn: Callable[[int], None], i: int, pinned: bool = False) -> float:
        with _pinned(pinned):
            t0 = time.perf_counter()
            fn(i)
            return time.perf_counter() - t0

    # Interleaved, one batch of each per rep, so load drift on shared cores hits all alike;
    # each ratio is the median over reps of (reference time / measured time).
    for i in range(-2, iters):
        put(i)
    if c_reserve is not None:
        put_reserve(-1)
    t: dict[str, list[float]] = {"ws_get": [], "shm_ws_get": [], "ws_put": [], "one_sided": [],
                                 "pinned": [], "put": [], "ws_put2": [], "put_reserve": [], "get_off16": []}
    # the three reads of a rep rotate their order (each writes the same bufs: whichever goes
    # first pays for bringing them into the cache)
    reads: list[tuple[str, Callable[[int], None]]] = [("ws_get", ws_get), ("shm_ws_get", shm_ws_get),
                                                      ("one_sided", get), ("get_off16", get_off16)]
    for i in range(iters):
        k = i % len(reads)
        for name, fn in reads[k:] + reads[:k]:
            t[name].append(one(fn, i))
        t["pinned"].append(one(get, i, pinned=True))
    for i in range(iters):  # the puts, against keys of their own (a put of a present key is a no-op)
        c.remove(_keys("b", size, i))
        t["ws_put"].append(one(ws_put, i))
        t["put"].append(one(put, i))
        if c_reserve is not None:
            t["ws_put2"].append(one(ws_put, i + 1))
            t["put_reserve"].append(one(put_reserve, i))
            c_reserve.remove(_keys("r", size, i))
    assert bytes(bufs[0][:64]) == bytes(values[0][:64]) and bytes(bufs16[0][:64]) == bytes(values[0][:64])
    c.remove([k for i in range(-2, iters) for k in _keys("b", size, i)])

    def ratio(ref: str, x: str) -> float:
        return statistics.median(r / m for r, m in zip(t[ref], t[x], strict=True))

    def gbps(x: str) -> float:
        return total / statistics.median(t[x]) / 1e9

    return {
        "memcpy_ws_get_gbps": gbps("ws_get"), "memcpy_ws_put_gbps": gbps("ws_put"),
        "one_sided_get_gbps": gbps("one_sided"), "pinned_get_gbps": gbps("pinned"),
        "shm_put_gbps": gbps("put"),
        "shm_put_reserve_gbps": gbps("put_reserve") if c_reserve is not None else float("nan"),
        "put_reserve_ratio_vs_ws_memcpy": (ratio("ws_put2", "put_reserve")
                                           if c_reserve is not None else float("nan")),
        "one_sided_get_p50_ms": statistics.median(t["one_sided"]) * 1e3,
        "pinned_get_p50_ms": statistics.median(t["pinned"]) * 1e3,
        "one_sided_get_ratio_vs_ws_memcpy": ratio("ws_get", "one_sided"),
        "memcpy_shm_ws_get_gbps": gbps("shm_ws_get"),
        "one_sided_get_ratio_vs_shm_ws_memcpy": ratio("shm_ws_get", "one_sided"),
        "shm_ws_memcpy_vs_ws_memcpy": ratio("ws_get", "shm_ws_get"),
        "pinned_get_ratio_vs_ws_memcpy": ratio("ws_get", "pinned"),
        "one_sided_vs_pinned_get": ratio("pinned", "one_sided"),
        "put_ratio_vs_ws_memcpy": ratio("ws_put", "put"),
        "one_sided_get_off16_gbps": gbps("get_off16"),
        "one_sided_get_off16_ratio_vs_ws_memcpy": ratio("ws_get", "get_off16"),
        "dst_page_offset": bufs[0].ctypes.data % 4096, "ws_src_page_offset": ws.ctypes.data % 4096,
        "reps": iters,
    }


def _page_bufs(size: int, offset: int) -> list[np.ndarray]:
    """``BATCH`` buffers of ``size`` bytes, each its own allocation, starting ``offset`` bytes
    past a page boundary (see the module doc: where a destination sits decides whether
    glibc's memcpy meets 4 KiB aliasing)."""
    out = []
    for _ in range(BATCH):
        raw = np.empty(size + 8192, dtype=np.uint8)
        start = (-raw.ctypes.data) % 4096 + offset
        out.append(raw[start : start + size])
    return out


def _shm_working_set(size_bytes: int) -> mmap.mmap:
    """A prefaulted MAP_SHARED mapping of a /dev/shm file (unlinked at once): memory of the
    arena's kind (tmpfs pages: 4 KiB unless the kernel's shmem_enabled gives tmpfs huge
    pages), where the ws reference (numpy, anonymous memory) may get transparent huge pages."""
    fd, path = tempfile.mkstemp(prefix="kvstored-bench-ws-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.ftruncate(fd, size_bytes)
        m = mmap.mmap(fd, size_bytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)
        os.unlink(path)
    np.frombuffer(m, dtype=np.uint8)[:] = 1
    return m


def _thp() -> dict[str, str]:
    """The kernel's transparent huge page modes (anonymous memory, tmpfs), as /sys says."""
    out = {}
    for name, f in (("thp_enabled", "enabled"), ("thp_shmem_enabled", "shmem_enabled")):
        try:
            out[name] = pathlib.Path(f"/sys/kernel/mm/transparent_hugepage/{f}").read_text().strip()
        except OSError:
            out[name] = "unknown"
    return out


def bench_single_get(c: Client, iters: int = 300) -> dict[str, float]:
    k = [b"os:single:get...."]
    c.put(k, [b"s" * (64 << 10)])
    buf = [bytearray(64 << 10)]
    out = {}
    for name, pinned in (("one_sided", False), ("pinned", True)):
        with _pinned(pinned):
            lat = _timed(lambda _: None if c.get_into(k, buf) == [64 << 10] else sys.exit("miss"), iters, 20)
        out[f"{name}_p50_us"] = statistics.median(lat) * 1e6
        out[f"{name}_p99_us"] = _p(lat, 0.99) * 1e6
    c.remove(k)
    return out


def bench_lookup(c: Client, n: int = 512, iters: int = 2000) -> dict[str, float]:
    """lookup_prefix(n) answered in the client and by the node; next to it, interleaved with
    the client's calls, a pure-Python CPU loop calibrated to the client's p50 (no I/O, no
    allocation): its p99 is this machine's scheduling noise floor for a call that long."""
    keys = [b"os:lk:" + i.to_bytes(10, "big") for i in range(n)]
    c.put(keys, [b"x" * 64] * n)
    out: dict[str, float] = {}
    with _pinned(True):
        lat = _timed(lambda _: None if c.lookup_prefix(keys) == n else sys.exit("lookup"), iters // 4, 20)
    out["node_p50_ms"] = statistics.median(lat) * 1e3
    out["node_p99_ms"] = _p(lat, 0.99) * 1e3
    p50 = statistics.median(_timed(lambda _: None if c.lookup_prefix(keys) == n else sys.exit("lookup"), 200, 20))
    spins = 1000
    while True:  # the loop's length: about the client's p50
        t0 = time.perf_counter()
        _spin(spins)
        took = time.perf_counter() - t0
        if took >= p50 / 2 or spins > 1 << 24:
            spins = max(1, int(spins * p50 / max(took, 1e-9)))
            break
        spins *= 2
    lk: list[float] = []
    ref: list[float] = []
    for _ in range(iters):
        t0 = time.perf_counter()
        c.lookup_prefix(keys)
        t1 = time.perf_counter()
        _spin(spins)
        t2 = time.perf_counter()
        lk.append(t1 - t0)
        ref.append(t2 - t1)
    out["one_sided_p50_ms"] = statistics.median(lk) * 1e3
    out["one_sided_p99_ms"] = _p(lk, 0.99) * 1e3
    out["cpu_loop_p50_ms"] = statistics.median(ref) * 1e3
    out["cpu_loop_p99_ms"] = _p(ref, 0.99) * 1e3
    out["one_sided_p99_vs_cpu_loop_p99"] = out["one_sided_p99_ms"] / out["cpu_loop_p99_ms"]
    out["iters"] = iters
    c.remove(keys)
    return out


def _spin(n: int) -> int:
    x = 0
    for i in range(n):
        x ^= i
    return x


def bench_storm(addr: str, seconds: float = 3.0) -> dict[str, float]:
    """Fallback rate of one-sided reads while another client's puts evict (256 KiB blocks)."""
    size = 256 << 10
    keys = [b"os:storm:" + i.to_bytes(8, "big") for i in range(32)]
    stop = threading.Event()
    base = dict(_shm.ONE_SIDED_STATS)
    got = {"blocks": 0, "misses": 0}

    def writer() -> None:
        n = 0
        with Client(addr, timeout_s=30.0) as w:
            while not stop.is_set():
                w.put([b"os:fill:" + (n + j).to_bytes(8, "big") for j in range(8)], [b"f" * size] * 8)
                k = keys[(n // 8) % 32 : (n // 8) % 32 + 1]
                w.remove(k)  # removed and re-put with other bytes, under the readers
                w.put(k, [bytes([n % 251]) * size])
                n += 8

    with Client(addr, timeout_s=30.0) as c:
        c.put(keys, [b"k" * size] * 32)
        t = threading.Thread(target=writer)
        t.start()
        end = time.monotonic() + seconds
        rng = np.random.default_rng(18)
        while time.monotonic() < end:
            for v in c.get([keys[int(i)] for i in rng.choice(32, 8, replace=False)]):
                got["blocks"] += 1
                got["misses"] += v is None
        stop.set()
        t.join()
    hits = _shm.ONE_SIDED_STATS["hits"] - base["hits"]
    fallbacks = _shm.ONE_SIDED_STATS["fallbacks"] - base["fallbacks"]
    return {"blocks_read": got["blocks"], "misses": got["misses"], "one_sided_hits": hits,
            "fallbacks": fallbacks, "fallback_rate": fallbacks / max(1, hits + fallbacks)}


def run_all(shm_addr: str, storm_addr: str, iters: int = 8) -> dict[str, object]:
    """Every row, against the daemon at ``shm_addr`` (a unix socket; DRAM at least
    64 MiB x (iters + 2) + 128 MiB), the storm against ``storm_addr`` (DRAM 16 MiB: evicts
    at once)."""
    res: dict[str, object] = {}
    with Client(shm_addr, timeout_s=60.0, transport="shm") as c, \
            Client(shm_addr, timeout_s=60.0, transport="shm", reserve_ahead_bytes=0) as c0:
        for size in (256 << 10, 4 << 20):
            res[f"get_put_{size >> 10}KiB"] = bench_size(c, size, iters, c0)
        res["single_get_64KiB"] = bench_single_get(c)
        res["lookup_prefix_512"] = bench_lookup(c)
    res["storm"] = bench_storm(storm_addr)
    res["memory"] = _thp()
    return res


def print_rows(res: dict[str, object]) -> None:
    for size, target_get, target_put in (("256KiB", 0.8, 0.6), ("4096KiB", 0.95, 0.9)):
        r = res[f"get_put_{size}"]
        assert isinstance(r, dict)
        print(f"one-sided get {size} x{BATCH}: {r['one_sided_get_gbps']:.2f} GB/s = "
              f"{r['one_sided_get_ratio_vs_ws_memcpy']:.2f}x ws memcpy (target {target_get}x), "
              f"{r['one_sided_get_ratio_vs_shm_ws_memcpy']:.2f}x a memcpy from /dev/shm like the arena's "
              f"(which is {r['shm_ws_memcpy_vs_ws_memcpy']:.2f}x ws memcpy); pinned "
              f"{r['pinned_get_ratio_vs_ws_memcpy']:.2f}x; one-sided {r['one_sided_vs_pinned_get']:.2f}x pinned); "
              f"put {r['put_ratio_vs_ws_memcpy']:.2f}x (target {target_put}x; ReservePut path "
              f"{r['put_reserve_ratio_vs_ws_memcpy']:.2f}x); into buffers 16 bytes past a page "
              f"{r['one_sided_get_off16_ratio_vs_ws_memcpy']:.2f}x")
    s, lk, st = res["single_get_64KiB"], res["lookup_prefix_512"], res["storm"]
    assert isinstance(s, dict) and isinstance(lk, dict) and isinstance(st, dict)
    print(f"single get 64 KiB p50: {s['one_sided_p50_us']:.0f} us one-sided, {s['pinned_p50_us']:.0f} us "
          f"pinned (target 25 us)")
    print(f"lookup_prefix(512) p99: {lk['one_sided_p99_ms']:.3f} ms in the client (p50 {lk['one_sided_p50_ms']:.3f}), "
          f"{lk['node_p99_ms']:.3f} ms asking the node (target 0.1 ms); a CPU loop as long as the p50 "
          f"has p99 {lk['cpu_loop_p99_ms']:.3f} ms in the same run")
    print(f"eviction storm: fallback rate {st['fallback_rate']:.4f} ({st['fallbacks']} of "
          f"{st['one_sided_hits'] + st['fallbacks']} one-sided tries; {st['misses']} misses)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "bench_one_sided.json"))
    ap.add_argument("--iters", type=int, default=8)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_blocks import daemon  # the same daemon launcher

    with tempfile.TemporaryDirectory(prefix="kvstored-bench-os-") as tmpdir:
        tmp = pathlib.Path(tmpdir)
        with daemon(tmp, dram=str((4 << 20) * BATCH * (args.iters + 2) + (128 << 20)),
                    ssd_size="0", name="os") as (shm_addr, _), \
                daemon(tmp, dram="16MiB", ssd_size="0", name="os-storm") as (storm_addr, _):
            res = run_all(shm_addr, storm_addr, args.iters)
    res["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    print_rows(res)
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
