"""RDMA READ between two real processes, over the fake verbs layer (no device here).

The node is a child process: it maps the arena FILE (blocks + kvstored/tiers/slots.py
headers), registers it as one MR with :class:`RdmaServer`, publishes two blocks and answers
the QP handshake on a pipe (JSON adverts, as :func:`connect` exchanges them). This process
maps the same file and reads with :func:`read_slots_checked`: the fake "NIC" copies through
its own mapping of the file, so every byte read was written by the other process. A hook on
b's payload READ asks the node process to rewrite b's slot (odd, other bytes, even) and
waits for its ack: the read must drop b, never serve the other bytes.
"""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvstored.node.rdma_slots import read_slots_checked
from kvstored.tiers.slots import Layout
from kvstored.transport.base import RemoteRegion
from kvstored.transport.rdma import RdmaAdvert, RdmaEndpoint, connect
from tests.fake_verbs import E, Fabric

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 4096
ARENA = 16 * BLOCK
NS = b"ns"

NODE = r"""
import json, mmap, sys
from tests.fake_verbs import Fabric
from kvstored.tiers.slots import Layout, SlotTable
from kvstored.transport.rdma import RdmaEndpoint, RdmaServer
path, arena = sys.argv[1], int(sys.argv[2])
lay = Layout(arena)
f = open(path, "r+b")
buf = mmap.mmap(f.fileno(), lay.total_bytes)
table = SlotTable(buf, lay)
for n, key in enumerate((b"a", b"b")):
    buf[n * 4096:(n + 1) * 4096] = bytes([1 + n]) * 4096
    table.publish(n * 4096, 4096, b"ns", key, 10 + n, b"")
ep = RdmaEndpoint(Fabric().verbs(), "fake0", buf, remote_access=True)
server = RdmaServer(ep)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "accept":
        print(server.accept_json(1, cmd["advert"].encode()).decode(), flush=True)
    elif cmd["op"] == "rewrite_b":
        table.unpublish(4096)
        buf[4096:8192] = b"\xee" * 4096
        table.publish(4096, 4096, b"ns", b"c", 12, b"")
        print("ok", flush=True)
    elif cmd["op"] == "close":
        print(json.dumps({"regions": len(server.close()), "mr": ep.num_registered_regions}), flush=True)
        ep.close()
        print(json.dumps({"mr": ep.num_registered_regions}), flush=True)
        break
"""


def test_read_across_processes_drops_a_block_the_node_rewrote(tmp_path: Path) -> None:
    lay = Layout(ARENA)
    path = tmp_path / "arena"
    path.write_bytes(b"\0" * lay.total_bytes)
    node = subprocess.Popen([sys.executable, "-c", NODE, str(path), str(ARENA)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert node.stdin is not None and node.stdout is not None
    stdin, stdout = node.stdin, node.stdout

    def ask(cmd: dict[str, Any]) -> str:
        stdin.write(json.dumps(cmd) + "\n")
        stdin.flush()
        return stdout.readline().strip()

    try:
        with open(path, "r+b") as f:
            view = mmap.mmap(f.fileno(), lay.total_bytes)
        fab = Fabric()
        reader = RdmaEndpoint(fab.verbs(), "fake0", bytearray(4 * BLOCK), remote_access=False)
        peer: list[RdmaAdvert] = []

        def exchange(local: bytes) -> bytes:
            answer = ask({"op": "accept", "advert": local.decode()}).encode()
            peer.append(RdmaAdvert.from_json(answer))
            p = peer[0]  # the fake's wire to the node: its QP and MR, through our mapping
            fab.import_peer(p.qpn, p.rkey, p.addr, p.length_bytes, view)
            return answer

        rdma = connect(reader, exchange)
        regions = [RemoteRegion(0, BLOCK, 10), RemoteRegion(BLOCK, BLOCK, 11)]
        out: dict[int, bytearray] = {}

        def keep(i: int, size: int, meta: bytes) -> memoryview:
            out[i] = bytearray(size)
            return memoryview(out[i])

        assert read_slots_checked(rdma, lay, [b"a", b"b"], NS, regions, keep,
                                  deadline=time.monotonic() + 10) == [True, True]
        assert out[0] == b"\x01" * BLOCK and out[1] == b"\x02" * BLOCK

        def before(qp: Any, wr: Any) -> None:  # held at b's payload READ until the node rewrote b
            if wr.opcode == E.IBV_WR_RDMA_READ and wr.wr_id == 1 and wr.sg[0].length == BLOCK:
                assert ask({"op": "rewrite_b"}) == "ok"
                fab.before_wr = None
        fab.before_wr = before
        out.clear()
        assert read_slots_checked(rdma, lay, [b"a", b"b"], NS, regions, keep,
                                  deadline=time.monotonic() + 10) == [True, False]
        assert list(out) == [0] and out[0] == b"\x01" * BLOCK
        rdma.close()
        reader.close()
        assert json.loads(ask({"op": "close"})) == {"regions": 0, "mr": 1}
        assert json.loads(stdout.readline()) == {"mr": 0}
        assert fab.num_open == {"ctx": 0, "pd": 0, "cq": 0, "mr": 0, "qp": 0}
        view.close()
    finally:
        stdin.close()
        assert node.wait(20) == 0
