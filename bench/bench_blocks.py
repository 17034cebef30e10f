"""Block benchmark: kvstored put/get throughput and latency next to memcpy and Redis.

Usage:
    python bench/bench_blocks.py [--sizes 256KiB,1MiB,4MiB,16MiB] [--batch 16] [--iters 8]
                                 [--json bench/results/bench_blocks.json] [--quick]

Everything is measured in the same run on the same machine:
  * memcpy      numpy copy of the batch into preallocated buffers (the reference for shm paths)
  * shm         kvstored over the unix socket + shared-memory arena (same-host client)
  * tcp         kvstored over gRPC/TCP control + the TCP data plane (client without the arena)
  * redis       redis-server on loopback (started here), redis-py + hiredis, pipelined batch
  * ssd         kvstored get of blocks that live only on the SSD tier (cold, O_DIRECT), next to an
                O_DIRECT sequential read of the same number of bytes
  * lookup      lookup_prefix of 512 keys over the unix socket, p50/p99
Targets (issue 2): shm get >= 0.8x memcpy at 4 MiB; shm put >= 0.6x memcpy; tcp get >= 1.0x Redis GET;
tcp put >= 2x Redis SET; ssd get >= 0.7x O_DIRECT read; lookup p99 <= 1 ms.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from kvstored import Client
from kvstored.units import format_size, parse_size

ROOT = pathlib.Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def daemon(tmp: pathlib.Path, *, dram: str, ssd_size: str, name: str) -> Iterator[tuple[str, str]]:
    sock = tmp / f"{name}.sock"
    tcp = f"127.0.0.1:{free_port()}"
    cmd = [
        sys.executable, "-m", "kvstored.cli.main", "serve", "--listen", f"unix:{sock}", "--listen", tcp,
        "--data-address", f"127.0.0.1:{free_port()}", "--metrics-address", "",
        "--dram-size", dram, "--ssd-dir", str(tmp / f"{name}-ssd"), "--ssd-size", ssd_size,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "w"))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with Client(f"unix:{sock}", timeout_s=1.0) as c:
                    c.stats()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"daemon did not start; see {tmp / f'{name}.log'}") from None
                time.sleep(0.2)
        yield f"unix:{sock}", tcp
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def redis_server(tmp: pathlib.Path) -> Iterator[int | None]:
    exe = shutil.which("redis-server")
    if exe is None:
        print("redis-server not found (apt-get install redis-server); skipping the Redis reference")
        yield None
        return
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp), "--proto-max-bulk-len", "1gb", "--client-query-buffer-limit", "1gb"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    import redis

    r = redis.Redis(port=port)
    for _ in range(100):
        try:
            r.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def timed(fn: Callable[[int], None], iters: int, warmup: int = 1) -> list[float]:
    for i in range(warmup):
        fn(-1 - i)
    out = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def summarize(lat_s: list[float], batch_bytes: int) -> dict[str, float]:
    lat_sorted = sorted(lat_s)
    p99 = lat_sorted[min(len(lat_sorted) - 1, int(round(0.99 * (len(lat_sorted) - 1))))]
    return {
        "gbps": batch_bytes / statistics.median(lat_s) / 1e9,
        "p50_ms": statistics.median(lat_s) * 1e3,
        "p99_ms": p99 * 1e3,
    }


def make_keys(tag: str, size: int, i: int, batch: int) -> list[bytes]:
    return [f"{tag}:{size}:{i}:{j}".encode().ljust(16, b".")[:32] for j in range(batch)]


def bench_size(size: int, batch: int, iters: int, shm_addr: str, tcp_addr: str,
               redis_port: int | None) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(size)
    values = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(batch)]
    bufs = [np.empty(size, dtype=np.uint8) for _ in range(batch)]
    total = size * batch
    res: dict[str, dict[str, float]] = {}

    def memcpy(_: int) -> None:
        for v, b in zip(values, bufs):
            np.copyto(b, v)

    res["memcpy"] = summarize(timed(memcpy, iters), total)

    for name, addr, transport in (("shm", shm_addr, "shm"), ("tcp", tcp_addr, "tcp")):
        with Client(addr, timeout_s=60.0, transport=transport) as c:
            def put(i: int, c: Client = c, name: str = name) -> None:
                r = c.put(make_keys(name, size, i, batch), values)
                assert all(x.ok for x in r), r

            res[f"{name}_put"] = summarize(timed(put, iters), total)

            def get(i: int, c: Client = c, name: str = name) -> None:
                n = c.get_into(make_keys(name, size, i % iters, batch), bufs)
                assert all(x == size for x in n), n

            res[f"{name}_get"] = summarize(timed(get, iters), total)
            assert bytes(bufs[0][:64]) == bytes(values[0][:64])  # what came back is what went in
            c.remove([k for i in range(-1, iters) for k in make_keys(name, size, i, batch)])

    if redis_port is not None:
        import redis

        r = redis.Redis(port=redis_port)

        def rset(i: int) -> None:
            p = r.pipeline(transaction=False)
            for k, v in zip(make_keys("redis", size, i, batch), values):
                p.set(k, v.data)
            p.execute()

        def rget(i: int) -> None:
            p = r.pipeline(transaction=False)
            for k in make_keys("redis", size, i % iters, batch):
                p.get(k)
            out = p.execute()
            assert len(out[0]) == size

        res["redis_set"] = summarize(timed(rset, iters), total)
        res["redis_get"] = summarize(timed(rget, iters), total)
        r.flushall()
    return res


def odirect_read_gbps(path: pathlib.Path, total: int, chunk: int) -> float:
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(total // len(block)):
            f.write(block)
    buf = mmap.mmap(-1, chunk)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    try:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            off = 0
            while off < total:
                n = os.preadv(fd, [buf], off)
                if n <= 0:
                    break
                off += n
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return total / statistics.median(times) / 1e9


def bench_ssd(tmp: pathlib.Path, size: int, batch: int) -> dict[str, float]:
    """Cold SSD-tier get: DRAM holds only a few batches, so early keys live on SSD only."""
    n_batches = 8
    dram = max(4 * size * batch, 64 << 20)
    with daemon(tmp, dram=str(dram), ssd_size=str(4 * n_batches * size * batch), name="ssd") as (addr, _):
        rng = np.random.default_rng(7)
        values = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(batch)]
        bufs = [np.empty(size, dtype=np.uint8) for _ in range(batch)]
        with Client(addr, timeout_s=120.0) as c:
            for i in range(n_batches):
                assert all(x.ok for x in c.put(make_keys("ssd", size, i, batch), values))
            tiers = c.lookup_prefix_tiers(make_keys("ssd", size, 0, batch))
            lat = []
            for i in range(3):  # batches 0..2 were demoted to SSD by the later puts
                keys = make_keys("ssd", size, i, batch)
                t0 = time.perf_counter()
                n = c.get_into(keys, bufs)
                lat.append(time.perf_counter() - t0)
                assert all(x == size for x in n), n
                assert bytes(bufs[-1][:64]) == bytes(values[-1][:64])
    ssd_gbps = size * batch / statistics.median(lat) / 1e9
    ref = odirect_read_gbps(tmp / "odirect.bin", size * batch, size)
    return {"ssd_get_gbps": ssd_gbps, "odirect_read_gbps": ref, "ratio": ssd_gbps / ref,
            "first_batch_tiers": [int(t) for t in tiers].count(2)}


def bench_lookup(addr: str, n: int = 512, iters: int = 300) -> dict[str, float]:
    keys = [i.to_bytes(16, "big") for i in range(n)]
    with Client(addr, timeout_s=10.0) as c:
        c.put(keys, [b"x" * 64] * n)
        lat = timed(lambda _: c.lookup_prefix(keys), iters, warmup=20)
        assert c.lookup_prefix(keys) == n
        c.remove(keys)
    s = sorted(lat)
    return {"p50_ms": statistics.median(lat) * 1e3, "p99_ms": s[int(0.99 * (len(s) - 1))] * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256KiB,1MiB,4MiB,16MiB")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "bench_blocks.json"))
    ap.add_argument("--quick", action="store_true", help="only 4 MiB, fewer iterations")
    ap.add_argument("--skip-memory", action="store_true", help="skip the 1M-block metadata measurement")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in (["4MiB"] if args.quick else args.sizes.split(","))]
    iters = 4 if args.quick else args.iters
    results: dict[str, object] = {"batch": args.batch, "iters": iters, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="kvstored-bench-") as tmpdir:
        tmp = pathlib.Path(tmpdir)
        need = max(sizes) * args.batch * (iters + 1) + (128 << 20)  # one transport at a time
        with daemon(tmp, dram=str(need), ssd_size="0", name="dram") as (shm_addr, tcp_addr), \
                redis_server(tmp) as redis_port:
            for size in sizes:
                print(f"... {format_size(size)} blocks", file=sys.stderr)
                results["sizes"][format_size(size)] = bench_size(  # type: ignore[index]
                    size, args.batch, iters, shm_addr, tcp_addr, redis_port)
            results["lookup_prefix_512"] = bench_lookup(shm_addr)
        results["ssd_4MiB"] = bench_ssd(tmp, 4 << 20, args.batch)
    if not args.skip_memory:
        mem = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_store_memory.py")],
                             capture_output=True, text=True)
        results["store_memory"] = (mem.stdout.strip() if mem.returncode == 0
                                   else f"bench_store_memory.py failed: {mem.stderr.strip()[-500:]}")
    print_table(results)
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")


def print_table(results: dict[str, object]) -> None:
    print(f"\nbatch of {results['batch']} blocks; GB/s at the median batch latency; same run for all rows")
    hdr = f"{'size':>9} {'path':>10} {'GB/s':>7} {'p50 ms':>8} {'p99 ms':>8}  ratio"
    print(hdr)
    print("-" * len(hdr))
    for size, rows in results["sizes"].items():  # type: ignore[attr-defined]
        ref = {"shm_get": "memcpy", "shm_put": "memcpy", "tcp_get": "redis_get", "tcp_put": "redis_set"}
        for path, r in rows.items():
            ratio = ""
            if path in ref and ref[path] in rows:
                ratio = f"{r['gbps'] / rows[ref[path]]['gbps']:.2f}x {ref[path]}"
            print(f"{size:>9} {path:>10} {r['gbps']:7.2f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f}  {ratio}")
    lk = results["lookup_prefix_512"]
    print(f"\nlookup_prefix(512 keys) over unix socket: p50 {lk['p50_ms']:.3f} ms, p99 {lk['p99_ms']:.3f} ms"  # type: ignore[index]
          " (target p99 <= 1 ms)")
    ssd = results["ssd_4MiB"]
    print(f"SSD-tier cold get, 4 MiB blocks: {ssd['ssd_get_gbps']:.2f} GB/s vs O_DIRECT read "  # type: ignore[index]
          f"{ssd['odirect_read_gbps']:.2f} GB/s = {ssd['ratio']:.2f}x (target >= 0.7x)")  # type: ignore[index]
    if "store_memory" in results:
        print(f"\nstore metadata (bench/bench_store_memory.py):\n{results['store_memory']}")


if __name__ == "__main__":
    main()
