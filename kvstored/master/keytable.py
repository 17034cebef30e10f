"""KeyTable: a bucketized hash table from 16-byte keys to int slots, in numpy.

Why not a ``dict[bytes, int]``: at 10M keys a dict costs ~170 bytes per key (a 64-byte
bytes object, a 32-byte int, ~40 bytes of table) and its lookups run one at a time in the
interpreter, so each key pays its cache and TLB misses in series (the dict gets of a
512-key prefix took 183 us at 10M keys against 10 us at 10k, measured here). Here a key is 20 bytes in
numpy columns and a batch of keys
is looked up with a few vectorized gathers, whose misses overlap::

    bucket    lo u8[3] | hi u8[3] | slot i4[3] | overflow u1 | pad[3]   = 64 bytes, one
              cache line (the array is 64-byte aligned): 3 entries (slot -1 = free) and
              a flag (a key once did not fit: look further)
    home      (lo * 0x9E3779B97F4A7C15) >> (64 - bits)   (Fibonacci hashing); a full
              bucket spills into the next one; live entries kept <= 1/2 of capacity

A probe of a key in its home bucket reads one cache line (an earlier layout kept lo, hi and
slot in three arrays: three misses per key at 10M keys). At load <= 1/2 (1.5 keys per
bucket on average) about 4-7% of buckets overflow (Poisson), and a spill goes to the
adjacent line. Per key this costs 64 / (3 * load) bytes: 43-85 (the 8-way, three-array
layout at load 3/16-3/8: 54-107). A batch lookup gathers each key's home bucket row in one
step and compares its entries at once; the rare rest (overflowed buckets, equal low words)
are finished one by one.

Keys must be exactly 16 bytes (block hashes); :func:`key_digest` maps other lengths to 16.
Source: Knuth, TAOCP vol. 3, 6.4 (multiplicative hashing, open addressing with buckets).

Not thread-safe (the master's loop only).
"""

from __future__ import annotations

from collections.abc import Sequence

import blake3
import numpy as np

from kvstored import native

KEY_BYTES = 16
EMPTY = -1
WAYS = 3
BUCKET_DTYPE = np.dtype([("lo", "<u8", (WAYS,)), ("hi", "<u8", (WAYS,)), ("sl", "<i4", (WAYS,)),
                         ("over", "?"), ("pad", "u1", (3,))])
"""One bucket, 64 bytes (native/master_buffers.h MbBucket)."""
_LINE = 64
assert BUCKET_DTYPE.itemsize == _LINE
_MULT_INT = 0x9E3779B97F4A7C15
_MULT = np.uint64(_MULT_INT)
_U64 = (1 << 64) - 1


def key_digest(key: bytes) -> bytes:
    """The 16-byte form of a key: itself if it has 16 bytes, else a BLAKE3 digest of it."""
    if len(key) == KEY_BYTES:
        return key
    return blake3.blake3(b"kvstored/index-key/v1" + key).digest(KEY_BYTES)


def keys_to_words(keys: Sequence[bytes]) -> np.ndarray:
    """``(len(keys), 2)`` uint64 little-endian words of 16-byte keys (others digested)."""
    if not keys:
        return np.zeros((0, 2), dtype=np.uint64)
    try:
        joined = b"".join(keys)
    except TypeError:
        joined = b"".join(bytes(k) for k in keys)
    if len(joined) != KEY_BYTES * len(keys) or set(map(len, keys)) != {KEY_BYTES}:
        joined = b"".join(key_digest(bytes(k)) for k in keys)
    return np.frombuffer(joined, dtype="<u8").reshape(-1, 2).astype(np.uint64, copy=False)


class KeyTable:
    """16-byte key -> non-negative int slot (see the module docstring).

    Args:
        capacity: initial number of entries (rounded up to buckets of 8, at least 16).
    """

    def __init__(self, capacity: int = 16) -> None:
        self._init(max(1, int(max(16, capacity) // WAYS - 1).bit_length()))

    def _init(self, bits: int) -> None:
        nb = 1 << bits
        self._bits = bits
        self._mask = nb - 1
        # 64-byte aligned (one bucket per cache line): a line more, and the view from the
        # first aligned byte (numpy aligns to 16)
        raw = np.zeros(nb * _LINE + _LINE, dtype=np.uint8)
        off = -raw.ctypes.data % _LINE
        self._buckets = raw[off : off + nb * _LINE]  # what the C probes take (u1, contiguous)
        b = self._buckets.view(BUCKET_DTYPE)
        # strided views of the fields: writes show through
        self._lo, self._hi, self._sl, self._over = b["lo"], b["hi"], b["sl"], b["over"]
        self._sl[:] = EMPTY
        self._num_live = 0

    def __len__(self) -> int:
        return self._num_live

    @property
    def nbytes(self) -> int:
        """Bytes of the bucket arrays."""
        return int(self._buckets.nbytes)

    def _home(self, lo: np.ndarray) -> np.ndarray:
        return ((lo * _MULT) >> np.uint64(64 - self._bits)).astype(np.int64)

    def _home_int(self, lo: int) -> int:
        return ((lo * _MULT_INT) & _U64) >> (64 - self._bits)

    # ---- lookup ----------------------------------------------------------------------
    def get_many(self, words: np.ndarray) -> np.ndarray:
        """Slots of ``words`` (``(n, 2)`` uint64), ``-1`` where absent; int64 ``(n,)``.

        One C call (native/master.c ``keytable_get_many``: each key's probe as
        :meth:`_probe` does it) when the extension is built, else :meth:`py_get_many`."""
        impl = native.master_index
        if impl is None:
            return self.py_get_many(words)
        n = len(words)
        out = np.empty(n, dtype=np.int64)
        if n == 0 or self._num_live == 0:
            out.fill(EMPTY)
            return out
        impl.keytable_get_many(self._buckets, self._bits, np.ascontiguousarray(words, dtype=np.uint64), out)
        return out

    def probe_buffers(self) -> tuple[np.ndarray, int]:
        """``(buckets, bits)``: the buckets a C probe reads (native/master_lookup.c
        ``lookup_wire``): uint8 ``(2**bits * 64,)``, 64-byte aligned, of :data:`BUCKET_DTYPE`
        items; a view of the live table, reallocated when it grows (ask again per call)."""
        return self._buckets, self._bits

    def py_get_many(self, words: np.ndarray) -> np.ndarray:
        """:meth:`get_many` in numpy (the fallback, and the reference of the C probe)."""
        n = len(words)
        out = np.full(n, EMPTY, dtype=np.int64)
        if n == 0 or self._num_live == 0:
            return out
        lo = np.ascontiguousarray(words[:, 0])
        hi = np.ascontiguousarray(words[:, 1])
        b = self._home(lo)
        # one row gather per key (np.take: 3-6x faster than a 2-D fancy index at 10M keys,
        # measured); a free entry may still hold an old low word, so the first match is
        # checked for being live (else the slow path below settles it)
        match = np.take(self._lo, b, axis=0) == lo[:, None]
        j = match.argmax(axis=1)
        cand = np.take_along_axis(match, j[:, None], axis=1)[:, 0]
        slot = self._sl[b, j]
        ok = cand & (slot >= 0) & (self._hi[b, j] == hi)
        out[ok] = slot[ok]
        # not found at home: absent, unless the bucket overflowed or an entry with the same
        # low word but another high word came first (then finish that key one by one); a
        # fully present prefix never reads the overflow flags
        nf = np.flatnonzero(~ok)
        if len(nf) == 0:
            return out
        rest = nf[self._over[b[nf]] | cand[nf]]
        for i in rest.tolist():
            out[i] = self._probe(int(lo[i]), int(hi[i]))[2]
        return out

    def _probe(self, lo: int, hi: int) -> tuple[int, int, int]:
        """(bucket, way, slot) of a key; ``(-1, -1, -1)`` when absent."""
        b = self._home_int(lo)
        while True:  # Python ints from one .tolist() per row: ~4x fewer numpy calls
            row_lo = self._lo[b].tolist()
            if lo in row_lo:
                row_sl = self._sl[b].tolist()
                row_hi = self._hi[b].tolist()
                for w in range(WAYS):
                    if row_lo[w] == lo and row_hi[w] == hi and row_sl[w] >= 0:
                        return b, w, row_sl[w]
            if not self._over[b]:
                return -1, -1, EMPTY
            b = (b + 1) & self._mask

    def get(self, key: bytes) -> int:
        """The slot of one key, or -1."""
        if self._num_live == 0:
            return EMPTY
        d = key_digest(key)
        return self._probe(int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little"))[2]

    # ---- changes ---------------------------------------------------------------------
    def has_room(self, extra: int) -> bool:
        """Whether ``extra`` more keys fit without growing the buckets (load <= 1/2)."""
        return 2 * (self._num_live + extra) <= self._sl.size

    def reserve(self, extra: int) -> None:
        """Grow the buckets (as :meth:`insert_many` would) so that ``extra`` more keys fit
        (native/master.c ``apply_events`` inserts into them and cannot grow them)."""
        self._maybe_grow(extra)

    def add_live(self, delta: int) -> None:
        """Count keys that native/master.c ``apply_events`` inserted (or deleted) in the
        buckets directly."""
        self._num_live += delta

    def _maybe_grow(self, extra: int) -> None:
        if self.has_room(extra):
            return
        live = self._sl >= 0
        words = np.stack([self._lo[live], self._hi[live]], axis=1)
        slots = self._sl[live].astype(np.int64)
        bits = self._bits
        while (WAYS << bits) < 2 * (len(slots) + extra):
            bits += 1
        self._init(bits)
        self._insert_new(words, slots)

    def _insert_new(self, words: np.ndarray, slots: np.ndarray) -> None:
        """Insert keys known to be absent and distinct: each takes the k-th free entry of
        its bucket when it is the k-th of the batch aiming there, else spills onward."""
        n = len(words)
        lo = np.ascontiguousarray(words[:, 0])
        hi = np.ascontiguousarray(words[:, 1])
        b = self._home(lo)
        todo = np.arange(n)
        while len(todo):
            order = todo[np.argsort(b[todo], kind="stable")]
            bs = b[order]
            new_group = np.ones(len(bs), dtype=np.bool_)
            new_group[1:] = bs[1:] != bs[:-1]
            starts = np.flatnonzero(new_group)
            rank = np.arange(len(bs)) - np.repeat(starts, np.diff(np.append(starts, len(bs))))
            free = self._sl[bs] < 0
            target = (np.cumsum(free, axis=1) == (rank + 1)[:, None]) & free
            fits = target.any(axis=1)
            w = target.argmax(axis=1)
            put = order[fits]
            pb, pw = bs[fits], w[fits]
            self._lo[pb, pw] = lo[put]
            self._hi[pb, pw] = hi[put]
            self._sl[pb, pw] = slots[put]
            spill = order[~fits]
            self._over[b[spill]] = True
            b[spill] = (b[spill] + 1) & self._mask
            todo = spill
        self._num_live += n

    def insert_many(self, words: np.ndarray, slots: np.ndarray) -> None:
        """Insert distinct keys that are not in the table, with their slots (>= 0)."""
        if len(words):
            self._maybe_grow(len(words))
            self._insert_new(words, np.asarray(slots, dtype=np.int64))

    def insert(self, key: bytes, slot: int) -> None:
        """Insert one key that is not in the table."""
        d = key_digest(key)
        self.insert_words(int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little"), slot)

    def insert_words(self, lo: int, hi: int, slot: int) -> None:
        """Insert one key (its two words) that is not in the table: the first free entry
        from its home bucket on (scalar; the batch path costs ~20x more for one key)."""
        self._maybe_grow(1)
        b = self._home_int(lo)
        while True:
            row_sl = self._sl[b].tolist()
            for w in range(WAYS):
                if row_sl[w] < 0:
                    self._lo[b, w] = lo
                    self._hi[b, w] = hi
                    self._sl[b, w] = slot
                    self._num_live += 1
                    return
            self._over[b] = True
            b = (b + 1) & self._mask

    def delete_words(self, lo: int, hi: int) -> bool:
        """Remove one key (given as its two words); True if it was present."""
        b, w, slot = self._probe(lo, hi)
        if slot < 0:
            return False
        self._sl[b, w] = EMPTY  # overflow flags stay set: later keys may live further on
        self._num_live -= 1
        return True
