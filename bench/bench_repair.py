"""Repair throughput: GB/s re-replicated by the master's copy commands, vs the TCP data plane.

The "repair" section of issue 17's failover bench (bench/bench_failover.py, ha17's, runs the
"failover" section; this file is the repair section, to be called from there once both
land: ``run_repair(args)`` returns the same dict shape).

Setup: a real ``kvstored master`` and three real ``kvstored node`` processes on loopback.
``--total-mib`` of ``--block-mib`` blocks are put through node a (one replica each). Then:

- ``repair``: ``SetReplication(keys, 2)``: the master queues one COPY per block to b or c
  (``[master] repair_bytes_per_s`` set far above the data plane here, so the figure is the
  machinery's own: command delivery on heartbeats, the pull over the peer data plane with
  ``GET_FLAG_PEER_EXPORT``, the verification, the commit, the ADDED event); timed from the
  call until the master indexes a second readable original of every block.
  GB/s = bytes re-replicated / that time.
- ``kill``: a fresh set of blocks put with ``replicas=2``, then a holder SIGKILLed; timed
  from the kill until every block has two originals again (node lease + repair).
- Reference, same run: ``DataPlaneClient.get`` of the same blocks from node a's data plane
  into preallocated memory (the TCP data plane's own GB/s, as bench/bench_remote_get.py
  measures it), best of 3.

Printed: both GB/s and their ratio (repair / data plane). Heartbeats are 1 s, so for small
totals the ratio is bounded by command delivery (the copy waits for the target's next
heartbeat, its ADDED event for the one after), not by the copy.

Usage:  python bench/bench_repair.py [--total-mib 256] [--block-mib 2] [--node-lease-s 3]
        [--out bench/results/bench_repair.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import write_json  # noqa: E402

from kvstored import Client  # noqa: E402
from kvstored.client.master_admin import MasterAdminClient  # noqa: E402
from kvstored.transport.tcp import DataPlaneClient  # noqa: E402

MiB = 1 << 20
READY_S = 60.0


class Proc:
    """One daemon: started, ``listening ...`` lines parsed, ``ready`` awaited."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.addresses: dict[str, list[str]] = {}
        with open(log, "a") as f:
            self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=f, text=True,
                                      env={**os.environ, **(env or {})})
        ready = threading.Event()

        def read() -> None:
            assert self.p.stdout is not None
            for line in self.p.stdout:
                parts = line.split()
                if line.startswith("listening ") and len(parts) >= 3:
                    self.addresses.setdefault(parts[1], []).append(parts[2])
                elif line.strip() == "ready":
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(READY_S):
            self.p.kill()
            raise SystemExit(f"{args[3]} did not start; see {log}")

    def tcp(self, kind: str) -> str:
        return next(a for a in self.addresses[kind] if not a.startswith("unix:"))

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(30)


def _originals(m: MasterAdminClient, keys: list[bytes]) -> list[set[str]]:
    per, _ = m.list_replicas(b"", keys)
    return [{r["node_id"] for r in reps if not r["copy"] and r["readable"]
             and r["state"] == "committed"} for reps in per]


def _wait(cond: Any, timeout_s: float = 300.0, step_s: float = 0.02) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit("timed out")
        time.sleep(step_s)
    return time.monotonic() - t0


def run_repair(args: argparse.Namespace) -> dict[str, Any]:
    """Run the repair section (see the module docstring); returns its results."""
    work = Path(tempfile.mkdtemp(prefix="kvbrep"))
    py = [sys.executable, "-m", "kvstored.cli.main"]
    procs: list[Proc] = []
    n = max(1, args.total_mib // args.block_mib)
    size = args.block_mib * MiB
    dram = f"{max(64, 3 * args.total_mib)}MiB"
    try:
        master = Proc(py + ["master", "--listen", "127.0.0.1:0", "--data-dir", str(work / "m"),
                            "--node-lease-s", str(args.node_lease_s)], work / "master.log",
                      env={"KVSTORED_MASTER__REPAIR_BYTES_PER_S": "100GiB"})
        procs.append(master)
        maddr = master.tcp("grpc")
        nodes = {}
        for name in "abc":
            (work / name).mkdir()
            nodes[name] = Proc(py + [
                "node", "--master", maddr, "--node-id", name,
                "--listen", f"unix:{work / name}.sock", "--listen", "127.0.0.1:0",
                "--data-address", "127.0.0.1:0", "--metrics-address", "",
                "--dram-size", dram, "--ssd-size", "0"],
                work / f"{name}.log")
            procs.append(nodes[name])
        m = MasterAdminClient(maddr, timeout_s=30)
        _wait(lambda: len([x for x in m.list_nodes()["nodes"]  # type: ignore[attr-defined]
                           if x["health"] == "healthy"]) == 3)
        keys = [os.urandom(16) for _ in range(n)]
        vals = [os.urandom(size) for _ in range(n)]
        with Client(f"unix:{work / 'a'}.sock") as c:
            assert all(r.stored for r in c.put(keys, vals))
        _wait(lambda: all(h == {"a"} for h in _originals(m, keys)))

        # reference: the data plane's own GB/s, same blocks, same source
        buf = bytearray(size * n)
        view = memoryview(buf)
        dp = DataPlaneClient(nodes["a"].tcp("data"))
        ref = []
        for _ in range(3):
            t0 = time.perf_counter()
            got = dp.get(keys, b"", lambda i, sz, meta: view[i * size:(i + 1) * size],
                         deadline=time.monotonic() + 60)
            ref.append(time.perf_counter() - t0)
            assert sum(1 for g in got if g is not None and g.found) == n
        dp.close()
        ref_gbps = size * n / min(ref) / 1e9

        t0 = time.monotonic()
        m.set_replication(b"", keys, 2)
        _wait(lambda: all(len(h) == 2 for h in _originals(m, keys)))
        repair_s = time.monotonic() - t0
        repair_gbps = size * n / repair_s / 1e9

        keys2 = [os.urandom(16) for _ in range(n)]
        with Client(f"unix:{work / 'b'}.sock") as c:
            assert all(r.replicas_written == 2 for r in c.put(keys2, vals, replicas=2))
        _wait(lambda: all(len(h) == 2 for h in _originals(m, keys2)))
        t0 = time.monotonic()
        nodes["b"].kill()
        _wait(lambda: all(len(h) == 2 and "b" not in h for h in _originals(m, keys2)))
        kill_s = time.monotonic() - t0
        m.close()
        return {"num_blocks": n, "block_bytes": size, "total_bytes": size * n,
                "dataplane_gbps": ref_gbps, "repair_s": repair_s, "repair_gbps": repair_gbps,
                "ratio": repair_gbps / ref_gbps, "kill_to_repaired_s": kill_s,
                "node_lease_s": args.node_lease_s}
    finally:
        for p in reversed(procs):
            p.kill()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--block-mib", type=int, default=2,
                    help="block size (at most the nodes' max_block_bytes, 2 MiB by default)")
    ap.add_argument("--node-lease-s", type=float, default=3.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    res = run_repair(args)
    print(f"repair: {res['num_blocks']} x {args.block_mib} MiB re-replicated in "
          f"{res['repair_s']:.2f} s = {res['repair_gbps']:.3f} GB/s; data plane "
          f"{res['dataplane_gbps']:.3f} GB/s; ratio {res['ratio']:.3f}")
    print(f"kill: a holder SIGKILLed -> every block at 2 originals again in "
          f"{res['kill_to_repaired_s']:.2f} s (node lease {args.node_lease_s} s)")
    write_json({"repair": res}, args.out)


if __name__ == "__main__":
    main()
