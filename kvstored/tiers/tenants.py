"""TenantUsage: bytes per tenant and tier, and the quota checks (docs/tenants.md).

A block's tenant is read off its stored namespace id (kvstored/tenancy.py), so the store needs
no table of owners: the DRAM and SSD block maps (``ObservedEntries``, feed.py) call
:meth:`TenantUsage.count` on every key they gain or lose, and the write side charges pending
reservations (:meth:`reserve` / :meth:`unreserve`) and SSD writes in flight. Every method runs
under the store lock (StoreState.lock); the getters used by stats and metrics read plain dicts
(a racy but consistent-per-key read).

Quota rule (what a quota may never do): a put that would take its tenant past its DRAM quota
is refused with :class:`~kvstored.errors.TenantQuotaExceeded` *before* any space is allocated,
so it never evicts anything, least of all another tenant's blocks. A demotion that would take
its tenant past its SSD quota is not written (the block leaves DRAM as a plain eviction: a
miss for that tenant only); the SSD tier never evicts to make room for it. Counted bytes are
payload bytes (``size_bytes``), the unit quotas are configured in.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvstored.errors import TenantQuotaExceeded
from kvstored.tenancy import TenantQuota, tenant_of
from kvstored.tiers.ssd_format import split_store_key
from kvstored.types import Tier


class TenantUsage:
    """Per-tenant byte counts of one store and its quotas (store lock held for mutations).

    Args:
        quotas: tenant name -> :class:`TenantQuota`; tenants not named have no quota.

    Attributes:
        used_bytes: ``(tenant, tier) -> bytes`` of blocks in that tier's map.
        reserved_bytes: tenant -> DRAM bytes of pending reservations.
        writing_bytes: tenant -> SSD bytes of demotion writes in flight.
        refusals: ``(tenant, tier) -> number`` of puts (DRAM) or demotions (SSD) refused.
    """

    def __init__(self, quotas: Mapping[str, TenantQuota] | None = None) -> None:
        self.quotas: dict[str, TenantQuota] = dict(quotas or {})
        self.used_bytes: dict[tuple[str, int], int] = {}
        self.reserved_bytes: dict[str, int] = {}
        self.writing_bytes: dict[str, int] = {}
        self.refusals: dict[tuple[str, int], int] = {}
        self._tenants: dict[bytes, str] = {}  # stored namespace id -> tenant (ids are few)

    def tenant(self, skey: bytes) -> str:
        """The tenant of a store key."""
        ns = split_store_key(skey)[0]
        t = self._tenants.get(ns)
        if t is None:
            t = self._tenants[ns] = tenant_of(ns)
        return t

    def tenant_of_namespace(self, namespace_id: bytes) -> str:
        """The tenant of a stored namespace id (cached)."""
        t = self._tenants.get(namespace_id)
        if t is None:
            t = self._tenants[namespace_id] = tenant_of(namespace_id)
        return t

    def count(self, skey: bytes, tier: int, size_bytes: int) -> None:
        """A tier map gained (``size_bytes`` > 0) or lost (< 0) a block."""
        k = (self.tenant(skey), tier)
        self.used_bytes[k] = self.used_bytes.get(k, 0) + size_bytes

    def used(self, tenant: str, tier: int) -> int:
        """Bytes of ``tenant``'s blocks in ``tier``."""
        return self.used_bytes.get((tenant, int(tier)), 0)

    def note_refusal(self, tenant: str, tier: int) -> None:
        """Count one refused put (DRAM) or demotion (SSD) of ``tenant``."""
        k = (tenant, int(tier))
        self.refusals[k] = self.refusals.get(k, 0) + 1

    def over_dram(self, tenant: str, size_bytes: int, *, extra_bytes: int = 0) -> TenantQuotaExceeded | None:
        """The error a put of ``size_bytes`` more DRAM gets when it would take ``tenant``
        past its quota (``extra_bytes``: more already granted in the same batch), else None.
        Counts nothing (see :meth:`note_refusal`)."""
        q = self.quotas.get(tenant)
        if q is None or q.dram_quota_bytes is None:
            return None
        usage = self.used(tenant, Tier.DRAM) + self.reserved_bytes.get(tenant, 0) + extra_bytes
        if usage + size_bytes <= q.dram_quota_bytes:
            return None
        return TenantQuotaExceeded(
            f"tenant {tenant!r} is over its DRAM quota: {usage} bytes used of "
            f"{q.dram_quota_bytes} (dram_quota_bytes of [tenants.{tenant}]); a block of "
            f"{size_bytes} bytes does not fit (nothing of another tenant is evicted for it)"
        )

    def check_dram(self, tenant: str, size_bytes: int) -> None:
        """Raise if ``size_bytes`` more DRAM would take ``tenant`` past its quota.

        Raises:
            TenantQuotaExceeded: naming the tenant, the tier, the quota and the usage.
        """
        err = self.over_dram(tenant, size_bytes)
        if err is not None:
            self.note_refusal(tenant, Tier.DRAM)
            raise err

    def reserve(self, tenant: str, size_bytes: int) -> None:
        """Charge a pending reservation (after :meth:`check_dram`)."""
        self.reserved_bytes[tenant] = self.reserved_bytes.get(tenant, 0) + size_bytes

    def unreserve(self, skey: bytes, size_bytes: int) -> None:
        """A pending reservation ended (committed: its entry is counted by :meth:`count`)."""
        t = self.tenant(skey)
        self.reserved_bytes[t] = self.reserved_bytes.get(t, 0) - size_bytes

    def ssd_room_bytes(self, skey: bytes) -> int | None:
        """SSD bytes the block's tenant may still demote within its SSD quota (usage and
        writes in flight counted; may be negative), None = no SSD quota. A probe: counts
        no refusal (``tiers/spare.py`` asks it before choosing a victim)."""
        t = self.tenant(skey)
        q = self.quotas.get(t)
        if q is None or q.ssd_quota_bytes is None:
            return None
        return q.ssd_quota_bytes - self.used(t, Tier.SSD) - self.writing_bytes.get(t, 0)

    def may_write_ssd(self, skey: bytes, size_bytes: int) -> bool:
        """Whether a demotion of ``size_bytes`` keeps the block's tenant within its SSD
        quota; a refusal is counted (the caller drops the block instead, never evicting)."""
        t = self.tenant(skey)
        q = self.quotas.get(t)
        if q is None or q.ssd_quota_bytes is None:
            return True
        usage = self.used(t, Tier.SSD) + self.writing_bytes.get(t, 0)
        if usage + size_bytes > q.ssd_quota_bytes:
            self.note_refusal(t, Tier.SSD)
            return False
        return True

    def start_ssd_write(self, skey: bytes, size_bytes: int) -> None:
        """Charge a demotion write in flight."""
        t = self.tenant(skey)
        self.writing_bytes[t] = self.writing_bytes.get(t, 0) + size_bytes

    def end_ssd_write(self, skey: bytes, size_bytes: int) -> None:
        """A demotion write ended (kept: its entry is counted by :meth:`count`)."""
        t = self.tenant(skey)
        self.writing_bytes[t] = self.writing_bytes.get(t, 0) - size_bytes

    def snapshot(self) -> dict[str, dict[str, int]]:
        """``{tenant: {"dram_used_bytes", "ssd_used_bytes", "dram_quota_bytes",
        "ssd_quota_bytes", "dram_refusals", "ssd_refusals"}}`` for every tenant seen or
        configured (a quota of -1 = none)."""
        names = {t for t, _ in self.used_bytes} | set(self.quotas) | {t for t, _ in self.refusals}
        out: dict[str, dict[str, int]] = {}
        for t in sorted(names):
            q = self.quotas.get(t, TenantQuota())
            out[t] = {
                "dram_used_bytes": self.used(t, Tier.DRAM),
                "ssd_used_bytes": self.used(t, Tier.SSD),
                "dram_quota_bytes": -1 if q.dram_quota_bytes is None else q.dram_quota_bytes,
                "ssd_quota_bytes": -1 if q.ssd_quota_bytes is None else q.ssd_quota_bytes,
                "dram_refusals": self.refusals.get((t, int(Tier.DRAM)), 0),
                "ssd_refusals": self.refusals.get((t, int(Tier.SSD)), 0),
            }
        return out


__all__ = ["TenantUsage"]
