"""Which blocks an allocation may evict: a read never costs the pool a block.

A remote fill (node/remote.py) copies a peer's block into local DRAM so the engine can read
it through shared memory. Such a *copy* is a duplicate in the pool: the peer still holds the
block. Making room for it by evicting a block of this node's last tier (DRAM on a DRAM-only
node; a DRAM block not on SSD when the SSD cannot take it) would trade a block the pool
holds nowhere else for one it holds already (a DRAM-only pool read in full through one node
would lose blocks that way: 46 of 110 when measured). So a copy's reservation
(``TieredStore.reserve(..., copy=True)``) may only use, in this order of preference:

1. free arena space;
2. other copies (dropped: their peer holds them), oldest copy first;
3. blocks already on SSD (their DRAM space is freed, the SSD copy stays);
4. DRAM-only blocks the SSD tier can take *without evicting any SSD block* (demoted).

Anything else is spared: when no window of such victims frees the space, the reservation
raises :class:`~kvstored.errors.NoCapacity` and the copy is skipped (the engine's read
misses that block and recomputes it; the pool stays whole).

On a node in a pool (``TieredStore.set_pool_room`` installed), a promotion (of a block this
node holds on SSD already) is limited the same way (``Transit.allocate(promotion=True)``):
with no such victim, after a bounded wait on the pool, it is skipped and the block is served
from SSD, never paid for with an original.

Every allocation (a local put, a promotion, a copy) tries the copies first, and an evicted
copy is dropped, never demoted to SSD (it would spend SSD space on a block a peer holds).
Copies are kept in ``DramTier.copies`` (commit order); the mark goes when the block leaves
DRAM and when a local writer puts the same key (then the engine made it here too, so it is
no longer "only a duplicate"). Pure metadata: callers hold the store lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from kvstored.tiers.ssd_format import round_up_page, trailer_bytes

if TYPE_CHECKING:
    from kvstored.tiers.dram import DramTier
    from kvstored.tiers.ssd import SsdTier


MAX_COPY_SCAN = 256
"""Most non-copy blocks (LRU first) a copy's allocation looks at for a spareable victim."""


def candidates(dram: DramTier, *, copy: bool = False, ssd: SsdTier | None = None
               ) -> Iterator[bytes]:
    """Eviction candidates (store keys): the copies, oldest first, then the other blocks in
    LRU order. The caller stops iterating before it changes the tier.

    For a copy's allocation (``copy``) the scan is bounded, so a full node of unique
    blocks refuses a copy in O(copies + :data:`MAX_COPY_SCAN`) under the store lock, never
    O(blocks): without an SSD tier no other block is spareable; with one, only the
    :data:`MAX_COPY_SCAN` least recent blocks are looked at (blocks on SSD, or demotable
    into the SSD's free space, are the LRU ones in practice).
    """
    copies = dram.copies
    yield from copies
    if copy and ssd is None:
        return
    left = MAX_COPY_SCAN if copy else -1
    for skey in dram.entries:
        if left == 0:
            return
        if skey not in copies:
            left -= 1
            yield skey


def demote_charge(ssd: SsdTier, skey: bytes, dram: DramTier) -> int | None:
    """SSD bytes a demotion of DRAM block ``skey`` would charge, 0 when evicting it from DRAM
    costs the SSD nothing (on SSD already), None when it cannot be demoted as is (no SSD
    tier, its file is being written or deleted, or its tenant's SSD quota would refuse it:
    ``SsdTier.begin_write`` then writes nothing and evicting it would drop it)."""
    if skey in ssd.entries:
        return 0
    if skey in ssd._writing or skey in ssd._deleting:  # noqa: SLF001 (same package)
        return None
    e = dram.entries[skey]
    tenants = ssd.tenants
    if tenants is not None:
        room = tenants.ssd_room_bytes(skey)
        if room is not None and e.size_bytes > room:
            return None  # over its tenant's SSD quota: a demotion would drop it
    return round_up_page(e.size_bytes + trailer_bytes(skey, e.meta))


def spares_pool(dram: DramTier, ssd: SsdTier | None) -> Callable[[bytes], bool]:
    """Per block: may a copy's allocation evict it (a copy, or demotable to SSD as is)?"""

    def ok(skey: bytes) -> bool:
        if skey in dram.copies:
            return True
        return ssd is not None and demote_charge(ssd, skey, dram) is not None

    return ok


def window_spares_pool(dram: DramTier, ssd: SsdTier | None, window: list[bytes]) -> bool:
    """Whether evicting ``window`` drops no block from the pool: each victim is a copy or
    on SSD already, and the SSD's free space covers all the others' demotions at once (so
    ``SsdTier.begin_write`` evicts nothing for them)."""
    need = 0
    by_tenant: dict[str, int] = {}  # demoted bytes per tenant with an SSD quota
    for skey in window:
        if skey in dram.copies:
            continue
        if ssd is None:
            return False
        charge = demote_charge(ssd, skey, dram)
        if charge is None:
            return False
        need += charge
        tenants = ssd.tenants
        if charge and tenants is not None and tenants.ssd_room_bytes(skey) is not None:
            t = tenants.tenant(skey)
            by_tenant[t] = by_tenant.get(t, 0) + dram.entries[skey].size_bytes
            room = tenants.ssd_room_bytes(skey)
            if room is not None and by_tenant[t] > room:
                return False  # the window's demotions together pass that tenant's quota
    return need == 0 or (ssd is not None and ssd.used_bytes + need <= ssd.capacity_bytes)


class SpareBytes:
    """The DRAM bytes a store can give up without dropping a block from the pool, kept
    current as its block maps change (O(1) per change, no scan): remote-fill copies (a peer
    holds them) and DRAM blocks whose bytes are on the node's SSD too (a promoted block: the
    same key in both tiers). Such bytes are room, not use: the node's next allocation frees
    them first (``Transit.allocate``'s spare victims), so a node full of them is no full
    node (issue 17 §3). A block in both tiers counts once, on its DRAM side (its SSD file is
    the one that stays), as allocated (rounded up to the arena's unit). Pins are not looked
    at: a block being read counts (a read's pin is short).

    Installed by the store as the ``on_change`` hook of its observed DRAM and SSD maps
    (tiers/feed.py), which also fires for copy marks. Lock: the store's (the hooks run
    under it).
    """

    def __init__(self, dram: DramTier, ssd: SsdTier | None) -> None:
        self._dram = dram
        self._ssd = ssd
        self._counted: dict[bytes, int] = {}
        self.total = 0
        """Bytes counted now."""

    def recheck_many(self, skeys: Iterable[bytes]) -> None:
        """:meth:`recheck` of each key, in order (a batch of commits: one call)."""
        dram = self._dram
        entries, copies, round_up = dram.entries, dram.copies, dram.round_up
        ssd_entries = None if self._ssd is None else self._ssd.entries
        counted = self._counted
        for skey in skeys:
            e = entries.get(skey)
            spare = e is not None and (skey in copies
                                       or (ssd_entries is not None and skey in ssd_entries))
            had = counted.get(skey)
            if spare:
                assert e is not None
                n = round_up(e.size_bytes)
                if had != n:
                    counted[skey] = n
                    self.total += n - (had or 0)
            elif had is not None:
                del counted[skey]
                self.total -= had

    def recheck(self, skey: bytes) -> None:
        """The block ``skey`` joined or left a map (or its copy mark changed): count it, or
        stop counting it, as it is now."""
        dram = self._dram
        e = dram.entries.get(skey)
        spare = e is not None and (skey in dram.copies
                                   or (self._ssd is not None and skey in self._ssd.entries))
        had = self._counted.get(skey)
        if spare:
            assert e is not None
            n = dram.round_up(e.size_bytes)
            if had != n:
                self._counted[skey] = n
                self.total += n - (had or 0)
        elif had is not None:
            del self._counted[skey]
            self.total -= had


MAX_AGE_SCAN = 64
"""Most entries per tier :func:`coldest_original_touched` looks at from the cold end."""


def coldest_original_touched(dram: DramTier, ssd: SsdTier | None,
                             max_scan: int = MAX_AGE_SCAN) -> float | None:
    """The ``touched`` stamp (monotonic s) of the coldest *original* block: one the pool
    holds nowhere else as far as this node knows (not a remote-fill copy), i.e. the block
    this node's next eviction for good would drop (pool LRU, docs/cluster.md).

    Looks at the cold end of each tier only (at most ``max_scan`` entries each: the block
    maps are in LRU order, so their heads are the oldest): SSD blocks not also in DRAM
    (a block in both tiers counts by its DRAM entry, the more recent use), then DRAM blocks
    that are not copies. None when the node holds no original. Lock held.
    """
    oldest: float | None = None
    if ssd is not None:
        for n, (skey, se) in enumerate(ssd.entries.items()):
            if n >= max_scan:
                break
            if skey in dram.entries:
                continue
            if oldest is None or se.touched < oldest:
                oldest = se.touched
    copies = dram.copies
    for n, (skey, de) in enumerate(dram.entries.items()):
        if n >= max_scan:
            break
        if skey in copies:
            continue
        if oldest is None or de.touched < oldest:
            oldest = de.touched
    return oldest
