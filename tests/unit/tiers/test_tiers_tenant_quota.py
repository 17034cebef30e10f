"""Per-tenant DRAM and SSD quotas in the store (kvstored/tiers/tenants.py, docs/tenants.md)."""

from __future__ import annotations

import contextlib
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstored.errors import TenantQuotaExceeded
from kvstored.tenancy import TenantQuota, scope_namespace
from kvstored.tiers.tiered import TieredStore
from kvstored.types import Reservation, Tier

K = 4096
NS_A = scope_namespace("a", b"ns")
NS_B = scope_namespace("b", b"ns")


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_a_put_over_the_dram_quota_is_refused_naming_tenant_tier_quota_and_usage() -> None:
    s = TieredStore(dram_size_bytes=64 * K, arena_dir=None,
                    tenant_quotas={"a": TenantQuota(dram_quota_bytes=2 * K)})
    try:
        assert s.put(key(0), bytes(K), namespace_id=NS_A)
        assert s.put(key(1), bytes(K), namespace_id=NS_A)
        with pytest.raises(TenantQuotaExceeded) as e:
            s.put(key(2), bytes(K), namespace_id=NS_A)
        msg = str(e.value)
        assert "'a'" in msg and "DRAM" in msg and "8192 bytes used of 8192" in msg
        # tenant b has no quota: unaffected; a's blocks all still there
        assert all(s.put(key(i), bytes(K), namespace_id=NS_B) for i in range(8))
        assert s.exists([key(0), key(1), key(2)], namespace_id=NS_A) == [True, True, False]
        snap = s.tenants.snapshot()
        assert snap["a"]["dram_used_bytes"] == 2 * K and snap["a"]["dram_refusals"] == 1
        assert snap["b"]["dram_used_bytes"] == 8 * K
        s.remove([key(0)], namespace_id=NS_A)  # room again within the quota
        assert s.put(key(2), bytes(K), namespace_id=NS_A)
    finally:
        s.close()


def test_pending_reservations_count_so_a_batch_cannot_overshoot() -> None:
    s = TieredStore(dram_size_bytes=64 * K, arena_dir=None,
                    tenant_quotas={"a": TenantQuota(dram_quota_bytes=3 * K)})
    try:
        first = s.reserve(key(0), 2 * K, namespace_id=NS_A)
        assert isinstance(first, Reservation)
        got = s.reserve_many([(key(1), K, b""), (key(2), K, b"")], namespace_id=NS_A)
        assert isinstance(got, list)
        assert isinstance(got[0], Reservation) and isinstance(got[1], TenantQuotaExceeded)
        s.abort(first)  # an abort gives the quota back
        assert s.tenants.reserved_bytes["a"] == K
        assert isinstance(s.reserve(key(3), 2 * K, namespace_id=NS_A), Reservation)
    finally:
        s.close()


def test_a_full_arena_never_evicts_another_tenant_for_a_tenant_over_its_quota() -> None:
    s = TieredStore(dram_size_bytes=4 * K, arena_dir=None,
                    tenant_quotas={"a": TenantQuota(dram_quota_bytes=K)})
    try:
        for i in range(3):
            assert s.put(key(i), np.full(K, i, np.uint8), namespace_id=NS_B)
        assert s.put(key(9), bytes(K), namespace_id=NS_A)  # fills the arena, within a's quota
        with pytest.raises(TenantQuotaExceeded):
            s.put(key(10), bytes(K), namespace_id=NS_A)  # would evict b's LRU block: refused
        assert s.exists([key(i) for i in range(3)], namespace_id=NS_B) == [True] * 3
    finally:
        s.close()


def test_a_demotion_past_the_ssd_quota_is_dropped_not_written(tmp_path: pathlib.Path) -> None:
    s = TieredStore(dram_size_bytes=4 * K, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=1 << 20, ssd_direct_io=False,
                    tenant_quotas={"a": TenantQuota(ssd_quota_bytes=K)})
    try:
        for i in range(6):  # 4 fit in DRAM; the two oldest are evicted in LRU order
            assert s.put(key(i), np.full(K, i, np.uint8), namespace_id=NS_A)
        snap = s.tenants.snapshot()["a"]
        assert snap["ssd_used_bytes"] == K and snap["ssd_refusals"] == 1
        assert s.exists([key(0), key(1)], namespace_id=NS_A) == [True, False]
        tiers = {t.tier: t for t in s.stats().tiers}
        assert tiers[Tier.SSD].num_blocks == 1
    finally:
        s.close()


def test_the_shared_tenant_and_unknown_tenants_have_no_quota() -> None:
    s = TieredStore(dram_size_bytes=16 * K, arena_dir=None,
                    tenant_quotas={"a": TenantQuota(dram_quota_bytes=0)})
    try:
        assert s.put(key(0), bytes(K))  # shared tenant
        assert s.put(key(0), bytes(K), namespace_id=scope_namespace("c", b"ns"))
        with pytest.raises(TenantQuotaExceeded):
            s.put(key(0), bytes(K), namespace_id=NS_A)
    finally:
        s.close()


def test_the_node_exports_usage_quota_and_refusals_per_tenant() -> None:
    from kvstored.node.metrics import NodeMetrics

    s = TieredStore(dram_size_bytes=64 * K, arena_dir=None,
                    tenant_quotas={"a": TenantQuota(dram_quota_bytes=K)})
    try:
        metrics = NodeMetrics()
        metrics.add_tenant_collector(s.tenant_usage)
        assert s.put(key(0), bytes(K), namespace_id=NS_A)
        assert s.put(key(0), bytes(2 * K), namespace_id=NS_B)
        with pytest.raises(TenantQuotaExceeded):
            s.put(key(1), bytes(K), namespace_id=NS_A)
        value = metrics.registry.get_sample_value
        assert value("kvstored_tenant_used_bytes", {"tenant": "a", "tier": "DRAM"}) == K
        assert value("kvstored_tenant_used_bytes", {"tenant": "b", "tier": "DRAM"}) == 2 * K
        assert value("kvstored_tenant_quota_bytes", {"tenant": "a", "tier": "DRAM"}) == K
        assert value("kvstored_tenant_quota_bytes", {"tenant": "b", "tier": "DRAM"}) is None
        assert value("kvstored_tenant_quota_refusals_total", {"tenant": "a", "tier": "DRAM"}) == 1
    finally:
        s.close()


def _recount(s: TieredStore) -> dict[tuple[str, int], int]:
    st = s._state  # noqa: SLF001 (the invariant is about the maps themselves)
    out: dict[tuple[str, int], int] = {}
    maps = [(int(Tier.DRAM), st.dram.entries)]
    if st.ssd is not None:
        maps.append((int(Tier.SSD), st.ssd.entries))
    for tier, entries in maps:
        for skey, e in entries.items():
            k = (st.tenants.tenant(skey), tier)
            out[k] = out.get(k, 0) + e.size_bytes
    return out


@settings(max_examples=10, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "get", "remove"]), st.integers(0, 2),
                          st.integers(0, 11), st.integers(1, 3)), max_size=40))
def test_usage_always_equals_a_recount_of_the_tier_maps(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int, int]]
) -> None:
    """Whatever puts, reads (promotions), removes, evictions and demotions ran, and after a
    restart on the same SSD directory, the per-tenant counts are the maps' sums."""
    ssd_dir = tmp_path_factory.mktemp("ssd")
    namespaces = [scope_namespace(t, b"ns") for t in ("", "a", "b")]

    def open_store() -> TieredStore:
        return TieredStore(dram_size_bytes=8 * K, arena_dir=None, ssd_dir=ssd_dir,
                           ssd_size_bytes=24 * K, ssd_direct_io=False,
                           tenant_quotas={"a": TenantQuota(dram_quota_bytes=5 * K,
                                                           ssd_quota_bytes=6 * K)})

    s = open_store()
    try:
        for op, t, i, n in ops:
            ns = namespaces[t]
            if op == "put":
                with contextlib.suppress(TenantQuotaExceeded):
                    s.put(key(i), bytes(n * K // 2), namespace_id=ns)
            elif op == "get":
                s.get(key(i), namespace_id=ns)
            else:
                s.remove([key(i)], namespace_id=ns)
            got = {k: v for k, v in s.tenants.used_bytes.items() if v}
            assert got == _recount(s)
            assert not any(s.tenants.reserved_bytes.values())
            assert not any(s.tenants.writing_bytes.values())
            q = s.tenants.quotas["a"]
            assert s.tenants.used("a", Tier.DRAM) <= (q.dram_quota_bytes or 0)
            assert s.tenants.used("a", Tier.SSD) <= (q.ssd_quota_bytes or 0)
        s.close()
        s = open_store()  # SSD recovery: the blocks found again are counted
        assert {k: v for k, v in s.tenants.used_bytes.items() if v} == _recount(s)
    finally:
        s.close()


def test_a_demotion_in_flight_counts_against_the_ssd_quota(tmp_path: pathlib.Path) -> None:
    """Race: a demotion's write runs with the store lock released; a second demotion of the
    same tenant starting meanwhile must see the first one's bytes, or both would pass the
    quota. The io_hook holds the first write until the second has been decided."""
    import threading

    s = TieredStore(dram_size_bytes=4 * K, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=1 << 20, ssd_direct_io=False,
                    tenant_quotas={"a": TenantQuota(ssd_quota_bytes=K)})
    try:
        for i in range(4):
            assert s.put(key(i), np.full(K, i, np.uint8), namespace_id=NS_A)
        entered, release = threading.Event(), threading.Event()

        def hold_first_write(op: str, skey: bytes) -> None:
            if op == "write" and not entered.is_set():
                entered.set()
                assert release.wait(30)

        ssd = s._state.ssd  # noqa: SLF001
        assert ssd is not None
        ssd.io_hook = hold_first_write
        first = threading.Thread(target=s.put, args=(key(4), bytes(K)), kwargs={"namespace_id": NS_A})
        first.start()  # evicts key 0: its demotion write is held by the hook
        try:
            assert entered.wait(30)
            assert s.put(key(5), bytes(K), namespace_id=NS_A)  # evicts key 1, key 0 in flight
            assert s.tenants.writing_bytes["a"] == K
        finally:
            release.set()
            first.join(30)
        assert s.exists([key(0), key(1)], namespace_id=NS_A) == [True, False]
        assert s.tenants.used("a", Tier.SSD) == K and s.tenants.refusals[("a", int(Tier.SSD))] == 1
    finally:
        s.close()


def test_a_victim_over_its_tenants_ssd_quota_is_no_spare_victim(tmp_path: pathlib.Path) -> None:
    """Issue 17 section 3: the spare-victim check took a demotion the SSD has room for as
    lossless, but a tenant's SSD quota makes ``SsdTier.begin_write`` refuse it, and the
    eviction then dropped the block. Such a block is no spare victim: another block (one
    that may be demoted) goes to SSD instead, and nothing is dropped."""
    s = TieredStore(dram_size_bytes=2 * K, arena_dir=None, ssd_dir=tmp_path / "ssd",
                    ssd_size_bytes=64 * K,
                    tenant_quotas={"a": TenantQuota(ssd_quota_bytes=K // 2)})
    try:
        assert s.put(key(0), bytes(K), namespace_id=NS_A)  # DRAM LRU: a's block, then b's
        assert s.put(key(1), bytes([1]) * K, namespace_id=NS_B)
        assert s.put(key(2), bytes([2]) * K, namespace_id=NS_B)  # needs one victim
        assert s.exists([key(0)], namespace_id=NS_A) == [True], "a's block was dropped"
        assert s.exists([key(1), key(2)], namespace_id=NS_B) == [True, True]
        assert s.lookup_prefix([key(1)], namespace_id=NS_B) == [Tier.SSD]  # b's went to SSD
        assert s.evictions_for_good == 0
    finally:
        s.close()
