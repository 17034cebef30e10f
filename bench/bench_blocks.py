"""Block benchmark: kvstored put/get throughput and latency next to memcpy and Redis.

Usage:
    python bench/bench_blocks.py [--sizes 256KiB,1MiB,4MiB,16MiB] [--batch 16] [--iters 8]
                                 [--json bench/results/bench_blocks.json] [--quick]

Everything is measured in the same run on the same machine:
  * memcpy      numpy copy of the batch into preallocated buffers (the reference for shm paths):
                the same `batch` buffers every time, so cache-resident at small block sizes
  * memcpy_ws_get / memcpy_ws_put  the same copies with the shm paths' footprint: one distinct
                slot per block of a prefaulted buffer as large as the arena working set
                (batch x (iters + 1) blocks), copied into / from the same `batch` buffers as
                shm_get / shm_put; the table prints the shm ratio against both references
  * shm         kvstored over the unix socket + shared-memory arena (same-host client)
  * tcp         kvstored over gRPC/TCP control + the TCP data plane (client without the arena)
  * redis       redis-server on loopback (started here), redis-py + hiredis, pipelined batch
  * loopback    raw Python TCP loopback socket (sendall -> recv_into) of one 4 MiB batch: tcp_get's
                reference
  * ssd         per block size (1, 4, 16 MiB): kvstored get of blocks that live only on the SSD tier
                (cold, O_DIRECT promotion), next to O_DIRECT reads of the same bytes at queue depth 8
                (fio-style: 8 threads of aligned preads); and a demotion write (SsdTier.write_files
                of one batch) next to O_DIRECT writes at queue depth 8
  * lookup      lookup_prefix of 512 keys over the unix socket, p50/p99
  * control     bench/bench_control.py: per-batch control overhead in us (gRPC vs the lean
                control channel), single-block get p50, lookup_prefix_512 p99 under a put
                storm that forces demotion, 4 client processes' aggregate vs 1
  * native_copy kvstored.native.copy_many (C, GIL released) of one batch into a mapping, next to
                its pure-Python fallback and the memcpy reference (bench/bench_native.py)
Targets (issue 9): shm get >= 0.9x memcpy at 4 MiB; tcp get >= 0.85x loopback socket at 4 MiB; ssd
cold get and demotion write >= 0.7x O_DIRECT qd8; lookup p99 <= 0.5 ms.
JSON: sizes[<size>][<path>].gbps (paths also memcpy_ws_get/put up to 512 MiB of working set),
lookup_prefix_512.p99_ms, ssd_4MiB.ratio (as before), plus
ssd[<size>].cold_get / .demotion_write {.._gbps, odirect_.._gbps, ratio, fresh_ratio,
fresh_vs_new_files_ratio} / .cold_get_full_dram {ssd_get_gbps, odirect_write_read_gbps, ratio}
(bench/bench_ssd_extra.py),
native_copy[<size>] {native_gbps, fallback_gbps, memcpy_gbps, native_vs_fallback, ...},
control_us {get,put}_{grpc,channel}_us, single_get.p50_us, lookup_prefix_512_storm.p99_ms,
clients.{clients_1_gbps, clients_4_gbps, ratio_4_to_1, memcpy_1_gbps, memcpy_4_gbps, memcpy_ratio_4_to_1,
ratio_vs_memcpy}, one_sided (bench/bench_one_sided.py: get_put_{256,4096}KiB, single_get_64KiB,
lookup_prefix_512, storm; issue 18 targets as ratios), date_utc, machine.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import bench_control  # bench/ is on sys.path when this script runs
import bench_ssd_extra
import numpy as np
from bench_common import finite_or_none, percentile, timed

from kvstored import Client
from kvstored import log as kvlog
from kvstored.units import format_size, parse_size

ROOT = pathlib.Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A free TCP port on 127.0.0.1: from ``$KVSTORED_BENCH_PORTS`` (``LO-HI``, for runs that
    must keep to a range on a shared machine) when set, else one the kernel picks."""
    span = os.environ.get("KVSTORED_BENCH_PORTS")
    if span:
        lo, _, hi = span.partition("-")
        for port in range(int(lo), int(hi or lo) + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                if port not in _HANDED_OUT:
                    _HANDED_OUT.add(port)
                    return port
        raise RuntimeError(f"no free port left in KVSTORED_BENCH_PORTS={span}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_HANDED_OUT: set[int] = set()
"""Ports :func:`free_port` gave out from the range (a daemon may not have bound one yet)."""


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


def summarize(lat_s: list[float], batch_bytes: int) -> dict[str, float]:
    p99 = percentile(lat_s, 0.99)
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
        for v, b in zip(values, bufs, strict=True):
            np.copyto(b, v)

    res["memcpy"] = summarize(timed(memcpy, iters), total)
    # The same copies with the shm paths' memory footprint: every batch of the shm get/put
    # touches blocks of its own (iters + 1 batches of distinct keys live in the arena at once),
    # so its arena side is mostly cache-cold, while the memcpy row above copies the same
    # `batch` source buffers over and over (cache-resident for small blocks). Here the arena
    # side is a prefaulted buffer of the working set's size, one distinct slot per block.
    slots_n = batch * (iters + 1)
    if size * slots_n <= WS_REFERENCE_MAX_BYTES:
        ws = np.ones(size * slots_n, dtype=np.uint8)  # every page touched (as MAP_POPULATE)
        slots = [ws[k * size:(k + 1) * size] for k in range(slots_n)]

        def group(i: int) -> list[np.ndarray]:  # warmup (-1) -> batch 0, timed i -> batch i + 1
            g = (i + 1) % (iters + 1)
            return slots[g * batch:(g + 1) * batch]

        def ws_put(i: int) -> None:
            for v, dst in zip(values, group(i), strict=True):
                np.copyto(dst, v)

        def ws_get(i: int) -> None:
            for src, b in zip(group(i), bufs, strict=True):
                np.copyto(b, src)

        res["memcpy_ws_put"] = summarize(timed(ws_put, iters), total)
        res["memcpy_ws_get"] = summarize(timed(ws_get, iters), total)
        del slots, ws

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
            for k, v in zip(make_keys("redis", size, i, batch), values, strict=True):
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


WS_REFERENCE_MAX_BYTES = 512 << 20
"""Largest working set of the memcpy_ws_* reference rows (larger block sizes get none)."""
QD = 8  # queue depth of the O_DIRECT references (fio-style: QD threads of aligned preads)


def _aligned(nbytes: int) -> mmap.mmap:
    return mmap.mmap(-1, nbytes)  # page-aligned anonymous memory (what O_DIRECT needs)


def _qd_run(fn: Callable[[int], int], n: int, qd: int = QD) -> float:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(qd, thread_name_prefix="bench-odirect") as pool:
        t0 = time.perf_counter()
        done = sum(pool.map(fn, range(n)))
        dt = time.perf_counter() - t0
    assert done > 0
    return dt


def odirect_gbps(path: pathlib.Path, size: int, n: int, *, write: bool, reps: int = 3) -> float:
    """GB/s of O_DIRECT reads (or writes) of ``n`` blocks of ``size`` bytes at queue depth 8.

    The file is written (and fsync'd) first; each of QD threads does whole-block
    ``preadv``/``pwritev`` calls on its own page-aligned buffer. Median of ``reps`` passes.
    """
    bufs = [_aligned(size) for _ in range(QD)]
    for b in bufs:
        b.write(os.urandom(4096) * (size // 4096))
    with open(path, "wb") as f:
        for i in range(n):
            f.write(bufs[i % QD])
        f.flush()
        os.fsync(f.fileno())
    flags = (os.O_WRONLY if write else os.O_RDONLY) | getattr(os, "O_DIRECT", 0)
    fd = os.open(path, flags)
    try:
        def one(i: int) -> int:
            buf = bufs[i % QD]
            if write:
                return os.pwritev(fd, [buf], i * size)
            return os.preadv(fd, [buf], i * size)

        times = []
        for _ in range(reps):
            times.append(_qd_run(one, n))
            if write:
                os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return size * n / statistics.median(times) / 1e9


def bench_ssd(tmp: pathlib.Path, size: int, batch: int, reps: int = 3) -> dict[str, float]:
    """Cold SSD-tier get of ``batch`` blocks through the daemon (shm client), vs O_DIRECT qd8.

    The O_DIRECT reference is measured right before each timed get, since a shared VM disk
    drifts by 2x within a minute; ``ratio`` is the median over reps of (get / its reference). ``2 * reps`` batches
    are put into a DRAM tier that holds ``reps`` of them, so the first ``reps`` are demoted
    (checked: every timed block is on the SSD tier only); the batches still in DRAM are then
    removed, so each timed get promotes its blocks into free DRAM (reads only, no demotion
    writes in the timing).
    """
    n_batches = 2 * reps
    batch_bytes = size * batch
    dram = reps * batch_bytes
    ssd_cap = 2 * n_batches * batch_bytes
    with daemon(tmp, dram=str(dram), ssd_size=str(ssd_cap), name="ssd") as (addr, _):
        rng = np.random.default_rng(7)
        values = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(batch)]
        bufs = [np.empty(size, dtype=np.uint8) for _ in range(batch)]
        with Client(addr, timeout_s=120.0) as c:
            for i in range(n_batches):
                assert all(x.ok for x in c.put(make_keys("ssd", size, i, batch), values))
            for i in range(reps, n_batches):
                c.remove(make_keys("ssd", size, i, batch))
            on_ssd = sum([int(t) for t in c.lookup_prefix_tiers(make_keys("ssd", size, i, batch))].count(2)
                         for i in range(reps))
            assert on_ssd == reps * batch, f"only {on_ssd} of {reps * batch} timed blocks are SSD-only"

            lat, refs = [], []
            for i in range(reps):  # the reference right before each get: the disk drifts
                refs.append(odirect_gbps(tmp / "odirect.bin", size, batch, write=False, reps=1))
                keys = make_keys("ssd", size, i, batch)
                t0 = time.perf_counter()
                n = c.get_into(keys, bufs)
                lat.append(time.perf_counter() - t0)
                assert all(x == size for x in n), n
                assert bytes(bufs[-1][-64:]) == bytes(values[-1][-64:])
            warm = []  # the same gets again, now DRAM hits: the cost that is not the disk
            for i in range(reps):
                t0 = time.perf_counter()
                c.get_into(make_keys("ssd", size, i, batch), bufs)
                warm.append(time.perf_counter() - t0)
    ssd_gbps = batch_bytes / statistics.median(lat) / 1e9
    ref = statistics.median(refs)
    pair = statistics.median(batch_bytes / t / 1e9 / r for t, r in zip(lat, refs, strict=True))
    return {"ssd_get_gbps": ssd_gbps, "odirect_read_gbps": ref, "odirect_qd": QD,
            "ratio": pair, "reps": reps, "batch": batch, "timed_blocks_on_ssd_only": on_ssd,
            "warm_get_gbps": batch_bytes / statistics.median(warm) / 1e9}


def _demote_reps(tier: object, view: memoryview, tmp: pathlib.Path, size: int, batch: int,
                 reps: int, tag: str, *, keep: bool, new_refs: list[float] | None = None
                 ) -> tuple[list[float], list[float]]:
    """Timed ``write_files`` of ``reps`` batches (each next to its own O_DIRECT reference);
    ``keep``: leave each batch on the tier (a full tier then evicts, and reuses, the oldest);
    ``new_refs``: also measure O_DIRECT writes into new files right before each rep."""
    from kvstored.tiers.ssd_format import store_key

    times: list[float] = []
    refs: list[float] = []
    for rep in range(reps):
        writes = []
        with tier.lock:  # type: ignore[attr-defined]
            for j in range(batch):
                sk = store_key(b"", f"demote:{tag}:{rep}:{j}".encode())
                w = tier.begin_write(sk, size, namespace_id=b"", meta=b"")  # type: ignore[attr-defined]
                assert w is not None
                writes.append((w, view[j * size : (j + 1) * size]))
        if new_refs is not None:
            new_refs.append(bench_ssd_extra.odirect_new_files_gbps(tmp, view, size, batch))
        refs.append(odirect_gbps(tmp / "odirect-w.bin", size, batch, write=True, reps=1))
        t0 = time.perf_counter()
        ok = tier.write_files(writes)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - t0)
        assert all(ok)
        doomed: list[bytes] = []
        with tier.lock:  # type: ignore[attr-defined]
            for w, _ in writes:
                doomed += tier.end_write(w)  # type: ignore[attr-defined]
                if not keep:
                    doomed += tier.drop(w.skey)  # type: ignore[attr-defined]
        tier.delete_files(doomed)  # type: ignore[attr-defined]
    return times, refs


def bench_demotion_write(tmp: pathlib.Path, size: int, batch: int, reps: int = 3) -> dict[str, float]:
    """SSD-tier demotion write (in process: ``SsdTier.write_files`` of one batch, as an eviction
    window writes it) vs O_DIRECT writes of the same bytes at qd8 (fsync'd).

    Demotion files are written with O_DIRECT and not fsync'd (a torn file is a checksum miss
    after a power loss): the time until the DRAM slots are free again. ``ratio``: the steady
    state of a demoting node, a full tier (filled with two batches first) whose every write
    evicts its LRU block and overwrites that block's file in place; ``fresh_ratio``: an empty
    tier, one new file per block. Each is the median over reps of (this rep / the reference
    measured right before it).
    """
    from kvstored.tiers.ssd import SsdTier
    from kvstored.tiers.ssd_format import round_up_page

    src = _aligned(size * batch)
    src.write(os.urandom(1 << 20) * (size * batch >> 20))
    view = memoryview(src)
    out: dict[str, float] = {"odirect_qd": QD, "batch": batch, "reps": reps}
    for name, keep in (("fresh", False), ("full", True)):
        charge = round_up_page(size + 64)  # the trailer of a short key fits the last page
        tier = SsdTier(tmp / "demote-ssd", 2 * batch * charge if keep else 4 * size * batch)
        try:
            if keep:  # fill the tier (untimed): every timed write then evicts and reuses
                _demote_reps(tier, view, tmp, size, batch, 2, "fill", keep=True)
                assert tier.used_bytes == tier.capacity_bytes, (tier.used_bytes, tier.capacity_bytes)
            new_refs: list[float] = []
            times, refs = _demote_reps(tier, view, tmp, size, batch, reps, name, keep=keep,
                                       new_refs=None if keep else new_refs)
        finally:
            tier.close()
            shutil.rmtree(tmp / "demote-ssd", ignore_errors=True)
        gbps = size * batch / statistics.median(times) / 1e9
        ratio = statistics.median(size * batch / t / 1e9 / r for t, r in zip(times, refs, strict=True))
        if keep:
            out.update(demotion_write_gbps=gbps, odirect_write_gbps=statistics.median(refs),
                       ratio=ratio)
        else:
            out.update(fresh_gbps=gbps, fresh_odirect_write_gbps=statistics.median(refs),
                       fresh_ratio=ratio, odirect_new_files_gbps=statistics.median(new_refs),
                       fresh_vs_new_files_ratio=statistics.median(
                           size * batch / t / 1e9 / r for t, r in zip(times, new_refs, strict=True)))
    return out


_LOOPBACK_SENDER = """
import os, socket, sys
n = int(sys.argv[1])
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
    conn.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
payload = memoryview(bytearray(os.urandom(1 << 20) * max(1, n >> 20))[:n])
while conn.recv(1):
    conn.sendall(payload)
"""


def loopback_socket_gbps(nbytes: int, iters: int) -> float:
    """Raw Python TCP loopback, request/response like a tcp get: a separate process ``sendall``s
    ``nbytes`` per 1-byte request; this one ``recv_into``s them into a preallocated buffer
    (the reference for tcp_get). Median of ``iters``."""
    proc = subprocess.Popen([sys.executable, "-c", _LOOPBACK_SENDER, str(nbytes)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        cli = socket.create_connection(("127.0.0.1", port))
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):  # as the data plane (framing.py)
            cli.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = memoryview(bytearray(nbytes))
        times = []
        with cli:
            for i in range(iters + 1):
                t0 = time.perf_counter()
                cli.sendall(b"g")
                got = 0
                while got < nbytes:
                    n = cli.recv_into(buf[got:])
                    assert n > 0, "loopback sender closed"
                    got += n
                if i:
                    times.append(time.perf_counter() - t0)
    finally:
        proc.wait(10)
    return nbytes / statistics.median(times) / 1e9


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
    ap.add_argument("--quick", action="store_true", help="only 4 MiB, fewer iterations, SSD batches of 8")
    ap.add_argument("--tmp-dir", default=None, help="where the daemons' SSD dirs go (a disk, not tmpfs)")
    ap.add_argument("--skip-memory", action="store_true", help="skip the 1M-block metadata measurement")
    ap.add_argument("--ssd-only", action="store_true", help="only the SSD-tier rows (cold get, demotion)")
    ap.add_argument("--ssd-sizes", default="1MiB,4MiB,16MiB")
    ap.add_argument("--ssd-batch", type=int, default=None,
                    help="blocks per cold get (default: --batch; 8 with --quick)")
    ap.add_argument("--skip-control", action="store_true",
                    help="skip the control-path rows (per-batch overhead, single get, storm, 4 clients)")
    ap.add_argument("--ssd-reps", type=int, default=5, help="timed SSD gets/writes per size")
    ap.add_argument("--skip-one-sided", action="store_true",
                    help="skip the one-sided read rows (bench/bench_one_sided.py)")
    args = ap.parse_args()
    kvlog.configure(level="warning")  # the in-process SSD tiers' info lines would split the table
    sizes = [parse_size(s) for s in (["4MiB"] if args.quick else args.sizes.split(","))]
    ssd_sizes = [parse_size(s) for s in args.ssd_sizes.split(",")]
    ssd_batch = args.ssd_batch or (8 if args.quick else args.batch)
    iters = 4 if args.quick else args.iters
    results: dict[str, object] = {"batch": args.batch, "iters": iters, "sizes": {},
                                  "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                  "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="kvstored-bench-", dir=args.tmp_dir) as tmpdir:
        tmp = pathlib.Path(tmpdir)
        if not args.ssd_only:
            need = max(sizes) * args.batch * (iters + 1) + (128 << 20)  # one transport at a time
            with daemon(tmp, dram=str(need), ssd_size="0", name="dram") as (shm_addr, tcp_addr), \
                    redis_server(tmp) as redis_port:
                for size in sizes:
                    print(f"... {format_size(size)} blocks", file=sys.stderr)
                    res = bench_size(size, args.batch, iters, shm_addr, tcp_addr, redis_port)
                    if size == 4 << 20:
                        res["loopback_socket"] = {"gbps": loopback_socket_gbps(size * args.batch, iters),
                                                  "p50_ms": float("nan"), "p99_ms": float("nan")}
                    results["sizes"][format_size(size)] = res  # type: ignore[index]
                results["lookup_prefix_512"] = bench_lookup(shm_addr)
                if not args.skip_one_sided:  # issue 18: DRAM hits with no round trip
                    import bench_one_sided  # (bench/ is on sys.path: the script's dir)

                    print("... one-sided reads", file=sys.stderr)
                    with daemon(tmp, dram="16MiB", ssd_size="0", name="os-storm") as (os_storm, _):
                        results["one_sided"] = bench_one_sided.run_all(shm_addr, os_storm, iters)
                if not args.skip_control:  # control-path rows (bench/bench_control.py)
                    print("... control path", file=sys.stderr)
                    with daemon(tmp, dram="128MiB", ssd_size="1GiB", name="storm") as (storm_addr, _):
                        results.update(bench_control.run_all(shm_addr, storm_addr))
        ssd: dict[str, object] = {}
        for size in ssd_sizes:
            print(f"... SSD tier, {format_size(size)} blocks", file=sys.stderr)
            ssd[format_size(size)] = {
                "cold_get": bench_ssd(tmp, size, ssd_batch, args.ssd_reps),
                "demotion_write": bench_demotion_write(tmp, size, ssd_batch, args.ssd_reps),
                "cold_get_full_dram": bench_ssd_extra.bench_cold_get_full_dram(
                    tmp, size, ssd_batch, args.ssd_reps)}
        results["ssd"] = ssd
        if format_size(4 << 20) in ssd:  # (keys are "4.0 MiB": "4MiB" never matched)
            results["ssd_4MiB"] = ssd[format_size(4 << 20)]["cold_get"]  # type: ignore[index]
    if not args.ssd_only:
        from bench_native import bench_native_copy  # (bench/ is on sys.path: the script's dir)

        results["native_copy"] = bench_native_copy(sizes, args.batch, 4 * iters)
    if not args.skip_memory and not args.ssd_only:
        mem = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_store_memory.py")],
                             capture_output=True, text=True)
        results["store_memory"] = (mem.stdout.strip() if mem.returncode == 0
                                   else f"bench_store_memory.py failed: {mem.stderr.strip()[-500:]}")
    print_table(results)
    if "one_sided" in results:
        import bench_one_sided

        print()
        bench_one_sided.print_rows(results["one_sided"])  # type: ignore[arg-type]
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(finite_or_none(results), indent=2, allow_nan=False))
    print(f"\nwrote {out}")


def machine() -> str:
    """One line naming the machine: CPU model, cores, memory, the kernel."""
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (OSError, ValueError):
        mem_gib = float("nan")
    return f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, Linux {os.uname().release}"


def print_table(results: dict[str, object]) -> None:
    print(f"\n{results['machine']}; {results['date_utc']} UTC")
    print(f"batch of {results['batch']} blocks; GB/s at the median batch latency; same run for all rows")
    hdr = f"{'size':>9} {'path':>16} {'GB/s':>7} {'p50 ms':>8} {'p99 ms':>8}  ratio"
    print(hdr)
    print("-" * len(hdr))
    ref = {"shm_get": "memcpy", "shm_put": "memcpy", "tcp_get": "redis_get", "tcp_put": "redis_set"}
    ws_ref = {"shm_get": "memcpy_ws_get", "shm_put": "memcpy_ws_put"}
    for size, rows in results["sizes"].items():  # type: ignore[attr-defined]
        for path, r in rows.items():
            ratio = ""
            if path in ref and ref[path] in rows:
                ratio = f"{r['gbps'] / rows[ref[path]]['gbps']:.2f}x {ref[path]}"
            if path in ws_ref and ws_ref[path] in rows:
                ratio += f", {r['gbps'] / rows[ws_ref[path]]['gbps']:.2f}x {ws_ref[path]}"
            if path == "tcp_get" and "loopback_socket" in rows:
                ratio += f", {r['gbps'] / rows['loopback_socket']['gbps']:.2f}x loopback socket (target 0.85x)"
            print(f"{size:>9} {path:>16} {r['gbps']:7.2f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f}  {ratio}")
    for size, row in results.get("ssd", {}).items():  # type: ignore[attr-defined]
        g, w = row["cold_get"], row["demotion_write"]
        print(f"{size:>9} {'ssd_cold_get':>16} {g['ssd_get_gbps']:7.2f} {'':>8} {'':>8}  "
              f"{g['ratio']:.2f}x O_DIRECT read qd{g['odirect_qd']} {g['odirect_read_gbps']:.2f} GB/s "
              f"(target 0.7x; batch {g['batch']}, median of {g['reps']}; same get warm {g['warm_get_gbps']:.2f} GB/s)")
        print(f"{size:>9} {'ssd_demote_write':>16} {w['demotion_write_gbps']:7.2f} {'':>8} {'':>8}  "
              f"{w['ratio']:.2f}x O_DIRECT write qd{w['odirect_qd']} {w['odirect_write_gbps']:.2f} GB/s "
              f"(target 0.7x; full tier, evicting; empty tier, new files: {w['fresh_ratio']:.2f}x)")
        if "fresh_vs_new_files_ratio" in w:
            print(f"{size:>9} {'ssd_demote_fresh':>16} {w['fresh_gbps']:7.2f} {'':>8} {'':>8}  "
                  f"{w['fresh_vs_new_files_ratio']:.2f}x O_DIRECT write qd{w['odirect_qd']} into new files "
                  f"{w['odirect_new_files_gbps']:.2f} GB/s "
                  f"(empty tier; {w['fresh_ratio']:.2f}x the overwrite reference)")
        f = row.get("cold_get_full_dram")
        if f:
            print(f"{size:>9} {'ssd_get_fulldram':>16} {f['ssd_get_gbps']:7.2f} {'':>8} {'':>8}  "
                  f"{f['ratio']:.2f}x O_DIRECT write+read qd{f['odirect_qd']} {f['odirect_write_read_gbps']:.2f} GB/s "
                  f"(cold get into a full DRAM tier: each promotion demotes a block)")
    if "native_copy" in results:
        from bench_native import print_rows

        print_rows(results["native_copy"])  # type: ignore[arg-type]
    lk = results.get("lookup_prefix_512")
    if lk:
        print(f"\nlookup_prefix(512 keys) over unix socket: p50 {lk['p50_ms']:.3f} ms, "  # type: ignore[index]
              f"p99 {lk['p99_ms']:.3f} ms (target p99 <= 0.5 ms)")  # type: ignore[index]
    bench_control.print_rows(results)
    if "store_memory" in results:
        print(f"\nstore metadata (bench/bench_store_memory.py):\n{results['store_memory']}")


if __name__ == "__main__":
    main()
