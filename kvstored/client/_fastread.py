"""The one-call read path of the sync client: a DRAM hit with no op driver around it.

The general path (kvstored/client/_ops.py ``op_read``, ``op_lookup_prefix_tiers``,
``op_exists``) is a generator driven step by step (a Session step, a Blocking step, a sink
with per-key lists). For the common case (a live session, every key a DRAM block readable
one-sided now) all it does is one native call: ``read_keys`` (probe, copy, version check)
for get / get_into, ``probe_keys`` for lookup_prefix / exists. The functions here make that
one call and return, or return None to say "take the general path", which then runs from
the start exactly as before (it repeats the probe; no count of the attempt is kept).

When this path answers (every case below checked first, nothing else answers here):
- the node was described (``st.info``), its transport is ``shm`` and its arena is mapped
  with a slot region, ``KVSTORED_ONE_SIDED`` is not ``0``, and no client hook is installed
  (tests: the hook's block-by-block seam is the general path's);
- the session is open now (``is_live``: the OpenSession stream has not ended, the client is
  not closed) and it was opened by the epoch the arena was mapped under;
- the keys are a list of valid keys (a bad key: the general path names it), and get_into's
  buffers a list of flat, writable ``uint8`` buffers (anything else: the general path casts
  or names it);
- every key was kept (get / get_into: its version held around the copy; lookup_prefix:
  every key found; exists: every key found). A miss, a failed version check, an SSD-only
  block or a buffer too small: the general path reads the whole call again (a buffer this
  path wrote is written again or reported as the general path reports it).

The version check is the one of ``read_keys`` (kvstored/tiers/slots.py), unchanged: no
byte is kept that was not proven stable. Hits are counted exactly as the general path
counts them (``OneSidedCounts``, ``ONE_SIDED_STATS``), once; a version check that failed
here is added to ``ONE_SIDED_STATS["fallbacks"]`` (the general path's re-read counts its own).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvstored.client import _hooks
from kvstored.client._shm import ONE_SIDED_STATS, one_sided_enabled
from kvstored.tiers.slots import SlotReader, py_probe_keys, py_read_all
from kvstored.types import Tier

if TYPE_CHECKING:
    from kvstored.client._state import ClientState

FAST_STATS = {"taken": 0, "passed": 0}
"""This process's calls of this path: ``taken`` (answered here), ``passed`` (eligible, but
handed to the general path after the native call: a miss, a failed check, a bad buffer)."""

MID: Callable[[], object] | None = None
"""Tests only: passed to ``read_keys`` as its ``mid`` seam (between the plan and the copies)."""

_PREFIXES: dict[bytes, bytes] = {}
"""Namespace id -> its ident prefix (``len`` byte + id: kvstored/tiers/slots.py ``_prefix``)."""


def _prefix(namespace_id: bytes) -> bytes | None:
    p = _PREFIXES.get(namespace_id)
    if p is None:
        if len(namespace_id) > 255:
            return None  # the general path raises naming it
        if len(_PREFIXES) > 1024:
            _PREFIXES.clear()
        p = _PREFIXES[namespace_id] = bytes((len(namespace_id),)) + namespace_id
    return p


def _reader(st: ClientState, is_live: Callable[[], bool]) -> SlotReader | None:
    """The slot reader when a one-sided answer may be given now (the module's rules), or None."""
    info = st.info
    if info is None or info.transport != "shm" or _hooks._hook is not None:
        return None
    arena = st.arena
    reader = None if arena is None else arena.slots
    if reader is None or len(arena.view) != arena.size_bytes:  # type: ignore[union-attr]
        return None
    if st.session_epoch != info.epoch or not is_live() or not one_sided_enabled():
        return None
    return reader


def lookup_prefix(st: ClientState, is_live: Callable[[], bool], keys: object) -> int | None:
    """lookup_prefix of DRAM blocks in one native call: the number of keys, when every key
    is a DRAM block found in the shared index now; None: ask the general path."""
    if type(keys) is not list:
        return None
    reader = _reader(st, is_live)
    if reader is None:
        return None
    prefix = _prefix(st.stored_namespace_id)
    if prefix is None:
        return None
    info = st.info
    assert info is not None
    fn = reader.native_probe_keys or py_probe_keys
    lead = fn(reader.buckets, reader.slots, prefix, keys, info.min_key_bytes, info.max_key_bytes,
              None, reader.hints)
    n = len(keys)
    if lead != n:
        FAST_STATS["passed"] += 1
        return None
    if n and st.one_sided_counts.add_lookup(n, n):  # counts pending now: make sure they go
        control = st.control
        if control is not None:
            control.note_report()
    FAST_STATS["taken"] += 1
    return n


def exists(st: ClientState, is_live: Callable[[], bool], keys: object) -> list[bool] | None:
    """exists of DRAM blocks in one native call: ``[True] * n`` when every key is a DRAM
    block found in the shared index now (a probe: no recency, no count); None otherwise."""
    if type(keys) is not list:
        return None
    reader = _reader(st, is_live)
    if reader is None:
        return None
    prefix = _prefix(st.stored_namespace_id)
    if prefix is None:
        return None
    info = st.info
    assert info is not None
    n = len(keys)
    found = bytearray(n)
    fn = reader.native_probe_keys or py_probe_keys
    if fn(reader.buckets, reader.slots, prefix, keys, info.min_key_bytes, info.max_key_bytes,
          found, reader.hints) < 0 or found.count(1) != n:
        FAST_STATS["passed"] += 1
        return None
    FAST_STATS["taken"] += 1
    return [True] * n


def read(st: ClientState, is_live: Callable[[], bool], keys: object, buffers: object | None,
         return_meta: bool = False) -> list[Any] | None:
    """get (``buffers`` None: a list of bytes) or get_into (a list of sizes, or ``(size,
    meta)`` with ``return_meta``) of DRAM blocks in one native ``read_all`` call, which also
    makes the argument checks (every key ``bytes`` within the node's length bounds, every
    buffer flat, writable, C-contiguous ``uint8``); None when a key was not kept or the call
    is not eligible (the general path then reads it all, and names a bad argument)."""
    if type(keys) is not list or not keys:
        return None
    reader = _reader(st, is_live)
    if reader is None:
        return None
    prefix = _prefix(st.stored_namespace_id)
    if prefix is None:
        return None
    info = st.info
    assert info is not None
    fn = reader.native_read_all or py_read_all
    got = fn(reader.buckets, reader.slots, reader.arena, prefix, keys, buffers, time.monotonic_ns(),
             reader.hints, info.min_key_bytes, info.max_key_bytes, return_meta, MID)
    if type(got) is int:  # a miss, a failed check, a buffer too small or of another kind
        FAST_STATS["passed"] += 1
        if got > 0:
            # the failed checks are tries this process saw (the storm's fallback rate); the
            # node hears of the general path's reads only (nothing here is counted twice there)
            ONE_SIDED_STATS["fallbacks"] += got
        return None
    out, num_bytes = got  # type: ignore[misc]  # not an int: checked above
    n = len(out)
    if st.one_sided_counts.add(n, num_bytes, 0, 0):  # counts pending now: make sure they go
        control = st.control
        if control is not None:
            control.note_report()
    ONE_SIDED_STATS["hits"] += n
    FAST_STATS["taken"] += 1
    return out


def read_into(st: ClientState, is_live: Callable[[], bool], keys: object, buffers: object,
              return_meta: bool = False) -> list[Any] | None:
    """get_into's :func:`read`: None (the general path, which names it) unless ``buffers``
    is a list (a ``None`` must not turn a get_into into a get)."""
    if type(buffers) is not list:
        return None
    return read(st, is_live, keys, buffers, return_meta)


def tiers_of_lead(n: int) -> list[Tier]:
    """lookup_prefix_tiers' answer for ``n`` leading DRAM blocks."""
    return [Tier.DRAM] * n
