"""Master failover and (later) repair: one table per section, one JSON file.

Section "failover" (issue 17 section 1): a real etcd, two real ``kvstored master --etcd``
processes and N indexed blocks; the leader is SIGKILLed and the bench measures, from the kill:

- ``leader_s``: until the other master answers as leader (a higher term);
- ``complete_s``: until it answers a lookup of one block per node with ``complete=true``
  and every block found: the index rebuilt from the nodes' inventories.

The inventories come from a *synthetic inventory source*: ``--nodes`` real
:class:`~kvstored.node.cluster.MasterLink` objects in this process (the node's real link
code: register, chunked SyncInventory over gRPC, events, heartbeats, following NotLeader /
Unavailable through ``etcd://``) over stores that list N/nodes blocks of 4 KiB from memory
(no DRAM arena, no payloads; the master only ever sees metadata). So the figures are the
election, the masters' index rebuild and the links' resync, not a node daemon's listing.

Reference measured in the same run: ``cold_sync_s``, the time the same links took to
register and sync the same inventories into the first leader at start (the rebuild's work
without the failover). Printed: complete_s / (election lease + node lease), the floor the
design sets (a dead leader's etcd lease must lapse, then lookups say complete=false for one
node lease), and complete_s / cold_sync_s.

Section "repair" (issue 17 section 2): a real ``kvstored master`` and three real ``kvstored
node`` processes on loopback (no etcd). ``--total-mib`` of ``--block-mib`` blocks are put
through node a (one replica each). Then:

- reference, same run: ``DataPlaneClient.get`` of the same blocks from node a's data plane
  into preallocated memory (the TCP data plane's own GB/s, as bench/bench_remote_get.py
  measures it), best of 3;
- ``repair``: ``SetReplication(keys, 2)``: the master queues one COPY per block to b or c
  (``[master] repair_bytes_per_s`` set far above the data plane, so the figure is the
  machinery's own: the commands reach the targets through their WaitCommands long poll,
  the targets pull in parts, several in flight, over the peer data plane with
  ``GET_FLAG_PEER_EXPORT``, verify, commit, and report ADDED at once); timed from the call
  until the master indexes a second readable original of every block;
  GB/s = bytes re-replicated / that time, ratio = that / the reference;
- ``kill``: blocks put with ``replicas=2``, then a holder SIGKILLed; timed from the kill
  until every block has two originals again (node lease + repair);
- ``limited`` (a second cluster): the same ``repair`` with ``repair_bytes_per_s`` =
  ``--limited-mib-per-s``; its GB/s must stay at or below that rate (the rate limit holds
  however fast the nodes copy); printed as measured / limit.

Usage:  python bench/bench_failover.py [--sections failover,repair] [--sizes 10000,1000000]
        [--nodes 2] [--election-lease-s 3] [--node-lease-s 3] [--total-mib 256]
        [--block-mib 2] [--limited-mib-per-s 64] [--out bench/results/bench_failover.json]
The failover section needs /usr/bin/etcd (scripts/setup-system.sh); the repair section
does not (``--sections repair``; bench/bench_repair.py is that).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import signal
import socket
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
from kvstored import log as kvlog  # noqa: E402
from kvstored.client.master_admin import MasterAdminClient  # noqa: E402
from kvstored.config import ClusterConfig  # noqa: E402
from kvstored.node.cluster import MasterLink  # noqa: E402
from kvstored.transport.master_rpc import MasterClient  # noqa: E402
from kvstored.transport.tcp import DataPlaneClient  # noqa: E402
from kvstored.types import BlockInfo, StoreStats, Tier, TierStats  # noqa: E402

NS = b"\x42" * 16
BLOCK_BYTES = 4096
READY_S = 60.0
MiB = 1 << 20


class SyntheticStore:
    """An InventorySource of ``n`` DRAM blocks keyed like block hashes (16-byte digests of
    ``node:i``; the master's key table assumes digest keys), listed from memory."""

    def __init__(self, node: str, n: int) -> None:
        self.blocks = [BlockInfo(key=hashlib.blake2b(f"{node}:{i}".encode(), digest_size=16).digest(),
                                 size_bytes=BLOCK_BYTES, namespace_id=NS, tiers=(Tier.DRAM,),
                                 pinned=False, generations=(i + 1,)) for i in range(n)]

    def list_blocks(self, *, namespace_id: bytes = b"", limit: int = 10000
                    ) -> tuple[list[BlockInfo], bool]:
        return self.blocks[:limit], len(self.blocks) > limit

    def stats(self) -> StoreStats:
        n = len(self.blocks)
        cap = max(1, 2 * n * BLOCK_BYTES)
        return StoreStats(tiers=(TierStats(Tier.DRAM, cap, n * BLOCK_BYTES, n, 0, 0),),
                          gets=0, hits=0, misses=0, puts=0, put_failures=0,
                          checksum_failures=0, pinned_blocks=0)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_etcd(d: Path) -> tuple[subprocess.Popen[bytes], str]:
    client, peer = free_ports(2)
    url, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = subprocess.Popen(
        ["etcd", "--data-dir", str(d / "etcd"), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", purl,
         "--initial-advertise-peer-urls", purl, "--initial-cluster", f"default={purl}",
         "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + READY_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", client), timeout=0.5).close()
            return proc, f"127.0.0.1:{client}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("etcd did not start") from None
            time.sleep(0.05)


def start_master(d: Path, etcd: str, prefix: str, args: argparse.Namespace
                 ) -> tuple[subprocess.Popen[str], str]:
    d.mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstored.cli.main", "master", "--listen", "127.0.0.1:0",
         "--data-dir", str(d), "--node-lease-s", str(args.node_lease_s), "--etcd",
         f"http://{etcd}", "--election-prefix", prefix,
         "--election-lease-s", str(args.election_lease_s), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=open(d / "log", "w"), text=True)  # noqa: SIM115 (the process keeps it)
    address = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("listening grpc "):
            address = line.split()[2]
        if line.strip() == "ready":
            break
    threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
    if not address:
        raise RuntimeError(f"master did not start: {(d / 'log').read_text()[-2000:]}")
    return proc, address


def leader_of(addresses: str) -> tuple[str, int]:
    with MasterClient(addresses, timeout_s=2) as m:
        try:
            m.list_nodes()
        except Exception:  # noqa: BLE001 (no leader right now)
            return "", 0
        return m.address, m.fence.term


def probe_keys(stores: list[SyntheticStore]) -> list[bytes]:
    return [s.blocks[-1].key for s in stores]


def lookup_complete(addresses: str, keys: list[bytes]) -> tuple[bool, int]:
    """(complete and every key found, the answering term) of one lookup per key."""
    with MasterClient(addresses, timeout_s=5) as m:
        try:
            ok = True
            for k in keys:
                got, complete = m.lookup_prefix(NS, [k])
                ok = ok and complete and len(got) == 1
            return ok, m.fence.term
        except Exception:  # noqa: BLE001 (no leader right now)
            return False, 0


def run_failover(n_blocks: int, args: argparse.Namespace) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix="kvbfail", dir="/tmp"))
    procs: list[subprocess.Popen[Any]] = []
    try:
        etcd, endpoint = start_etcd(d)
        procs.append(etcd)
        prefix = f"/bench{os.getpid()}"
        a, addr_a = start_master(d / "ma", endpoint, prefix, args)
        procs.append(a)
        deadline = time.monotonic() + READY_S
        while leader_of(addr_a)[0] != addr_a:
            assert time.monotonic() < deadline, "the first master never led"
            time.sleep(0.05)
        b, addr_b = start_master(d / "mb", endpoint, prefix, args)
        procs.append(b)
        both = f"{addr_a},{addr_b}"
        per_node = n_blocks // args.nodes
        stores = [SyntheticStore(f"n{i}", per_node) for i in range(args.nodes)]
        keys = probe_keys(stores)
        out: dict[str, Any] = {"blocks": per_node * args.nodes, "nodes": args.nodes}
        ready = threading.Event()
        stop = threading.Event()
        box: dict[str, Any] = {}

        async def links() -> None:
            cfg = ClusterConfig(master_address=f"etcd://{endpoint}{prefix}",
                                heartbeat_interval_s=0.2, rpc_timeout_s=10,
                                inventory_chunk_blocks=4096)
            ls = [MasterLink(cfg, node_id=f"n{i}", epoch=1000 + i,
                             grpc_address=f"127.0.0.1:{9000 + i}",
                             data_address=f"127.0.0.1:{9500 + i}", store=s,
                             load=lambda: 0.0) for i, s in enumerate(stores)]
            t0 = time.monotonic()
            for link in ls:
                await link.start()
            while not all(link.synced for link in ls):
                await asyncio.sleep(0.01)
            box["cold_sync_s"] = time.monotonic() - t0
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            for link in ls:
                await link.stop(unregister=False)

        t = threading.Thread(target=lambda: asyncio.run(links()), daemon=True)
        t.start()
        if not ready.wait(600):
            raise RuntimeError("the links never synced")
        deadline = time.monotonic() + 120
        while not lookup_complete(addr_a, keys)[0]:
            assert time.monotonic() < deadline, "the first leader never answered complete"
            time.sleep(0.05)
        _, old_term = leader_of(addr_a)
        a.send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        a.wait()
        leader_s = complete_s = None
        deadline = t_kill + 600
        while complete_s is None:
            assert time.monotonic() < deadline, "no new leader answered complete=true"
            if leader_s is None:
                addr, term = leader_of(both)
                if addr == addr_b and term > old_term:
                    leader_s = time.monotonic() - t_kill
            if leader_s is not None:
                ok, term = lookup_complete(addr_b, keys)
                if ok and term > old_term:
                    complete_s = time.monotonic() - t_kill
            time.sleep(0.02)
        stop.set()
        t.join(60)
        floor = args.election_lease_s + args.node_lease_s
        out.update(cold_sync_s=box["cold_sync_s"], leader_s=leader_s, complete_s=complete_s,
                   floor_s=floor, complete_over_floor=complete_s / floor,
                   complete_over_cold_sync=complete_s / box["cold_sync_s"])
        return out
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
                p.wait(30)
        if args.keep:
            print(f"kept {d} (etcd data, master logs)")
        else:
            shutil.rmtree(d, ignore_errors=True)


class Proc:  # the repair section's daemons
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


def run_repair(args: argparse.Namespace, rate: str = "100GiB", *, kill: bool = True
               ) -> dict[str, Any]:
    """Run the repair section (see the module docstring) with ``repair_bytes_per_s`` =
    ``rate``; ``kill``: the SIGKILL case too. Returns its results."""
    work = Path(tempfile.mkdtemp(prefix="kvbrep", dir="/tmp"))
    py = [sys.executable, "-m", "kvstored.cli.main"]
    procs: list[Proc] = []
    n = max(1, args.total_mib // args.block_mib)
    size = args.block_mib * MiB
    dram = f"{max(64, 3 * args.total_mib)}MiB"
    try:
        master = Proc(py + ["master", "--listen", "127.0.0.1:0", "--data-dir", str(work / "m"),
                            "--node-lease-s", str(args.node_lease_s)], work / "master.log",
                      env={"KVSTORED_MASTER__REPAIR_BYTES_PER_S": rate})
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

        out = {"num_blocks": n, "block_bytes": size, "total_bytes": size * n,
               "repair_bytes_per_s": rate, "dataplane_gbps": ref_gbps, "repair_s": repair_s,
               "repair_gbps": repair_gbps, "ratio": repair_gbps / ref_gbps,
               "node_lease_s": args.node_lease_s}
        if not kill:
            m.close()
            return out
        keys2 = [os.urandom(16) for _ in range(n)]
        with Client(f"unix:{work / 'b'}.sock") as c:
            assert all(r.replicas_written == 2 for r in c.put(keys2, vals, replicas=2))
        _wait(lambda: all(len(h) == 2 for h in _originals(m, keys2)))
        t0 = time.monotonic()
        nodes["b"].kill()
        _wait(lambda: all(len(h) == 2 and "b" not in h for h in _originals(m, keys2)))
        kill_s = time.monotonic() - t0
        m.close()
        out["kill_to_repaired_s"] = kill_s
        return out
    finally:
        for p in reversed(procs):
            p.kill()
        shutil.rmtree(work, ignore_errors=True)


def run_sections(args: argparse.Namespace) -> dict[str, Any]:
    """The sections asked for (``args.sections``), each printed as it ends; returns the JSON."""
    sections = set(args.sections.split(","))
    if not sections <= {"failover", "repair"}:
        sys.exit(f"bench_failover: --sections takes failover and/or repair, got {args.sections!r}")
    out: dict[str, Any] = {"failover": None, "repair": None}
    if "failover" in sections:
        if shutil.which("etcd") is None:
            sys.exit("bench_failover: etcd is not installed (scripts/setup-system.sh); "
                     "--sections repair runs without it")
        out["failover"] = [run_failover(int(n), args) for n in args.sizes.split(",")]
    if "repair" in sections:
        full = run_repair(args)
        limit_mib = args.limited_mib_per_s
        limited = run_repair(argparse.Namespace(**{**vars(args), "total_mib": min(
            args.total_mib, 2 * limit_mib)}), f"{limit_mib}MiB", kill=False)
        limited["limit_gbps"] = limit_mib * MiB / 1e9
        # the bucket starts full (one second's worth), so T seconds may carry the rate x (T + 1)
        limited["over_limit"] = limited["total_bytes"] / (
            limit_mib * MiB * (limited["repair_s"] + 1.0))
        out["repair"] = {**full, "limited": limited}
    return out


def print_table(res: dict[str, Any], args: argparse.Namespace) -> None:
    """One table: failover rows (seconds from the kill) and repair rows (GB/s vs the TCP
    data plane measured in the same run)."""
    print(f"{'section':<9} {'case':<34} {'seconds':>8} {'GB/s':>7} {'ratio':>7}  ratio of")
    for r in res["failover"] or ():
        case = f"{r['blocks']} blocks, {r['nodes']} nodes"
        print(f"{'failover':<9} {case + ': leader':<34} {r['leader_s']:>8.2f} {'':>7} {'':>7}")
        print(f"{'failover':<9} {case + ': complete=true':<34} {r['complete_s']:>8.2f} "
              f"{'':>7} {r['complete_over_floor']:>7.2f}  election + node lease "
              f"({r['floor_s']:.0f} s)")
        print(f"{'':<9} {'':<34} {'':>8} {'':>7} {r['complete_over_cold_sync']:>7.2f}  "
              f"cold sync ({r['cold_sync_s']:.2f} s)")
    rep = res["repair"]
    if rep:
        mib = rep["block_bytes"] // MiB
        what = f"{rep['num_blocks']} x {mib} MiB"
        print(f"{'repair':<9} {'TCP data plane get, ' + what:<34} "
              f"{rep['total_bytes'] / rep['dataplane_gbps'] / 1e9:>8.2f} "
              f"{rep['dataplane_gbps']:>7.3f} {1.0:>7.2f}  itself")
        print(f"{'repair':<9} {'SetReplication 2, ' + what:<34} {rep['repair_s']:>8.2f} "
              f"{rep['repair_gbps']:>7.3f} {rep['ratio']:>7.2f}  TCP data plane")
        print(f"{'repair':<9} {'SIGKILL a holder -> 2 originals':<34} "
              f"{rep['kill_to_repaired_s']:>8.2f} {'':>7} "
              f"{rep['kill_to_repaired_s'] / rep['node_lease_s']:>7.2f}  node lease "
              f"({rep['node_lease_s']} s)")
        lim = rep["limited"]
        case = f"{args.limited_mib_per_s} MiB/s limit, {lim['num_blocks']} x {mib} MiB"
        print(f"{'repair':<9} {case:<34} {lim['repair_s']:>8.2f} {lim['repair_gbps']:>7.3f} "
              f"{lim['over_limit']:>7.2f}  limit x (seconds + 1 s burst), <= 1: held")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--sections", default="failover,repair")
    ap.add_argument("--sizes", default="10000,1000000")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--election-lease-s", type=int, default=3)
    ap.add_argument("--node-lease-s", type=float, default=3.0)
    ap.add_argument("--total-mib", type=int, default=256, help="repair: bytes put on node a")
    ap.add_argument("--block-mib", type=int, default=2,
                    help="repair: block size (at most the nodes' max_block_bytes, 2 MiB)")
    ap.add_argument("--limited-mib-per-s", type=int, default=64,
                    help="repair: repair_bytes_per_s of the rate-limited case")
    ap.add_argument("--out", type=Path, default=Path("bench/results/bench_failover.json"))
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (logs)")
    args = ap.parse_args()
    kvlog.configure(json=False, level="warning")
    res = run_sections(args)
    print_table(res, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(res, str(args.out))


if __name__ == "__main__":
    main()
