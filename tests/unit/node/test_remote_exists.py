"""RemoteReads.exists: one per-key master lookup, however many misses lie between the keys;
an older master (no per-key answer) falls back to looking up runs past the misses."""

from __future__ import annotations

from helpers import key
from remote_helpers import PerKeyMaster, make_core, make_reads

from kvstored.transport.master_rpc import ClusterReplica
from kvstored.types import Tier


def _probe(master: PerKeyMaster) -> list[bool]:
    core = make_core("dst", block_bytes=4096)
    reads = make_reads(core, master, lookup_each=master.lookup_each)
    try:
        for i in range(0, 40, 2):  # 20 present blocks, each after a cluster-wide miss
            master.replicas[key(i)] = ClusterReplica("src", 7, Tier.DRAM, 100, 1, "127.0.0.1:1")
        keys = [key(i) for i in range(1, 41)]
        present, _ = reads.exists(b"", keys, [False] * len(keys), [])
        return present
    finally:
        reads.close()
        core.store.close()


def test_exists_asks_the_master_once_per_probe_and_sees_every_key() -> None:
    master = PerKeyMaster()
    assert _probe(master) == [False, True] * 19 + [False, False]
    assert (master.each_lookups, master.lookups) == (1, 0)


def test_an_older_master_is_asked_in_runs_up_to_the_limit() -> None:
    master = PerKeyMaster(old=True)
    got = _probe(master)
    assert (master.each_lookups, master.lookups) == (1, 8)  # exists_max_runs
    assert got[:14] == [False, True] * 7 and not any(got[14:])  # the first run finds none
