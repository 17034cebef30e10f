"""Control-path rows of bench/bench_blocks.py (issue 9): what a batch costs besides its copy.

Measured against a daemon of the same run (over its unix socket):
  * control_us      per-batch control overhead, microseconds: the median latency of a get_into
                    (pin, copy, release) and a put (reserve, copy, commit) of 16 blocks of
                    4 KiB (the copies take ~1 us), with the hot calls over the lean control
                    channel and over gRPC (KVSTORED_CONTROL_CHANNEL=0)
  * single_get      one 4 KiB block, get_into over the channel: p50/p99 in us (target p50 <= 150)
  * lookup storm    lookup_prefix of 512 keys p99 while another process puts 4 MiB blocks
                    into a DRAM tier too small for them, so every put forces a demotion to SSD
                    (target p99 <= 1 ms; quiet target 0.5 ms is bench_blocks' lookup row)
  * clients         shm get_into GB/s of 1 client process and the aggregate of 4 at once, all
                    reading the same blocks (target 4 >= 1.5x 1), next to 1 and 4 processes doing
                    the same copies with numpy alone (what the cores and memory allow)

Also runnable on its own: ``python bench/bench_control.py ADDRESS`` (a running daemon's unix
address; ``--storm-address`` another with a small DRAM tier and an SSD tier).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from bench_common import percentile as _pct  # bench/ is on sys.path when this script runs
from bench_common import timed, write_json

from kvstored import Client
from kvstored.client import _control

SMALL = 4 << 10


def _timed(fn: Callable[[int], None], iters: int, warmup: int = 20) -> list[float]:
    return timed(fn, iters, warmup)  # warmup calls get negative indexes (their own keys)


@contextmanager
def control_switch(on: bool) -> Iterator[None]:
    """Clients made inside use the control channel (on) or gRPC only (off)."""
    old = os.environ.get(_control.ENV_SWITCH)
    os.environ[_control.ENV_SWITCH] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_control.ENV_SWITCH, None)
        else:
            os.environ[_control.ENV_SWITCH] = old


def _keys(tag: str, n: int) -> list[bytes]:
    return [f"ctl:{tag}:{j}".encode().ljust(16, b".")[:32] for j in range(n)]


def control_overhead_us(addr: str, batch: int = 16, iters: int = 300) -> dict[str, float]:
    """Median per-batch latency (us) of tiny-block gets and puts, channel vs gRPC."""
    out: dict[str, float] = {}
    values = [np.full(SMALL, j, dtype=np.uint8) for j in range(batch)]
    bufs = [np.empty(SMALL, dtype=np.uint8) for _ in range(batch)]
    for name, on in (("channel", True), ("grpc", False)):
        with control_switch(on), Client(addr, timeout_s=30.0, transport="shm") as c:
            keys = _keys(f"get-{name}", batch)
            c.put(keys, values)
            assert (c._st.control is not None) == on

            def get(_: int, c: Client = c, keys: list[bytes] = keys) -> None:
                assert c.get_into(keys, bufs) == [SMALL] * batch

            out[f"get_{name}_us"] = statistics.median(_timed(get, iters)) * 1e6

            def put(i: int, c: Client = c, name: str = name) -> None:
                assert all(r.stored for r in c.put(_keys(f"put-{name}-{i}", batch), values))

            out[f"put_{name}_us"] = statistics.median(_timed(put, iters)) * 1e6
            c.remove(keys + [k for i in range(-20, iters) for k in _keys(f"put-{name}-{i}", batch)])
    out["get_saved_us"] = out["get_grpc_us"] - out["get_channel_us"]
    out["put_saved_us"] = out["put_grpc_us"] - out["put_channel_us"]
    out["batch"] = batch
    out["block_bytes"] = SMALL
    return out


def single_get_us(addr: str, iters: int = 1000) -> dict[str, float]:
    """One 4 KiB block per get_into: p50/p99 in us, and whether the hot calls went over the
    control channel (``channel``; False under KVSTORED_CONTROL_CHANNEL=0: gRPC)."""
    buf = np.empty(SMALL, dtype=np.uint8)
    with Client(addr, timeout_s=30.0) as c:
        keys = _keys("single", 1)
        c.put(keys, [np.ones(SMALL, dtype=np.uint8)])
        lat = _timed(lambda _: c.get_into(keys, [buf]) and None, iters)
        channel = c._st.control is not None
        c.remove(keys)
    return {"p50_us": statistics.median(lat) * 1e6, "p99_us": _pct(lat, 0.99) * 1e6,
            "block_bytes": SMALL, "channel": channel}


_STORM = """
import sys, time, numpy as np
from kvstored import Client
addr, stop_at = sys.argv[1], float(sys.argv[2])
v = [np.random.default_rng(1).integers(0, 255, 4 << 20, dtype=np.uint8) for _ in range(4)]
n = 0
with Client(addr, timeout_s=60) as c:
    while time.time() < stop_at:
        c.put([f"storm:{n}:{j}".encode().ljust(16, b".") for j in range(4)], v)
        n += 1
print(n * 4)
"""


def lookup_under_storm(addr: str, n: int = 512, iters: int = 300) -> dict[str, float]:
    """lookup_prefix(512 keys) p50/p99 while a separate process forces demotions with puts.

    ``addr``'s DRAM tier must be much smaller than the storm's volume (and it needs an SSD
    tier), so every put evicts (demotes) older blocks.
    """
    keys = [b"lk" + i.to_bytes(14, "big") for i in range(n)]
    with Client(addr, timeout_s=30.0) as c:
        c.put(keys, [b"x" * 64] * n)
        lat_quiet = _timed(lambda _: c.lookup_prefix(keys) and None, iters)
        stop_at = time.time() + 3600
        storm = subprocess.Popen([sys.executable, "-c", _STORM, addr, str(stop_at)],
                                 stdout=subprocess.PIPE, text=True)
        try:
            before = c.stats()["tiers"][0]["evictions"]
            deadline = time.monotonic() + 30
            while c.stats()["tiers"][0]["evictions"] == before:  # the storm is demoting now
                if time.monotonic() > deadline or storm.poll() is not None:
                    raise RuntimeError("the put storm never forced a demotion")
                time.sleep(0.05)
            lat = _timed(lambda _: c.lookup_prefix(keys) and None, iters, warmup=5)
            evicted = c.stats()["tiers"][0]["evictions"] - before
        finally:
            storm.terminate()
            storm.wait(30)
        assert c.lookup_prefix(keys) in range(n + 1)
    return {"p50_ms": statistics.median(lat) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3,
            "quiet_p99_ms": _pct(lat_quiet, 0.99) * 1e3, "evictions_during": evicted}


_READER = """
import sys, time, numpy as np
from kvstored import Client
addr, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
start_at, seconds = float(sys.argv[4]), float(sys.argv[5])
keys = [f"clients:{j}".encode().ljust(16, b".") for j in range(batch)]
bufs = [np.empty(size, dtype=np.uint8) for _ in range(batch)]
with Client(addr, timeout_s=60) as c:
    c.get_into(keys, bufs)
    while time.time() < start_at:
        time.sleep(0.001)
    t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < seconds:
        c.get_into(keys, bufs); n += 1
    el = time.perf_counter() - t0
print(n * size * batch / el / 1e9)
"""

_COPIER = """
import sys, time, numpy as np
size, batch, start_at, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
src = [np.full(size, j, dtype=np.uint8) for j in range(batch)]
bufs = [np.empty(size, dtype=np.uint8) for _ in range(batch)]
for s, b in zip(src, bufs):
    np.copyto(b, s)
while time.time() < start_at:
    time.sleep(0.001)
t0 = time.perf_counter(); n = 0
while time.perf_counter() - t0 < seconds:
    for s, b in zip(src, bufs):
        np.copyto(b, s)
    n += 1
el = time.perf_counter() - t0
print(n * size * batch / el / 1e9)
"""


def _run_at_once(k: int, argv: list[str]) -> float:
    """Start ``k`` processes of ``argv`` (its ``START_AT`` replaced by a common start time) and
    return the sum of the GB/s each prints last."""
    start_at = str(time.time() + 2.0)  # every process is set up (arena mapped) by then
    procs = [subprocess.Popen([start_at if a == "START_AT" else a for a in argv],
                              stdout=subprocess.PIPE, text=True) for _ in range(k)]
    return sum(float(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs)


def clients_gbps(addr: str, size: int = 1 << 20, batch: int = 16, seconds: float = 3.0,
                 counts: tuple[int, ...] = (1, 4)) -> dict[str, float]:
    """shm get_into GB/s of 1 client process, and the aggregate of 4 at once.

    The reference is the same thing without kvstored: 1 and 4 processes each copying one
    batch of the same shape over and over with numpy (``memcpy_{k}_gbps``), so
    ``memcpy_ratio_4_to_1`` is what this machine's cores and memory allow and
    ``ratio_vs_memcpy`` = ``ratio_4_to_1 / memcpy_ratio_4_to_1``.
    """
    rng = np.random.default_rng(4)
    with Client(addr, timeout_s=60.0) as c:
        keys = [f"clients:{j}".encode().ljust(16, b".") for j in range(batch)]
        c.put(keys, [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(batch)])
        out: dict[str, float] = {"block_bytes": size, "batch": batch}
        for k in counts:
            out[f"clients_{k}_gbps"] = _run_at_once(
                k, [sys.executable, "-c", _READER, addr, str(size), str(batch), "START_AT", str(seconds)])
            out[f"memcpy_{k}_gbps"] = _run_at_once(
                k, [sys.executable, "-c", _COPIER, str(size), str(batch), "START_AT", str(seconds)])
        c.remove(keys)
    if 1 in counts and 4 in counts:
        out["ratio_4_to_1"] = out["clients_4_gbps"] / out["clients_1_gbps"]
        out["memcpy_ratio_4_to_1"] = out["memcpy_4_gbps"] / out["memcpy_1_gbps"]
        out["ratio_vs_memcpy"] = out["ratio_4_to_1"] / out["memcpy_ratio_4_to_1"]
    return out


def run_all(addr: str, storm_addr: str | None) -> dict[str, object]:
    """Every control-path row (``storm_addr`` None: no storm row)."""
    res: dict[str, object] = {
        "control_us": control_overhead_us(addr),
        "single_get": single_get_us(addr),
        "clients": clients_gbps(addr),
    }
    if storm_addr is not None:
        res["lookup_prefix_512_storm"] = lookup_under_storm(storm_addr)
    return res


def print_rows(res: dict[str, object]) -> None:
    """The control rows of the table."""
    c = res.get("control_us")
    if c:
        print(f"\nper-batch control cost, {c['batch']} x {c['block_bytes'] // 1024} KiB blocks "  # type: ignore[index]
              "(median batch latency, us; the copies take ~1 us):")
        for op in ("get", "put"):
            print(f"  {op}: gRPC {c[f'{op}_grpc_us']:7.0f} us   control channel {c[f'{op}_channel_us']:7.0f} us"  # type: ignore[index]
                  f"   saved {c[f'{op}_saved_us']:6.0f} us per batch")  # type: ignore[index]
    s = res.get("single_get")
    if s:
        via = "control channel" if s.get("channel", True) else "gRPC: KVSTORED_CONTROL_CHANNEL=0"
        print(f"single-block get ({s['block_bytes'] // 1024} KiB, unix socket, {via}): "  # type: ignore[index]
              f"p50 {s['p50_us']:.0f} us, p99 {s['p99_us']:.0f} us (target p50 <= 150 us)")  # type: ignore[index]
    lk = res.get("lookup_prefix_512_storm")
    if lk:
        print(f"lookup_prefix(512 keys) under a demotion storm ({lk['evictions_during']} evictions meanwhile): "  # type: ignore[index]
              f"p50 {lk['p50_ms']:.3f} ms, p99 {lk['p99_ms']:.3f} ms (target p99 <= 1 ms); "  # type: ignore[index]
              f"same daemon quiet p99 {lk['quiet_p99_ms']:.3f} ms")  # type: ignore[index]
    cl = res.get("clients")
    if cl:
        print(f"shm get_into, {cl['batch']} x {cl['block_bytes'] >> 20} MiB: 1 client {cl['clients_1_gbps']:.2f} GB/s, "  # type: ignore[index]
              f"4 clients at once {cl['clients_4_gbps']:.2f} GB/s aggregate = {cl['ratio_4_to_1']:.2f}x "  # type: ignore[index]
              f"(target 1.5x; {os.cpu_count()} cores)")
        if "memcpy_ratio_4_to_1" in cl:
            print(f"  reference, numpy copies of the same batch: 1 process {cl['memcpy_1_gbps']:.2f} GB/s, "  # type: ignore[index]
                  f"4 at once {cl['memcpy_4_gbps']:.2f} GB/s = {cl['memcpy_ratio_4_to_1']:.2f}x; "  # type: ignore[index]
                  f"kvstored's scaling is {cl['ratio_vs_memcpy']:.2f}x of the machine's")  # type: ignore[index]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("address", help="unix:PATH of a running daemon")
    ap.add_argument("--storm-address", default=None, help="a daemon with a small DRAM and an SSD tier")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    res = run_all(args.address, args.storm_address)
    print_rows(res)
    write_json(res, args.json)


if __name__ == "__main__":
    main()
