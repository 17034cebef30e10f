"""The first read after a holder stalls: its latency with the holder SIGSTOPped, with and
without hedged copies (``[cluster] hedge_after_ms``; kvstored/node/remote.py).

A real ``kvstored master`` and three real ``kvstored node`` processes on loopback. ``--blocks``
blocks of ``--block-kib`` are put through node a with ``replicas=2`` while only a and b run
(each block on a and b); then c joins. Per run (a fresh cluster each, so c has no memory of
a failed holder):

- reference, same run: the first read through c of another ``--blocks`` blocks put the same
  way, with every holder running (``healthy_s``: lookup, copy, verify, commit), after a
  warm-up read of a third set (c's connections to a and b are open for both reads);
- ``stopped_s``: the holder the master names for most of the measured blocks is SIGSTOPped
  (its kernel still accepts connections; nothing answers), then the first read of them
  through c (``Client.get``, timeout 30 s); ``served`` counts the blocks returned with their
  bytes (the rest missed). The holder is sent SIGCONT afterwards.

Ratio = stopped_s / healthy_s. With hedging off (``--hedge-after-ms 0``, or ``default``
against a tree that has no such setting: run the daemons from it with ``PYTHONPATH``),
the stopped holder keeps the read for ``remote_fetch_timeout_s`` and its blocks miss.

Usage:  python bench/bench_hedge.py [--hedge-after-ms 0,100] [--runs 3] [--blocks 32]
        [--block-kib 256] [--out bench/results/bench_hedge.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import write_json  # noqa: E402
from bench_failover import Proc, _originals, _wait  # noqa: E402

from kvstored import Client  # noqa: E402
from kvstored.client.master import MasterClient  # noqa: E402
from kvstored.client.master_admin import MasterAdminClient  # noqa: E402


def one_run(hedge: str, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh cluster; ``hedge`` is the ``hedge_after_ms`` value ("default": unset)."""
    work = Path(tempfile.mkdtemp(prefix="kvbhedge", dir="/tmp"))
    py = [sys.executable, "-m", "kvstored.cli.main"]
    env = {"KVSTORED_CLUSTER__HEARTBEAT_INTERVAL_S": "0.25"}
    if hedge != "default":
        env["KVSTORED_CLUSTER__HEDGE_AFTER_MS"] = hedge
    procs: list[Proc] = []
    stopped: Proc | None = None

    def node(name: str) -> Proc:
        (work / name).mkdir()
        p = Proc(py + ["node", "--master", maddr, "--node-id", name,
                       "--listen", f"unix:{work / name}.sock", "--listen", "127.0.0.1:0",
                       "--data-address", "127.0.0.1:0", "--metrics-address", "",
                       "--dram-size", "128MiB", "--ssd-size", "0"], work / f"{name}.log", env)
        procs.append(p)
        return p

    try:
        master = Proc(py + ["master", "--listen", "127.0.0.1:0", "--data-dir", str(work / "m"),
                            "--node-lease-s", "30"], work / "master.log")
        procs.append(master)
        maddr = master.tcp("grpc")
        nodes = {n: node(n) for n in "ab"}
        m = MasterAdminClient(maddr, timeout_s=30)
        size = args.block_kib << 10
        warm_keys = [os.urandom(16) for _ in range(args.blocks)]
        ref_keys = [os.urandom(16) for _ in range(args.blocks)]
        keys = [os.urandom(16) for _ in range(args.blocks)]
        every = warm_keys + ref_keys + keys
        vals = {k: os.urandom(size) for k in every}
        _wait(lambda: len([x for x in m.list_nodes()["nodes"]  # type: ignore[attr-defined]
                           if x["health"] == "healthy"]) == 2)
        with Client(f"unix:{work / 'a'}.sock") as c:
            assert all(r.replicas_written == 2
                       for r in c.put(every, [vals[k] for k in every], replicas=2))
        _wait(lambda: all(h == {"a", "b"} for h in _originals(m, every)))
        node("c")
        _wait(lambda: len([x for x in m.list_nodes()["nodes"]  # type: ignore[attr-defined]
                           if x["health"] == "healthy"]) == 3)
        with Client(f"unix:{work / 'c'}.sock") as c:
            assert c.get(warm_keys, timeout_s=30) == [vals[k] for k in warm_keys]  # connections
            t0 = time.perf_counter()
            got = c.get(ref_keys, timeout_s=30)
            healthy_s = time.perf_counter() - t0
            assert got == [vals[k] for k in ref_keys]
            with MasterClient(maddr) as mc:
                named = mc.lookup_each(b"", keys, local_node_id="c")
            assert named is not None
            victim, num_named = Counter(r.node_id for r in named[0].values()).most_common(1)[0]
            stopped = nodes[victim]
            stopped.p.send_signal(signal.SIGSTOP)
            t0 = time.perf_counter()
            got = c.get(keys, timeout_s=30)
            stopped_s = time.perf_counter() - t0
        served = sum(1 for k, v in zip(keys, got, strict=True) if v == vals[k])
        m.close()
        return {"hedge_after_ms": hedge, "healthy_s": healthy_s, "stopped_s": stopped_s,
                "ratio": stopped_s / healthy_s, "served": served, "blocks": args.blocks,
                "blocks_on_stopped_holder": num_named}
    finally:
        if stopped is not None and stopped.p.poll() is None:
            stopped.p.send_signal(signal.SIGCONT)
        for p in reversed(procs):
            p.kill()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hedge-after-ms", default="0,100",
                    help="comma-separated values to compare; 'default' leaves it unset")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--block-kib", type=int, default=256)
    ap.add_argument("--out", default="bench/results/bench_hedge.json")
    args = ap.parse_args()
    values = [v.strip() for v in args.hedge_after_ms.split(",") if v.strip()]
    runs: list[dict[str, Any]] = []
    for _ in range(args.runs):
        for v in values:  # interleaved, so a busy spell hits every setting alike
            runs.append(one_run(v, args))
    rows = []
    for v in values:
        mine = [r for r in runs if r["hedge_after_ms"] == v]
        rows.append({
            "hedge_after_ms": v,
            "healthy_s_median": median(r["healthy_s"] for r in mine),
            "stopped_s_median": median(r["stopped_s"] for r in mine),
            "stopped_s_range": [min(r["stopped_s"] for r in mine),
                                max(r["stopped_s"] for r in mine)],
            "ratio_median": median(r["ratio"] for r in mine),
            "served_min": min(r["served"] for r in mine), "blocks": args.blocks,
        })
    print(f"first read through c, a holder SIGSTOPped ({args.blocks} x {args.block_kib} KiB, "
          f"{args.runs} runs; medians)")
    print(f"{'hedge_after_ms':>14} {'healthy s':>10} {'stopped s':>10} {'range s':>15} "
          f"{'stopped/healthy':>16} {'served (min)':>13}")
    for r in rows:
        lo, hi = r["stopped_s_range"]
        span = f"{lo:.3f}-{hi:.3f}"
        served = f"{r['served_min']}/{r['blocks']}"
        print(f"{r['hedge_after_ms']:>14} {r['healthy_s_median']:>10.3f} "
              f"{r['stopped_s_median']:>10.3f} {span:>15} "
              f"{r['ratio_median']:>16.1f} {served:>13}")
    write_json({"rows": rows, "runs": runs}, args.out)


if __name__ == "__main__":
    main()
