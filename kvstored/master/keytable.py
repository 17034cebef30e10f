"""KeyTable: an open-addressing hash table from 16-byte keys to int slots, in numpy.

Why not a ``dict[bytes, int]``: at 10M keys a dict costs ~170 bytes per key (a 64-byte
bytes object, a 32-byte int, ~40 bytes of table) and its lookups run one at a time in the
interpreter, so each key pays its cache and TLB misses in series: a 512-key lookup was ~18x
slower at 10M keys than at 10k. Here a key is 20 bytes in three numpy columns and a batch
of keys is probed with vectorized gathers, whose misses overlap::

    records   lo u8 | hi u8 | slot i4     (three contiguous arrays; slot -1 = empty,
                                           -2 = deleted)
    position  (lo * 0x9E3779B97F4A7C15) >> (64 - bits)   (Fibonacci hashing), then linear
              probing; load (live + deleted) kept <= 1/2, so probes are short

Keys must be exactly 16 bytes (block hashes); :func:`key_digest` maps other lengths to 16.
Source: Knuth, TAOCP vol. 3, 6.4 (multiplicative hashing, linear probing).

Not thread-safe (the master's loop only).
"""

from __future__ import annotations

from collections.abc import Sequence

import blake3
import numpy as np

KEY_BYTES = 16
EMPTY = -1
DELETED = -2
_MULT_INT = 0x9E3779B97F4A7C15
_MULT = np.uint64(_MULT_INT)
_U64 = (1 << 64) - 1
_VECTOR_ROUNDS = 4


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
        capacity: initial number of records (rounded up to a power of two, >= 16).
    """

    def __init__(self, capacity: int = 16) -> None:
        bits = max(4, int(capacity - 1).bit_length())
        self._init(bits)

    def _init(self, bits: int) -> None:
        self._bits = bits
        self._mask = (1 << bits) - 1
        size = 1 << bits
        self._lo = np.zeros(size, dtype=np.uint64)
        self._hi = np.zeros(size, dtype=np.uint64)
        self._sl = np.full(size, EMPTY, dtype=np.int32)
        self._num_used = 0  # live + deleted records
        self._num_live = 0

    def __len__(self) -> int:
        return self._num_live

    @property
    def nbytes(self) -> int:
        """Bytes of the record array."""
        return self._lo.nbytes + self._hi.nbytes + self._sl.nbytes

    def _home(self, lo: np.ndarray) -> np.ndarray:
        return ((lo * _MULT) >> np.uint64(64 - self._bits)).astype(np.int64)

    # ---- lookup ----------------------------------------------------------------------
    def get_many(self, words: np.ndarray) -> np.ndarray:
        """Slots of ``words`` (``(n, 2)`` uint64), ``-1`` where absent; int64 ``(n,)``."""
        n = len(words)
        out = np.full(n, EMPTY, dtype=np.int64)
        if n == 0 or self._num_live == 0:
            return out
        lo = np.ascontiguousarray(words[:, 0])
        hi = np.ascontiguousarray(words[:, 1])
        pos = self._home(lo)
        # round 1 on every key (most sit at their home record), then only the rest
        slot = self._sl[pos]
        hit = (slot >= 0) & (self._lo[pos] == lo) & (self._hi[pos] == hi)
        out[hit] = slot[hit]
        active = np.flatnonzero(~hit & (slot != EMPTY))
        for _ in range(_VECTOR_ROUNDS - 1):
            if len(active) == 0:
                return out
            pos[active] = (pos[active] + 1) & self._mask
            p = pos[active]
            slot = self._sl[p]
            hit = (slot >= 0) & (self._lo[p] == lo[active]) & (self._hi[p] == hi[active])
            out[active[hit]] = slot[hit]
            active = active[~hit & (slot != EMPTY)]
        if len(active) == 0:
            return out
        pos[active] = (pos[active] + 1) & self._mask
        for i in active.tolist():  # the few long probe sequences: finish one by one
            out[i] = self._probe(int(lo[i]), int(hi[i]), int(pos[i]))[1]
        return out

    def _probe(self, lo: int, hi: int, pos: int) -> tuple[int, int]:
        """(position, slot) of the key from ``pos`` on; slot -1 and the first free
        position (deleted or empty) when absent."""
        sl, klo, khi = self._sl, self._lo, self._hi
        free = -1
        while True:
            slot = int(sl[pos])
            if slot == EMPTY:
                return (free if free >= 0 else pos), EMPTY
            if slot == DELETED:
                if free < 0:
                    free = pos
            elif int(klo[pos]) == lo and int(khi[pos]) == hi:
                return pos, slot
            pos = (pos + 1) & self._mask

    def _home_int(self, lo: int) -> int:
        return ((lo * _MULT_INT) & _U64) >> (64 - self._bits)

    def get(self, key: bytes) -> int:
        """The slot of one key, or -1 (scalar path: no numpy temporaries)."""
        if self._num_live == 0:
            return EMPTY
        d = key_digest(key)
        lo = int.from_bytes(d[:8], "little")
        return self._probe(lo, int.from_bytes(d[8:], "little"), self._home_int(lo))[1]

    # ---- changes ---------------------------------------------------------------------
    def _maybe_grow(self, extra: int) -> None:
        if 2 * (self._num_used + extra) <= len(self._sl):
            return
        live = self._sl >= 0
        words = np.stack([self._lo[live], self._hi[live]], axis=1)
        slots = self._sl[live].astype(np.int64)
        need = 2 * (len(slots) + extra)
        bits = self._bits
        while (1 << bits) < need:
            bits += 1
        self._init(bits)
        self._insert_new(words, slots)

    def _insert_new(self, words: np.ndarray, slots: np.ndarray) -> None:
        """Insert keys known to be absent and distinct (vectorized claim of free records)."""
        n = len(words)
        if n == 0:
            return
        lo = np.ascontiguousarray(words[:, 0])
        hi = np.ascontiguousarray(words[:, 1])
        pos = self._home(lo)
        active = np.arange(n)
        while len(active):
            p = pos[active]
            free = self._sl[p] < 0
            # among keys aiming at one free record, the first claims it
            cand = active[free]
            _, first = np.unique(pos[cand], return_index=True)
            won = cand[first]
            wp = pos[won]
            self._lo[wp] = lo[won]
            self._hi[wp] = hi[won]
            was_empty = self._sl[wp] == EMPTY
            self._sl[wp] = slots[won]
            self._num_used += int(was_empty.sum())
            done = np.zeros(n, dtype=bool)
            done[won] = True
            active = active[~done[active]]
            pos[active] = (pos[active] + 1) & self._mask
        self._num_live += n

    def insert_many(self, words: np.ndarray, slots: np.ndarray) -> None:
        """Insert distinct keys that are not in the table, with their slots (>= 0)."""
        self._maybe_grow(len(words))
        self._insert_new(words, np.asarray(slots, dtype=np.int64))

    def insert(self, key: bytes, slot: int) -> None:
        """Insert one key that is not in the table."""
        self.insert_many(keys_to_words([key]), np.asarray([slot], dtype=np.int64))

    def delete_words(self, lo: int, hi: int) -> bool:
        """Remove one key (given as its two words); True if it was present."""
        pos, slot = self._probe(lo, hi, self._home_int(lo))
        if slot < 0:
            return False
        self._sl[pos] = DELETED
        self._num_live -= 1
        return True
