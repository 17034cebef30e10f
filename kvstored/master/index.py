"""BlockIndex: the master's map (namespace id, block hash) -> replicas, packed in numpy columns.

A facade over parts composed on one :class:`~kvstored.master.columns.IndexColumns` (the
packed storage: key tables, block, row and holder columns; its module docstring draws
them), each part one concern::

    columns.py      storage and its primitives (slots, rows, chains, holder row lists)
    holders.py      holders: readability, load, retirement, GC of retired holders' rows
    ranking.py      which replica a lookup returns (vectorized, bounded per block)
    generations.py  generations and the rows of one two-phase write (commit / abort)
    index.py        this: replicas added, removed and listed; lookups

A *holder* is one incarnation of a node as the membership sees it: (node id, epoch, sync);
a replica is readable only while its holder is readable (master/holders.py).

Invariants:

- A row whose holder was retired is never returned, counted or committed (retired holders
  never become readable again: ids are not reused).
- A block with no row is not in its namespace's key table (absent = missing cluster-wide).
- Rows of one (block, holder, tier) are unique.
- A block's wanted replication factor (``factor[slot]``, 0 = the default 1) only rises while
  the block is indexed (the highest any writer or holder asked for); a block that loses
  its last row keeps it for when it is indexed again (bounded, columns.py), and nodes
  report it again in their inventories and events.

Not thread-safe: the master mutates it from its event loop only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvstored import native
from kvstored.errors import InvalidArgument
from kvstored.master import generations
from kvstored.master.columns import HOT_CHAIN_ROWS, MAX_RECENT_FACTORS, NO_ROW, IndexColumns
from kvstored.master.holders import HolderRows
from kvstored.master.keytable import KEY_BYTES, keys_to_words
from kvstored.master.ranking import MAX_RANKED_REPLICAS, best_rows, native_args, ranked_rows
from kvstored.master.types import (
    COPY_BIT,
    EMPTY_HIT,
    MAX_REPLICAS,
    MAX_SIZE_BYTES,
    STATE_MASK,
    Alternates,
    EventColumns,
    EventKind,
    PrefixHit,
    Replica,
    ReplicaState,
)
from kvstored.types import Tier


def _has_long(keys: Sequence[bytes]) -> bool:
    return any(len(k) != KEY_BYTES for k in keys)


_COMMITTED = int(ReplicaState.COMMITTED)
_ADDED = int(EventKind.ADDED)
_REMOVED = int(EventKind.REMOVED)
_APPLY_CONSTS = (_ADDED, _REMOVED, _COMMITTED, STATE_MASK, COPY_BIT, MAX_SIZE_BYTES, MAX_REPLICAS,
                 HOT_CHAIN_ROWS, MAX_RECENT_FACTORS)
_DRAM = int(Tier.DRAM)
_SSD = int(Tier.SSD)


def _check_batch(tiers: np.ndarray, sizes: np.ndarray, factors: np.ndarray) -> None:
    """Raises InvalidArgument naming the first bad tier, size or factor of a batch."""
    bad = (tiers != _DRAM) & (tiers != _SSD)
    if bad.any():
        raise InvalidArgument(f"tier must be DRAM (1) or SSD (2), got {int(tiers[bad][0])}")
    bad = (sizes < 0) | (sizes > MAX_SIZE_BYTES)
    if bad.any():
        raise InvalidArgument(f"size_bytes must be in [0, {MAX_SIZE_BYTES}], got "
                              f"{int(sizes[bad][0])}")
    bad = (factors < 0) | (factors > MAX_REPLICAS)
    if bad.any():
        raise InvalidArgument(f"every replication factor must be in 0..{MAX_REPLICAS} "
                              f"(0 = unknown), got {int(factors[bad][0])}")


def _check_factor(factor: int) -> None:
    if not 0 <= factor <= MAX_REPLICAS:
        raise InvalidArgument(f"replication factor must be in 0..{MAX_REPLICAS} (0 = unknown "
                              f"or the default 1), got {factor}")


_POSITIONS = [np.zeros(0, np.int64)]  # (a list: grown in place)


def _positions(n: int) -> np.ndarray:
    """``np.arange(n)`` (int64, read-only): a view of one shared array, grown by doubling."""
    got = _POSITIONS[0]
    if len(got) < n:
        got = np.arange(max(n, 2 * len(got)), dtype=np.int64)
        got.flags.writeable = False
        _POSITIONS[0] = got
    return got[:n]


_NO_HOLDERS = np.zeros(0, np.int64)
_NO_HOLDERS.flags.writeable = False  # (shared: no avoided holders)


@dataclass(frozen=True, slots=True)
class WireHit:
    """Answer of :meth:`BlockIndex.lookup_wire`: a LookupPrefix answer's columns, encoded.

    Attributes:
        wire: the packed repeated fields of a ``MasterLookupPrefixResponse`` (``node_index``,
            ``tier``, ``size_bytes``, ``generation``; ``key_index`` for ``every_key``; the
            ``num_alternates`` and ``alternate_*`` columns when alternates were asked), as
            protobuf wire bytes; ``node_index`` counts into :attr:`holders`.
        holders: the distinct holders named, ascending (the response's ``nodes``, in order).
        num_blocks: blocks answered.
        best_holders: the bytes of an int64 array: each answered block's best holder.
        positions: the bytes of an int64 array: each answered block's index in the keys.
    """

    wire: bytes
    holders: list[int]
    num_blocks: int
    best_holders: bytes
    positions: bytes


class BlockIndex:
    """Cluster block index over packed numpy columns (see the module docstring).

    Args:
        initial_blocks: block slots and replica rows allocated up front (grown by doubling).
    """

    def __init__(self, initial_blocks: int = 1024) -> None:
        self._cols = IndexColumns(initial_blocks)
        self._holders = HolderRows(self._cols)

    @property
    def columns(self) -> IndexColumns:
        """The packed storage (read by tests and benchmarks that measure it; mutate it only
        through this index)."""
        return self._cols

    # ---- sizes -----------------------------------------------------------------------
    @property
    def num_replicas(self) -> int:
        """Replicas of holders not retired (readable or not), WRITING included."""
        c = self._cols
        return c.num_rows_used - len(c.free_rows) - self._holders.num_dead_rows

    @property
    def num_blocks(self) -> int:
        """Blocks with at least one row (garbage rows of retired holders included)."""
        return self._cols.num_blocks

    @property
    def num_garbage_rows(self) -> int:
        """Rows of retired holders not yet unlinked by :meth:`collect_garbage`."""
        return self._holders.num_dead_rows

    def column_bytes(self) -> int:
        """Bytes held by the numpy columns (capacity included; dicts and keys excluded)."""
        return self._cols.column_bytes()

    def memory_bytes(self) -> int:
        """Bytes of every numpy structure (columns and key tables, capacity included);
        excludes the small Python lists of free slots and keys longer than 16 bytes."""
        return self._cols.column_bytes() + self._cols.table_bytes()

    # ---- holders (master/holders.py) -------------------------------------------------
    def add_holder(self) -> int:
        """A new holder id (starts unreadable; never reused)."""
        return self._holders.add_holder()

    def set_readable(self, holder: int, readable: bool) -> None:
        """Let lookups return (or stop returning) this holder's committed replicas.

        Raises:
            InvalidArgument: unknown holder, or making a retired holder readable.
        """
        self._holders.set_readable(holder, readable)

    def is_readable(self, holder: int) -> bool:
        """Whether lookups may return this holder's replicas."""
        return self._holders.is_readable(holder)

    def set_load(self, holder: int, load: float) -> None:
        """The holder's load (lower is preferred among replicas of equal rank).

        Raises:
            InvalidArgument: unknown holder.
        """
        self._holders.set_load(holder, load)

    def retire_holder(self, holder: int) -> int:
        """Drop every replica of a holder at once (O(1)); rows are unlinked by GC later.

        Returns:
            How many rows the holder had (all of them are now garbage).

        Raises:
            InvalidArgument: unknown holder.
        """
        return self._holders.retire_holder(holder)

    def num_holder_replicas(self, holder: int) -> int:
        """Replica rows of a holder (0 once retired).

        Raises:
            InvalidArgument: unknown holder.
        """
        return self._holders.num_holder_replicas(holder)

    def collect_garbage(self, max_rows: int = 65536, *,
                        on_only_copies: Callable[[bytes, bytes], None] | None = None) -> int:
        """Unlink up to ``max_rows`` rows of retired holders (:meth:`HolderRows.collect_garbage
        <kvstored.master.holders.HolderRows.collect_garbage>`: bounded work, its callback).

        Returns:
            Rows unlinked (0 when there is no garbage).
        """
        return self._holders.collect_garbage(max_rows, on_only_copies=on_only_copies)

    def holder_keys(self, holder: int) -> list[tuple[bytes, bytes, Tier]]:
        """(namespace_id, key, tier) of every row of a holder (admin and tests; O(its rows))."""
        return self._holders.holder_keys(holder)

    # ---- replicas --------------------------------------------------------------------
    def _check_row_args(self, holder: int, tier: Tier, size_bytes: int) -> None:
        self._holders.check_holder(holder)
        c = self._cols
        if c.retired[holder]:
            raise InvalidArgument(f"holder {holder} is retired; register the node again")
        if tier not in (Tier.DRAM, Tier.SSD):
            raise InvalidArgument(f"tier must be DRAM or SSD, got {tier!r}")
        if not 0 <= size_bytes <= MAX_SIZE_BYTES:
            raise InvalidArgument(
                f"size_bytes must be in [0, {MAX_SIZE_BYTES}], got {size_bytes}"
            )

    def add_replica(
        self,
        namespace_id: bytes,
        key: bytes,
        *,
        holder: int,
        tier: Tier,
        size_bytes: int,
        generation: int,
        state: ReplicaState = ReplicaState.COMMITTED,
        replace_generation: bool = False,
        copy: bool = False,
        factor: int = 0,
    ) -> bool:
        """Index one replica; idempotent for an existing (block, holder, tier).

        An existing row keeps its state unless this one commits it (size, generation and
        ``copy`` are then taken from this call). With ``replace_generation`` (the holder
        reported the replica under its own generation: it is the authority on what it
        holds) an existing COMMITTED row takes this call's size, generation and ``copy``
        too. ``copy`` (a remote-fill copy, COMMITTED only) is kept in the state byte.
        ``factor``: the block's wanted replication factor as the caller knows it (0 =
        unknown, nothing changes; see :meth:`record_replication_factor`).

        Returns:
            True if a row was added, False if (block, holder, tier) was already indexed.

        Raises:
            InvalidArgument: unknown or retired holder, bad tier, size or factor.
        """
        c = self._cols
        self._check_row_args(holder, tier, size_bytes)
        _check_factor(factor)
        ns = c.ns(namespace_id, create=True)
        assert ns is not None
        slot = c.slot(ns, key)
        if slot is None:
            slot = c.new_block(ns, key)
        else:
            row, _ = c.find_row(slot, holder, int(tier))
            if factor > c.factor[slot]:
                c.factor[slot] = factor
            if row != NO_ROW:
                if state is ReplicaState.COMMITTED and (replace_generation or (
                        c.state[row] & STATE_MASK) != ReplicaState.COMMITTED):
                    c.state[row] = ReplicaState.COMMITTED | (COPY_BIT if copy else 0)
                    c.size[row] = size_bytes
                    c.gen[row] = generation
                return False
        if factor > c.factor[slot]:  # a new block (its factor starts at 0)
            c.factor[slot] = factor
        row = c.new_row()
        c.holder[row] = holder
        c.tier[row] = int(tier)
        c.state[row] = int(state) | (COPY_BIT if copy and state is ReplicaState.COMMITTED
                                     else 0)
        c.size[row] = size_bytes
        c.gen[row] = generation
        c.link_row(slot, row)
        c.holder_rows[holder] += 1
        c.link_holder_one(holder, row)
        return True

    def add_replicas_bulk(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        *,
        holder: int,
        tiers: Sequence[int] | np.ndarray,
        sizes: Sequence[int] | np.ndarray,
        generation: int | Sequence[int] | np.ndarray,
        copies: Sequence[bool] | np.ndarray | None = None,
        factors: Sequence[int] | np.ndarray | None = None,
    ) -> int:
        """Index many COMMITTED replicas of one holder (inventory sync, benchmarks).

        ``copies``: per key, a remote-fill copy (see :meth:`add_replica`); None = none.
        ``factors``: per key, the wanted replication factor the holder knows (0 = unknown;
        see :meth:`record_replication_factor`); None = none known.

        Idempotent like :meth:`add_replica`: a (key, tier) repeated in the batch, or one
        the holder already has, is indexed once (existing rows are left as they are).
        ``generation``: one for every row, or one per key (the holder's own, in ``[1,
        2**63)``).

        Returns:
            Rows added.

        Raises:
            InvalidArgument: unknown or retired holder, lengths differ, bad tier, size or
                factor.
        """
        c = self._cols
        n = len(keys)
        factor_arr = None
        if factors is not None:
            factor_arr = np.asarray(factors, dtype=np.int64)
            if len(factor_arr) != n:
                raise InvalidArgument(f"factors must have one entry per key; got "
                                      f"{len(factor_arr)} for {n} keys")
            if n and (factor_arr.min() < 0 or factor_arr.max() > MAX_REPLICAS):
                bad = factor_arr[(factor_arr < 0) | (factor_arr > MAX_REPLICAS)][0]
                raise InvalidArgument(f"every replication factor must be in 0..{MAX_REPLICAS} "
                                      f"(0 = unknown), got {int(bad)}")
        tier_arr = np.asarray(tiers, dtype=np.int64)
        size_arr = np.asarray(sizes, dtype=np.int64)
        if len(tier_arr) != n or len(size_arr) != n:
            raise InvalidArgument(
                f"keys, tiers and sizes must have one entry each; got {n}, {len(tier_arr)}, "
                f"{len(size_arr)}"
            )
        gen_arr = np.full(n, generation, dtype=np.uint64) if isinstance(generation, int) \
            else np.asarray(generation, dtype=np.uint64)
        state_arr = np.full(n, int(ReplicaState.COMMITTED), dtype=np.uint8)
        if copies is not None:
            if len(copies) != n:
                raise InvalidArgument(f"copies must have one entry per key; got {len(copies)} "
                                      f"for {n} keys")
            state_arr[np.asarray(copies, dtype=np.bool_)] |= COPY_BIT
        if len(gen_arr) != n:
            raise InvalidArgument(f"generation must be one int or one per key; got "
                                  f"{len(gen_arr)} for {n} keys")
        if n == 0:
            return 0
        self._check_row_args(holder, Tier.DRAM, 0)
        if not np.isin(tier_arr, (int(Tier.DRAM), int(Tier.SSD))).all():
            bad = tier_arr[~np.isin(tier_arr, (int(Tier.DRAM), int(Tier.SSD)))][0]
            raise InvalidArgument(f"tier must be DRAM (1) or SSD (2), got {int(bad)}")
        if (size_arr < 0).any() or (size_arr > MAX_SIZE_BYTES).any():
            raise InvalidArgument(f"every size_bytes must be in [0, {MAX_SIZE_BYTES}]")
        ns = c.ns(namespace_id, create=True)
        assert ns is not None
        words = keys_to_words(keys)
        _, first_of, inverse = np.unique(words.view(np.dtype((np.void, 16))).ravel(),
                                            return_index=True, return_inverse=True)
        uwords = words[first_of]
        uslots = c.tables[ns].get_many(uwords)
        absent = np.flatnonzero(uslots < 0)
        if len(absent):
            uslots[absent] = c.new_blocks(ns, uwords[absent],
                                              [keys[int(first_of[i])] for i in absent]
                                              if _has_long(keys) else [])
        slots = uslots[inverse.ravel()]
        if factor_arr is not None and factor_arr.any():  # raise-only, duplicates: the max
            np.maximum.at(c.factor, slots, factor_arr.astype(np.uint8))
        # one row per distinct (slot, tier); duplicates in the batch are dropped
        combo = slots * 4 + tier_arr
        _, first = np.unique(combo, return_index=True)
        if len(first) != n:
            first.sort()
            slots, tier_arr, size_arr = slots[first], tier_arr[first], size_arr[first]
            gen_arr, state_arr = gen_arr[first], state_arr[first]
        # rows this holder already has (an earlier chunk repeated a block): kept, not doubled
        have = c.find_rows(slots, holder, tier_arr) >= 0
        if have.any():
            keep = ~have
            slots, tier_arr, size_arr = slots[keep], tier_arr[keep], size_arr[keep]
            gen_arr, state_arr = gen_arr[keep], state_arr[keep]
            if len(slots) == 0:
                return 0
        rows = c.new_rows(len(slots))
        c.holder[rows] = holder
        c.tier[rows] = tier_arr
        c.state[rows] = state_arr
        c.size[rows] = size_arr
        c.gen[rows] = gen_arr
        c.link_rows(slots, rows)
        c.holder_rows[holder] += len(rows)
        c.link_holder(holder, rows)
        return len(rows)

    def add_replicas_batch(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        *,
        holder: int,
        tiers: np.ndarray,
        sizes: np.ndarray,
        generations: np.ndarray,
        replace_generation: np.ndarray,
        copies: np.ndarray,
        factors: np.ndarray,
    ) -> np.ndarray:
        """:meth:`add_replica` (COMMITTED) of many distinct keys of one holder, vectorized
        (a ReportEvents batch: master/membership.py); the same outcome as one call per key.

        Args:
            keys: distinct keys (a key repeated in one batch is refused: apply such events
                in order, one batch per run of distinct keys).
            tiers, sizes, generations, replace_generation, copies, factors: one per key
                (int tiers 1/2, sizes in bytes, generations in [1, 2**63), bools, factors
                0..MAX_REPLICAS), as :meth:`add_replica` takes them.

        Returns:
            int8 per key: 1 a row was added, 2 the holder's uncommitted (WRITING) row was
            committed, 0 a committed row was already indexed (its size, generation and
            ``copy`` replaced when ``replace_generation``).

        Raises:
            InvalidArgument: unknown or retired holder, a repeated key, lengths differ,
                bad tier, size or factor.
        """
        c = self._cols
        n = len(keys)
        tier_arr = np.asarray(tiers, dtype=np.int64)
        size_arr = np.asarray(sizes, dtype=np.int64)
        gen_arr = np.asarray(generations, dtype=np.uint64)
        repl = np.asarray(replace_generation, dtype=np.bool_)
        copy_arr = np.asarray(copies, dtype=np.bool_)
        factor_arr = np.asarray(factors, dtype=np.int64)
        lengths = {len(tier_arr), len(size_arr), len(gen_arr), len(repl), len(copy_arr),
                   len(factor_arr)}
        if lengths != {n}:
            raise InvalidArgument(f"keys, tiers, sizes, generations, replace_generation, copies "
                                  f"and factors must have one entry per key ({n} keys); got "
                                  f"lengths {sorted(lengths)}")
        out = np.zeros(n, dtype=np.int8)
        if n == 0:
            return out
        self._check_row_args(holder, Tier.DRAM, 0)
        _check_batch(tier_arr, size_arr, factor_arr)
        if len(set(keys)) != n:
            raise InvalidArgument(f"add_replicas_batch: keys must be distinct; {n} keys hold "
                                  f"{len(set(keys))} distinct ones")
        ns = c.ns(namespace_id, create=True)
        assert ns is not None
        words = keys_to_words(keys)
        slots = c.tables[ns].get_many(words)
        absent = np.flatnonzero(slots < 0)
        present = np.flatnonzero(slots >= 0)
        if len(absent):
            slots[absent] = c.new_blocks(ns, words[absent],
                                         [keys[i] for i in absent.tolist()]
                                         if _has_long(keys) else [])
        if factor_arr.any():  # raise-only (distinct slots: no duplicate to combine)
            c.factor[slots] = np.maximum(c.factor[slots], factor_arr.astype(np.uint8))
        state_new = np.where(copy_arr, _COMMITTED | COPY_BIT, _COMMITTED).astype(np.uint8)
        new_idx = absent
        if len(present):
            rows = c.find_rows(slots[present], holder, tier_arr[present])
            have = rows >= 0
            if have.any():
                hi = present[have]
                hr = rows[have]
                uncommitted = (c.state[hr] & STATE_MASK) != _COMMITTED
                upd = uncommitted | repl[hi]
                ur, ui = hr[upd], hi[upd]
                c.state[ur] = state_new[ui]
                c.size[ur] = size_arr[ui]
                c.gen[ur] = gen_arr[ui]
                out[hi[uncommitted]] = 2
                new_idx = np.concatenate([absent, present[~have]])
            else:
                new_idx = np.concatenate([absent, present])
        if len(new_idx):
            new_idx.sort()  # key order: the rows' order in the holder's list
            rows = c.new_rows(len(new_idx))
            c.holder[rows] = holder
            c.tier[rows] = tier_arr[new_idx]
            c.state[rows] = state_new[new_idx]
            c.size[rows] = size_arr[new_idx]
            c.gen[rows] = gen_arr[new_idx]
            c.link_rows(slots[new_idx], rows)
            c.holder_rows[holder] += len(rows)
            c.link_holder(holder, rows)
            out[new_idx] = 1
        return out

    def apply_events_native(self, namespace_id: bytes, events: EventColumns, run: Sequence[int], *,
                            holder: int, next_generation: int
                            ) -> tuple[int, list[tuple[int, int]], np.ndarray] | None:
        """Events ``run`` of ``events`` (distinct blocks of one namespace, in order) applied to
        ``holder``'s rows in one C call (native/master.c ``apply_events``), with the outcome of
        :meth:`add_replicas_batch` of the ADDED ones (an ADDED event with generation 0 takes
        ``next_generation``, the next one, ... in order; the holder's own replaces a row's),
        then :meth:`remove_replicas_batch` of the REMOVED ones, then
        :meth:`copy_holders_to_promote` of the blocks that lost a row.

        Returns:
            ``(generations taken, [(event, holder whose copy to promote)], codes)``: codes
            int8 per event of ``run``, those of :meth:`add_replicas_batch` for ADDED events
            and of :meth:`remove_replicas_batch` for REMOVED ones; None when the
            extension is not built or the run is not one C applies (a key not of 16 bytes, a
            value out of range, a retired holder): nothing changed, apply it with the batch
            methods (which name what was wrong).
        """
        c = self._cols
        impl = c.native_loops()  # (the C maps: an index made without the extension has none)
        bc = events.blocks
        kinds, keys = events.kinds, bc.keys
        if impl is None or type(kinds) is not list or type(keys) is not list:
            return None
        whole = len(run) == len(kinds)
        num_added = kinds.count(_ADDED) if whole else sum(kinds[i] == _ADDED for i in run)
        ns = c.ns(namespace_id, create=num_added > 0)
        if ns is None:  # only REMOVED events of a namespace never indexed: nothing to do
            return 0, [], np.zeros(len(run), np.int8)
        if not 0 <= holder < self._holders.num_holders:
            return None
        c.reserve(num_added, num_added)
        table = c.tables[ns]
        if num_added and not table.has_room(num_added):  # exactly as insert_many would grow
            add_keys = [keys[i] for i in run if kinds[i] == _ADDED]
            table.reserve(int((table.get_many(keys_to_words(add_keys)) < 0).sum()))
        idx = _positions(len(run)) if whole else np.asarray(run, dtype=np.int64)
        codes = np.empty(len(run), np.int8)
        got = impl.apply_events(c, table, ns, holder, idx, kinds, keys,
                                np.ascontiguousarray(bc.tiers, np.int64),
                                np.ascontiguousarray(bc.sizes, np.int64),
                                np.ascontiguousarray(bc.generations, np.uint64),
                                np.ascontiguousarray(bc.copies, np.bool_),
                                np.ascontiguousarray(bc.replicas, np.int64),
                                next_generation, codes, _APPLY_CONSTS)
        if got is None:
            return None
        fresh_rows, fresh_slots, gens_taken, live_delta, promote = got
        c.num_rows_used += fresh_rows
        c.num_slots += fresh_slots
        table.add_live(live_delta)
        return gens_taken, promote, codes

    def remove_replicas_batch(self, namespace_id: bytes, keys: Sequence[bytes], *, holder: int,
                              tiers: np.ndarray) -> np.ndarray:
        """:meth:`remove_replica` of many keys of one holder (one lookup of their slots and
        rows for the whole batch; the same outcome as one call per key, in order).

        Args:
            tiers: one int tier per key.

        Returns:
            int8 per key: 0 not indexed, 1 an uncommitted row dropped, 2 a COMMITTED row
            dropped.

        Raises:
            InvalidArgument: ``tiers`` has not one entry per key.
        """
        c = self._cols
        n = len(keys)
        tier_arr = np.asarray(tiers, dtype=np.int64)
        if len(tier_arr) != n:
            raise InvalidArgument(f"tiers must have one entry per key; got {len(tier_arr)} "
                                  f"for {n} keys")
        out = np.zeros(n, dtype=np.int8)
        ns = c.ns(namespace_id, create=False)
        if ns is None or n == 0 or not 0 <= holder < self._holders.num_holders:
            return out
        slots = c.tables[ns].get_many(keys_to_words(keys))
        present = np.flatnonzero(slots >= 0)
        if len(present) == 0:
            return out
        rows = c.find_rows(slots[present], holder, tier_arr[present])
        have = rows >= 0
        idx, rows = present[have], rows[have]
        if len(rows) == 0:
            return out
        out[idx] = np.where((c.state[rows] & STATE_MASK) == _COMMITTED, 2, 1)
        _, first = np.unique(rows, return_index=True)
        if len(first) != len(rows):  # a (key, tier) repeated in the batch: gone at its first
            keep = np.zeros(len(rows), dtype=np.bool_)
            keep[first] = True
            out[idx[~keep]] = 0
            idx, rows = idx[keep], rows[keep]
        c.holder_rows[holder] -= len(rows)
        if c.retired[holder]:
            self._holders.num_dead_rows -= len(rows)
        c.unlink_many(slots[idx], rows)
        return out

    def copy_holders_to_promote(self, namespace_id: bytes, keys: Sequence[bytes]) -> list[int | None]:
        """Per key: the holder whose copy should become the block's original, if any (the
        rule of :func:`kvstored.master.copies.copy_to_promote`, vectorized: each chain is
        walked until its first replica that is not a committed copy).

        Returns:
            Per key, the lowest readable holder of a COMMITTED copy when every replica of
            holders not retired is a committed copy; None otherwise (an original or a
            WRITING replica remains, no readable copy, or the block is not indexed).
        """
        c = self._cols
        ns = c.ns(namespace_id, create=False)
        if ns is None or not keys:
            return [None] * len(keys)
        slots = c.tables[ns].get_many(keys_to_words(keys))
        n = len(slots)
        best = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        bad = np.zeros(n, dtype=np.bool_)
        cur = np.full(n, NO_ROW, dtype=np.int64)
        ok = slots >= 0
        cur[ok] = c.head[slots[ok]]
        idx = np.flatnonzero(cur >= 0)
        while len(idx):
            r = cur[idx]
            h = c.holder[r].astype(np.int64)
            live = ~c.retired[h]
            st = c.state[r]
            copy = ((st & STATE_MASK) == _COMMITTED) & ((st & COPY_BIT) != 0)
            bad[idx] |= live & ~copy
            take = live & copy & c.readable[h]
            np.minimum.at(best, idx[take], h[take])
            cur[idx] = c.next[r]
            idx = idx[(cur[idx] >= 0) & ~bad[idx]]
        found = ~bad & (best != np.iinfo(np.int64).max)
        return [int(b) if f else None for b, f in zip(best.tolist(), found.tolist(), strict=True)]

    def remove_replica(self, namespace_id: bytes, key: bytes, *, holder: int, tier: Tier) -> bool:
        """Drop one replica (a node evicted or removed it).

        Returns:
            True if it was indexed.
        """
        c = self._cols
        ns = c.ns(namespace_id, create=False)
        if ns is None:
            return False
        slot = c.slot(ns, key)
        if slot is None:
            return False
        row, prev = c.find_row(slot, holder, int(tier))
        if row == NO_ROW:
            return False
        c.holder_rows[holder] -= 1
        if c.retired[holder]:  # a garbage row unlinked before GC reached it
            self._holders.num_dead_rows -= 1
        c.unlink(slot, row, prev)
        return True

    def replicas(self, namespace_id: bytes, key: bytes, *, readable_only: bool = False) -> list[Replica]:
        """Every replica of a block whose holder is not retired (newest row first).

        Args:
            readable_only: only COMMITTED replicas of readable holders.
        """
        c = self._cols
        ns = c.ns(namespace_id, create=False)
        if ns is None:
            return []
        slot = c.slot(ns, key)
        if slot is None:
            return []
        out = []
        row = int(c.head[slot])
        while row != NO_ROW:
            h = int(c.holder[row])
            raw = int(c.state[row])
            st = raw & STATE_MASK
            if not c.retired[h] and (
                not readable_only or (c.readable[h] and st == ReplicaState.COMMITTED)
            ):
                out.append(Replica(h, Tier(int(c.tier[row])), int(c.size[row]),
                                   int(c.gen[row]), ReplicaState(st), bool(raw & COPY_BIT)))
            row = int(c.next[row])
        return out

    # ---- replication factor ----------------------------------------------------------
    def replication_factor(self, namespace_id: bytes, key: bytes) -> int:
        """The block's wanted replication factor: the highest a writer (PutStart
        ``replicas``) or a holder (``BlockRef.replicas``) asked for while it is indexed.

        Returns:
            1..:data:`MAX_REPLICAS` for an indexed block (1 when nobody asked for more);
            0 when the block is not indexed (no row, WRITING ones included).
        """
        slot = self._write_slot(namespace_id, key)
        if slot is None:
            return 0
        return max(1, int(self._cols.factor[slot]))

    def replication_factors(self, namespace_id: bytes, keys: Sequence[bytes]) -> np.ndarray:
        """:meth:`replication_factor` of many keys (vectorized): uint8, one per key."""
        c = self._cols
        ns = c.ns(namespace_id, create=False)
        if ns is None or not keys:
            return np.zeros(len(keys), np.uint8)
        slots = c.tables[ns].get_many(keys_to_words(keys))
        out = np.zeros(len(keys), np.uint8)
        present = slots >= 0
        out[present] = np.maximum(c.factor[slots[present]], 1)
        return out

    def record_replication_factor(self, namespace_id: bytes, key: bytes, factor: int) -> bool:
        """Raise an indexed block's wanted replication factor to ``factor`` (never lowers
        it: a holder that does not know the factor, or an older one, reports less).

        Returns:
            True if the block is indexed (its factor is now at least ``factor``), False if
            it is not (nothing is recorded: a factor lives with the block's rows).

        Raises:
            InvalidArgument: ``factor`` outside 0..:data:`MAX_REPLICAS`.
        """
        _check_factor(factor)
        slot = self._write_slot(namespace_id, key)
        if slot is None:
            return False
        if factor > self._cols.factor[slot]:
            self._cols.factor[slot] = factor
        return True

    def blocks_above_factor(self, factor: int = 1) -> list[tuple[bytes, bytes]]:
        """``(namespace_id, key)`` of every indexed block whose wanted replication factor is
        above ``factor`` (the repair's background pass, kvstored/master/repair.py).

        Cost: one vectorized pass over the factor column (1 byte per block slot), then
        O(matches) in Python.
        """
        c = self._cols
        slots = np.flatnonzero(c.factor[:c.num_slots] > factor)
        return [c.key_of(s) for s in slots.tolist() if c.head[s] != NO_ROW]

    def _write_slot(self, namespace_id: bytes, key: bytes) -> int | None:
        c = self._cols
        return c.slot(c.ns(namespace_id, create=False), key)

    def commit_generation(self, namespace_id: bytes, key: bytes, generation: int) -> int:
        """Commit the WRITING replicas of one write (PutEnd commit).

        Returns:
            Replicas committed; 0 when no WRITING replica of that generation exists (a
            stale or unknown write: the caller refuses it).
        """
        return generations.commit_write(self._cols, self._write_slot(namespace_id, key),
                                        generation)

    def abort_generation(self, namespace_id: bytes, key: bytes, generation: int) -> int:
        """Drop the WRITING replicas of one write (PutEnd abort, or a lapsed write lease).

        Returns:
            Replicas dropped (0: no such write in progress).
        """
        return generations.abort_write(self._cols, self._write_slot(namespace_id, key),
                                       generation)

    # ---- lookup (ranking: master/ranking.py) -----------------------------------------
    def _rank(self, slots: np.ndarray, local_holder: int, avoid_holders: Sequence[int],
              max_alternates: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(best rows, their holders, ranked rows or None)`` of some block slots: the
        plain ranking when neither avoid nor alternates are asked (the hot path), else
        :func:`ranked_rows` (``(num_blocks, 1 + max_alternates)`` rows)."""
        if not 0 <= max_alternates < MAX_RANKED_REPLICAS:
            raise InvalidArgument(f"max_alternates must be in 0..{MAX_RANKED_REPLICAS - 1}, "
                                  f"got {max_alternates}")
        if not len(avoid_holders) and not max_alternates:
            best_row, best_holder = best_rows(self._cols, slots, local_holder)
            return best_row, best_holder, None
        rows, holders = ranked_rows(self._cols, slots, local_holder,
                                    avoid=np.asarray(avoid_holders, np.int64),
                                    width=1 + max_alternates)
        return rows[:, 0], holders[:, 0], rows

    def _hit(self, best_row: np.ndarray, best_holder: np.ndarray,
             ranked: np.ndarray | None) -> PrefixHit:
        """A :class:`PrefixHit` of answered blocks (every ``best_row`` readable), with
        their alternates when ``ranked`` holds them (columns after the first)."""
        c = self._cols
        alternates = None
        if ranked is not None and ranked.shape[1] > 1:
            alt = ranked[:, 1:]
            ok = alt >= 0  # a prefix of each row: ranked_rows packs the valid ones first
            flat = alt[ok]
            alternates = Alternates(ok.sum(axis=1).astype(np.int64),
                                    c.holder[flat].astype(np.int64), c.tier[flat],
                                    c.size[flat], c.gen[flat])
        return PrefixHit(best_holder, c.tier[best_row], c.size[best_row], c.gen[best_row],
                         alternates)

    def lookup_prefix(
        self, namespace_id: bytes, keys: Sequence[bytes], *, local_holder: int = -1,
        avoid_holders: Sequence[int] = (), max_alternates: int = 0,
    ) -> PrefixHit:
        """Longest prefix present cluster-wide and the best replica of each of its blocks.

        Stops at the first block without a readable COMMITTED replica. Best = local DRAM >
        local SSD > remote DRAM > remote SSD, then an original over a remote-fill copy, then
        the least loaded holder, then the lowest holder id (deterministic; master/ranking.py,
        which also bounds the rows ranked per block). Never pins, touches or changes
        anything.

        Args:
            namespace_id: the blocks' namespace.
            keys: the prefix's block hashes, in order.
            local_holder: the asking node's holder id (-1: every replica is remote).
            avoid_holders: holders the asker found unreachable: ranked after every other
                readable replica (still answered when nothing else is readable).
            max_alternates: also answer up to this many other readable replicas of each
                block on distinct holders, ranked (``hit.alternates``; 0 = none).

        Returns:
            The best replica of each leading present block, as columns.

        Raises:
            InvalidArgument: ``max_alternates`` outside 0..MAX_RANKED_REPLICAS - 1.
        """
        c = self._cols
        ns = c.ns(namespace_id, create=False)
        if ns is None or not keys:
            return EMPTY_HIT
        slots = c.tables[ns].get_many(keys_to_words(keys))
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            slots = slots[: int(missing[0])]
        if len(slots) == 0:
            return EMPTY_HIT
        best_row, best_holder, ranked = self._rank(slots, local_holder, avoid_holders,
                                                   max_alternates)
        missing = np.flatnonzero(best_row < 0)
        count = int(missing[0]) if len(missing) else len(slots)
        return self._hit(best_row[:count], best_holder[:count],
                         None if ranked is None else ranked[:count])

    def lookup_wire(
        self, namespace_id: bytes, request: bytes, *, local_holder: int = -1,
        avoid_holders: Sequence[int] = (), max_alternates: int = 0, every_key: bool = False,
    ) -> WireHit | None:
        """:meth:`lookup_prefix` (or, ``every_key``, :meth:`lookup_each`) of a serialized
        ``MasterLookupPrefixRequest``'s keys, answered as the response's encoded columns, in
        one C call (native/master_lookup.c ``lookup_wire``: the keys read from the bytes,
        probed, ranked as those methods rank them, the holders numbered, the columns
        written); the same answer as those methods. Never changes anything.

        Args:
            request: the request's wire bytes (only its ``keys`` are read here).

        Returns:
            The answer; None when it cannot be given this way (the extension is not built,
            a key is not exactly 16 bytes, or the namespace is not indexed: the caller uses
            :meth:`lookup_prefix`, which also checks the keys).

        Raises:
            InvalidArgument: ``max_alternates`` outside 0..MAX_RANKED_REPLICAS - 1.
        """
        impl = native.master_index
        if impl is None:
            return None
        if not 0 <= max_alternates < MAX_RANKED_REPLICAS:
            raise InvalidArgument(f"max_alternates must be in 0..{MAX_RANKED_REPLICAS - 1}, "
                                  f"got {max_alternates}")
        c = self._cols
        ns = c.ns(namespace_id, create=False)
        if ns is None:  # (rare) the caller's path checks the keys and answers none
            return None
        t = c.tables[ns]
        columns, consts = native_args(c)
        avoid = np.asarray(avoid_holders, dtype=np.int64) if len(avoid_holders) else _NO_HOLDERS
        got = impl.lookup_wire(t.probe_buffers(), columns, consts, request, int(local_holder),
                               avoid, max_alternates,
                               bool(len(avoid_holders)), every_key)
        return None if got is None else WireHit(*got)

    def lookup_each(
        self, namespace_id: bytes, keys: Sequence[bytes], *, local_holder: int = -1,
        avoid_holders: Sequence[int] = (), max_alternates: int = 0,
    ) -> tuple[np.ndarray, PrefixHit]:
        """The best replica of every one of ``keys`` present cluster-wide, misses skipped.

        Per-key presence (an Exists probe), where :meth:`lookup_prefix` stops at the first
        miss; the best replica (and, asked for, its alternates, ``avoid_holders`` ranked
        last) is chosen the same way. Never changes anything.

        Returns:
            ``(positions, hit)``: int64 indexes into ``keys`` of the present blocks, in
            order, and their best replicas as columns (row i is ``keys[positions[i]]``).
        """
        c = self._cols
        ns = c.ns(namespace_id, create=False)
        if ns is None or not keys:
            return np.zeros(0, np.int64), EMPTY_HIT
        slots = c.tables[ns].get_many(keys_to_words(keys))
        positions = np.flatnonzero(slots >= 0)
        if len(positions) == 0:
            return positions, EMPTY_HIT
        best_row, best_holder, ranked = self._rank(slots[positions], local_holder,
                                                   avoid_holders, max_alternates)
        ok = best_row >= 0
        return positions[ok], self._hit(best_row[ok], best_holder[ok],
                                        None if ranked is None else ranked[ok])
