"""Remote get node to node over TCP: GB/s for 1, 4 and 16 MiB blocks, next to plain sockets.

Source: a real ``kvstored serve`` process (its data plane) holding the blocks. Reader: this
process, a :class:`~kvstored.node.core.NodeCore` over its own DRAM arena with
:class:`~kvstored.node.remote.RemoteReads`: the whole remote-read path of a node (the
lookup, here answered by an in-process dict instead of the master's gRPC, naming each
replica under the generation the source stamped; the data-plane GET received straight into
local reservations; the verification by the generation sent, or a second lookup from a
source that sends none; the commit). Each
round fetches ``--batch`` blocks, then removes the copies so the next round fetches again.

Reference, same run, same machine: a plain Python socket sender process (``sendall`` of a
preallocated buffer, one 8-byte length header per block) and a receiver here doing
``recv_into`` a preallocated bytearray, on loopback, same sizes, same number of bytes.
Ratio = kvstored GB/s / plain GB/s (target >= 0.7 at 4 MiB, issue 7).

``--via-cluster`` also measures what an engine sees: a real master and two real nodes,
``Client(node B).get_into`` of blocks put through node A (B's gRPC PinBlocks, its master
lookups over gRPC, the copy, the verification, the commit, and the copy out of B's shared
memory into the caller's buffer), ratio against the same plain-socket reference.

``--mooncake`` (with ``--via-cluster``) also measures Mooncake Store's TCP get of the same
4 MiB workload (``--total-mib`` per run, batches of ``--batch``, a client without a segment
reading from a separate store process over Mooncake's TCP transfer engine; best of 2 reps),
the way ``bench/bench_mooncake.py`` runs it: its own venv (``python bench/bench_mooncake.py
--install``), a private network namespace with only ``lo`` (Mooncake binds 0.0.0.0), and a
check that ``ss -ltnp`` shows its listeners on loopback only. Ratio = kvstored through a
node / Mooncake TCP get (target >= 2x, issue 7). Without the venv the row says why.

Usage:  python bench/bench_remote_get.py [--sizes-mib 1,4,16] [--total-mib 512] [--batch 8]
        [--via-cluster [--mooncake]] [--repeat 3] [--out bench/results/bench_remote_get.json]

``--repeat N`` measures each size N times, interleaved (plain socket, node to node, through
a node); the table shows medians, and each ratio is the median of the per-repeat ratios
(each against the plain socket measured just before it), which keeps the ratios usable on
a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kvstored import Client  # noqa: E402
from kvstored.client.master import ClusterReplica  # noqa: E402
from kvstored.config import NodeConfig  # noqa: E402
from kvstored.node.core import NodeCore  # noqa: E402
from kvstored.node.remote import RemoteReads  # noqa: E402
from kvstored.tiers.tiered import TieredStore  # noqa: E402
from kvstored.transport.tcp import DataPlaneClient  # noqa: E402
from kvstored.types import Tier  # noqa: E402

MiB = 1 << 20

_SENDER = r"""
import socket, struct, sys
size, count = int(sys.argv[1]), int(sys.argv[2])
buf = bytearray(size)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
hdr = struct.pack("<Q", size)
mv = memoryview(buf)
for _ in range(count):
    c.sendall(hdr); c.sendall(mv)
c.close()
"""


def plain_socket_gbps(size: int, count: int) -> float:
    """GB/s of a plain Python sender process -> recv_into here, ``count`` blocks of ``size``."""
    proc = subprocess.Popen([sys.executable, "-c", _SENDER, str(size), str(count)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    dst = bytearray(size)
    view = memoryview(dst)
    hdr = bytearray(8)
    t0 = time.perf_counter()
    for _ in range(count):
        _recv_exact(sock, memoryview(hdr))
        _recv_exact(sock, view)
    elapsed = time.perf_counter() - t0
    sock.close()
    proc.wait(30)
    return size * count / elapsed / 1e9


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("sender closed early")
        got += n


def _start_source(workdir: Path, dram_bytes: int, max_block: int) -> tuple[subprocess.Popen[str], str, str]:
    sock = workdir / "src.sock"
    env = {**os.environ, "KVSTORED_NODE__MAX_BLOCK_BYTES": str(max_block)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstored.cli.main", "serve", "--listen", f"unix:{sock}",
         "--data-address", "127.0.0.1:0", "--metrics-address", "", "--dram-size",
         str(dram_bytes), "--ssd-size", "0", "--node-id", "bench-src"],
        stdout=subprocess.PIPE, stderr=open(workdir / "src.log", "w"), text=True, env=env,
        cwd=workdir)
    assert proc.stdout is not None
    data = ""
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if line.startswith("listening data "):
            data = line.split()[2]
        if line.strip() == "ready":
            break
        if time.monotonic() > deadline:
            break
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    if not data:
        proc.kill()
        raise SystemExit("source node did not start:\n" + (workdir / "src.log").read_text()[-2000:])
    return proc, f"unix:{sock}", data


def remote_get_gbps(size: int, count: int, batch: int, workdir: Path) -> float:
    """GB/s of RemoteReads.fill from a real source node, ``count`` blocks of ``size``."""
    dram = (batch + 2) * (size + MiB)
    proc, grpc_addr, data_addr = _start_source(workdir, dram, size)
    try:
        keys = [os.urandom(16) for _ in range(batch)]
        payload = os.urandom(size)
        with Client(grpc_addr) as c:
            for k in keys:
                r = c.put([k], [payload])[0]
                assert r.stored, r
        # name each replica as the master would from the source's events: under the
        # generation the source's store stamped (the one its data plane sends)
        probe = DataPlaneClient(data_addr, max_block_bytes=size)
        try:
            sent = probe.get(keys, b"", lambda i, n, meta: None,
                             deadline=time.monotonic() + 60)
        finally:
            probe.close()
        replicas = {k: ClusterReplica("bench-src", 1, Tier.DRAM, size, it.generation or 1,
                                      data_addr) for k, it in zip(keys, sent, strict=True)}

        def lookup(ns: bytes, ks: Sequence[bytes], local: str, timeout_s: float) -> list[ClusterReplica]:
            out = []
            for k in ks:
                if k not in replicas:
                    break
                out.append(replicas[k])
            return out

        cfg = NodeConfig(node_id="bench-dst", dram_size_bytes=dram, ssd_size_bytes=0,
                         max_block_bytes=size, max_batch_keys=max(64, batch))
        store = TieredStore(dram_size_bytes=dram, arena_dir=None, max_block_bytes=size)
        core = NodeCore(store, cfg, epoch=1)
        reads = RemoteReads(core, node_id="bench-dst", lookup=lookup, report=lambda *a: None,
                            fetch_timeout_s=120.0)
        try:
            rounds = max(1, count // batch)
            reads.fill(keys, b"")  # warm: connection, arena pages
            store.remove(keys)
            elapsed = 0.0
            for _ in range(rounds):
                t0 = time.perf_counter()
                got = reads.fill(keys, b"")
                elapsed += time.perf_counter() - t0
                assert got.num_fetched == batch, got
                store.remove(keys)
            return size * batch * rounds / elapsed / 1e9
        finally:
            reads.close()
            store.close()
    finally:
        proc.terminate()
        proc.wait(60)


def _start(workdir: Path, name: str, args: list[str], env: dict[str, str]
           ) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Start a kvstored subprocess; returns it and its ``listening KIND ADDR`` lines."""
    proc = subprocess.Popen([sys.executable, "-m", "kvstored.cli.main", *args],
                            stdout=subprocess.PIPE, stderr=open(workdir / f"{name}.log", "w"),
                            text=True, env={**os.environ, **env}, cwd=workdir)
    assert proc.stdout is not None
    seen: dict[str, str] = {}
    for line in proc.stdout:
        parts = line.split()
        if line.startswith("listening ") and len(parts) >= 3:
            seen.setdefault(parts[1], parts[2])
        if line.strip() == "ready":
            break
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    if proc.poll() is not None:
        raise SystemExit(f"{name} did not start:\n" + (workdir / f"{name}.log").read_text()[-2000:])
    return proc, seen


def via_cluster_gbps(size: int, count: int, batch: int, workdir: Path) -> float:
    """GB/s of ``Client(node B).get_into`` of blocks held by node A: a real master and two
    real nodes; per round fresh keys are put through A and indexed (untimed), then read
    through B (timed: B's master lookups, the copy A -> B, the verification, the commit,
    the pin and the copy out of B's shared memory into the caller's buffer)."""
    from kvstored.client.master import MasterClient

    env = {"KVSTORED_NODE__MAX_BLOCK_BYTES": str(size),
           "KVSTORED_CLUSTER__REMOTE_FETCH_TIMEOUT_S": "60"}
    dram = str(3 * batch * (size + MiB))
    procs: list[subprocess.Popen[str]] = []
    try:
        mproc, m = _start(workdir, "master", ["master", "--listen", "127.0.0.1:0", "--data-dir",
                                              str(workdir / f"master-{size}")], env)
        procs.append(mproc)
        socks = {}
        for name in ("a", "b"):
            sock = workdir / f"{name}.sock"
            socks[name] = f"unix:{sock}"
            p, _ = _start(workdir, name, [
                "node", "--master", m["grpc"], "--node-id", name, "--listen", f"unix:{sock}",
                "--listen", "127.0.0.1:0", "--data-address", "127.0.0.1:0",
                "--metrics-address", "", "--dram-size", dram, "--ssd-size", "0"], env)
            procs.append(p)
        payload = os.urandom(size)
        rounds = max(1, count // batch)
        bufs = [bytearray(size) for _ in range(batch)]
        elapsed = local_s = 0.0
        with Client(socks["a"]) as a, Client(socks["b"]) as b, MasterClient(m["grpc"]) as mc:
            for r in range(rounds + 1):  # round 0 warms connections and arena pages
                keys = [os.urandom(16) for _ in range(batch)]
                assert all(x.stored for x in a.put(keys, [payload] * batch))
                deadline = time.monotonic() + 60
                while len(mc.lookup_prefix(b"", keys)[0]) < batch:
                    if time.monotonic() > deadline:
                        raise SystemExit("blocks were not indexed within 60 s")
                    time.sleep(0.05)
                t0 = time.perf_counter()
                got = b.get_into(keys, bufs, timeout_s=60)
                if r:
                    elapsed += time.perf_counter() - t0
                assert got == [size] * batch, got
                t0 = time.perf_counter()
                assert b.get_into(keys, bufs, timeout_s=60) == [size] * batch  # local hits now
                if r:
                    local_s += time.perf_counter() - t0
        moved = size * batch * rounds
        print(f"    through node B: {moved / elapsed / 1e9:.2f} GB/s remote, "
              f"{moved / local_s / 1e9:.2f} GB/s when the same blocks are local hits of B "
              "(PinBlocks + copy out of shared memory)", flush=True)
        return moved / elapsed / 1e9
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(60)


def mooncake_tcp_get_gbps(size: int, total_mib: int, batch: int) -> tuple[float | None, str]:
    """Mooncake Store's TCP get GB/s of ``size`` blocks in batches of ``batch`` (best of 2
    reps, ``total_mib`` per rep), run as bench_mooncake.py runs it; ``(None, why)`` when it
    cannot run here."""
    import bench_mooncake as bm

    if batch not in bm.BATCHES:
        return None, f"Mooncake is measured in batches of {bm.BATCHES}, not {batch}"
    py, why = bm.mooncake_python(bm.VENV)
    if py is None:
        return None, why
    ns = argparse.Namespace(venv=str(bm.VENV), sizes=str(size), total=f"{total_mib}MiB",
                            reps=2, timeout=600.0, quick=False)
    with tempfile.TemporaryDirectory(prefix="kvbrg-mc-", dir="/tmp") as d:
        try:
            res = bm.run_mooncake_in_netns(ns, Path(d))
        except Exception as exc:  # say exactly why; the kvstored rows stand
            return None, f"{type(exc).__name__}: {exc}"
    key = f"{bm.format_size(size)}/b{batch}"
    return float(res["tcp"]["get"][key]), ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="1,4,16")
    ap.add_argument("--total-mib", type=int, default=512, help="bytes moved per size and side")
    ap.add_argument("--batch", type=int, default=8, help="blocks per remote read")
    ap.add_argument("--via-cluster", action="store_true",
                    help="also measure the engine-facing get through a node of a real cluster")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each size this many times, interleaved; medians are printed")
    ap.add_argument("--mooncake", action="store_true",
                    help="with --via-cluster: Mooncake Store's TCP get of the 4 MiB workload")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvbrg", dir="/tmp"))
    rows = []
    try:
        for mib in (int(x) for x in args.sizes_mib.split(",")):
            size = mib * MiB
            count = max(args.batch, args.total_mib // mib)
            plains, ours, fulls = [], [], []
            for _ in range(args.repeat):  # interleaved: each ratio against its own reference
                plains.append(plain_socket_gbps(size, count))
                ours.append(remote_get_gbps(size, count, args.batch, workdir))
                if args.via_cluster:
                    fulls.append(via_cluster_gbps(size, count, args.batch, workdir))
            plain, mine = median(plains), median(ours)
            ratio = median([o / p for o, p in zip(ours, plains, strict=True)])
            row = {"block_mib": mib, "blocks": count, "repeats": args.repeat,
                   "remote_get_gbps": round(mine, 3), "plain_socket_gbps": round(plain, 3),
                   "ratio": round(ratio, 3)}
            line = (f"{mib:>3} MiB  remote get {mine:6.2f} GB/s  plain socket {plain:6.2f} GB/s"
                    f"  ratio {ratio:.2f}")
            if args.via_cluster:
                full = median(fulls)
                full_ratio = median([f / p for f, p in zip(fulls, plains, strict=True)])
                row["via_cluster_gbps"] = round(full, 3)
                row["via_cluster_ratio"] = round(full_ratio, 3)
                line += f"  | through a node {full:6.2f} GB/s  ratio {full_ratio:.2f}"
                if args.mooncake and mib == 4:
                    mc, why = mooncake_tcp_get_gbps(size, args.total_mib, args.batch)
                    if mc is None:
                        line += f"  | Mooncake TCP get not measured: {why}"
                    else:
                        row["mooncake_tcp_get_gbps"] = round(mc, 3)
                        row["vs_mooncake_ratio"] = round(full / mc, 3)
                        line += f"  | Mooncake TCP get {mc:6.2f} GB/s  ratio {full / mc:.2f}"
            rows.append(row)
            print(line, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
