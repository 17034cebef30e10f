"""One-sided shared-memory reads against a real node: DRAM hits take no round trip.

The client reads a DRAM block through the shared index and its version-stamped slot
(kvstored/tiers/slots.py) and asks the node only for what it could not prove stable. Checked
here: the node's request counters show no PinBlocks for DRAM hits; a reader SIGKILLed in the
middle of a copy leaves nothing to clean up; a randomized stress (several readers, an eviction
storm, removes and re-puts of the same keys with other bytes) finds 0 wrong bytes over at
least 1 GiB read.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

import numpy as np
from it_helpers import DaemonThread, random_keys, value_for
from prometheus_client.parser import text_string_to_metric_families

from kvstored import AsyncClient, Client, Tier
from kvstored.client import _shm

MIB = 1 << 20


def _calls(node: DaemonThread, method: str) -> float:
    """The node's count of ``method`` requests (gRPC and control channel), any result."""
    body = urllib.request.urlopen(f"http://{node.daemon.metrics_address}/metrics", timeout=10).read().decode()
    return sum(s.value for fam in text_string_to_metric_families(body) for s in fam.samples
               if s.name == "kvstored_rpc_requests_total" and s.labels.get("method") == method)


def _pin_calls(node: DaemonThread) -> float:
    return _calls(node, "PinBlocks")


def test_dram_hits_take_no_pin_and_misses_still_go_to_the_node(start_node: Any) -> None:
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(6)
    values = [value_for(k, 100_000 + i) for i, k in enumerate(keys)]
    with Client(node.unix_address) as c:
        assert all(r.stored for r in c.put(keys[:5], values[:5], metas=[b"m%d" % i for i in range(5)]))
        before = _pin_calls(node)
        blocks = c.get_blocks(keys[:5])
        assert [(b.value, b.meta, b.tier) for b in blocks if b is not None] == [
            (v, b"m%d" % i, Tier.DRAM) for i, v in enumerate(values[:5])
        ]
        bufs = [bytearray(200_000) for _ in range(5)]
        assert c.get_into(keys[:5], bufs) == [len(v) for v in values[:5]]
        assert [bytes(b[: len(v)]) for b, v in zip(bufs, values, strict=False)] == values[:5]
        assert _pin_calls(node) == before  # DRAM hits: not one PinBlocks
        assert c.get([keys[5]]) == [None]  # a miss: asked the node
        assert _pin_calls(node) == before + 1


def test_exists_and_lookup_prefix_of_dram_blocks_take_no_round_trip(start_node: Any) -> None:
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(5)
    with Client(node.unix_address) as c:
        assert all(r.stored for r in c.put(keys[:4], [b"x" * 5000] * 4))
        asked = _calls(node, "Exists") + _calls(node, "LookupPrefix")
        assert c.exists(keys[:4]) == [True] * 4
        assert c.lookup_prefix(keys[:4]) == 4
        assert c.lookup_prefix_tiers(keys[:2]) == [Tier.DRAM] * 2
        assert _calls(node, "Exists") + _calls(node, "LookupPrefix") == asked
        assert c.exists(keys) == [True] * 4 + [False]  # the miss was asked
        assert c.lookup_prefix(keys[3:]) == 1
        assert _calls(node, "Exists") + _calls(node, "LookupPrefix") == asked + 2


def _metric(node: DaemonThread, name: str, **labels: str) -> float:
    body = urllib.request.urlopen(f"http://{node.daemon.metrics_address}/metrics", timeout=10).read().decode()
    return sum(s.value for fam in text_string_to_metric_families(body) for s in fam.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_one_sided_hits_reach_the_node_hit_metrics_with_no_pin(start_node: Any) -> None:
    """The client reports its one-sided reads on its next control request (or the idle
    flusher's, or the flush before a gRPC call): the node's hit counters (Stats, the store's
    and the DRAM tier's, kvstored_one_sided_blocks_total, the lookups) include them, and its
    PinBlocks counter stays 0 for them."""
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(6)
    values = [value_for(k, 10_000 + i) for i, k in enumerate(keys)]
    with Client(node.unix_address) as c:
        assert all(r.stored for r in c.put(keys[:5], values[:5]))
        before = c.stats()
        pins = _pin_calls(node)
        assert c.get(keys[:5]) == values[:5]  # 5 one-sided hits
        bufs = [bytearray(20_000) for _ in range(3)]
        assert c.get_into(keys[:3], bufs) == [len(v) for v in values[:3]]  # 3 more
        assert c.lookup_prefix(keys) == 5  # 5 leading keys answered here, the 6th by the node
        after = c.stats()  # a gRPC call: the pending report is flushed first
        assert _pin_calls(node) == pins  # not one PinBlocks for them
        assert (after["gets"] - before["gets"], after["hits"] - before["hits"]) == (8, 8)
        dram = [t for t in after["tiers"] if t["tier"] == "DRAM"][0]
        dram0 = [t for t in before["tiers"] if t["tier"] == "DRAM"][0]
        assert dram["hits"] - dram0["hits"] == 8
        assert _metric(node, "kvstored_one_sided_blocks_total", outcome="hit") == 8
        assert _metric(node, "kvstored_store_hits_total") == after["hits"]
        assert _metric(node, "kvstored_lookup_hit_blocks_total") == 5
        assert _metric(node, "kvstored_lookup_blocks_total") == 6
        assert c.get([keys[5]]) == [None]  # a miss: the node's path, reported as a miss too
        # keys[0] between two misses is pinned and read again with them: the node counts
        # that read, so the client does not report it (never counted twice)
        assert c.get([keys[5], keys[0], keys[5]]) == [None, values[0], None]
        mixed = c.stats()
        assert mixed["hits"] - after["hits"] == 1  # keys[0], through PinBlocks
        assert _metric(node, "kvstored_one_sided_blocks_total", outcome="hit") == 8
        assert _metric(node, "kvstored_one_sided_blocks_total", outcome="miss") == 3
        assert _pin_calls(node) == pins + 2  # the two reads with misses
        assert c.get(keys[:1]) == values[:1]  # the idle flusher reports this one on its own
        deadline = time.monotonic() + 30  # (REPORT_IDLE_S after it; waited for, not slept)
        while _metric(node, "kvstored_one_sided_blocks_total", outcome="hit") < 9:
            assert time.monotonic() < deadline, "the idle flusher sent no report"
            time.sleep(0.05)
        assert _pin_calls(node) == pins + 2


def test_an_async_clients_one_sided_hits_reach_the_node_too(start_node: Any) -> None:
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)
    keys = random_keys(4)
    values = [value_for(k, 5_000) for k in keys]

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with AsyncClient(node.unix_address) as c:
            assert all(r.stored for r in await c.put(keys, values))
            before = await c.stats()
            assert await c.get(keys) == values
            return before, await c.stats()

    pins = _pin_calls(node)
    before, after = asyncio.run(main())
    assert after["hits"] - before["hits"] == 4
    assert _pin_calls(node) == pins
    assert _metric(node, "kvstored_one_sided_blocks_total", outcome="hit") == 4


_CHILD = """
import os, signal, sys
from kvstored import AsyncClient, Client, Tier
from kvstored.client import _hooks
def hook(event, **fields):
    if event == "shm_one_sided_mid":
        print("mid", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
_hooks.install(hook)
with Client(sys.argv[1]) as c:
    c.get([bytes.fromhex(sys.argv[2])])
print("not killed", flush=True)
"""


def test_a_reader_sigkilled_mid_copy_leaves_nothing_to_clean_up(start_node: Any) -> None:
    node = start_node(dram_size_bytes=8 * MIB, ssd_size_bytes=0, ssd_dir=None)
    (k,) = random_keys(1)
    v = value_for(k, MIB)
    with Client(node.unix_address) as c:
        assert c.put([k], [v])[0].stored
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, node.unix_address, k.hex()],
            capture_output=True, text=True, timeout=60, env={**os.environ},
        )
        assert child.returncode == -signal.SIGKILL and child.stdout == "mid\n", child.stderr
        assert c.stats()["pinned_blocks"] == 0  # it held nothing: no pin, no lease to expire
        assert c.remove([k]) == [True]  # freed at once, nothing quarantined for it
        assert c.put([k], [v[::-1]])[0].stored
        assert c.get([k]) == [v[::-1]]


def test_stress_readers_eviction_storm_and_re_puts_read_no_wrong_byte(start_node: Any) -> None:
    """Readers check every block they get: each value is one u64 word repeated, naming its key
    and the round that wrote it, so a torn or misplaced copy shows as wrong words."""
    block = 256 << 10
    node = start_node(dram_size_bytes=16 * MIB, ssd_size_bytes=0, ssd_dir=None)  # 64 blocks
    nkeys = 40
    keys = random_keys(nkeys)

    def value(i: int, rnd: int) -> bytes:
        return np.full(block // 8, (i << 32) | rnd, dtype=np.uint64).tobytes()

    with Client(node.unix_address) as w:
        assert all(r.stored for r in w.put(keys, [value(i, 0) for i in range(nkeys)]))
    stop = threading.Event()
    stats = {"bytes": 0, "blocks": 0, "wrong_bytes": 0, "wrong_blocks": 0, "rounds": 0}
    lock = threading.Lock()
    base = dict(_shm.ONE_SIDED_STATS)
    errors: list[BaseException] = []

    def writer() -> None:
        rnd = 1
        filler = 0
        try:
            with Client(node.unix_address) as c:
                while not stop.is_set():
                    i = rnd % nkeys
                    c.remove([keys[i]])
                    c.put([keys[i]], [value(i, rnd)])  # the same key, other bytes
                    fill = random_keys(8)  # the storm: evicts the least recent blocks
                    c.put(fill, [value(1000 + filler + j, 0) for j in range(8)])
                    filler += 8
                    rnd += 1
                    stats["rounds"] += 1
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            with Client(node.unix_address) as c:
                while not stop.is_set():
                    idx = [int(x) for x in rng.choice(nkeys, 8, replace=False)]
                    for i, got in zip(idx, c.get([keys[i] for i in idx]), strict=True):
                        if got is None:
                            continue  # evicted meanwhile: a miss, never wrong bytes
                        words = np.frombuffer(got, dtype=np.uint64)
                        bad = int(np.count_nonzero(words != words[0])) * 8
                        if len(got) != block or int(words[0]) >> 32 != i:
                            bad = len(got)
                        with lock:
                            stats["bytes"] += len(got)
                            stats["blocks"] += 1
                            stats["wrong_bytes"] += bad
                            stats["wrong_blocks"] += bad > 0
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(s,)) for s in range(3)]
    start = time.monotonic()
    for t in threads:
        t.start()
    # at least 1 GiB read and 150 storm rounds (each: a remove, a re-put, 8 evicting puts)
    while time.monotonic() - start < 20 and not errors and (
        stats["bytes"] < (1 << 30) or stats["rounds"] < 150
    ):
        time.sleep(0.05)  # polling the readers' progress, not waiting for an event
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    hits = _shm.ONE_SIDED_STATS["hits"] - base["hits"]
    fallbacks = _shm.ONE_SIDED_STATS["fallbacks"] - base["fallbacks"]
    print(f"stress: {stats} one_sided_hits={hits} fallbacks={fallbacks} "
          f"in {time.monotonic() - start:.1f} s")
    assert stats["wrong_bytes"] == 0, f"wrong bytes: {stats}"
    assert stats["bytes"] >= 1 << 30, f"read only {stats['bytes']} bytes in 20 s: {stats}"
    assert stats["rounds"] >= 150, stats
    assert hits > 0
