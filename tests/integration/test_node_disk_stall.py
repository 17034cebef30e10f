"""A stalled SSD stalls only the reads that need it (issue 6 section 2, the FUSE-pause case).

Measured before: with the SSD directory on a FUSE passthrough whose reads were paused, a get
of an SSD block timed out (right), but gets of DRAM blocks by another client and a Stats call
failed with DeadlineExceeded too (wrong). Here the SSD tier's ``io_hook`` holds the read of
one block on an Event; every other call must complete while it is held (``completes`` fails
the test if a call does not return; the join timeout is a hang guard, not a timing claim).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from it_helpers import DaemonThread, random_keys, value_for
from thread_helpers import completes as _completes
from thread_helpers import in_thread

from kvstored import Client, Tier
from kvstored.tiers.ssd_format import store_key

# counts the node's hits, and one-sided DRAM reads are not counted there
pytestmark = pytest.mark.usefixtures("pinned_reads")

MiB = 1 << 20
TRANSPORTS = ["shm", "tcp", "grpc"]


def completes(fn: Callable[[], Any]) -> Any:
    return _completes(fn, timeout_s=20, blocked_msg="call blocked behind another block's disk read")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dram_gets_and_metadata_rpcs_complete_while_an_ssd_read_is_held(
    start_node: Callable[..., DaemonThread], transport: str
) -> None:
    node = start_node(dram_size_bytes=8 * MiB, max_block_bytes=2 * MiB)
    ssd_keys, dram_keys = random_keys(2), random_keys(2)
    size = 2 * MiB - 4096
    addr = node.address_for(transport)
    with Client(addr, transport=transport, timeout_s=20) as a:
        a.put(ssd_keys, [value_for(k, size) for k in ssd_keys])
        a.put(dram_keys, [value_for(k, size) for k in dram_keys])
        a.put(random_keys(2), [b"x" * size] * 2)  # pushes ssd_keys out to SSD
        assert a.lookup_prefix_tiers(ssd_keys) == [Tier.SSD, Tier.SSD]
        assert a.lookup_prefix_tiers(dram_keys) == [Tier.DRAM, Tier.DRAM]
    store = node.daemon.store
    assert store._state.ssd is not None
    entered, release = threading.Event(), threading.Event()
    target = store_key(b"", ssd_keys[0])

    def hook(op: str, skey: bytes) -> None:
        if op == "read" and skey == target:
            entered.set()
            assert release.wait(60)

    store._state.ssd.io_hook = hook
    try:
        with Client(addr, transport=transport, timeout_s=20) as a, \
                Client(addr, transport=transport, timeout_s=20) as b:
            reader, box = in_thread(lambda: a.get(ssd_keys[:1]))
            assert entered.wait(20), "the SSD read did not start"
            # another client's DRAM gets, probes and Stats go on while that read is held
            assert completes(lambda: b.get(dram_keys)) == [value_for(k, size) for k in dram_keys]
            assert completes(lambda: b.lookup_prefix(dram_keys)) == 2
            assert completes(lambda: b.exists(ssd_keys + dram_keys)) == [True] * 4
            # Stats answers with this node's counters as of now: the six blocks put, b's two
            # DRAM hits, and no hit yet for the SSD read still held
            stats = completes(b.stats)
            assert stats["node_id"] == node.daemon.cfg.node_id
            assert (stats["puts"], stats["hits"]) == (6, 2), stats
            assert reader.is_alive()
            release.set()
            reader.join(20)
            assert box == [[value_for(ssd_keys[0], size)]]
    finally:
        release.set()
        store._state.ssd.io_hook = None
