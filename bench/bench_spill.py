"""Spill throughput: how fast a full node moves its coldest blocks to a peer, next to a plain
data-plane PUT of the same bytes.

Cluster: a real master and two real nodes (DRAM only). Node A is filled to just below its
high watermark (0.9), then one more batch is put: from that moment A spills (one PutStartBatch
over gRPC, one data-plane PUT to B and one PutEndBatch per batch, drop the local copies)
until it is at its low watermark (0.5). Timed: from the start of the put that crosses the
watermark (at 4 MiB it does not fit and waits for the spiller) to A's DRAM at the low
watermark (A's Stats polled every 5 ms); moved = A's DRAM before that put + the put's bytes -
A's DRAM at the end.

Reference, same run: this process putting the same number of blocks of the same size to
B's data plane with :class:`~kvstored.transport.tcp.DataPlaneClient`, in batches of the
same size (no master, no source store). Ratio = spill GB/s / plain PUT GB/s.

Burst case (issue 17 section 3; goal: 0 blocks lost): a real master and two real DRAM-only
nodes of ``--burst-dram-mib`` each; ``--burst-blocks`` blocks of 1 MiB are put into node A
as fast as one client goes (batches of 4, no pacing), then both nodes' listings are
counted (a, b, then a again: a block still moving between them is seen): a block held by
neither is lost. Three variants in the same run: ``wait 0``
(``cluster.spill_put_wait_s = 0``: a put that finds no room evicts at once, the behaviour
before backpressure), ``backpressure`` (the default 2 s bound: the put waits for a spill
round) and ``master down`` (backpressure, the master SIGKILLed after A's spiller cached
its peer view: batches go straight to B). Also printed: the burst's wall time.

Usage:  python bench/bench_spill.py [--sizes-kib 256,1024,4096] [--dram-mib 128]
        [--batch 8] [--burst-blocks 100] [--burst-dram-mib 64] [--no-ratio]
        [--tiered-blocks 150 [--tiered-dram-mib 32] [--tiered-ssd-mib 64]]
        [--pool-full-extra 8 [--pool-full-dram-mib 16]]
        [--out bench/results/bench_spill.json]

``--tiered-blocks N``: the tester's read case (issue 17): two nodes with DRAM + SSD tiers
hold N x 1 MiB, half put through each; every block is then read through both nodes in
batches of 8 and the blocks neither node holds are counted (lost).

``--pool-full-extra N`` (pool LRU, issue 17 §3): two DRAM-only nodes of
``--pool-full-dram-mib`` each, both filled with 1 MiB blocks (the spill watermark at 1.0:
the pool is full and stays so), d's first, then c's ``POOL_FULL_GAP_S`` later; then N more
blocks are put into c one by one. A full pool must drop N blocks; counted: how many of
them were the N coldest cluster-wide (d's oldest: the goal, N) and how many were c's own,
with pool LRU (``pool_lru_enabled``, the default) and without it, in the same run; and the
N puts' wall time.
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
            # timed from before the put that crosses HIGH: at 4 MiB that put does not fit
            # (100 + 8 MiB of the client's put slots + 32 MiB > 128) and waits for the
            # spiller, which has moved most blocks by the time it returns
            start_used = _dram(a)[0] + batch * size
            t0 = time.perf_counter()
            assert all(r.stored for r in a.put(extra, [payload] * batch))  # crosses HIGH
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


def burst(num_blocks: int, dram_mib: int, workdir: Path, variant: str) -> dict[str, object]:
    """Put ``num_blocks`` x 1 MiB into node A as fast as possible; count the blocks lost."""
    env = {"KVSTORED_CLUSTER__SPILL_INTERVAL_S": "0.05",
           "KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S": "0.25",
           "KVSTORED_CLUSTER__SPILL_PEER_VIEW_S": "0.25",
           "KVSTORED_CLUSTER__SPILL_PUT_WAIT_S": "0" if variant == "wait 0" else "2"}
    tag = variant.replace(" ", "-")
    procs: list[subprocess.Popen[str]] = []
    try:
        mproc, m = _start(workdir, f"master-{tag}", ["master", "--listen", "127.0.0.1:0",
                                                     "--data-dir", str(workdir / f"m-{tag}")], env)
        procs.append(mproc)
        socks = {}
        for name in ("a", "b"):
            sock = workdir / f"{name}-{tag}.sock"
            socks[name] = f"unix:{sock}"
            p, _ = _start(workdir, f"{name}-{tag}", [
                "node", "--master", m["grpc"], "--node-id", name, "--listen", f"unix:{sock}",
                "--listen", "127.0.0.1:0", "--data-address", "127.0.0.1:0",
                "--metrics-address", "", "--dram-size", str(dram_mib * MiB), "--ssd-size", "0"],
                env)
            procs.append(p)
        log_a = workdir / f"a-{tag}.log"
        deadline = time.monotonic() + 60
        while "peers=b" not in log_a.read_text():  # A's spiller cached its peer view
            if time.monotonic() > deadline:
                raise SystemExit("node A never listed its peer:\n" + log_a.read_text()[-2000:])
            time.sleep(0.05)
        if variant == "master down":
            mproc.kill()
            mproc.wait(30)
        keys = [os.urandom(16) for _ in range(num_blocks)]
        payload = os.urandom(MiB)
        t0 = time.perf_counter()
        with Client(socks["a"]) as a:
            for i in range(0, num_blocks, 4):
                chunk = keys[i : i + 4]
                assert all(r.stored for r in a.put(chunk, [payload] * len(chunk)))
        burst_s = time.perf_counter() - t0
        # Listed a, b, then a again: the spillers may still be moving blocks (a past its
        # watermark, or b, filled past its own by a's hand-offs, moving blocks back to a with
        # the master down). A move drops its source only once the target stored the block,
        # so a block moving a -> b is seen on a or b, and one moving b -> a after a's first
        # listing is seen on a's second; a count of a then b alone called such blocks lost
        # (issue 17 §3: the master-down burst's "7 lost", held 43 / 51, were b's move-back).
        held: set[bytes] = set()
        per_node = {}
        late = 0
        for name in ("a", "b", "a"):
            with Client(socks[name]) as c:
                mine = {b.key for b in c.list_blocks(limit=100000)[0]}
            if name in per_node:
                late = len((mine - held) & set(keys))
            per_node[name] = len(mine & set(keys))
            held |= mine
        return {"variant": variant, "blocks": num_blocks, "node_mib": dram_mib,
                "lost": len(set(keys) - held), "held_a": per_node["a"], "held_b": per_node["b"],
                "moved_back_while_counted": late, "burst_s": round(burst_s, 2),
                "put_mib_per_s": round(num_blocks / burst_s, 1)}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                p.wait(60)


def tiered(num_blocks: int, dram_mib: int, ssd_mib: int, workdir: Path) -> dict[str, object]:
    """The tester's read case: two DRAM + SSD nodes hold ``num_blocks`` x 1 MiB (half put
    through each), then every block is read through both nodes in batches of 8; a block
    neither node holds afterwards is lost."""
    env = {"KVSTORED_CLUSTER__SPILL_INTERVAL_S": "0.05",
           "KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S": "0.25"}
    procs: list[subprocess.Popen[str]] = []
    try:
        mproc, m = _start(workdir, "master-tiered", ["master", "--listen", "127.0.0.1:0",
                                                     "--data-dir", str(workdir / "m-tiered")], env)
        procs.append(mproc)
        socks = {}
        for name in ("a", "b"):
            sock = workdir / f"{name}-tiered.sock"
            socks[name] = f"unix:{sock}"
            p, _ = _start(workdir, f"{name}-tiered", [
                "node", "--master", m["grpc"], "--node-id", name, "--listen", f"unix:{sock}",
                "--listen", "127.0.0.1:0", "--data-address", "127.0.0.1:0",
                "--metrics-address", "", "--dram-size", str(dram_mib * MiB),
                "--ssd-size", str(ssd_mib * MiB), "--ssd-dir", str(workdir / f"{name}-ssd")], env)
            procs.append(p)
        time.sleep(1.0)  # both registered and heartbeated (untimed)
        keys = [os.urandom(16) for _ in range(num_blocks)]
        values = {k: k * (MiB // 16) for k in keys}
        half = num_blocks // 2
        for name, part in (("a", keys[:half]), ("b", keys[half:])):
            with Client(socks[name]) as c:
                for i in range(0, len(part), 2):
                    chunk = part[i : i + 2]
                    assert all(r.stored for r in c.put(chunk, [values[k] for k in chunk]))

        def held() -> set[bytes]:
            out: set[bytes] = set()
            for addr in socks.values():
                with Client(addr) as c:
                    out |= {b.key for b in c.list_blocks(limit=100000)[0]}
            return out

        lost_put = len(set(keys) - held())
        hits = wrong = 0
        for name in ("a", "b"):
            with Client(socks[name]) as c:
                for i in range(0, num_blocks, 8):
                    chunk = keys[i : i + 8]
                    for k, got in zip(chunk, c.get(chunk, timeout_s=60), strict=True):
                        hits += got is not None
                        wrong += got is not None and got != values[k]
        return {"blocks": num_blocks, "dram_mib": dram_mib, "ssd_mib": ssd_mib,
                "lost_after_puts": lost_put, "lost_after_reads": len(set(keys) - held()),
                "hits": hits, "reads": 2 * num_blocks, "wrong": wrong}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                p.wait(60)


POOL_FULL_GAP_S = 2.0
"""How much older d's blocks are than c's in the pool-full case (> ``pool_lru_margin_s``)."""


def pool_full(num_extra: int, dram_mib: int, workdir: Path, lru: bool) -> dict[str, object]:
    """Two full DRAM-only nodes (d's blocks older); ``num_extra`` more puts into c: which
    blocks the full pool dropped (see the module docstring)."""
    env = {"KVSTORED_CLUSTER__SPILL_INTERVAL_S": "0.05",
           "KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S": "0.25",
           "KVSTORED_CLUSTER__SPILL_PEER_VIEW_S": "0.2",
           "KVSTORED_CLUSTER__SPILL_HIGH_WATERMARK": "1.0",
           "KVSTORED_CLUSTER__SPILL_LOW_WATERMARK": "0.9",
           "KVSTORED_CLUSTER__POOL_LRU_MARGIN_S": "0.5",
           "KVSTORED_CLUSTER__POOL_LRU_ENABLED": "true" if lru else "false"}
    tag = "lru" if lru else "nolru"
    procs: list[subprocess.Popen[str]] = []
    try:
        mproc, m = _start(workdir, f"master-{tag}", ["master", "--listen", "127.0.0.1:0",
                                                     "--data-dir", str(workdir / f"m-{tag}")], env)
        procs.append(mproc)
        socks = {}
        for name in ("c", "d"):
            sock = workdir / f"{name}-{tag}.sock"
            socks[name] = f"unix:{sock}"
            p, _ = _start(workdir, f"{name}-{tag}", [
                "node", "--master", m["grpc"], "--node-id", name, "--listen", f"unix:{sock}",
                "--listen", "127.0.0.1:0", "--data-address", "127.0.0.1:0",
                "--metrics-address", "", "--dram-size", str(dram_mib * MiB), "--ssd-size", "0"],
                env)
            procs.append(p)
        time.sleep(1.0)  # both registered and heartbeated (untimed)
        keys = {n: [os.urandom(16) for _ in range(dram_mib)] for n in ("c", "d", "extra")}
        payload = os.urandom(MiB)

        def put(node: str, ks: list[bytes]) -> None:
            with Client(socks[node]) as cl:
                for k in ks:  # one by one: the first key is the node's coldest
                    assert cl.put([k], [payload])[0].stored

        put("d", keys["d"])
        time.sleep(POOL_FULL_GAP_S)  # d's blocks get older than c's (the case's premise)
        put("c", keys["c"])
        time.sleep(0.6)  # c's heartbeat and spiller view catch up (untimed)
        extra = keys["extra"][:num_extra]
        t0 = time.perf_counter()
        put("c", extra)
        puts_s = time.perf_counter() - t0
        held: set[bytes] = set()
        for addr in socks.values():
            with Client(addr) as cl:
                held |= {b.key for b in cl.list_blocks(limit=100000)[0]}
        every = keys["d"] + keys["c"] + extra
        lost = [k for k in every if k not in held]
        coldest = set(keys["d"][:num_extra])  # the N coldest cluster-wide
        return {"variant": "pool LRU" if lru else "pool_lru_enabled = false",
                "extra": num_extra, "node_mib": dram_mib, "lost": len(lost),
                "lost_coldest": sum(1 for k in lost if k in coldest),
                "lost_of_c": sum(1 for k in lost if k in set(keys["c"])),
                "puts_s": round(puts_s, 3)}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                p.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-kib", default="256,1024,4096")
    ap.add_argument("--dram-mib", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--burst-blocks", type=int, default=100)
    ap.add_argument("--burst-dram-mib", type=int, default=64)
    ap.add_argument("--tiered-blocks", type=int, default=0,
                    help="also the read case through two DRAM + SSD nodes (the tester's: 150)")
    ap.add_argument("--tiered-dram-mib", type=int, default=32)
    ap.add_argument("--tiered-ssd-mib", type=int, default=64)
    ap.add_argument("--pool-full-extra", type=int, default=0,
                    help="also the pool-LRU case: this many puts into a full pool")
    ap.add_argument("--pool-full-dram-mib", type=int, default=16)
    ap.add_argument("--no-ratio", action="store_true", help="only the burst case")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    bursts = []
    reads = []
    fulls = []
    with tempfile.TemporaryDirectory(prefix="kvspill", dir="/tmp") as d:
        if not args.no_ratio:
            for kib in [int(x) for x in args.sizes_kib.split(",")]:
                rows.append(one_size(kib * KiB, args.dram_mib, args.batch, Path(d)))
                print(rows[-1], flush=True)
        if args.burst_blocks > 0:
            for variant in ("wait 0", "backpressure", "master down"):
                bursts.append(burst(args.burst_blocks, args.burst_dram_mib, Path(d), variant))
                print(bursts[-1], flush=True)
        if args.tiered_blocks > 0:
            reads.append(tiered(args.tiered_blocks, args.tiered_dram_mib, args.tiered_ssd_mib,
                                Path(d)))
            print(reads[-1], flush=True)
        if args.pool_full_extra > 0:
            for lru in (True, False):
                fulls.append(pool_full(args.pool_full_extra, args.pool_full_dram_mib, Path(d),
                                       lru))
                print(fulls[-1], flush=True)
    if rows:
        print("\n| block | moved MiB | spill GB/s | plain PUT GB/s | ratio | spill blocks/s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['block_kib']} KiB | {r['moved_mib']} | {r['spill_gbps']} | "
                  f"{r['plain_put_gbps']} | **{r['ratio']}** | {r['spill_blocks_per_s']} |")
    if bursts:
        print("\n| burst (1 MiB blocks) | blocks | node MiB | **lost** (goal 0) | held by A / B "
              "| burst s | MiB/s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for b in bursts:
            print(f"| {b['variant']} | {b['blocks']} | {b['node_mib']} | **{b['lost']}** | "
                  f"{b['held_a']} / {b['held_b']} | {b['burst_s']} | {b['put_mib_per_s']} |")
    for r in reads:
        print(f"\nreads through two nodes (DRAM {r['dram_mib']} + SSD {r['ssd_mib']} MiB), "
              f"{r['blocks']} x 1 MiB: **lost {r['lost_after_reads']}** "
              f"({r['lost_after_puts']} after the puts), hits {r['hits']} / {r['reads']}, "
              f"wrong {r['wrong']}")
    if fulls:
        print(f"\n| full pool (2 x {args.pool_full_dram_mib} MiB, 1 MiB blocks) | puts | lost | "
              "**of them the pool's coldest** (goal: all) | of them c's own | puts s |")
        print("|---|---:|---:|---:|---:|---:|")
        for f in fulls:
            print(f"| {f['variant']} | {f['extra']} | {f['lost']} | **{f['lost_coldest']}** | "
                  f"{f['lost_of_c']} | {f['puts_s']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"ratio": rows, "burst": bursts, "reads": reads,
                                              "pool_full": fulls}, indent=2) + "\n")


if __name__ == "__main__":
    main()
