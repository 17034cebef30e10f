"""Cancellation stress (issue 6's measured repro, scaled down): AsyncClient puts and get_intos
cancelled a few ms after they start, with another client putting blocks right after each cancel.

Usage: python bench/stress_cancel.py [--iters 30] [--blocks 16] [--block-mib 4]

Starts a private ``kvstored serve`` (SSD tier on), prints how many of the other client's blocks
read back with foreign bytes (must be 0), the quarantined bytes at the end (must be 0) and
the pins/reservations left. Timings are random on purpose; the check is on bytes, not time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from kvstored import AsyncClient, Client


def value(key: bytes, size: int) -> bytes:
    return np.random.default_rng(int.from_bytes(key[:8], "little")).integers(
        0, 256, size, dtype=np.uint8).tobytes()


def start_node(workdir: str) -> tuple[subprocess.Popen[str], str]:
    sock = os.path.join(workdir, "n.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstored.cli.main", "serve", "--listen", f"unix:{sock}",
         "--data-address", "127.0.0.1:0", "--metrics-address", "", "--dram-size", "384MiB",
         "--ssd-dir", os.path.join(workdir, "ssd"), "--ssd-size", "1GiB", "--node-id", "stress",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "ready":
            return proc, f"unix:{sock}"
    raise SystemExit("the daemon did not start")


async def run(address: str, iters: int, num_blocks: int, size: int) -> tuple[int, int]:
    rng = random.Random(1)
    bad = checked = 0
    b_keys: list[bytes] = []
    failed: list[str] = []
    async with AsyncClient(address, timeout_s=30) as a, AsyncClient(address, timeout_s=30) as b:
        await a.describe()
        for i in range(iters):
            keys = [os.urandom(16) for _ in range(num_blocks)]
            if i % 2:  # a get_into of blocks that exist
                await a.put(keys, [value(k, size) for k in keys])
                bufs = [np.empty(size, dtype=np.uint8) for _ in keys]
                task = asyncio.create_task(a.get_into(keys, bufs))
            else:
                task = asyncio.create_task(a.put(keys, [value(k, size) for k in keys]))
            await asyncio.sleep(rng.uniform(0.002, 0.05))
            task.cancel()
            new = [os.urandom(16) for _ in range(6)]
            for k, r in zip(new, await b.put(new, [value(k, 4 << 20) for k in new]), strict=True):
                if r.stored:
                    b_keys.append(k)
                else:
                    failed.append(type(r.error).__name__)
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.15)
        for k in b_keys:
            got = (await b.get([k]))[0]
            if got is not None:
                checked += 1
                bad += got != value(k, 4 << 20)
    if failed:
        print(f"other client's puts not stored: {len(failed)} ({sorted(set(failed))})")
    return bad, checked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--block-mib", type=int, default=4)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="kvst", dir="/tmp")
    proc, address = start_node(workdir)
    try:
        t0 = time.monotonic()
        bad, checked = asyncio.run(run(address, args.iters, args.blocks, args.block_mib << 20))
        with Client(address) as c:
            s = c.stats()
        print(f"iterations={args.iters} blocks_read_back={checked} foreign_byte_blocks={bad} "
              f"quarantined_bytes={s.get('quarantined_bytes', 'n/a')} pinned_blocks={s['pinned_blocks']} "
              f"wall_s={time.monotonic() - t0:.1f}")
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
