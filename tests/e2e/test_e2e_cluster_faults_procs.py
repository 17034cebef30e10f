"""Process faults in a real cluster (issue 7 §5): the master SIGKILLed during a put storm,
a node with an SSD tier restarted after its lease, eight nodes started at once on a loaded
machine, and a copy whose source is asked to evict the block while the copy is mid-send.

- Master SIGKILL: three writer processes put through three nodes; the master is killed and
  restarted on the same port; its index is rebuilt from the nodes (polled, bounded), lookups
  meanwhile say ``complete=false`` and name only the node that really holds a key; writers
  never stop; afterwards every committed block reads back with its bytes through another node.
- Restart after the lease: the master dropped the node; the restarted daemon's SSD blocks
  hit again through another node (right bytes), its DRAM-only blocks are gone from the index
  and miss. (The restart *within* the lease is tests/e2e/test_e2e_cluster.py.)
- Eight nodes at once, one CPU burner per core: each node registers once, one epoch, no
  lapsed lease, with the default lease (10 s) and heartbeat (1 s).
- Mid-send eviction: the source's data plane is held (``KVSTORED_TEST_HOOKS``, see
  kvstored/node/fault_hooks.py) after it pinned the block and before it sent it; meanwhile
  the source is asked to remove the block, fills its DRAM and re-puts the key with other
  bytes. The pin wins: the block is not removed nor its space reused, and the copy, released,
  carries the right bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cluster_helpers import (
    WAIT_S,
    MasterProcess,
    NodeProcess,
    _indexed,
    _nodes,
    _wait,
    start_master,
    start_nodes,
    wait_healthy,
)
from e2e_helpers import small_value_for, value_for

from kvstored import Client
from kvstored.client.master import MasterClient
from kvstored.types import Tier

HERE = Path(__file__).parent


def _committed(path: Path) -> list[bytes]:
    if not path.exists():
        return []
    return [bytes.fromhex(line) for line in path.read_text().split("\n") if len(line) == 32]


def test_master_sigkilled_during_a_put_storm_rebuilds_its_index_from_the_nodes(
    workdir: Path, procs: list[Any]
) -> None:
    lease_s = 3.0
    master = start_master(workdir, procs, lease_s=lease_s)
    address = master.address
    nodes = [NodeProcess(workdir / f"n{i}", address, f"n{i}") for i in range(3)]
    start_nodes(nodes, procs, {})
    wait_healthy(address, {"n0", "n1", "n2"})
    stop = workdir / "stop"
    outs = [workdir / f"w{i}.keys" for i in range(3)]
    writers = [subprocess.Popen(
        [sys.executable, str(HERE / "e2e_cluster_writer.py"), nodes[i].unix_address, str(i),
         "3000", str(outs[i]), str(stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=nodes[i].env)
        for i in range(3)]
    try:
        def each_at_least(n: int) -> bool:
            return all(len(_committed(o)) >= n for o in outs)

        _wait("every writer committed 20 keys", lambda: each_at_least(20))
        master.kill()  # SIGKILL mid-storm
        before_restart = [len(_committed(o)) for o in outs]
        _wait("writers go on without the master",
              lambda: all(len(_committed(o)) >= b + 20 for o, b in zip(outs, before_restart,
                                                                        strict=True)))
        restarted = MasterProcess(workdir)
        restarted.args[restarted.args.index("--node-lease-s") + 1] = str(lease_s)
        restarted.args[restarted.args.index("--listen") + 1] = address  # the same port
        procs.append(restarted)
        restarted.start()
        t_ready = time.monotonic()
        assert restarted.epoch > master.epoch
        samples = [_committed(o)[:20] for o in outs]
        owners = {k: f"n{i}" for i, ks in enumerate(samples) for k in ks}
        saw_incomplete = False
        with MasterClient(address) as m:
            while True:  # the rebuild, polled: partial answers meanwhile, never a wrong holder
                named = {}
                complete = True
                for ks in samples:
                    got, c = m.lookup_prefix(b"", ks)
                    complete = complete and c
                    named.update({k: r.node_id for k, r in zip(ks, got, strict=False)})
                assert all(owners[k] == node for k, node in named.items()), named
                saw_incomplete = saw_incomplete or not complete
                if complete and len(named) == len(owners):
                    break
                assert time.monotonic() - t_ready < WAIT_S, "index not rebuilt in time"
                time.sleep(0.1)
            rebuild_s = time.monotonic() - t_ready
            assert saw_incomplete, "lookups right after the restart claimed a complete answer"
            print(f"index rebuilt {rebuild_s:.2f} s after the restarted master was ready")
            # the storm goes on against the new master, then stops
            during = [len(_committed(o)) for o in outs]
            _wait("writers go on after the restart",
                  lambda: all(len(_committed(o)) >= d + 20 for o, d in zip(outs, during,
                                                                            strict=True)))
            stop.touch()
            for w in writers:
                out, err = w.communicate(timeout=60)
                assert w.returncode == 0, err
                assert out.startswith("done "), out
            committed = [_committed(o) for o in outs]
            for i, ks in enumerate(committed):
                _wait(f"writer {i}'s blocks indexed on n{i}",
                      lambda i=i, ks=ks: all(_indexed(m, ks[j:j + 512], f"n{i}")
                                            for j in range(0, len(ks), 512)))
        for i, ks in enumerate(committed):  # every committed block, through another node
            with Client(nodes[(i + 1) % 3].unix_address) as c:
                for j in range(0, len(ks), 64):
                    batch = ks[j:j + 64]
                    assert c.get(batch, timeout_s=30) == [small_value_for(k) for k in batch]
        assert all(len(ks) >= 60 for ks in committed)
    finally:
        stop.touch()
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait(timeout=30)


def test_a_node_restarted_after_its_lease_brings_back_its_ssd_blocks_only(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs, lease_s=2.0)
    address = master.address
    n1 = NodeProcess(workdir / "n1", address, "n1")
    n2 = NodeProcess(workdir / "n2", address, "n2")
    start_nodes([n1, n2], procs, {})
    wait_healthy(address, {"n1", "n2"})
    keys = [os.urandom(16) for _ in range(60)]  # ~8.6 MiB: more than n2's 4 MiB of DRAM
    with Client(n2.unix_address) as c:
        for i in range(0, len(keys), 6):
            batch = keys[i:i + 6]
            assert all(r.stored for r in c.put(batch, [value_for(k) for k in batch]))
        blocks, _ = c.list_blocks()
    ssd = {b.key for b in blocks if Tier.SSD in b.tiers}
    dram_only = [k for k in keys if k not in ssd]
    assert ssd and dram_only, "the test needs blocks on n2's SSD and blocks in its DRAM only"
    with MasterClient(address) as m:
        _wait("n2's blocks indexed", lambda: all(_indexed(m, [k], "n2") for k in keys))
    old_epoch = _nodes(address)["n2"]["epoch"]
    n2.kill()
    _wait("n2 dropped after its lease", lambda: "n2" not in _nodes(address))
    n2b = NodeProcess(workdir / "n2", address, "n2")
    procs.append(n2b)
    n2b.start()
    nodes = wait_healthy(address, {"n1", "n2"})
    assert nodes["n2"]["epoch"] > old_epoch
    with Client(n2b.unix_address) as c:
        truth = {b.key for b in c.list_blocks()[0]}
    assert truth and truth <= ssd  # the restarted daemon found its SSD blocks only
    with MasterClient(address) as m:
        _wait("n2's SSD blocks indexed again", lambda: all(_indexed(m, [k], "n2") for k in truth))
        for k in dram_only:  # gone from the index, not guessed from the old epoch
            assert m.lookup_prefix(b"", [k], local_node_id="n1")[0] == []
    back = [k for k in keys if k in truth]
    with Client(n1.unix_address) as c:
        for i in range(0, len(back), 4):  # SSD blocks hit again through another node
            batch = back[i:i + 4]
            assert c.get(batch, timeout_s=30) == [value_for(k) for k in batch]
        for k in dram_only:
            assert c.get([k], timeout_s=30) == [None]


def test_eight_nodes_started_at_once_on_a_loaded_machine_keep_one_epoch_each(
    workdir: Path, procs: list[Any]
) -> None:
    lease_s = 10.0  # the defaults: node lease 10 s, heartbeat 1 s
    master = start_master(workdir, procs, lease_s=lease_s)
    address = master.address
    nodes = [NodeProcess(workdir / f"n{i}", address, f"n{i}") for i in range(8)]
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(os.cpu_count() or 1)]
    try:
        start_nodes(nodes, procs, {})  # all at once
        names = {f"n{i}" for i in range(8)}
        epochs = {k: v["epoch"] for k, v in wait_healthy(address, names).items()}
        # one lease more under load: a heartbeat stalled by the start would lapse in it
        min_left = {n: lease_s for n in names}
        with MasterClient(address) as m:
            t_end = time.monotonic() + lease_s
            while time.monotonic() < t_end:
                listed: Any = m.list_nodes()["nodes"]
                view = {n["node_id"]: n for n in listed}
                assert set(view) == names
                assert {k: v["epoch"] for k, v in view.items()} == epochs
                for k, v in view.items():
                    min_left[k] = min(min_left[k], v["lease_left_s"])
                time.sleep(0.25)
    finally:
        for b in burners:
            b.kill()
            b.wait(timeout=30)
    print(f"least lease left seen per node under load: {min_left}")
    log = master.log_path.read_text()
    assert "node_lease_expired" not in log and "node_epoch_superseded" not in log
    assert all(log.count(f"node_id={n}") >= 1 for n in names)
    for n in nodes:
        nlog = n.log()
        assert nlog.count("master_registered") == 1, nlog[-2000:]
        assert "master_asks_reregister" not in nlog


def test_a_copy_held_mid_send_pins_its_source_so_eviction_and_reuse_cannot_touch_it(
    workdir: Path, procs: list[Any]
) -> None:
    master = start_master(workdir, procs, lease_s=3.0)
    address = master.address
    fifo = workdir / "hold.fifo"
    os.mkfifo(fifo)
    src = NodeProcess(workdir / "src", address, "src")
    src.env["KVSTORED_TEST_HOOKS"] = f"dataplane_get_before_send:{fifo}"
    dst = NodeProcess(workdir / "dst", address, "dst")
    start_nodes([src, dst], procs, {"KVSTORED_CLUSTER__REMOTE_FETCH_TIMEOUT_S": "30"})
    wait_healthy(address, {"src", "dst"})
    k = os.urandom(16)
    with Client(src.unix_address) as c:
        assert c.put([k], [value_for(k)])[0].stored
    with MasterClient(address) as m:
        _wait("k indexed on src", lambda: _indexed(m, [k], "src"))
    got: list[object] = []

    def read() -> None:
        with Client(dst.unix_address) as c:
            got.append(c.get([k], timeout_s=60))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        _wait("src's data plane holds the GET (k pinned, nothing sent)",
              lambda: Path(str(fifo) + ".held").exists())
        fillers = [os.urandom(16) for _ in range(40)]  # ~5.6 MiB: more than src's 4 MiB DRAM
        with Client(src.unix_address) as c:
            assert c.remove([k]) == [False]  # pinned: kept, not removed
            for i in range(0, len(fillers), 4):
                batch = fillers[i:i + 4]
                assert all(r.stored for r in c.put(batch, [value_for(f) for f in batch]))
            wrong = bytes(len(value_for(k)))  # the same key with other bytes
            assert not c.put([k], [wrong])[0].stored  # still there: the put is a no-op
            held = {b.key: b.tiers for b in c.list_blocks()[0]}
            assert Tier.DRAM in held[k]  # eviction went past the pinned block
        with MasterClient(address) as m:  # the master has heard of all of it
            _wait("fillers indexed on src", lambda: all(_indexed(m, [f], "src") for f in fillers))
    finally:
        open(fifo, "wb").close()  # release the held send
        reader.join(60)
    assert got == [[value_for(k)]]
    with Client(dst.unix_address) as c:
        assert c.get([k]) == [value_for(k)]  # the verified copy, now local on dst
    assert "test_hook_released" in src.log()
