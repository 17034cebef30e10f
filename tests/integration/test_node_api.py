"""The node API end to end in one process: every client method over shm, tcp and grpc."""

from __future__ import annotations

import asyncio
import urllib.request

import numpy as np
import pytest
from it_helpers import DaemonThread, random_keys, value_for, wait_until
from prometheus_client.parser import text_string_to_metric_families
from thread_helpers import HookEvents

from kvstored import AsyncClient, Client, Namespace, Tier
from kvstored.client import _ops, _shm
from kvstored.transport.framing import OP_GET

TRANSPORTS = ["shm", "tcp", "grpc"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_client_methods(node: DaemonThread, transport: str) -> None:
    with Client(node.address_for(transport), transport=transport, timeout_s=10) as c:
        assert c.describe().transport == transport
        keys = random_keys(6)
        sizes = [1, 4096, 100_000, 1 << 20, 3 << 20, 0]
        values = [value_for(k, n) for k, n in zip(keys, sizes, strict=True)]
        metas = [f"meta-{i}".encode() for i in range(6)]
        results = c.put(keys, values, metas=metas)
        assert [r.stored for r in results] == [True] * 6 and all(r.ok for r in results)
        again = c.put(keys[:2], [b"other"] * 2)
        assert [r.stored for r in again] == [False, False] and all(r.ok for r in again)

        miss = random_keys(1)[0]
        assert c.get([*keys, miss]) == [*values, None]

        blocks = c.get_blocks([keys[2], miss])
        assert blocks[1] is None
        assert blocks[0] is not None and blocks[0].value == values[2]
        assert blocks[0].meta == b"meta-2" and blocks[0].tier == Tier.DRAM

        bufs: list[object] = [bytearray(n + 10) for n in sizes[:3]]
        bufs += [np.zeros(sizes[3], np.uint8), np.zeros((2, sizes[4] // 2), np.uint8), bytearray(0)]
        got = c.get_into([*keys], bufs)
        assert got == sizes
        for buf, v in zip(bufs, values, strict=True):
            assert bytes(memoryview(buf).cast("B")[: len(v)]) == v  # type: ignore[arg-type]
        with_meta = c.get_into([keys[0], miss], [bytearray(8), bytearray(8)], return_meta=True)
        assert with_meta == [(1, b"meta-0"), None]

        assert c.lookup_prefix(keys) == 6
        assert c.lookup_prefix([keys[0], keys[1], miss, keys[2]]) == 2
        assert c.lookup_prefix_tiers(keys[:2]) == [Tier.DRAM, Tier.DRAM]
        assert c.exists([keys[0], miss]) == [True, False]
        assert c.where([keys[0], miss]) == [Tier.DRAM, None]

        listed, truncated = c.list_blocks()
        assert not truncated and set(keys) <= {b.key for b in listed}
        listed, truncated = c.list_blocks(limit=2)
        assert truncated and len(listed) == 2

        assert c.remove([keys[0], miss]) == [True, False]
        assert c.get([keys[0]]) == [None]
        stats = c.stats()
        assert stats["puts"] >= 6 and stats["node_id"] == node.cfg.node_id
        assert stats["tiers"][0]["tier"] == "DRAM" and stats["tiers"][0]["num_blocks"] >= 5
    wait_until(lambda: node.daemon.store.stats().pinned_blocks == 0, what="pins released")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_async_client(node: DaemonThread, transport: str) -> None:
    async def main() -> None:
        async with AsyncClient(node.address_for(transport), transport=transport) as c:
            keys = random_keys(4)
            values = [value_for(k, 300_000) for k in keys]
            results = await c.put(keys, values, metas=[b"m"] * 4)
            assert all(r.stored for r in results)
            assert await c.get(keys) == values
            bufs = [bytearray(300_000) for _ in keys]
            assert await c.get_into(keys, bufs) == [300_000] * 4
            assert [bytes(b) for b in bufs] == values
            blocks = await c.get_blocks(keys[:1])
            assert blocks[0] is not None and blocks[0].meta == b"m"
            assert await c.lookup_prefix(keys) == 4
            assert await c.lookup_prefix_tiers(keys[:1]) == [Tier.DRAM]
            assert await c.exists(keys[:1]) == [True]
            assert await c.where(keys[:1]) == [Tier.DRAM]
            assert (await c.describe()).transport == transport
            assert (await c.stats())["puts"] >= 4
            assert len((await c.list_blocks(limit=10))[0]) >= 4
            assert await c.remove(keys[:1]) == [True]
            # many concurrent calls on one client
            many = await asyncio.gather(*(c.get([k]) for k in keys[1:] * 5))
            assert [m[0] for m in many] == values[1:] * 5

    asyncio.run(main())
    wait_until(lambda: node.daemon.store.stats().pinned_blocks == 0, what="pins released")


def test_auto_transport_picks_shm_on_unix_and_tcp_on_tcp(node: DaemonThread) -> None:
    with Client(node.unix_address) as c:
        assert c.describe().transport == "shm"
    with Client(node.tcp_address) as c:
        assert c.describe().transport == "tcp"
    with Client(node.tcp_address, transport="shm") as c:  # explicit shm over TCP: maps too
        assert c.describe().transport == "shm"


def test_default_address_comes_from_env(node: DaemonThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORED_ADDRESS", node.unix_address)
    with Client() as c:
        assert c.address == node.unix_address
        assert c.describe().node_id == node.cfg.node_id


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_batches_larger_than_one_request(node: DaemonThread, transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shm, "PIN_CHUNK_KEYS", 3)  # the shared-memory path's chunking
    monkeypatch.setattr(_shm, "MAX_CHUNK_BYTES", 50_000)
    monkeypatch.setattr(_ops, "MAX_CHUNK_BYTES", 50_000)  # the tcp path's
    keys = random_keys(20)
    values = [value_for(k, 20_000) for k in keys]
    with Client(node.address_for(transport), transport=transport) as c:
        assert all(r.stored for r in c.put(keys, values))
        assert c.get(keys) == values
        assert c.lookup_prefix(keys) == 20


def test_grpc_get_over_the_inline_budget_takes_several_calls(start_node: object) -> None:
    node = start_node(max_inline_bytes=100_000)  # type: ignore[operator]
    keys = random_keys(5)
    values = [value_for(k, 60_000) for k in keys]
    with Client(node.tcp_address, transport="grpc") as c:
        assert all(r.stored for r in c.put(keys, values))
        assert c.get(keys) == values


def test_namespace_is_stored_and_listed(node: DaemonThread) -> None:
    ns = Namespace(model_id="test/model", block_size=4)
    with Client(node.unix_address, namespace=ns) as c:
        keys = random_keys(3)
        c.put(keys, [b"v"] * 3)
        listed, _ = c.list_blocks(ns.id)
        assert {b.key for b in listed} == set(keys)
        assert all(b.namespace_id == ns.id for b in listed)
        assert c.list_blocks(b"\x00" * 16)[0] == []


def _scrape(node: DaemonThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the node's /metrics, parsed by prometheus_client's own parser."""
    body = urllib.request.urlopen(f"http://{node.daemon.metrics_address}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples}


@pytest.mark.usefixtures("pinned_reads")  # one-sided DRAM hits never reach the node's counters
def test_metrics_move_by_what_the_traffic_did(start_node: object, sock_dir: str) -> None:
    """Each counter and gauge moves by exactly what a known sequence of calls did."""
    mib = 1 << 20
    node = start_node(dram_size_bytes=4 * mib, ssd_dir=f"{sock_dir}/ssd", ssd_size_bytes=64 * mib)  # type: ignore[operator]

    def m(name: str, **labels: str) -> float:
        return scrape.get((name, tuple(sorted(labels.items()))), 0.0)

    scrape = _scrape(node)
    assert m("kvstored_tier_capacity_bytes", tier="DRAM") == 4 * mib
    assert m("kvstored_node_draining") == 0
    keys = random_keys(6)
    miss = random_keys(1)
    with Client(node.unix_address) as c:
        for k in keys:  # one at a time: DRAM holds 4, so the 2 least recent go to SSD
            assert c.put([k], [value_for(k, mib)])[0].stored
        scrape = _scrape(node)
        assert m("kvstored_store_puts_total") == 6
        assert m("kvstored_transfer_bytes_total", transport="shm", direction="in") == 6 * mib
        assert m("kvstored_transfer_blocks_total", transport="shm", direction="in") == 6
        assert m("kvstored_rpc_requests_total", method="ReservePut", code="OK") == 6
        assert m("kvstored_tier_evictions_total", tier="DRAM") == 2
        assert (m("kvstored_tier_blocks", tier="DRAM"), m("kvstored_tier_blocks", tier="SSD")) == (4, 2)
        assert m("kvstored_tier_used_bytes", tier="DRAM") == 4 * mib
        assert m("kvstored_tier_used_bytes", tier="SSD") >= 2 * mib
        # reads: 1 SSD hit (promoted, which demotes one more), 1 DRAM hit, 1 miss
        assert c.get([keys[0], keys[5], miss[0]]) == [value_for(keys[0], mib), value_for(keys[5], mib), None]
        assert c.lookup_prefix([keys[5], keys[4], miss[0], keys[3]]) == 2
    # The data-plane server counts a GET's bytes after its last send returns, so the client
    # can hold every byte before the counter moves: wait for the server's request_done,
    # reported after the count (a scrape raced it under load).
    served = HookEvents()
    data_plane = node.daemon._data_plane
    assert data_plane is not None
    data_plane.hook = served.hook
    with Client(node.tcp_address, transport="tcp") as c:
        assert c.get([keys[5]]) == [value_for(keys[5], mib)]
    served.wait_for(1, "request_done", op=OP_GET)
    scrape = _scrape(node)
    gets, hits, misses = "kvstored_store_gets_total", "kvstored_store_hits_total", "kvstored_store_misses_total"
    assert (m(gets), m(hits), m(misses)) == (4, 3, 1)
    assert m("kvstored_tier_hits_total", tier="SSD") == 1 and m("kvstored_tier_hits_total", tier="DRAM") == 2
    assert m("kvstored_tier_evictions_total", tier="DRAM") == 3
    assert (m("kvstored_tier_blocks", tier="DRAM"), m("kvstored_tier_blocks", tier="SSD")) == (4, 3)
    assert m("kvstored_transfer_bytes_total", transport="shm", direction="out") == 2 * mib
    assert m("kvstored_transfer_bytes_total", transport="tcp", direction="out") == mib
    assert (m("kvstored_lookup_blocks_total"), m("kvstored_lookup_hit_blocks_total")) == (4, 2)
    assert m("kvstored_rpc_duration_seconds_count", method="ReservePut") == 6
    assert m("kvstored_lease_active", kind="pin") == 0 and m("kvstored_store_pinned_blocks") == 0
    # a pin held by a client shows as one active pin lease and one pinned block until released
    core = node.daemon.core
    assert core is not None
    sid = node.call(core.open_session)
    pin_id, _ = node.call(lambda: core.pin_blocks([keys[5]], b"", session_id=sid))
    scrape = _scrape(node)
    assert m("kvstored_lease_active", kind="pin") == 1 and m("kvstored_store_pinned_blocks") == 1
    assert core.release_pins([pin_id]) == 1
    scrape = _scrape(node)
    assert m("kvstored_lease_active", kind="pin") == 0 and m("kvstored_store_pinned_blocks") == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_one_read_larger_than_dram_promotes_from_ssd_in_pieces(
    start_node: object, sock_dir: str, transport: str
) -> None:
    node = start_node(dram_size_bytes=8 << 20, ssd_dir=f"{sock_dir}/ssd", ssd_size_bytes=64 << 20)  # type: ignore[operator]
    keys = random_keys(40)
    values = [value_for(k, 512 << 10) for k in keys]  # 20 MiB: most of it lives on SSD only
    with Client(node.address_for(transport), transport=transport, timeout_s=60) as c:
        for i in range(0, 40, 8):
            assert all(r.stored for r in c.put(keys[i : i + 8], values[i : i + 8]))
        assert Tier.SSD in c.where(keys)
        assert c.get(keys) == values
        bufs = [bytearray(512 << 10) for _ in keys]
        assert c.get_into(keys, bufs) == [512 << 10] * 40
        assert [bytes(b) for b in bufs] == values
    wait_until(lambda: node.daemon.store.stats().pinned_blocks == 0, what="pins released")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_empty_block_alone_reads_back_empty_not_a_miss(node: DaemonThread, transport: str) -> None:
    """Regression: over shm a chunk holding only 0-byte hits skipped the copy step -> None."""
    with Client(node.address_for(transport), transport=transport, timeout_s=10) as c:
        (key,) = random_keys(1)
        assert c.put([key], [b""])[0].stored
        assert c.get([key]) == [b""]
        assert c.get_into([key], [bytearray(8)]) == [0]
