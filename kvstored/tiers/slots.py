"""Version-stamped slots and the shared key -> slot index: the layout one-sided readers check.

A one-sided reader (a local client through shared memory, or a peer through an RDMA READ)
copies a DRAM block without asking the node, then proves afterwards that what it copied was
stable (Pilaf, USENIX ATC 2013; FaRM, NSDI 2014). The node is the only writer of the slot
headers' stable fields and of the index; readers write only a slot's ``access_ns``.

This module is the ONE place the layout is written down (rdma18 reads it too). Pure Python,
a leaf of kvstored.tiers: it imports nothing of kvstored but :mod:`kvstored.errors`.

File layout (the arena file, or the anonymous arena mapping; little-endian throughout)::

    [0, arena_size)                       block bytes (carved by the allocator, 4096-byte units)
    [meta_off, meta_off + 4096)           region header (REGION_FORMAT below)
    [slots_off, slots_off + nslots*128)   slot headers: one per 4096-byte unit of the arena;
                                          the header of a block is that of its first unit
    [index_off, index_off + nbuckets*32)  index buckets (open addressing, linear probing)

    meta_off = arena_size; slots_off = meta_off + 4096; index_off = slots_off + nslots * 128
    rounded up to 4096; the file is index_off + nbuckets * 32 bytes rounded up to 4096.

Region header (``REGION_FORMAT`` = ``<8sQQQQQQQ``, at ``meta_off``):

    ======  ======  ==================================================================
    offset  type    field
    ======  ======  ==================================================================
    0       8s      magic ``b"KVSLOTS1"``
    8       u64     layout version (``LAYOUT_VERSION``)
    16      u64     arena_size (bytes of block data; == meta_off)
    24      u64     unit_bytes (4096: slot i covers arena bytes [i*unit, (i+1)*unit))
    32      u64     nslots
    40      u64     slot_bytes (128)
    48      u64     nbuckets (a power of two)
    56      u64     bucket_bytes (32)
    ======  ======  ==================================================================

Slot header (``SLOT_BYTES`` = 128, 8-byte aligned; word = u64 index into the slot):

    ======  ======  =====  ===========================================================
    offset  type    word   field
    ======  ======  =====  ===========================================================
    0       u64     0      version: even = stable, odd = changing (or not a committed block)
    8       u64     1      generation of the replica (DramEntry.generation at commit)
    16      u64     2      ident_lo: low 64 bits of :func:`ident` (stored namespace id, key)
    24      u64     3      ident_hi: high 64 bits of :func:`ident`
    32      u64     4      size_bytes of the block
    40      u64     5      access_ns: CLOCK_MONOTONIC ns of the last one-sided read (readers
                           write it; the node's eviction reads it; not covered by version)
    48      u32     -      key_len (bytes of the key)
    52      u32     -      meta_len: bytes of meta inline at offset 64, or META_NOT_INLINE
                           (meta longer than META_INLINE_BYTES: readers use the node path)
    56      u64     7      reserved (0)
    64      64s     8..15  meta, inline (meta_len bytes)
    ======  ======  =====  ===========================================================

Index bucket (``BUCKET_BYTES`` = 32; bucket ``(ident_lo & (nbuckets - 1))`` first, then the
next ones, wrapping, until an empty bucket; generation and size are read from the slot header):

    ======  ======  =====  ===========================================================
    offset  type    word   field
    ======  ======  =====  ===========================================================
    0       u64     0      version: even = stable, odd = being changed (readers: unknown)
    8       u64     1      ident_lo
    16      u64     2      ident_hi
    24      u64     3      slot + 1 (0 = empty bucket)
    ======  ======  =====  ===========================================================

Protocol (a seqlock per slot and per bucket):

- The node makes a slot header odd before the slot's space is reused, freed or rewritten
  (:meth:`SlotTable.unpublish`, called when a block leaves the DRAM map: removal, eviction,
  demotion start) and writes the fields then makes it even (:meth:`SlotTable.publish`) when a
  committed block enters the map (a put's commit, a promotion). A header is even and names a
  block only while that block is in the DRAM map; every other unit's header is odd (all start
  at 1). A bucket is made odd, rewritten, then made even.
- A reader: reads the version ``v1`` (acquire), requires it even and the ident / generation /
  size to be the expected ones, copies the bytes, then (acquire fence) reads the version
  again; keeps the bytes only if it is ``v1`` again. Otherwise: the node's pinned path, never
  the copied bytes.
- The index can only cause misses, never wrong bytes: every index hit is checked against the
  slot header, and a miss (including a bucket held odd, or an entry moved by a deletion while
  probing) goes to the node.

Memory ordering: the native copy-and-check (native/copy.c ``copy_checked``, through
``kvstored.native.copy_checked``) uses acquire / release fences (x86 and arm64), and the node
stores versions with ``store_release`` (release store + fence) when the extension is built.
The pure-Python paths (``kvstored.native.py_copy_checked``, the node's numpy stores) rely on
x86's total store order (stores are not reordered with stores, loads not with loads) and on
aligned 8-byte numpy loads/stores being single instructions: correct on x86, NOT on arm64
(use the native build there).
"""

from __future__ import annotations

import mmap
import struct
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import xxhash

from kvstored.errors import InvalidArgument

LAYOUT_VERSION = 1
MAGIC = b"KVSLOTS1"
UNIT_BYTES = 4096
SLOT_BYTES = 128
BUCKET_BYTES = 32
META_INLINE_BYTES = 64
META_NOT_INLINE = 0xFFFFFFFF
REGION_FORMAT = "<8sQQQQQQQ"
REGION_BYTES = 4096

# slot header words (u64 index into a slot's 16 words)
S_VERSION, S_GENERATION, S_IDENT_LO, S_IDENT_HI, S_SIZE, S_ACCESS_NS = 0, 1, 2, 3, 4, 5
S_LENS = 6  # key_len (low u32) | meta_len (high u32)
S_META = 8  # words 8..15: inline meta
SLOT_WORDS = SLOT_BYTES // 8
# bucket words
B_VERSION, B_IDENT_LO, B_IDENT_HI, B_SLOT1 = 0, 1, 2, 3
BUCKET_WORDS = BUCKET_BYTES // 8

_MASK64 = (1 << 64) - 1
_FIELDS = struct.Struct("<QQQQQIIQ")  # slot header words 1..7 (offset 8..63)


def _round_up(n: int, unit: int = 4096) -> int:
    return (n + unit - 1) // unit * unit


def ident(namespace_id: bytes, key: bytes) -> tuple[int, int]:
    """The 128-bit identity a slot and a bucket carry: ``xxh3_128(u8 len(ns) + ns + key)``.

    ``namespace_id`` is the STORED namespace id (tenant-scoped, as the node stores it: see
    docs/tenants.md), so another tenant's reader never matches this tenant's slot.

    Returns:
        ``(ident_lo, ident_hi)``; never ``(0, 0)`` (mapped to ``(1, 0)``).

    Raises:
        InvalidArgument: ``namespace_id`` is longer than 255 bytes.
    """
    if len(namespace_id) > 255:
        raise InvalidArgument(f"namespace_id is {len(namespace_id)} bytes; at most 255 are accepted")
    d = xxhash.xxh3_128_intdigest(bytes((len(namespace_id),)) + namespace_id + key)
    lo, hi = d & _MASK64, d >> 64
    return (1, 0) if lo == 0 and hi == 0 else (lo, hi)


def idents(namespace_id: bytes, keys: list[bytes]) -> np.ndarray:
    """:func:`ident` of every key, as a ``(len(keys), 2)`` uint64 array of ``(lo, hi)`` rows
    (what the native ``probe_many`` takes).

    Raises:
        InvalidArgument: ``namespace_id`` is longer than 255 bytes.
    """
    if len(namespace_id) > 255:
        raise InvalidArgument(f"namespace_id is {len(namespace_id)} bytes; at most 255 are accepted")
    prefix = bytes((len(namespace_id),)) + namespace_id
    h = xxhash.xxh3_128_digest
    raw = np.frombuffer(b"".join([h(prefix + k) for k in keys]), dtype=">u8").reshape(-1, 2)
    out = np.empty((len(keys), 2), dtype=np.uint64)
    out[:, 0] = raw[:, 1]  # the canonical digest is big-endian: high 64 bits first
    out[:, 1] = raw[:, 0]
    out[(out[:, 0] == 0) & (out[:, 1] == 0), 0] = 1
    return out


class Layout:
    """Offsets of the slot region of an arena of ``arena_size`` bytes (see the module table).

    Args:
        arena_size: bytes of block data (a multiple of 4096).

    Raises:
        ValueError: ``arena_size`` is not a positive multiple of 4096.
    """

    def __init__(self, arena_size: int) -> None:
        if arena_size <= 0 or arena_size % UNIT_BYTES:
            raise ValueError(f"arena_size must be a positive multiple of {UNIT_BYTES}, got {arena_size}")
        self.arena_size = arena_size
        self.nslots = arena_size // UNIT_BYTES
        n = 64
        while n < 2 * self.nslots:
            n *= 2
        self.nbuckets = n
        self.meta_off = arena_size
        self.slots_off = self.meta_off + REGION_BYTES
        self.index_off = _round_up(self.slots_off + self.nslots * SLOT_BYTES)
        self.total_bytes = _round_up(self.index_off + self.nbuckets * BUCKET_BYTES)

    def region_bytes(self) -> bytes:
        """The region header's bytes (``REGION_FORMAT``)."""
        return struct.pack(REGION_FORMAT, MAGIC, LAYOUT_VERSION, self.arena_size, UNIT_BYTES,
                           self.nslots, SLOT_BYTES, self.nbuckets, BUCKET_BYTES)

    @classmethod
    def parse(cls, buf: Any, arena_size: int) -> Layout | None:
        """The layout whose region header is at ``arena_size`` in ``buf`` (a mapping of the
        whole file), or None if there is none (an arena without slots: no one-sided reads)."""
        mv = memoryview(buf)
        if len(mv) < arena_size + REGION_BYTES:
            return None
        f = struct.unpack_from(REGION_FORMAT, mv, arena_size)
        if f[0] != MAGIC or f[1] != LAYOUT_VERSION or f[2] != arena_size:
            return None
        lay = cls(arena_size)
        if (f[3], f[4], f[5], f[6], f[7]) != (UNIT_BYTES, lay.nslots, SLOT_BYTES, lay.nbuckets, BUCKET_BYTES):
            return None
        if len(mv) < lay.total_bytes:
            return None
        return lay


def slot_words(buf: Any, lay: Layout) -> np.ndarray:
    """The slot headers of ``buf`` (the whole file's mapping) as a ``(nslots, 16)`` uint64 view."""
    a = np.frombuffer(buf, dtype=np.uint64, count=lay.nslots * SLOT_WORDS, offset=lay.slots_off)
    return a.reshape(lay.nslots, SLOT_WORDS)


def bucket_words(buf: Any, lay: Layout) -> np.ndarray:
    """The index buckets of ``buf`` as a ``(nbuckets, 8)`` uint64 view."""
    a = np.frombuffer(buf, dtype=np.uint64, count=lay.nbuckets * BUCKET_WORDS, offset=lay.index_off)
    return a.reshape(lay.nbuckets, BUCKET_WORDS)


Hook = Any  # callable(str step, int slot) -> None, or None


def _np_store(words: np.ndarray, index: int, value: int) -> None:
    """A plain aligned u64 store (ordered with other stores on x86 only)."""
    words[index] = value


class SlotTable:
    """The node's side: the only writer of slot headers (but ``access_ns``) and of the index.

    Args:
        buf: a writable mapping of the whole arena file (``Layout.total_bytes`` at least).
        lay: its layout.

    Callers hold the store lock (as for :class:`~kvstored.tiers.dram.DramTier`).
    ``hook(step, slot)``, when set (tests only), runs while a slot or bucket is held odd:
    steps ``"unpublish"`` (mid-free/reuse), ``"publish"`` (mid-rewrite), ``"bucket"``.
    """

    def __init__(self, buf: Any, lay: Layout,
                 store: Callable[[np.ndarray, int, int], None] | None = None,
                 native_publish: Callable[..., int] | None = None,
                 native_unindex: Callable[..., int] | None = None) -> None:
        self.lay = lay
        mv = memoryview(buf)
        self._mv = mv
        mv[lay.meta_off : lay.meta_off + REGION_BYTES] = lay.region_bytes().ljust(REGION_BYTES, b"\0")
        self.slots = slot_words(buf, lay)
        self.buckets = bucket_words(buf, lay)
        self.slots[:, S_VERSION] = 1  # every unit starts odd: no block
        self.words = self.slots.reshape(-1)
        self.bucket_flat = self.buckets.reshape(-1)
        self.store: Callable[[np.ndarray, int, int], None] = store or _np_store
        """``store(words, index, value)``: how a version word is written (a release store
        with a fence when the native extension is built: kvstored.native.store_release)."""
        self.native_publish = native_publish
        """The native ``publish_many`` (kvstored.native), or None: :meth:`publish_many` runs
        :meth:`publish` per block (also while :attr:`hook` is set)."""
        self.native_unindex = native_unindex
        """The native ``unindex_many``, or None: :meth:`unindex` runs in Python (also while
        :attr:`hook` is set)."""
        self.hook: Hook = None
        self.used_buckets = 0

    def release(self) -> None:
        """Drop this table's views of the mapping (before it is unmapped); idempotent."""
        self.slots = np.zeros((0, SLOT_WORDS), dtype=np.uint64)
        self.buckets = np.zeros((0, BUCKET_WORDS), dtype=np.uint64)
        self.words = self.slots.reshape(-1)
        self.bucket_flat = self.buckets.reshape(-1)
        self._mv.release()

    # --- slots ---------------------------------------------------------------------------

    def unpublish(self, offset: int) -> None:
        """Make the slot of the block at arena ``offset`` odd (no block): before its space is
        freed, reused or rewritten. Idempotent (an odd slot stays odd)."""
        s = offset // UNIT_BYTES
        row = self.slots[s]
        v = int(row[S_VERSION])
        if v % 2 == 0:
            self.store(self.words, s * SLOT_WORDS, v + 1)
        if self.hook is not None:
            self.hook("unpublish", s)

    def publish(self, offset: int, size_bytes: int, namespace_id: bytes, key: bytes,
                generation: int, meta: bytes) -> None:
        """Stamp the slot of the committed block at ``offset`` and make it even; index it.

        The slot is made odd first (if it was not), the fields written, then the version is
        bumped to the next even value.
        """
        s = offset // UNIT_BYTES
        row = self.slots[s]
        v = int(row[S_VERSION])
        if v % 2 == 0:
            v += 1
            self.store(self.words, s * SLOT_WORDS, v)
        lo, hi = ident(namespace_id, key)
        base = self.lay.slots_off + s * SLOT_BYTES
        inline = len(meta) <= META_INLINE_BYTES
        # words 1..7 in one call (generation, ident, size, access_ns = 0, key_len | meta_len, 0)
        _FIELDS.pack_into(self._mv, base + 8, generation & _MASK64, lo, hi, size_bytes, 0,
                          len(key), len(meta) if inline else META_NOT_INLINE, 0)
        if inline:
            self._mv[base + 64 : base + 64 + META_INLINE_BYTES] = meta.ljust(META_INLINE_BYTES, b"\0")
        if self.hook is not None:
            self.hook("publish", s)
        self.store(self.words, s * SLOT_WORDS, v + 1)
        self._index_put(lo, hi, s)

    def publish_many(self, items: list[tuple[int, int, bytes, bytes, int, bytes]]) -> None:
        """:meth:`publish` of each ``(offset, size_bytes, namespace_id, key, generation, meta)``,
        in order (one native call when the extension is built and no :attr:`hook` is set: the
        same stores, byte for byte, each version store a release store and a fence).

        Raises:
            InvalidArgument: a ``namespace_id`` is longer than 255 bytes (nothing published).
        """
        fn = self.native_publish
        if fn is None or self.hook is not None:
            for offset, size_bytes, namespace_id, key, generation, meta in items:
                self.publish(offset, size_bytes, namespace_id, key, generation, meta)
            return
        for it in items:
            if len(it[2]) > 255:
                raise InvalidArgument(f"namespace_id is {len(it[2])} bytes; at most 255 are accepted")
        self.used_buckets = fn(self.slots, self.buckets,
                               [(o // UNIT_BYTES, n, ns, k, g, m) for o, n, ns, k, g, m in items],
                               self.used_buckets)

    def unindex(self, namespace_id: bytes, key: bytes) -> None:
        """Remove ``(namespace_id, key)`` from the index (no-op when absent).

        Raises:
            InvalidArgument: ``namespace_id`` is longer than 255 bytes.
        """
        fn = self.native_unindex
        if fn is not None and self.hook is None:
            if len(namespace_id) > 255:
                raise InvalidArgument(f"namespace_id is {len(namespace_id)} bytes; at most 255 are accepted")
            self.used_buckets -= fn(self.buckets, [(namespace_id, key)])
            return
        lo, hi = ident(namespace_id, key)
        b = self._find(lo, hi)
        if b is not None:
            self._delete(b)

    def access_ns(self, offset: int) -> int:
        """The last one-sided read of the block at ``offset`` (CLOCK_MONOTONIC ns; 0 = none)."""
        return int(self.slots[offset // UNIT_BYTES, S_ACCESS_NS])

    def clear_access(self, offset: int) -> None:
        """Clear the ``access_ns`` stamp of the block at ``offset`` (the node absorbed it)."""
        self.slots[offset // UNIT_BYTES, S_ACCESS_NS] = 0

    # --- index ---------------------------------------------------------------------------

    def _find(self, lo: int, hi: int) -> int | None:
        mask = self.lay.nbuckets - 1
        i = lo & mask
        bk = self.buckets
        while int(bk[i, B_SLOT1]) != 0:
            if int(bk[i, B_IDENT_LO]) == lo and int(bk[i, B_IDENT_HI]) == hi:
                return i
            i = (i + 1) & mask
        return None

    def _write_bucket(self, i: int, lo: int, hi: int, slot1: int) -> None:
        row = self.buckets[i]
        v = int(row[B_VERSION])
        self.store(self.bucket_flat, i * BUCKET_WORDS, v + 1)  # odd (even between writes)
        row[B_IDENT_LO] = lo
        row[B_IDENT_HI] = hi
        row[B_SLOT1] = slot1
        if self.hook is not None:
            self.hook("bucket", i)
        self.store(self.bucket_flat, i * BUCKET_WORDS, v + 2)

    def _index_put(self, lo: int, hi: int, slot: int) -> None:
        b = self._find(lo, hi)
        if b is None:
            if self.used_buckets + 1 > self.lay.nbuckets * 3 // 4:
                return  # full (cannot happen: twice as many buckets as slots): node path
            mask = self.lay.nbuckets - 1
            b = lo & mask
            while int(self.buckets[b, B_SLOT1]) != 0:
                b = (b + 1) & mask
            self.used_buckets += 1
        self._write_bucket(b, lo, hi, slot + 1)

    def _delete(self, i: int) -> None:
        """Backward-shift deletion (linear probing): every step is a seqlocked bucket write;
        a reader probing meanwhile may miss (node path), never find a wrong slot."""
        mask = self.lay.nbuckets - 1
        bk = self.buckets
        j = i
        while True:
            j = (j + 1) & mask
            if int(bk[j, B_SLOT1]) == 0:
                break
            home = int(bk[j, B_IDENT_LO]) & mask
            # move j into the hole i when its home is not in (i, j] (cyclically)
            if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
                r = bk[j]
                self._write_bucket(i, int(r[B_IDENT_LO]), int(r[B_IDENT_HI]), int(r[B_SLOT1]))
                i = j
        self._write_bucket(i, 0, 0, 0)
        self.used_buckets -= 1


# --- readers: the copy-and-check itself is kvstored.native.copy_checked (C, or pure Python) ------


class SlotReader:
    """A reader's view of the slot region: index lookups and checked copies, no round trip.

    Args:
        buf: a mapping of the whole arena file (slot headers writable for ``access_ns``).
        lay: its layout (:meth:`Layout.parse`).
    """

    def __init__(self, buf: Any, lay: Layout, probe: Callable[..., int] | None = None,
                 probe_keys: Callable[..., int] | None = None,
                 read_keys: Callable[..., ReadAnswer] | None = None, hints: bool = True,
                 read_all: Callable[..., ReadAllAnswer] | None = None) -> None:
        self.lay = lay
        self.probe = probe
        """The native ``probe_many`` (kvstored.native), or None: :meth:`probe_many` loops here."""
        self.native_probe_keys = probe_keys
        """The native ``probe_keys`` (hash + probe of a whole prefix in one C call), or None:
        :meth:`lookup_keys` runs :func:`py_probe_keys`."""
        self.native_read_keys = read_keys
        """The native ``read_keys`` (a whole batch of checked reads in one C call), or None:
        :meth:`read_keys` runs :func:`py_read_keys`."""
        self.native_read_all = read_all
        """The native ``read_all`` (``read_keys`` all or nothing, with the client's argument
        checks), or None: :meth:`read_all` runs :func:`py_read_all`."""
        self._mv = memoryview(buf)  # bytes (an mmap or a bytearray)
        self.arena = self._mv[: lay.arena_size]
        """The arena's block bytes (what a checked read copies from)."""
        self._base = lay.slots_off
        self.slots = slot_words(buf, lay)
        self.words = self.slots.reshape(-1)
        """The slot headers as one flat uint64 array: slot ``s``'s version is word
        ``s * SLOT_WORDS`` (what :func:`py_copy_checked` and the native check take)."""
        self.buckets = bucket_words(buf, lay)
        self.hints: np.ndarray | None = new_hints(lay.nbuckets) if hints else None
        """This reader's hint table (:func:`new_hints`; None: every lookup probes the index):
        where :meth:`lookup_keys` and :meth:`read_keys` look first."""

    def lookup(self, lo: int, hi: int) -> int | None:
        """The slot the index maps ident ``(lo, hi)`` to, or None (absent, or a bucket on the
        probe path is odd: ask the node). Check the slot header before trusting it."""
        mask = self.lay.nbuckets - 1
        i = lo & mask
        bk = self.buckets
        for _ in range(self.lay.nbuckets):
            row = bk[i]
            v1 = int(row[B_VERSION])
            if v1 & 1:
                return None
            s1, blo, bhi = int(row[B_SLOT1]), int(row[B_IDENT_LO]), int(row[B_IDENT_HI])
            if int(row[B_VERSION]) != v1:
                return None
            if s1 == 0:
                return None
            if blo == lo and bhi == hi:
                return s1 - 1
            i = (i + 1) & mask
        return None

    def probe_many(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """Per ident row of ``ids`` (:func:`idents`), the slot holding it now (stable, the
        same ident), or -1 (ask the node); and how many leading keys were found.

        Native (one C call, every bucket and header read under its version) when the extension
        is built; else a Python loop over :meth:`lookup` and :meth:`snapshot`'s check.
        """
        n = len(ids)
        out = np.empty(n, dtype=np.int64)
        if self.probe is not None:
            lead = self.probe(self.buckets, self.slots, ids, out)
            return out, lead
        lead, leading = 0, True
        for k in range(n):
            lo, hi = int(ids[k, 0]), int(ids[k, 1])
            slot = self.lookup(lo, hi)
            ok = slot is not None and self._holds(slot, lo, hi)
            out[k] = slot if ok and slot is not None else -1
            leading = leading and ok
            lead += leading
        return out, lead

    def _holds(self, slot: int, lo: int, hi: int) -> bool:
        if not 0 <= slot < self.lay.nslots:
            return False
        row = self.slots[slot]
        v = int(row[S_VERSION])
        return (not v & 1 and int(row[S_IDENT_LO]) == lo and int(row[S_IDENT_HI]) == hi
                and int(row[S_VERSION]) == v)

    def snapshot(self, slot: int, lo: int, hi: int) -> tuple[int, int, int, bytes] | None:
        """``(version, generation, size_bytes, meta)`` of ``slot`` if it is stable and holds
        ident ``(lo, hi)`` now (read under its version), else None (ask the node: changing,
        another block, or meta too long to be inline)."""
        if not 0 <= slot < self.lay.nslots:
            return None
        words = self.words
        w0 = slot * SLOT_WORDS
        v1 = int(words[w0])  # an aligned 8-byte load
        if v1 & 1:
            return None
        # words 1..7 in one copy, then the inline meta (under the version, re-read below)
        gen, hlo, hhi, size, _access, _klen, mlen, _r = _FIELDS.unpack_from(self._mv, self._base + w0 * 8 + 8)
        if hlo != lo or hhi != hi or mlen > META_INLINE_BYTES:
            return None
        meta = bytes(self._mv[self._base + w0 * 8 + 64 : self._base + w0 * 8 + 64 + mlen]) if mlen else b""
        if int(words[w0]) != v1:
            return None
        return v1, gen, size, meta

    def version(self, slot: int) -> int:
        """The slot's version now."""
        return int(self.slots[slot, S_VERSION])

    def touch(self, slot: int, now_ns: int | None = None) -> None:
        """Stamp the slot's ``access_ns`` (CLOCK_MONOTONIC ns): recency without a round trip."""
        self.slots[slot, S_ACCESS_NS] = time.monotonic_ns() if now_ns is None else now_ns

    def lookup_keys(self, namespace_id: bytes, keys: list[bytes], min_len: int, max_len: int,
                    found: bytearray | None = None) -> int:
        """Hash and look up a whole prefix in the shared index (no round trip, no recency).

        Args:
            namespace_id: the STORED namespace id (at most 255 bytes).
            keys: the keys, a list of ``bytes``.
            min_len, max_len: the node's key length bounds.
            found: None to stop at the first key not found (lookup_prefix); else a buffer of
                ``len(keys)`` bytes set to 1 / 0 per key (exists).

        Returns:
            How many leading keys are DRAM blocks readable one-sided now; or ``-1 - i`` when
            key ``i`` (the first such; every key is checked) is not ``bytes`` of
            ``min_len..max_len`` bytes (the caller's checks name it).

        Raises:
            InvalidArgument: ``namespace_id`` is longer than 255 bytes.
        """
        fn = self.native_probe_keys or py_probe_keys
        return fn(self.buckets, self.slots, _prefix(namespace_id), keys, min_len, max_len, found, self.hints)

    def read_keys(self, namespace_id: bytes, keys: list[bytes], dsts: list[Any] | None,
                  stamp_ns: int, mid: Callable[[], object] | None = None) -> ReadAnswer:
        """One-sided reads of a batch (the seqlock of the module docstring), tail first.

        Args:
            namespace_id: the STORED namespace id (at most 255 bytes).
            keys: the keys, a list of ``bytes``.
            dsts: one writable buffer per key (the block is written at its start), or None
                (each block into a new ``bytes``).
            stamp_ns: CLOCK_MONOTONIC ns stamped into ``access_ns`` (``stamp_ns + i`` for the
                ``i``-th block copied, the last key first); 0 = no stamp.
            mid: tests only: called between the plan (index and headers) and the copies.

        Returns:
            ``(sizes, metas, values, num_fallbacks)``: per key the bytes kept or None (ask the
            node), its meta (``b""`` when none), its bytes (``values`` is None with ``dsts``),
            and how many blocks the index named whose version check failed.

        Raises:
            InvalidArgument: ``namespace_id`` is longer than 255 bytes.
            TypeError, ValueError: a key is not bytes, a destination not a writable buffer
                (nothing copied then).
        """
        fn = self.native_read_keys or py_read_keys
        return fn(self.buckets, self.slots, self.arena, _prefix(namespace_id), keys, dsts, stamp_ns, mid,
                  self.hints)


    def read_all(self, namespace_id: bytes, keys: list[bytes], dsts: list[Any] | None, stamp_ns: int,
                 min_len: int, max_len: int, want_meta: bool = False,
                 mid: Callable[[], object] | None = None) -> ReadAllAnswer:
        """:meth:`read_keys`, all or nothing, with the argument checks of the sync client's
        hit path in the same call (kvstored/client/_fastread.py): native ``read_all`` when
        built, else :func:`py_read_all`.

        Args:
            namespace_id, keys, dsts, stamp_ns, mid: as :meth:`read_keys`.
            min_len, max_len: the node's key length bounds (a key must be ``bytes`` of
                ``max(min_len, 1)..max_len`` bytes).
            want_meta: with ``dsts``, answer ``(size, meta)`` per key instead of its size.

        Returns:
            ``(out, num_bytes)`` when every key was kept: ``out`` is the list of values
            (``dsts`` None), of sizes, or of ``(size, meta)`` tuples, ``num_bytes`` the bytes
            kept. Else an int: ``-1`` when an argument is not of the kind checked (a key, a
            destination that is not a flat, writable, C-contiguous buffer of format ``"B"``,
            ``dsts`` not a list as long as ``keys``; nothing was read), else how many version
            checks failed (0: a key not in the index, a slot changing, a meta not inline, a
            buffer too small). It may stop at the first key it cannot keep; what it copied
            into ``dsts`` before is the caller's to rewrite.

        Raises:
            InvalidArgument: ``namespace_id`` is longer than 255 bytes.
        """
        fn = self.native_read_all or py_read_all
        return fn(self.buckets, self.slots, self.arena, _prefix(namespace_id), keys, dsts, stamp_ns, self.hints,
                  min_len, max_len, want_meta, mid)


ReadAnswer = tuple[list[int | None], list[bytes], list[bytes | None] | None, int]
"""What :meth:`SlotReader.read_keys` answers: ``(sizes, metas, values, num_fallbacks)``."""

ReadAllAnswer = tuple[list[Any], int] | int
"""What :meth:`SlotReader.read_all` answers: ``(out, num_bytes)``, or an int (see there)."""


def _prefix(namespace_id: bytes) -> bytes:
    if len(namespace_id) > 255:
        raise InvalidArgument(f"namespace_id is {len(namespace_id)} bytes; at most 255 are accepted")
    return bytes((len(namespace_id),)) + namespace_id


def _ident_of(prefix: bytes, key: bytes) -> tuple[int, int]:
    d = xxhash.xxh3_128_intdigest(prefix + key)
    lo, hi = d & _MASK64, d >> 64
    return (1, 0) if lo == 0 and hi == 0 else (lo, hi)


def _probe(buckets: np.ndarray, slots: np.ndarray, lo: int, hi: int) -> int:
    """The fallback of the native ``probe_one``: the slot holding ident ``(lo, hi)`` now, or -1."""
    nb = len(buckets)
    mask = nb - 1
    i = lo & mask
    for _ in range(nb):
        row = buckets[i]
        v1 = int(row[B_VERSION])
        if v1 & 1:
            return -1
        s1, blo, bhi = int(row[B_SLOT1]), int(row[B_IDENT_LO]), int(row[B_IDENT_HI])
        if int(row[B_VERSION]) != v1 or s1 == 0:
            return -1
        if blo == lo and bhi == hi:
            s = s1 - 1
            if s >= len(slots):
                return -1
            h = slots[s]
            hv = int(h[S_VERSION])
            ok = not hv & 1 and int(h[S_IDENT_LO]) == lo and int(h[S_IDENT_HI]) == hi
            return s if ok and int(h[S_VERSION]) == hv else -1
        i = (i + 1) & mask
    return -1


HINT_BYTES = 16
MAX_HINTS = 1 << 17
"""At most this many hint entries (2 MiB: one huge page of anonymous memory)."""


def new_hints(nbuckets: int) -> np.ndarray:
    """A reader's hint table: ``min(nbuckets, MAX_HINTS)`` entries of two u64, ``(ident_lo,
    slot + 1)`` at entry ``ident_hi & (n - 1)`` (0: empty), zeroed, in private anonymous memory
    asked for as a transparent huge page (a 2 MiB table then costs one TLB entry).

    A hint only says which slot header to check first: it is checked exactly as the slot an
    index bucket names (even, the same ident, the version re-read), so a stale or torn hint
    costs an index probe, never a wrong slot. It spares the index's buckets, one random page
    each of a large index (native/copy.c ``hints_t``: 512 keys probed 34 us warm, 110 us
    after 4096 other pages were touched). Written by one reader only, with the GIL held.
    """
    n = max(1, min(nbuckets, MAX_HINTS))
    size = n * HINT_BYTES
    huge = 2 << 20
    # private anonymous memory (a shared one is shmem: no transparent huge pages unless the
    # kernel's shmem_enabled allows them), with room to align the table to a huge page
    m = mmap.mmap(-1, size + huge if size >= huge else size,
                  flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20))
    a = np.frombuffer(m, dtype=np.uint8)
    skip = (-a.ctypes.data) % huge if size >= huge else 0
    if size >= huge and hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE, skip, size)  # skip: a multiple of the page size
        except OSError:
            pass  # no transparent huge pages here: 4 KiB pages, still correct
    return a[skip : skip + size].view(np.uint64).reshape(n, 2)


def _holds(slots: np.ndarray, s: int, lo: int, hi: int) -> bool:
    """Whether slot ``s``'s header is even and carries ident ``(lo, hi)`` now (read under its
    version): the check of native/copy.c ``header_holds``."""
    if not 0 <= s < len(slots):
        return False
    h = slots[s]
    hv = int(h[S_VERSION])
    return not hv & 1 and int(h[S_IDENT_LO]) == lo and int(h[S_IDENT_HI]) == hi and int(h[S_VERSION]) == hv


def _probe_hinted(buckets: np.ndarray, slots: np.ndarray, hints: np.ndarray | None, lo: int, hi: int) -> int:
    """The fallback of the native ``probe_hinted``: the hinted slot if its header holds
    ``(lo, hi)``, else :func:`_probe` (whose slot is then remembered in ``hints``)."""
    if hints is None:
        return _probe(buckets, slots, lo, hi)
    e = hints[hi & (len(hints) - 1)]
    if int(e[0]) == lo and int(e[1]) and _holds(slots, int(e[1]) - 1, lo, hi):
        return int(e[1]) - 1
    s = _probe(buckets, slots, lo, hi)
    if s >= 0:
        e[0] = lo
        e[1] = s + 1
    return s


def py_probe_keys(buckets: np.ndarray, slots: np.ndarray, prefix: bytes, keys: list[bytes],
                  min_len: int, max_len: int, found: bytearray | None = None,
                  hints: np.ndarray | None = None) -> int:
    """The pure-Python fallback of the native ``probe_keys`` (same arguments and answer; see
    :meth:`SlotReader.lookup_keys`; ``hints``: :func:`new_hints`, or None). Correct on x86
    only (see the module docstring)."""
    lo_len = max(min_len, 1)
    for k, key in enumerate(keys):  # every key checked first, as in C
        if type(key) is not bytes or not lo_len <= len(key) <= max_len:
            return -1 - k
    lead, leading = 0, True
    for k, key in enumerate(keys):
        hit = _probe_hinted(buckets, slots, hints, *_ident_of(prefix, key)) >= 0
        if found is not None:
            found[k] = hit
        leading = leading and hit
        lead += leading
        if not leading and found is None:
            break
    return lead


def _unchanged(words: np.ndarray, index: int, version: int) -> bool:
    """The seqlock check of :func:`py_read_keys`: the slot's version is still ``version``
    (one function, so the mutation test can turn it off)."""
    return int(words[index]) == version


def py_read_keys(buckets: np.ndarray, slots: np.ndarray, arena: memoryview, prefix: bytes,
                 keys: list[bytes], dsts: list[Any] | None, stamp_ns: int,
                 mid: Callable[[], object] | None = None, hints: np.ndarray | None = None) -> ReadAnswer:
    """The pure-Python fallback of the native ``read_keys`` (same arguments, answer and
    order: plan every key tail first, then stamp, copy and re-check each). Correct on x86
    only (total store order; see the module docstring)."""
    n = len(keys)
    words = slots.reshape(-1)
    src_all = np.frombuffer(arena, dtype=np.uint8)
    plan: list[tuple[int, int, int, int, bytes, np.ndarray]] = []  # key, version, off, size, meta, dst
    for k in range(n - 1, -1, -1):
        key = keys[k]
        if type(key) is not bytes:
            raise TypeError(f"read_keys: key #{k} must be bytes, got {type(key).__name__}")
        lo, hi = _ident_of(prefix, key)
        slot = _probe_hinted(buckets, slots, hints, lo, hi)
        if slot < 0:
            continue
        w0 = slot * SLOT_WORDS
        v1 = int(words[w0])
        hlo, hhi, size = int(words[w0 + S_IDENT_LO]), int(words[w0 + S_IDENT_HI]), int(words[w0 + S_SIZE])
        mlen = int(words[w0 + S_LENS]) >> 32
        off = slot * UNIT_BYTES
        if v1 & 1 or (hlo, hhi) != (lo, hi) or mlen > META_INLINE_BYTES or off + size > len(src_all):
            continue
        meta = slots[slot, S_META:].tobytes()[:mlen]
        if dsts is None:
            dst = np.empty(size, dtype=np.uint8)
        else:
            try:
                mv = memoryview(dsts[k])
            except TypeError:
                raise ValueError(f"read_keys: dst #{k} must be a writable C-contiguous buffer, got "
                                 f"{type(dsts[k]).__name__}") from None
            if mv.readonly or not mv.c_contiguous:
                raise ValueError(f"read_keys: dst #{k} must be a writable C-contiguous buffer, got "
                                 f"{type(dsts[k]).__name__}")
            if size > mv.nbytes:
                continue
            dst = np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)[:size]
        plan.append((k, v1, off, size, meta, dst))
    if mid is not None:  # the test seam, as in C: between the plan and the copies
        mid()
    sizes: list[int | None] = [None] * n
    metas: list[bytes] = [b""] * n
    values: list[bytes | None] | None = None if dsts is not None else [None] * n
    fallbacks = 0
    for i, (k, v1, off, size, meta, dst) in enumerate(plan):
        w0 = (off // UNIT_BYTES) * SLOT_WORDS
        if not _unchanged(words, w0, v1):
            fallbacks += 1
            continue
        if stamp_ns:
            words[w0 + S_ACCESS_NS] = stamp_ns + i
        np.copyto(dst, src_all[off : off + size])
        if not _unchanged(words, w0, v1):
            fallbacks += 1
            continue
        sizes[k] = size
        metas[k] = meta
        if values is not None:
            values[k] = dst.tobytes()
    return sizes, metas, values, fallbacks


def py_read_all(buckets: np.ndarray, slots: np.ndarray, arena: memoryview, prefix: bytes, keys: object,
                dsts: object, stamp_ns: int, hints: np.ndarray | None, min_len: int, max_len: int,
                want_meta: bool, mid: Callable[[], object] | None = None) -> ReadAllAnswer:
    """The pure-Python fallback of the native ``read_all`` (same arguments and answer; see
    :meth:`SlotReader.read_all`): the same checks, then :func:`py_read_keys` (which reads the
    other keys even when one cannot be kept, where C stops). Correct on x86 only."""
    if type(keys) is not list or (dsts is not None and (type(dsts) is not list or len(dsts) != len(keys))):
        return -1
    lo_len = max(min_len, 1)
    for key in keys:
        if type(key) is not bytes or not lo_len <= len(key) <= max_len:
            return -1
    if dsts is not None:
        for d in dsts:
            try:
                mv = memoryview(d)
            except TypeError:
                return -1
            if mv.readonly or not mv.c_contiguous or mv.ndim != 1 or mv.format != "B":
                return -1
    sizes, metas, values, fallbacks = py_read_keys(buckets, slots, arena, prefix, cast(list[bytes], keys),
                                                   dsts, stamp_ns, mid, hints)
    if None in sizes:
        return fallbacks
    kept = cast(list[int], sizes)
    num_bytes = sum(kept)
    if values is not None:
        return list(values), num_bytes
    if want_meta:
        return list(zip(kept, metas, strict=True)), num_bytes
    return list(kept), num_bytes
