"""Type stub of the optional C extension built from native/copy.c (see kvstored/native.py)."""

from collections.abc import Sequence
from typing import Any

def copy_many(pairs: Sequence[tuple[Any, Any]], threads: int = 0, stream: bool = False) -> int:
    """memcpy each ``(dst, src)`` buffer pair with the GIL released; returns the bytes copied.
    ``stream=True``: pieces of 64 KiB and more with non-temporal stores, then an sfence
    (x86-64; memcpy elsewhere): what a put's copy into the arena asks.

    Raises:
        TypeError: a pair is not a ``(dst, src)`` tuple, or ``src`` has no C-contiguous buffer.
        ValueError: ``dst`` is not a writable C-contiguous buffer, the lengths differ, or
            ``threads`` < 0.
    """

def copy_checked(dst: Any, src: Any, versions: Any, index: int, expected: int) -> bool:
    """Copy ``src`` into ``dst`` and return whether u64 ``versions[index]`` was ``expected``
    (even) before and after (acquire load, copy, acquire fence, re-load).

    Raises:
        ValueError: a buffer is of the wrong kind, the lengths differ, or ``index`` is outside
            ``versions``.
    """

def store_release(versions: Any, index: int, value: int) -> None:
    """Release-store u64 ``versions[index] = value``, then a full fence.

    Raises:
        ValueError: ``versions`` is not a writable buffer, or ``index`` is outside it.
    """

def probe_many(buckets: Any, slots: Any, idents: Any, out: Any) -> int:
    """Batch lookup in the shared slot index: ``out[i]`` = slot of ident row ``i`` or -1;
    returns the number of leading keys found.

    Raises:
        ValueError: a buffer is of the wrong kind or size.
    """

def copy_checked_many(items: Sequence[tuple[Any, Any, int, int]], versions: Any, stamp_ns: int) -> list[bool]:
    """:func:`copy_checked` per ``(dst, src, index, expected)`` item (the GIL released once),
    stamping ``versions[index + 5]`` (the slot's access_ns) with ``stamp_ns + i`` first when > 0.

    Raises:
        TypeError: an item is not a ``(dst, src, index, expected)`` tuple.
        ValueError: a buffer is of the wrong kind, lengths differ, or an index is outside.
    """

def probe_keys(buckets: Any, slots: Any, prefix: bytes, keys: list[bytes], min_len: int, max_len: int,
               found: Any = None) -> int:
    """Hash (xxh3_128 of ``prefix + key``) and look up every key of a prefix in the shared
    index; returns the leading count found, or ``-1 - i`` for a key ``i`` that is not bytes of
    ``min_len..max_len``. With ``found`` (a writable buffer, one byte per key) every key is
    probed and flagged; without it the walk stops at the first miss.

    Raises:
        TypeError: ``keys`` is not a list.
        ValueError: a buffer is of the wrong kind or size.
    """

def read_keys(buckets: Any, slots: Any, arena: Any, prefix: bytes, keys: list[bytes], dsts: list[Any] | None,
              stamp_ns: int, mid: Any = None) -> tuple[list[int | None], list[bytes], list[bytes | None] | None, int]:
    """One-sided reads of a batch, tail first (hash, probe, header, stamp, copy, re-check);
    returns ``(sizes, metas, values, num_fallbacks)`` (a size of None: ask the node).
    ``mid()`` (tests only) runs between the plan and the copies.

    Raises:
        TypeError: a key is not bytes, or ``keys`` / ``dsts`` is not a list.
        ValueError: a buffer is of the wrong kind, or ``dsts`` has another length.
    """

def read_all(buckets: Any, slots: Any, arena: Any, prefix: bytes, keys: list[bytes], dsts: list[Any] | None,
             stamp_ns: int, hints: Any, min_len: int, max_len: int, want_meta: bool,
             mid: Any) -> tuple[list[Any], int] | int:
    """:func:`read_keys`, all or nothing, with the client's checks: ``(out, num_bytes)`` when
    every key was kept (``out``: the values with ``dsts`` None, else the sizes, or ``(size,
    meta)`` tuples with ``want_meta``); else -1 (a key not bytes of ``max(min_len, 1)..max_len``,
    a dst not a flat writable C-contiguous buffer of format ``"B"``, or mismatched lists:
    nothing read) or the number of failed version checks (0: a miss, a slot changing, a
    buffer too small). Stops at the first key that cannot be kept.

    Raises:
        TypeError: wrong argument count, ``prefix`` not bytes, or a number not an int.
        ValueError: a buffer (buckets, slots, arena, hints) is of the wrong kind.
    """

def publish_many(slots: Any, buckets: Any, items: list[tuple[int, int, bytes, bytes, int, bytes]],
                 used_buckets: int) -> int:
    """The node's ``SlotTable.publish`` per ``(slot, size_bytes, namespace_id, key, generation,
    meta)`` item, in order (header odd, fields, even; then its index bucket, under its
    version); returns the buckets in use after.

    Raises:
        TypeError: ``items`` is not a list, or an item not such a tuple.
        ValueError: a buffer is of the wrong kind, a slot outside the table, a namespace id
            longer than 255 bytes (nothing is written then).
    """

def unindex_many(buckets: Any, items: list[tuple[bytes, bytes]]) -> int:
    """The node's ``SlotTable.unindex`` per ``(namespace_id, key)`` item (backward-shift
    deletion, every bucket write under its version); returns the buckets freed.

    Raises:
        TypeError: ``items`` is not a list of ``(bytes, bytes)`` tuples.
        ValueError: ``buckets`` is of the wrong kind.
    """
