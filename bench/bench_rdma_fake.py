"""FAKE verbs, not a NIC: the RDMA read path's protocol overhead next to plain TCP.

What runs: kvstored/transport/rdma.py's versioned read (locate -> one signalled
IBV_WR_RDMA_READ per block into the reader's registered bounce buffer -> CQ poll -> copy
out -> check generations) over the fake verbs layer of tests/fake_verbs.py, whose "NIC" is
a ``ctypes.memmove`` between the two registered buffers in this process. So the number is
the Python cost of the protocol (work requests, completions, staging, the checks) plus
memcpy; it says nothing about a NIC's bandwidth or latency. The "slot-checked" column is
kvstored/node/rdma_slots.py's read_peer_blocks (index lookup by bucket READs, header READ,
block READ, header READ: no call to the node's CPU). No RDMA device exists here.

References, same run, same machine: numpy memcpy of the same bytes (the ceiling of any
fake-verbs path), and a plain Python socket sender process -> ``recv_into`` on loopback
(bench_remote_get.plain_socket_gbps; what the TCP fallback is bounded by).

Usage:  python bench/bench_rdma_fake.py [--sizes-kib 256,4096] [--total-mib 256] [--batch 16]
        [--out bench/results/bench_rdma_fake.json]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import numpy as np  # noqa: E402
from bench_common import write_json  # noqa: E402
from bench_remote_get import plain_socket_gbps  # noqa: E402

from kvstored.transport.base import RemoteRegion  # noqa: E402
from kvstored.transport.rdma import RdmaEndpoint, RdmaServer, connect, read_versioned  # noqa: E402
from tests.fake_verbs import Fabric  # noqa: E402


class _Index:
    def __init__(self, size: int, n: int) -> None:
        self.regions = {i.to_bytes(8, "little"): RemoteRegion(i * size, size, i + 1) for i in range(n)}

    def locate_blocks(self, keys, namespace_id):  # type: ignore[no-untyped-def]
        return [self.regions.get(k) for k in keys]

    def check_generations(self, keys, namespace_id, regions):  # type: ignore[no-untyped-def]
        return [self.regions.get(k) == r for k, r in zip(keys, regions, strict=True)]


def fake_rdma_gbps(size: int, total: int, batch: int) -> float:
    """GB/s of versioned reads of ``batch`` blocks of ``size`` over fake verbs."""
    fab = Fabric()
    verbs = fab.verbs()
    n = max(batch, 8)
    arena = bytearray(np.random.default_rng(1).integers(0, 255, n * size, dtype=np.uint8).tobytes())
    node = RdmaEndpoint(verbs, "fake0", arena, remote_access=True)
    server = RdmaServer(node)
    reader = RdmaEndpoint(verbs, "fake0", bytearray(batch * size), remote_access=False,
                          max_send_wr=batch)
    t = connect(reader, lambda b: server.accept_json(1, b))
    index = _Index(size, n)
    dst = [bytearray(size) for _ in range(batch)]
    keys = [i.to_bytes(8, "little") for i in range(batch)]
    rounds = max(1, total // (size * batch))
    t0 = time.perf_counter()
    for _ in range(rounds):
        found = read_versioned(index, t, keys, b"ns", lambda i, s, m: memoryview(dst[i]),
                               deadline=time.monotonic() + 30)
        assert all(found)
    elapsed = time.perf_counter() - t0
    assert dst[1] == arena[size:2 * size]
    t.close()
    server.close()
    reader.close()
    node.close()
    return rounds * batch * size / elapsed / 1e9


def fake_slots_gbps(size: int, total: int, batch: int) -> float:
    """GB/s of :func:`read_peer_blocks` (index lookup by bucket READs, then header READ,
    block READ, header READ) of ``batch`` blocks of ``size`` over fake verbs."""
    from kvstored.node.rdma_slots import read_peer_blocks
    from kvstored.tiers.slots import Layout, SlotTable
    n = max(batch, 8)
    lay = Layout(n * size)
    buf = bytearray(lay.total_bytes)
    table = SlotTable(buf, lay)
    keys = [i.to_bytes(8, "little") for i in range(batch)]
    for i, k in enumerate(keys):
        buf[i * size:(i + 1) * size] = bytes([i % 251]) * size
        table.publish(i * size, size, b"ns", k, i + 1, b"")
    fab = Fabric()
    verbs = fab.verbs()
    node = RdmaEndpoint(verbs, "fake0", buf, remote_access=True)
    server = RdmaServer(node)
    reader = RdmaEndpoint(verbs, "fake0", bytearray(batch * size), remote_access=False,
                          max_send_wr=batch)
    t = connect(reader, lambda b: server.accept_json(1, b))
    dst = [bytearray(size) for _ in range(batch)]
    rounds = max(1, total // (size * batch))
    t0 = time.perf_counter()
    for _ in range(rounds):
        assert all(read_peer_blocks(t, lay, keys, b"ns", lambda i, s, m: memoryview(dst[i]),
                                    deadline=time.monotonic() + 30))
    elapsed = time.perf_counter() - t0
    assert dst[1] == buf[size:2 * size]
    t.close()
    server.close()
    reader.close()
    node.close()
    return rounds * batch * size / elapsed / 1e9


def memcpy_gbps(size: int, total: int) -> float:
    """GB/s of numpy copies of ``size``-byte blocks (``total`` bytes)."""
    src = np.ones(size, np.uint8)
    dst = np.empty(size, np.uint8)
    n = max(1, total // size)
    t0 = time.perf_counter()
    for _ in range(n):
        np.copyto(dst, src)
    return n * size / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-kib", default="256,4096")
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    total = a.total_mib << 20
    rows = []
    print("FAKE verbs (memmove in one process; protocol overhead, not a NIC) vs references")
    for kib in (int(x) for x in a.sizes_kib.split(",")):
        size = kib << 10
        fake = fake_rdma_gbps(size, total, a.batch)
        slots = fake_slots_gbps(size, total, a.batch)
        mem = memcpy_gbps(size, total)
        tcp = plain_socket_gbps(size, max(1, total // size))
        rows.append({"size_kib": kib, "batch": a.batch, "fake_verbs_gbps": round(fake, 3),
                     "fake_verbs_slots_gbps": round(slots, 3),
                     "memcpy_gbps": round(mem, 3), "plain_tcp_gbps": round(tcp, 3),
                     "fake_over_memcpy_ratio": round(fake / mem, 3),
                     "fake_over_tcp_ratio": round(fake / tcp, 3)})
        print(f"{kib:>5} KiB x{a.batch}  fake-verbs {fake:6.2f} GB/s  (slot-checked {slots:6.2f})  "
              f"memcpy {mem:6.2f} GB/s  plain TCP {tcp:6.2f} GB/s  "
              f"fake/memcpy {fake / mem:.2f}  fake/TCP {fake / tcp:.2f}")
    write_json({"label": "FAKE verbs: protocol overhead, not a NIC", "rows": rows}, a.out)


if __name__ == "__main__":
    main()
