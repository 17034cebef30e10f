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

Section "repair" is repair17's (replicas re-created after a node dies); not in this file yet.

Usage:  python bench/bench_failover.py [--sizes 10000,1000000] [--nodes 2]
        [--election-lease-s 3] [--node-lease-s 3] [--out bench/results/bench_failover.json]
Needs /usr/bin/etcd (scripts/setup-system.sh).
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

from bench_common import write_json

from kvstored import log as kvlog
from kvstored.config import ClusterConfig
from kvstored.node.cluster import MasterLink
from kvstored.transport.master_rpc import MasterClient
from kvstored.types import BlockInfo, StoreStats, Tier, TierStats

NS = b"\x42" * 16
BLOCK_BYTES = 4096
READY_S = 60.0


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


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--sizes", default="10000,1000000")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--election-lease-s", type=int, default=3)
    ap.add_argument("--node-lease-s", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/bench_failover.json"))
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (logs)")
    args = ap.parse_args()
    if shutil.which("etcd") is None:
        sys.exit("bench_failover: etcd is not installed (scripts/setup-system.sh)")
    kvlog.configure(json=False, level="warning")
    rows = [run_failover(int(n), args) for n in args.sizes.split(",")]
    print("failover: SIGKILL of the leading master -> the other answers complete=true "
          f"(election lease {args.election_lease_s} s, node lease {args.node_lease_s} s, "
          f"{args.nodes} synthetic-inventory nodes)")
    print(f"{'blocks':>9} {'cold sync s':>12} {'leader s':>9} {'complete s':>11} "
          f"{'/ floor':>8} {'/ cold sync':>12}")
    for r in rows:
        print(f"{r['blocks']:>9} {r['cold_sync_s']:>12.2f} {r['leader_s']:>9.2f} "
              f"{r['complete_s']:>11.2f} {r['complete_over_floor']:>8.2f} "
              f"{r['complete_over_cold_sync']:>12.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json({"failover": rows, "repair": None}, str(args.out))


if __name__ == "__main__":
    main()
