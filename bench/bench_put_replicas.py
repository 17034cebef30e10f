"""put(replicas=N) cost: latency of a batch put with 2 and 3 replicas next to the same put
with 1, same run, same bytes.

Cluster: a real master and three real nodes (DRAM only, distinct zones). The engine is
this process, a :class:`~kvstored.Client` on node a's unix socket (shared memory). Each
round puts ``--batch`` fresh blocks of ``--size-kib``; with N > 1 the put returns only once
node a wrote the other N - 1 replicas (one PutStartBatch, one data-plane PUT per peer, one
PutEndBatch). Rounds alternate between the factors so load drifts hit all of them alike.

Ratio = p50(put, replicas=N) / p50(put, replicas=1): what asking for N replicas costs an
engine's put. Noisy on a shared machine: best of ``--repeat`` runs of the p50s.

Usage:  python bench/bench_put_replicas.py [--size-kib 256] [--batch 8] [--rounds 30]
        [--repeat 3] [--out bench/results/bench_put_replicas.json]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import percentile, write_json  # noqa: E402
from bench_remote_get import _start  # noqa: E402 (a kvstored subprocess and its addresses)

from kvstored import Client  # noqa: E402
from kvstored.client.master import MasterClient  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
FACTORS = (1, 2, 3)


def run(size: int, batch: int, rounds: int, workdir: Path) -> dict[int, float]:
    """p50 seconds per batch put, per factor."""
    env = {"KVSTORED_NODE__MAX_BLOCK_BYTES": str(max(size, MiB)),
           "KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S": "0.2"}
    dram = 2 * rounds * batch * size * len(FACTORS) + 64 * MiB
    procs: list[subprocess.Popen[str]] = []
    try:
        mproc, m = _start(workdir, "master", ["master", "--listen", "127.0.0.1:0",
                                              "--data-dir", str(workdir / "m")], env)
        procs.append(mproc)
        for name in ("a", "b", "c"):
            p, _ = _start(workdir, name, [
                "node", "--master", m["grpc"], "--node-id", name, "--zone", f"z-{name}",
                "--listen", f"unix:{workdir / name}.sock", "--listen", "127.0.0.1:0",
                "--data-address", "127.0.0.1:0", "--metrics-address", "",
                "--dram-size", str(dram), "--ssd-size", "0"], env)
            procs.append(p)
        with MasterClient(m["grpc"]) as mc:  # all three registered and synced (untimed)
            deadline = time.monotonic() + 60
            while sum(n["health"] == "healthy" for n in mc.list_nodes()["nodes"]) < 3:  # type: ignore[attr-defined, union-attr]
                if time.monotonic() > deadline:
                    raise SystemExit("the nodes did not become healthy within 60 s")
                time.sleep(0.1)
        payload = os.urandom(size)
        lat: dict[int, list[float]] = {f: [] for f in FACTORS}
        with Client(f"unix:{workdir / 'a'}.sock") as c:
            c.put([os.urandom(16)], [payload], replicas=3)  # warm every path once
            for _ in range(rounds):
                for f in FACTORS:
                    keys = [os.urandom(16) for _ in range(batch)]
                    t0 = time.perf_counter()
                    out = c.put(keys, [payload] * batch, replicas=f)
                    lat[f].append(time.perf_counter() - t0)
                    short = [r for r in out if r.short or not r.ok]
                    if short:
                        raise SystemExit(f"replicas={f}: {len(short)} short: "
                                         f"{short[0].replica_error or short[0].error}")
        return {f: percentile(v, 0.5) for f, v in lat.items()}
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-kib", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results/bench_put_replicas.json")
    args = ap.parse_args()
    size = args.size_kib * KiB
    best: dict[int, float] = {}
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="kvbench-repl") as tmp:
            got = run(size, args.batch, args.rounds, Path(tmp))
        print(f"run {i + 1}: " + "  ".join(f"replicas={f} p50 {s * 1e3:7.2f} ms"
                                           for f, s in got.items()), flush=True)
        for f, s in got.items():
            best[f] = min(best.get(f, s), s)
    res = {"block_kib": args.size_kib, "batch": args.batch, "rounds": args.rounds,
           "p50_ms": {str(f): round(s * 1e3, 3) for f, s in best.items()},
           "ratio_vs_1": {str(f): round(s / best[1], 2) for f, s in best.items()},
           "mb_per_s": {str(f): round(args.batch * size / s / 1e6, 1) for f, s in best.items()}}
    print(f"batch of {args.batch} x {args.size_kib} KiB, best p50 of {args.repeat} runs:")
    for f in FACTORS:
        print(f"  replicas={f}: {best[f] * 1e3:7.2f} ms  x{best[f] / best[1]:.2f} of replicas=1  "
              f"({res['mb_per_s'][str(f)]} MB/s of engine data)")
    write_json(res, args.out)


if __name__ == "__main__":
    main()
