"""Extra SSD-tier rows of bench/bench_blocks.py (issue 9): references and paths its first rows lack.

  * odirect_new_files_gbps  O_DIRECT writes at queue depth 8 of one NEW file per block (what an
                empty tier's demotion must do: the filesystem allocates every block), the fair
                reference for ``demotion_write.fresh_ratio``; bench_blocks' own reference
                overwrites one laid-out file, which allocates nothing
  * cold_get_full_dram  a cold get (blocks only on SSD) into a FULL DRAM tier of DRAM-only
                blocks: each promotion first evicts and demotes a block, so the get writes one
                batch and reads one batch; next to O_DIRECT qd8 writes + reads of the same bytes,
                measured right before each get (the disk drifts)

Every ratio is the median over reps of (this rep / the reference measured right before it).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

QD = 8


def odirect_new_files_gbps(tmp: pathlib.Path, src: memoryview, size: int, n: int) -> float:
    """GB/s of ``n`` O_DIRECT writes of ``size`` bytes at queue depth 8, each into a new file
    (16 shard directories, as the tier spreads its files), from page-aligned ``src`` slices.
    The files are fsync'd and deleted after the timing."""
    root = tmp / "odirect-new"
    shutil.rmtree(root, ignore_errors=True)
    for s in range(16):
        (root / f"{s:02x}").mkdir(parents=True)

    def one(i: int) -> int:
        fd = os.open(root / f"{i % 16:02x}" / f"b{i}.blk",
                     os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_DIRECT", 0), 0o644)
        try:
            return os.pwritev(fd, [src[i * size : (i + 1) * size]], 0)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(QD, thread_name_prefix="bench-odirect") as pool:
        t0 = time.perf_counter()
        done = sum(pool.map(one, range(n)))
        dt = time.perf_counter() - t0
    assert done == n * size
    os.sync()
    shutil.rmtree(root, ignore_errors=True)
    return size * n / dt / 1e9


def bench_cold_get_full_dram(tmp: pathlib.Path, size: int, batch: int, reps: int) -> dict[str, float]:
    """Cold SSD get through the daemon (shm client) into a full DRAM tier, vs O_DIRECT write + read.

    ``2 * reps`` batches are put into a DRAM tier holding ``reps`` of them: the first ``reps``
    are demoted (checked: SSD-only), the last ``reps`` stay DRAM-only. Timed get ``i`` reads
    batch ``i``; to make room it demotes the LRU DRAM batch (new files: the SSD tier is not
    full). Reference: the time of an O_DIRECT qd8 write plus an O_DIRECT qd8 read of a batch.
    """
    import bench_blocks as bb  # (bench/ is on sys.path; imported here: it imports this module)

    from kvstored import Client

    n_batches = 2 * reps
    batch_bytes = size * batch
    with bb.daemon(tmp, dram=str(reps * batch_bytes), ssd_size=str(4 * n_batches * batch_bytes),
                   name="ssd-full") as (addr, _):
        rng = np.random.default_rng(11)
        values = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(batch)]
        bufs = [np.empty(size, dtype=np.uint8) for _ in range(batch)]
        with Client(addr, timeout_s=120.0) as c:
            for i in range(n_batches):
                assert all(x.ok for x in c.put(bb.make_keys("full", size, i, batch), values))
            tiers = [c.lookup_prefix_tiers(bb.make_keys("full", size, i, batch)) for i in range(n_batches)]
            assert all([int(t) for t in tiers[i]] == [2] * batch for i in range(reps)), "timed batches not SSD-only"
            assert all([int(t) for t in tiers[i]] == [1] * batch for i in range(reps, n_batches))
            lat, refs = [], []
            for i in range(reps):
                w = bb.odirect_gbps(tmp / "odirect-w.bin", size, batch, write=True, reps=1)
                r = bb.odirect_gbps(tmp / "odirect.bin", size, batch, write=False, reps=1)
                refs.append(batch_bytes / 1e9 / (batch_bytes / 1e9 / w + batch_bytes / 1e9 / r))
                keys = bb.make_keys("full", size, i, batch)
                t0 = time.perf_counter()
                got = c.get_into(keys, bufs)
                lat.append(time.perf_counter() - t0)
                assert all(x == size for x in got), got
                assert bytes(bufs[-1][-64:]) == bytes(values[-1][-64:])
            demoted = [int(t) for t in c.lookup_prefix_tiers(bb.make_keys("full", size, reps, batch))]
            assert demoted == [2] * batch, f"the LRU DRAM batch was not demoted: {demoted}"
    return {"ssd_get_gbps": batch_bytes / statistics.median(lat) / 1e9,
            "odirect_write_read_gbps": statistics.median(refs), "odirect_qd": QD,
            "ratio": statistics.median(batch_bytes / t / 1e9 / r for t, r in zip(lat, refs, strict=True)),
            "reps": reps, "batch": batch}
