"""Spill throughput: how fast a full node moves its coldest blocks to a peer, next to a plain
data-plane PUT of the same bytes.

Cluster: a real master and two real nodes (DRAM only). Node A is filled to just below its
high watermark (0.9), then one more batch is put: from that moment A spills (one PutStartBatch
over gRPC, one data-plane PUT to B and one PutEndBatch per batch, drop the local copies)
until it is at its low watermark (0.5). Timed: from the put that crossed the watermark to
A's DRAM at the low watermark (A's Stats polled every 5 ms).

Reference, same run: this process putting the same number of blocks of the same size to
B's data plane with :class:`~kvstored.transport.tcp.DataPlaneClient`, in batches of the
same size (no master, no source store). Ratio = spill GB/s / plain PUT GB/s.

Usage:  python bench/bench_spill.py [--sizes-kib 256,1024,4096] [--dram-mib 128]
        [--batch 8] [--out bench/results/bench_spill.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_remote_get import _start  # noqa: E402 (a kvstored subprocess and its addresses)

from kvstored import Client  # noqa: E402
from kvstored.transport.tcp import DataPlaneClient  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
HIGH, LOW = 0.9, 0.5


def _dram(c: Client) -> tuple[int, int]:
    t = next(t for t in c.stats()["tiers"] if t["tier"] == "DRAM")
    return t["used_bytes"], t["capacity_bytes"]


def one_size(size: int, dram: int, batch: int, workdir: Path) -> dict[str, float]:
    env = {"KVSTORED_NODE__MAX_BLOCK_BYTES": str(max(size, 4 * MiB)),
           "KVSTORED_CLUSTER__SPILL_INTERVAL_S": "0.01",
           "KVSTORED_CLUSTER__SPILL_BATCH_BLOCKS": str(batch),
           "KVSTORED_CLUSTER__SPILL_HIGH_WATERMARK": str(HIGH),
           "KVSTORED_CLUSTER__SPILL_LOW_WATERMARK": str(LOW),
           "KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S": "0.2"}
    procs: list[subprocess.Popen[str]] = []
    try:
        mproc, m = _start(workdir, f"master-{size}", ["master", "--listen", "127.0.0.1:0",
                                                      "--data-dir", str(workdir / f"m{size}")], env)
        procs.append(mproc)
        socks, data = {}, {}
        for name, mib in (("a", dram), ("b", 4 * dram)):
            sock = workdir / f"{name}{size}.sock"
            socks[name] = f"unix:{sock}"
            p, seen = _start(workdir, f"{name}-{size}", [
                "node", "--master", m["grpc"], "--node-id", name, "--listen", f"unix:{sock}",
                "--listen", "127.0.0.1:0", "--data-address", "127.0.0.1:0",
                "--metrics-address", "", "--dram-size", str(mib * MiB), "--ssd-size", "0"], env)
            procs.append(p)
            data[name] = seen["data"]
        time.sleep(1.0)  # both registered and heartbeated (untimed)
        payload = os.urandom(size)
        with Client(socks["a"]) as a:
            used, cap = _dram(a)
            n_fill = int((HIGH * cap - 2 * size) // size) - 1
            keys = [os.urandom(16) for _ in range(n_fill)]
            for i in range(0, n_fill, batch):
                chunk = keys[i : i + batch]
                assert all(r.stored for r in a.put(chunk, [payload] * len(chunk)))
            extra = [os.urandom(16) for _ in range(batch)]
            assert all(r.stored for r in a.put(extra, [payload] * batch))  # crosses HIGH
            t0 = time.perf_counter()
            start_used, _ = _dram(a)
            deadline = time.monotonic() + 120
            while (used := _dram(a)[0]) > LOW * cap:
                if time.monotonic() > deadline:
                    raise SystemExit(f"node A did not spill down to {LOW:.0%} within 120 s")
                time.sleep(0.005)
            spill_s = time.perf_counter() - t0
        moved = start_used - used
        n_blocks = moved // size
        dp = DataPlaneClient(data["b"], pool_size=2, max_block_bytes=max(size, 4 * MiB))
        try:
            view = memoryview(payload)
            warm = [(os.urandom(16), view, b"") for _ in range(batch)]
            dp.put(warm, b"", deadline=time.monotonic() + 60)
            t0 = time.perf_counter()
            for i in range(0, n_blocks, batch):
                items = [(os.urandom(16), view, b"") for _ in range(min(batch, n_blocks - i))]
                assert all(o.code == 0 for o in dp.put(items, b"", deadline=time.monotonic() + 60))
            plain_s = time.perf_counter() - t0
        finally:
            dp.close()
        spill_gbps = moved / spill_s / 1e9
        plain_gbps = n_blocks * size / plain_s / 1e9
        return {"block_kib": size // KiB, "moved_mib": round(moved / MiB, 1),
                "spill_gbps": round(spill_gbps, 3), "plain_put_gbps": round(plain_gbps, 3),
                "ratio": round(spill_gbps / plain_gbps, 3),
                "spill_blocks_per_s": round(n_blocks / spill_s, 1)}
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-kib", default="256,1024,4096")
    ap.add_argument("--dram-mib", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvspill", dir="/tmp") as d:
        for kib in [int(x) for x in args.sizes_kib.split(",")]:
            rows.append(one_size(kib * KiB, args.dram_mib, args.batch, Path(d)))
            print(rows[-1], flush=True)
    print("\n| block | moved MiB | spill GB/s | plain PUT GB/s | ratio | spill blocks/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['block_kib']} KiB | {r['moved_mib']} | {r['spill_gbps']} | "
              f"{r['plain_put_gbps']} | **{r['ratio']}** | {r['spill_blocks_per_s']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
