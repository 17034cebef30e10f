"""A peer's read of SSD-only blocks (read_for_export) against an engine's cold get (issue 9).

In process, one TieredStore with an SSD tier (O_DIRECT where the bench's directory allows
it). Per block size, the same ``--chunk-mib`` of SSD-only blocks is read two ways, rounds
alternating:

  * engine   ``pin_many`` + ``unpin`` (promotes into the DRAM arena; the blocks are pushed
             back out to SSD-only between rounds, outside the timing)
  * export   ``read_for_export`` + ``release_export`` (a peer-export GET's read: the blocks
             stay SSD-only, read into private page-aligned buffers)

Each figure is the median round's GB/s; ``ratio`` = export / engine, the reference of the
same run. Before/after a change: run with PYTHONPATH set to each checkout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from bench_common import write_json

from kvstored import log as kvlog
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Tier


def _key(tag: int, i: int) -> bytes:
    return tag.to_bytes(8, "big") + i.to_bytes(8, "big")


def _direct_io_ok(path: str) -> bool:
    try:
        fd = os.open(os.path.join(path, "probe"), os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    return True


def run_size(size: int, chunk_bytes: int, rounds: int, workdir: str) -> dict[str, float]:
    """Median GB/s of the engine and export reads of one chunk of ``size``-byte blocks."""
    n = max(2, min(64, chunk_bytes // size))
    ssd_dir = os.path.join(workdir, f"ssd-{size}")
    os.makedirs(ssd_dir)
    store = TieredStore(dram_size_bytes=n * size, arena_dir=None, max_block_bytes=size,
                        ssd_dir=ssd_dir, ssd_size_bytes=4 * n * size + (64 << 20),
                        ssd_direct_io=_direct_io_ok(ssd_dir))
    keys = [_key(1, i) for i in range(n)]
    payload = os.urandom(size)
    try:
        for k in keys:
            assert store.put(k, payload)
        store.spill_to_ssd()
        filler_tag = 100

        def push_out() -> None:  # DRAM full of fresh fillers: every key is SSD-only again
            nonlocal filler_tag
            filler_tag += 1
            fillers = [_key(filler_tag, i) for i in range(n)]
            for f in fillers:
                assert store.put(f, payload)
            assert store.lookup_prefix(keys) == [Tier.SSD] * n
            store.remove(fillers)

        engine: list[float] = []
        export: list[float] = []
        for _ in range(rounds):
            push_out()
            t0 = time.perf_counter()
            got = store.pin_many(keys)
            for b in got:
                store.unpin(b)  # type: ignore[arg-type]
            engine.append(time.perf_counter() - t0)
            assert all(b is not None and not isinstance(b, Exception) for b in got)
            push_out()
            t0 = time.perf_counter()
            blocks = store.read_for_export(keys)
            store.release_export(blocks)
            export.append(time.perf_counter() - t0)
            assert all(b is not None and b.tier is Tier.SSD for b in blocks)
    finally:
        store.close()
    total = n * size
    eng = total / statistics.median(engine) / 1e9
    exp = total / statistics.median(export) / 1e9
    return {"blocks": n, "engine_gbps": eng, "export_gbps": exp, "ratio": exp / eng}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-kib", default="256,1024,4096")
    ap.add_argument("--chunk-mib", type=int, default=32, help="bytes read per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    kvlog.configure(level="warning")
    res: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-export-ssd-", dir=os.getcwd()) as workdir:
        for kib in (int(s) for s in args.sizes_kib.split(",")):
            res[f"{kib}KiB"] = run_size(kib << 10, args.chunk_mib << 20, args.rounds, workdir)
    print(f"{'size':>8} {'blocks':>6} {'engine GB/s':>12} {'export GB/s':>12} {'ratio':>6}")
    for name, r in res.items():
        print(f"{name:>8} {r['blocks']:>6} {r['engine_gbps']:>12.2f} {r['export_gbps']:>12.2f} "
              f"{r['ratio']:>6.2f}")
    write_json(res, args.json or None)


if __name__ == "__main__":
    main()
