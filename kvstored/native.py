"""Batch block copies: the optional C extension ``kvstored._native``, else pure Python.

``copy_many(pairs)`` copies each ``(dst, src)`` buffer pair (same length, C-contiguous,
``dst`` writable). The C version (native/copy.c) takes every buffer first, then copies the
whole batch with the GIL released (on up to 4 threads, a quarter of the CPUs, when the batch
holds at least 16 MiB): one call per batch instead of one numpy copy per block. Chosen at
import: the extension when it was built (``pip install -e .`` builds it where a C compiler
exists) and ``KVSTORED_NATIVE`` is not ``0``; otherwise :func:`py_copy_many` (one
``numpy.copyto`` per block, what the client did before), with one log line at its first use
saying why. Measured by ``python bench/bench_native.py`` (the ``native_copy`` rows of
bench/bench_blocks.py).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import structlog

__all__ = [
    "FALLBACK_REASON", "NATIVE", "copy_at", "copy_checked", "copy_checked_many", "copy_many",
    "master_index", "native_copy_at", "native_copy_checked", "native_copy_many", "probe_keys", "probe_many",
    "publish_many", "py_copy_at", "py_copy_checked", "py_copy_checked_many", "py_copy_many", "py_store_release",
    "read_all", "read_keys", "store_release", "unindex_many",
]

log = structlog.get_logger(__name__)

CopyPairs = Sequence[tuple[Any, Any]]


def py_copy_many(pairs: CopyPairs, threads: int = 0, stream: bool = False) -> int:
    """Copy each ``(dst, src)`` pair, one ``numpy.copyto`` per block (the fallback).

    Args:
        pairs: ``(dst, src)`` objects with the buffer protocol: C-contiguous, the same length
            in bytes, ``dst`` writable.
        threads: ignored (accepted for the native signature).
        stream: ignored (the native copy then uses non-temporal stores for large pieces).

    Returns:
        The bytes copied.

    Raises:
        TypeError: a pair is not a ``(dst, src)`` tuple of buffers.
        ValueError: lengths differ, or ``dst`` is read-only or not C-contiguous.
    """
    del threads, stream
    flat: list[tuple[np.ndarray, np.ndarray]] = []
    for i, pair in enumerate(pairs):  # all checked before any byte is copied (as in C)
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"copy_many: pair #{i} must be a (dst, src) tuple, got {type(pair).__name__}")
        dst, src = _flat(pair[0], i, "dst", writable=True), _flat(pair[1], i, "src", writable=False)
        if dst.nbytes != src.nbytes:
            raise ValueError(f"copy_many: pair #{i}: dst is {dst.nbytes} bytes but src is {src.nbytes}")
        flat.append((dst, src))
    for dst, src in flat:
        np.copyto(dst, src)
    return sum(d.nbytes for d, _ in flat)


def py_copy_at(dst: Any, offsets: Sequence[int], srcs: Sequence[Any], stream: bool = False) -> int:
    """Copy each ``srcs[i]`` into ``dst`` at byte offset ``offsets[i]`` (a put's copy into
    its slots; the fallback of the native ``copy_at``: the same checks, all before any byte
    is copied, then one ``numpy.copyto`` per block).

    Args:
        dst: a writable C-contiguous buffer (the arena).
        offsets: one byte offset (int) per src.
        srcs: C-contiguous buffers (bytes, uint8 arrays...).
        stream: ignored (the native copy then uses non-temporal stores for large pieces).

    Returns:
        The bytes copied.

    Raises:
        TypeError: an offset is not an int, a src is not a C-contiguous buffer.
        ValueError: offsets and srcs differ in length, ``dst`` is read-only or not
            contiguous, or a range falls outside ``dst``.
    """
    del stream
    if len(offsets) != len(srcs):
        raise ValueError(f"copy_at: {len(offsets)} offsets for {len(srcs)} srcs; pass one offset per src")
    try:
        d = _flat(dst, 0, "dst", writable=True)
    except (TypeError, ValueError):
        raise ValueError(
            f"copy_at: dst must be a writable C-contiguous buffer, got {type(dst).__name__}") from None
    size = d.nbytes
    flat: list[tuple[np.ndarray, np.ndarray]] = []
    for i, (off, src) in enumerate(zip(offsets, srcs, strict=True)):
        if type(off) is not int and not isinstance(off, int):
            raise TypeError(f"copy_at: offset #{i} must be an int, got {type(off).__name__}")
        try:
            s = _flat(src, i, "src", writable=False)
        except (TypeError, ValueError):
            raise TypeError(
                f"copy_at: src #{i} must be a C-contiguous buffer, got {type(src).__name__}") from None
        if off < 0 or off + s.nbytes > size:
            raise ValueError(f"copy_at: item #{i}: range [{off}, +{s.nbytes}) is outside the {size}-byte dst")
        flat.append((d[off : off + s.nbytes], s))
    for dd, ss in flat:
        np.copyto(dd, ss)
    return sum(ss.nbytes for _, ss in flat)


def _flat(obj: object, i: int, what: str, *, writable: bool) -> np.ndarray:
    if (  # the common case (an arena region), without a memoryview round trip
        type(obj) is np.ndarray and obj.dtype == np.uint8 and obj.ndim == 1
        and obj.flags.c_contiguous and (obj.flags.writeable or not writable)
    ):
        return obj
    try:
        mv = memoryview(obj)  # type: ignore[arg-type]  # any buffer is accepted; a non-buffer raises TypeError, handled below
    except TypeError:
        raise TypeError(
            f"copy_many: {what} of pair #{i} must be a C-contiguous buffer, got {type(obj).__name__}"
        ) from None
    if not mv.c_contiguous or (writable and mv.readonly):
        raise ValueError(
            f"copy_many: {what} of pair #{i} must be a {'writable ' if writable else ''}"
            f"C-contiguous buffer, got {type(obj).__name__}"
        )
    return np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv, dtype=np.uint8)


def py_copy_checked(dst: Any, src: Any, versions: np.ndarray, index: int, expected: int,
                    hook: Callable[[str, int], None] | None = None) -> bool:
    """Copy ``src`` into ``dst`` (same length) and keep the bytes only if ``versions[index]``
    (a slot's version word) was ``expected`` (even) before and after the copy.

    Pure Python: correct on x86 (total store order: the loads of the version, of the copy
    and of the version again are not reordered), NOT on arm64, where the native
    ``copy_checked`` (acquire fence) is required. See kvstored/tiers/slots.py.
    ``hook("copy_mid", index)`` (tests) runs between the two halves of the copy.

    Returns:
        True if ``dst`` holds the bytes the slot held at version ``expected``; False if the
        caller must use the node's pinned path (``dst``'s contents are then unspecified).
    """
    if expected & 1 or int(versions[index]) != expected:
        return False
    d, s = np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8)
    if hook is not None:
        half = s.size // 2
        np.copyto(d[:half], s[:half])
        hook("copy_mid", index)
        np.copyto(d[half:], s[half:])
    else:
        np.copyto(d, s)
    return int(versions[index]) == expected


def py_copy_checked_many(items: Sequence[tuple[Any, Any, int, int]], versions: np.ndarray,
                         stamp_ns: int) -> list[bool]:
    """:func:`py_copy_checked` per ``(dst, src, index, expected)`` item, in order; with
    ``stamp_ns`` > 0 each slot's ``access_ns`` word (``versions[index + 5]``) is stamped first
    (``stamp_ns + i`` for item ``i``).
    The fallback of the native ``copy_checked_many`` (x86 only, as :func:`py_copy_checked`)."""
    out = []
    for i, (dst, src, index, expected) in enumerate(items):
        if stamp_ns and int(versions[index]) == expected:
            versions[index + 5] = stamp_ns + i  # items come tail first: the head ends latest
        out.append(py_copy_checked(dst, src, versions, index, expected))
    return out


def py_store_release(versions: np.ndarray, index: int, value: int) -> None:
    """Store u64 ``versions[index] = value`` (the fallback of the native release store: a
    plain aligned store, ordered with the other stores on x86 only)."""
    versions[index] = value


_fallback_reason: list[str] = []  # logged once, at the fallback's first use


def _load() -> ModuleType | None:
    if os.environ.get("KVSTORED_NATIVE", "") == "0":
        _fallback_reason.append("KVSTORED_NATIVE=0")
        return None
    try:
        return importlib.import_module("kvstored._native")
    except ImportError as exc:
        _fallback_reason.append(f"kvstored._native not built ({exc}); pip install -e . builds it")
        return None


def _fallback_copy_many(pairs: CopyPairs, threads: int = 0, stream: bool = False) -> int:
    """:func:`py_copy_many`, saying once why the native copy is not used: through structlog
    where the process configured it, else stdlib logging at INFO (so a bare client or
    ``kvstorectl`` keeps its stdout clean)."""
    if _fallback_reason:
        reason = _fallback_reason.pop()
        if structlog.is_configured():
            log.info("native_copy_fallback", reason=reason)
        else:
            logging.getLogger(__name__).info("native_copy_fallback: %s", reason)
    return py_copy_many(pairs, threads, stream)


_native_mod = _load()

NATIVE: bool = _native_mod is not None
"""Whether :func:`copy_many` is the C extension."""
FALLBACK_REASON: str = _fallback_reason[0] if _fallback_reason else ""
"""Why :func:`copy_many` is the pure-Python fallback ("" when it is the C extension):
``KVSTORED_NATIVE=0``, or the import error of an extension that was not built."""

native_copy_many: Callable[..., int] | None = (
    _native_mod.copy_many if _native_mod is not None else None
)
"""The C ``copy_many`` (None when not built or disabled)."""

copy_many: Callable[..., int] = (
    native_copy_many if native_copy_many is not None else _fallback_copy_many
)
"""``copy_many(pairs, threads=0, stream=False) -> int``: the native copy when available, else
:func:`py_copy_many` (one log line at its first use says why); same arguments, result and
errors."""

native_copy_at: Callable[..., int] | None = (
    getattr(_native_mod, "copy_at", None) if _native_mod is not None else None
)
"""The C ``copy_at`` (None when not built or disabled, or an extension built before it)."""

copy_at: Callable[..., int] = native_copy_at if native_copy_at is not None else py_copy_at
"""``copy_at(dst, offsets, srcs, stream=False) -> int``: a put's copy into its slots, C when
built, else :func:`py_copy_at`; same arguments, result and errors."""

native_copy_checked: Callable[..., bool] | None = (
    _native_mod.copy_checked if _native_mod is not None else None
)
"""The C ``copy_checked`` (None when not built or disabled)."""

copy_checked: Callable[..., bool] = (
    native_copy_checked if native_copy_checked is not None else py_copy_checked
)
"""``copy_checked(dst, src, versions, index, expected) -> bool``: the version-checked
one-sided copy (kvstored/tiers/slots.py): C with acquire fences when built, else
:func:`py_copy_checked` (correct on x86 only)."""

store_release: Callable[[Any, int, int], None] = (
    _native_mod.store_release if _native_mod is not None else py_store_release
)
"""``store_release(versions, index, value)``: the node's slot-version store (release + fence
in C; a plain store in the fallback, x86 only)."""

probe_many: Callable[..., int] | None = _native_mod.probe_many if _native_mod is not None else None
"""``probe_many(buckets, slots, idents, out) -> int``: the shared index's batch lookup in C
(kvstored/tiers/slots.py ``SlotReader.probe_many``); None when not built (a Python loop)."""

copy_checked_many: Callable[..., list[bool]] = (
    _native_mod.copy_checked_many if _native_mod is not None else py_copy_checked_many
)
"""``copy_checked_many(items, versions, stamp_ns) -> list[bool]``: :data:`copy_checked` for
a batch of ``(dst, src, index, expected)`` (C: one call, the GIL released once)."""

probe_keys: Callable[..., int] | None = getattr(_native_mod, "probe_keys", None)
"""``probe_keys(buckets, slots, prefix, keys, min_len, max_len, found=None) -> int``: the
hashing (xxh3_128, vendored xxHash) and shared-index probe of a whole prefix in one C call
(kvstored/tiers/slots.py ``SlotReader.lookup_keys``); None when not built (or an extension
built before it): ``slots.py_probe_keys`` runs instead."""

read_keys: Callable[..., Any] | None = getattr(_native_mod, "read_keys", None)
"""``read_keys(buckets, slots, arena, prefix, keys, dsts, stamp_ns)``: a whole batch of
one-sided reads (hash, probe, header check, stamp, copy, re-check) in one C call, the GIL
released once (kvstored/tiers/slots.py ``SlotReader.read_keys``); None when not built:
``slots.py_read_keys`` runs instead."""

read_all: Callable[..., Any] | None = getattr(_native_mod, "read_all", None)
"""``read_all(buckets, slots, arena, prefix, keys, dsts, stamp_ns, hints, min_len, max_len,
want_meta, mid)``: :data:`read_keys` all or nothing, with the sync client's argument checks in
the same call (kvstored/tiers/slots.py ``SlotReader.read_all``, the client's one-call hit path);
None when not built: ``slots.py_read_all`` runs instead."""

publish_many: Callable[..., int] | None = getattr(_native_mod, "publish_many", None)
"""``publish_many(slots, buckets, items, used_buckets) -> int``: the node's slot-header
stamping and index inserts of a batch of commits in one C call (kvstored/tiers/slots.py
``SlotTable.publish_many``); None when not built: ``SlotTable.publish`` runs per block."""

unindex_many: Callable[..., int] | None = getattr(_native_mod, "unindex_many", None)
"""``unindex_many(buckets, items) -> int``: the node's index deletions (backward shift) of
``(namespace_id, key)`` items in one C call (``SlotTable.unindex``); None when not built."""


def _load_master() -> ModuleType | None:
    if os.environ.get("KVSTORED_NATIVE", "") == "0":
        return None
    try:
        return importlib.import_module("kvstored._native_master")
    except ImportError:
        return None


master_index: ModuleType | None = _load_master()
"""The master index's C loops (native/master.c: ``keytable_get_many``, ``best_rows``,
``find_rows``), or None when not built or ``KVSTORED_NATIVE=0``: kvstored/master/keytable.py,
ranking.py and columns.py then run their numpy code. Read at each call, so a test or
``bench/bench_master_sim.py --impl python`` sets it to None to force the fallback."""
