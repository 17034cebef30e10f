"""A peer's data-plane GET (GET_FLAG_PEER_EXPORT) sends blocks without churning the source.

In-process: a source NodeCore with DRAM and SSD behind a real DataPlaneServer; reads through
a DataPlaneClient (``peer_export=True``, as node/remote.py's) and through RemoteReads.

- An SSD-only block sent to a peer stays SSD-only; DRAM and SSD recency, gets and hits are
  unchanged; the bytes and the SSD replica's generation are right.
- A DRAM block is pinned for the whole send (held at ``get_before_send``) and keeps its
  LRU position.
- A bad SSD file is a miss (the block dropped), never wrong bytes.
- An engine's GET (no flag) still promotes and counts; both flags at once are refused.
- RemoteReads copies an SSD-only block of a peer without promoting it there.
- A source older than the flag refuses it: the client drops the flag for that node and
  reads it as before.
"""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import key

from kvstored.config import NodeConfig
from kvstored.errors import InvalidArgument
from kvstored.node.core import NodeCore
from kvstored.node.remote import RemoteReads
from kvstored.tiers.ssd_format import file_rel, store_key
from kvstored.tiers.tiered import TieredStore
from kvstored.transport import framing
from kvstored.transport.framing import (
    GET_FLAG_FILL_FROM_PEERS,
    GET_FLAG_GENERATION,
    GET_FLAG_PEER_EXPORT,
    OP_GET,
    FrameLimits,
    ProtocolError,
)
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp import DataPlaneClient
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import Tier

BLOCK = 32 << 10
DRAM_BYTES = 256 << 10  # 8 blocks


def value(i: int) -> bytes:
    return bytes([i % 251]) * (BLOCK - 8) + i.to_bytes(8, "big")


class Source:
    """Blocks 1-3 SSD-only (demoted, oldest first); 10-17 in DRAM (LRU order), on SSD too."""

    def __init__(self, tmp: pathlib.Path, hook: Any = None) -> None:
        cfg = NodeConfig(node_id="src", dram_size_bytes=DRAM_BYTES, ssd_size_bytes=0,
                         max_block_bytes=BLOCK, max_batch_keys=64)
        store = TieredStore(dram_size_bytes=DRAM_BYTES, arena_dir=None, max_block_bytes=BLOCK,
                            ssd_dir=tmp / "ssd", ssd_size_bytes=4 << 20, ssd_direct_io=False)
        self.core = NodeCore(store, cfg, epoch=7)
        for i in (1, 2, 3, *range(10, 18)):
            self.core.put_inline([(key(i), value(i), b"m%d" % i)], b"")
        store.spill_to_ssd()
        assert self.tiers(1) == (Tier.SSD,) and self.tiers(17)[0] is Tier.DRAM
        self.server = DataPlaneServer(self.core, "127.0.0.1:0", hook=hook)
        self.address = self.server.start()

    @property
    def store(self) -> TieredStore:
        return self.core.store

    def tiers(self, i: int) -> tuple[Tier, ...]:
        blocks, _ = self.store.list_blocks(limit=1 << 20)
        return next(b.tiers for b in blocks if b.key == key(i))

    def generation(self, i: int, tier: Tier) -> int:
        blocks, _ = self.store.list_blocks(limit=1 << 20)
        b = next(b for b in blocks if b.key == key(i))
        return dict(zip(b.tiers, b.generations, strict=True))[tier]

    def order(self) -> tuple[list[bytes], list[bytes]]:
        """(DRAM LRU order, SSD LRU order) of store keys, coldest first."""
        ssd = self.store._state.ssd
        assert ssd is not None
        with self.store._state.lock:
            return list(self.store._state.dram.entries), list(ssd.entries)

    def close(self) -> None:
        self.server.stop(0.0)
        self.store.close()


@pytest.fixture
def source(tmp_path: pathlib.Path) -> Iterator[Source]:
    s = Source(tmp_path)
    yield s
    s.close()


def _wait_unpinned(s: Source) -> None:
    """Poll (with a deadline) until the server released its pins: it does so right after
    the kernel took the last bytes, possibly after the client has read them."""
    deadline = time.monotonic() + 10
    while s.store.stats().pinned_blocks and time.monotonic() < deadline:
        time.sleep(0.005)
    assert s.store.stats().pinned_blocks == 0


def _get(address: str, ids: list[int], **kw: Any) -> tuple[list[Any], list[bytes]]:
    """GET ``ids``; (items, payload per item: b"" on a miss)."""
    bufs: dict[int, bytearray] = {}

    def sink(i: int, size: int, meta: bytes) -> memoryview:
        bufs[i] = bytearray(size)
        return memoryview(bufs[i])

    client = DataPlaneClient(address, max_block_bytes=BLOCK, **kw)
    try:
        items = client.get([key(i) for i in ids], b"", sink, deadline=time.monotonic() + 10)
    finally:
        client.close()
    return items, [bytes(bufs.get(n, b"")) for n in range(len(ids))]


def test_a_peer_get_of_an_ssd_only_block_leaves_it_ssd_only_and_its_recency_unchanged(
    source: Source,
) -> None:
    order, before = source.order(), source.store.stats()
    gen = source.generation(1, Tier.SSD)
    items, payloads = _get(source.address, [1, 12, 99], peer_export=True)
    _wait_unpinned(source)  # the DRAM pin is released after the send
    assert [it.found for it in items] == [True, True, False]
    assert payloads[:2] == [value(1), value(12)]
    assert [it.meta for it in items[:2]] == [b"m1", b"m12"]
    assert [it.tier for it in items] == [int(Tier.SSD), int(Tier.DRAM), 0]
    assert items[0].generation == gen != 0  # the SSD replica's own generation
    assert items[1].generation == source.generation(12, Tier.DRAM) != 0
    assert source.tiers(1) == (Tier.SSD,)  # not promoted
    assert source.order() == order  # neither tier's LRU order touched
    after = source.store.stats()
    assert (after.gets, after.hits, after.misses) == (before.gets, before.hits, before.misses)
    assert after.tiers == before.tiers  # nothing promoted, demoted, evicted or hit


def test_a_peer_get_holds_the_dram_pin_for_the_whole_send(tmp_path: pathlib.Path) -> None:
    held, release = threading.Event(), threading.Event()
    seen: list[int] = []
    box: list[Source] = []

    def hook(event: str, **fields: Any) -> None:
        if event == "get_before_send":
            seen.append(box[0].store.stats().pinned_blocks)
            held.set()
            assert release.wait(10)

    s = Source(tmp_path, hook=hook)
    box.append(s)
    try:
        order = s.order()
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(_get(s.address, [11, 2], peer_export=True)))
        t.start()
        assert held.wait(10)
        assert s.store.remove([key(11)]) == [False]  # pinned mid-send: cannot be removed
        release.set()
        t.join(10)
        assert seen == [1]  # block 11's DRAM pin; the SSD block 2 is a private copy
        items, payloads = out[0]
        assert payloads == [value(11), value(2)]
        _wait_unpinned(s)
        assert s.order() == order
        assert s.tiers(2) == (Tier.SSD,)
    finally:
        release.set()
        s.close()


def test_a_bad_ssd_file_is_a_miss_of_a_peer_get_never_wrong_bytes(source: Source) -> None:
    ssd = source.store._state.ssd
    assert ssd is not None
    with open(ssd._path(file_rel(store_key(b"", key(2)))), "r+b") as f:
        b = f.read(1)  # flip one payload byte: same size, wrong checksum
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    failures = source.store.stats().checksum_failures
    items, payloads = _get(source.address, [2, 3], peer_export=True)
    assert [it.found for it in items] == [False, True]
    assert items[0].generation == 0 and payloads[0] == b""
    assert payloads[1] == value(3)
    assert source.store.stats().checksum_failures == failures + 1
    assert source.store.exists([key(2), key(3)]) == [False, True]  # the bad block dropped


def test_an_engine_get_still_promotes_and_counts(source: Source) -> None:
    before = source.store.stats()
    gen = source.generation(1, Tier.SSD)
    items, payloads = _get(source.address, [1])
    assert payloads == [value(1)] and items[0].tier == int(Tier.SSD)
    assert items[0].generation == gen  # a promotion keeps the replica's generation
    assert source.tiers(1)[0] is Tier.DRAM  # promoted
    after = source.store.stats()
    assert (after.gets, after.hits) == (before.gets + 1, before.hits + 1)


def test_fill_from_peers_and_peer_export_together_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="fill_from_peers=True and peer_export=True"):
        DataPlaneClient("127.0.0.1:1", fill_from_peers=True, peer_export=True)
    limits = FrameLimits(max_items=64, max_key_bytes=64, max_meta_bytes=64,
                         max_namespace_bytes=64, max_item_bytes=BLOCK,
                         max_request_payload_bytes=1 << 20, max_body_bytes=1 << 20)
    limits.check_request_header(OP_GET, 1, 32, GET_FLAG_PEER_EXPORT)
    limits.check_request_header(OP_GET, 1, 32, GET_FLAG_FILL_FROM_PEERS)
    with pytest.raises(ProtocolError, match="GET_FLAG_PEER_EXPORT"):
        limits.check_request_header(OP_GET, 1, 32, GET_FLAG_FILL_FROM_PEERS | GET_FLAG_PEER_EXPORT)


def test_remote_reads_copy_an_ssd_only_block_without_promoting_it_on_the_source(
    source: Source,
) -> None:
    cfg = NodeConfig(node_id="dst", dram_size_bytes=4 << 20, ssd_size_bytes=0,
                     max_block_bytes=BLOCK, max_batch_keys=64)
    local = NodeCore(TieredStore(dram_size_bytes=4 << 20, arena_dir=None, max_block_bytes=BLOCK),
                     cfg, epoch=3)
    named = {key(i): ClusterReplica("src", 7, Tier.SSD, BLOCK, source.generation(i, Tier.SSD),
                                    source.address) for i in (1, 2)}
    lookups: list[int] = []

    def lookup(ns: bytes, keys: Any, local_id: str, timeout_s: float) -> list[ClusterReplica]:
        lookups.append(len(keys))
        return [named[k] for k in keys if k in named]

    order = source.order()
    reads = RemoteReads(local, node_id="dst", lookup=lookup, report=lambda *a, **k: None)
    try:
        got = reads.fill([key(1), key(2)], b"")
        assert (got.num_fetched, got.num_dropped, got.num_failed) == (2, 0, 0)
        assert len(lookups) == 1  # the generation matched: no re-check, no re-copy
        out = local.get_inline([key(1), key(2)], b"", budget_bytes=1 << 30)
        assert [o.value for o in out] == [value(1), value(2)]
        assert source.tiers(1) == (Tier.SSD,) and source.tiers(2) == (Tier.SSD,)
        assert source.order() == order
    finally:
        reads.close()
        local.store.close()


def test_a_source_older_than_the_flag_is_read_as_before(
    source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An older node knows GET flags 1 and 2 only: it refuses 4 and closes the connection.
    monkeypatch.setattr(framing, "GET_FLAGS", GET_FLAG_GENERATION | GET_FLAG_FILL_FROM_PEERS)
    client = DataPlaneClient(source.address, max_block_bytes=BLOCK, peer_export=True)
    bufs: dict[int, bytearray] = {}

    def sink(i: int, size: int, meta: bytes) -> memoryview:
        bufs[i] = bytearray(size)
        return memoryview(bufs[i])

    try:
        for _ in range(2):  # the second GET goes straight to the old way: no refusal
            items = client.get([key(1)], b"", sink, deadline=time.monotonic() + 10)
            assert items[0].found and bytes(bufs[0]) == value(1)
        assert client.get_flags == GET_FLAG_GENERATION  # the export flag dropped for this node
        assert source.server.counters().rejected_frames == 1
        assert source.tiers(1)[0] is Tier.DRAM  # the older node's pin promoted it
    finally:
        client.close()
