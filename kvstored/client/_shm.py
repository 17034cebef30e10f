"""The shared-memory path of the client: the mapped arena, and get/put through it.

    put: copy values into reserve-ahead slots -> CommitSlots (commits, refills the pool;
         kvstored/client/_slots.py); the rest: ReservePut -> copy -> CommitPut (abort on
         any failure)
    get: PinBlocks  -> copy out of the mapped arena      -> release the pins (ReleasePins, or
                                                            with the next request of the
                                                            control channel)

See kvstored/client/_ops.py for the safety rules of this path (fencing); the release of a
get's pins is described at :func:`read_shm`.
"""

from __future__ import annotations

import functools
import mmap
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvstored import native
from kvstored.client import _fastget, _hooks
from kvstored.client._args import (
    _EXISTED,
    _STORED,
    _chunks,
    _chunks_by_bytes,
    _Item,
    _result,
    _tail_first,
    _tier,
    status_error,
)
from kvstored.client._orphans import next_request_id
from kvstored.client._slots import size_class
from kvstored.client._steps import (
    MAX_CHUNK_BYTES,
    PIN_CHUNK_KEYS,
    PREFAULT_MAX_BYTES,
    Blocking,
    Call,
    Op,
    Session,
    _undo_pin,
    _undo_reserve,
    abort_call,
    lease_for,
    release_call,
)
from kvstored.client.types import NodeInfo, PutResult
from kvstored.errors import ErrorCode, InternalError, InvalidArgument, LeaseExpired, NotFound, Unavailable
from kvstored.native import copy_at, copy_checked, copy_many
from kvstored.tiers.slots import SLOT_WORDS, UNIT_BYTES, Layout, SlotReader, idents
from kvstored.types import Tier
from kvstored.v1 import node_pb2 as pb

_clock = time.monotonic
"""This process's monotonic clock (the node's lease clock on the same host); tests move it."""

if TYPE_CHECKING:
    from kvstored.client._control import OneSidedCounts
    from kvstored.client._ops import _ReadSink
    from kvstored.client._state import ClientState


class ArenaMap:
    """The node's arena file mapped into this process (read-write; prefaulted up to
    ``PREFAULT_MAX_BYTES``).

    The mapping is read-write because puts write into reserved ranges; a local client can
    therefore write anywhere in the arena: the shared-memory path trusts the processes that
    may open the file (the node's user; with ``node.arena_mode = 0o660`` also its group).

    Raises:
        OSError: the file cannot be opened or mapped.
        InvalidArgument: the file is not the node's arena (other device/inode) or too small.
    """

    def __init__(self, path: str, size_bytes: int, dev: int, ino: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if (dev or ino) and (st.st_dev, st.st_ino) != (dev, ino):
                raise InvalidArgument(
                    f"{path} is not the node's arena (different device/inode): the client runs "
                    "in another filesystem namespace"
                )
            if st.st_size < size_bytes:
                raise InvalidArgument(
                    f"{path} is {st.st_size} bytes, smaller than the arena ({size_bytes} bytes)"
                )
            flags = mmap.MAP_SHARED
            if size_bytes <= PREFAULT_MAX_BYTES:
                flags |= getattr(mmap, "MAP_POPULATE", 0)
            # the whole file: the blocks, then (a node with one-sided reads) the slot headers
            # and the shared index (kvstored/tiers/slots.py)
            self._mmap = mmap.mmap(fd, st.st_size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.path = path
        self.size_bytes = size_bytes
        self.array: np.ndarray = np.frombuffer(self._mmap, dtype=np.uint8, count=size_bytes)
        self._full = memoryview(self._mmap)
        self.view: memoryview = self._full[:size_bytes]
        """The arena's blocks as bytes (get_into's fast path slices it: _fastget.py)."""
        lay = Layout.parse(self._mmap, size_bytes)
        self.slots: SlotReader | None = (
            None if lay is None else SlotReader(self._mmap, lay, probe=native.probe_many,
                                                probe_keys=native.probe_keys, read_keys=native.read_keys,
                                                read_all=native.read_all)
        )
        """The version-stamped slots and the shared index (None: the node offers none, so
        every read pins): what :func:`_read_one_sided` reads without a round trip."""

    def region(self, offset: int, size_bytes: int) -> np.ndarray:
        """``size_bytes`` of the arena at ``offset`` (a view).

        Raises:
            InternalError: the range is outside the arena (a bug or a corrupt response).
            Unavailable: the mapping was closed meanwhile (the node restarted).
        """
        if self.array.size != self.size_bytes:
            raise Unavailable(f"the arena mapping of {self.path} was closed (the node restarted)")
        if offset < 0 or offset + size_bytes > self.size_bytes:
            raise InternalError(
                f"node sent arena range [{offset}, {offset + size_bytes}) outside its "
                f"{self.size_bytes}-byte arena"
            )
        return self.array[offset : offset + size_bytes]

    def copy_pairs(self, writes: list[tuple[int, memoryview]]) -> list[tuple[memoryview, memoryview]]:
        """``(arena bytes at offset, value)`` per ``(offset, value)`` write: what
        ``copy_many`` takes (views of :attr:`view`, one mapping check for the batch).

        Raises:
            InternalError: a range is outside the arena (a bug or a corrupt response).
            Unavailable: the mapping was closed meanwhile (the node restarted).
        """
        view, size = self.view, self.size_bytes
        if len(view) != size:
            raise Unavailable(f"the arena mapping of {self.path} was closed (the node restarted)")
        out = []
        for offset, value in writes:
            end = offset + len(value)
            if offset < 0 or end > size:
                raise InternalError(
                    f"node sent arena range [{offset}, {end}) outside its {size}-byte arena"
                )
            out.append((view[offset:end], value))
        return out

    def close(self) -> None:
        """Unmap (deferred to the garbage collector while copies still hold views)."""
        self.array = np.empty(0, dtype=np.uint8)
        self.slots = None
        view, self.view = self.view, memoryview(b"")
        full, self._full = self._full, memoryview(b"")
        for v in (view, full):
            try:
                v.release()  # slices of it still in use keep the mapping until they go
            except BufferError:
                pass
        try:
            self._mmap.close()
        except BufferError:
            pass



def _copy_pinned(
    arena: ArenaMap, blocks: Sequence[pb.PinnedBlock], base: int, sink: _ReadSink, _deadline: float
) -> None:
    first = True
    for j, b in enumerate(blocks):
        if not b.found:
            continue
        src = arena.region(b.offset, b.size_bytes)
        if first and _hooks._hook is not None and sink.views is not None and src.size > 1:
            first = False  # test seam: copy half, report, then the rest
            dst = sink._fits(base + j, src.size)
            if dst is not None:
                half = src.size // 2
                np.copyto(dst[:half], src[:half])
                _hooks.fire("shm_copy_out_mid", offset=b.offset, size_bytes=b.size_bytes)
                np.copyto(dst[half:], src[half:])
                sink._done(base + j, src.size, b.meta, _tier(b.tier))
            continue
        sink.from_array(base + j, src, b.meta, _tier(b.tier))
    _hooks.fire("shm_copy_out_done")


def one_sided_enabled() -> bool:
    """Whether gets try one-sided reads first (``KVSTORED_ONE_SIDED`` is not ``0``; read at
    each get, so a test may turn them off to exercise the pinned path alone)."""
    if _ENV_DATA is not None:
        # one dict lookup: os.environ.get is four Python frames (Mapping.get, __getitem__,
        # encodekey, encode), 1 us warm and 8-9 us after a context switch left them cold
        # (docs/performance.md, "The Python around the one native call")
        return _ENV_DATA.get(_ONE_SIDED_KEY) != _OFF
    return os.environ.get("KVSTORED_ONE_SIDED", "") != "0"


def _env_data() -> dict[bytes, bytes] | None:
    data = getattr(os.environ, "_data", None) if os.name == "posix" else None
    return data if isinstance(data, dict) else None


_ENV_DATA = _env_data()
"""CPython's ``os.environ`` store on POSIX (fs-encoded keys and values; ``os.environ[k] = v``,
``del`` and ``monkeypatch.setenv`` update it), or None where it is not that (then
``os.environ.get``); tests/unit/client/test_one_sided_switch.py checks they agree."""
_ONE_SIDED_KEY = os.fsencode("KVSTORED_ONE_SIDED")
_OFF = b"0"


_SESSION = Session()
"""The session step of every one-sided read (immutable: one object, not one per read)."""

ONE_SIDED_STATS = {"hits": 0, "fallbacks": 0}
"""This process's one-sided reads: ``hits`` (blocks kept with no round trip) and
``fallbacks`` (blocks the index named but whose check failed: read through the node)."""


def one_sided_live(st: ClientState, info: NodeInfo) -> Op[bool]:
    """Whether a one-sided read (or probe) may use the mapped arena now.

    Only inside this client's live session with the node whose arena is mapped: the
    OpenSession stream is the node's liveness, by construction (it ends when the node
    process dies; no timer). A SIGKILLed node's arena keeps its last contents in a mapping
    that nobody writes any more; those blocks are the dead node's, which the design never
    serves (a replica whose node or epoch is gone is a miss). So the session is opened (or
    checked open) first: a dead node fails that step (Unavailable, and the client describes
    the node again on its next call), and a session answered by another epoch than the one
    mapped (the node restarted with a new arena) refuses the stale mapping the same way.

    Raises:
        Unavailable: the node is gone, or restarted since the arena was mapped.
    """
    arena = st.arena
    if arena is None or arena.slots is None or not one_sided_enabled():
        return False
    yield _SESSION
    if st.session_epoch and st.session_epoch != info.epoch:
        raise Unavailable(f"the node restarted (epoch {st.session_epoch}, arena mapped at epoch "
                          f"{info.epoch}); describe it again")
    return True


def dram_present(st: ClientState, keys: list[bytes], info: NodeInfo) -> list[bool] | None:
    """Per key: a DRAM block of this client's namespace, by the shared index and its slot
    header (no round trip; never stamps recency: a probe is not a read), or None when no
    slot region is mapped or a key is invalid (ask the node, whose checks name it). False
    means "not known here": ask the node (an SSD-only block, a miss, a slot changing now).
    Call it only after :func:`one_sided_live` said yes (it checks ``KVSTORED_ONE_SIDED``).
    """
    arena = st.arena
    reader = None if arena is None else arena.slots
    if reader is None:
        return None
    found = bytearray(len(keys))
    if reader.lookup_keys(st.stored_namespace_id, keys, info.min_key_bytes, info.max_key_bytes, found) < 0:
        return None
    return [b == 1 for b in found]


def dram_lead(st: ClientState, keys: list[bytes], info: NodeInfo) -> int:
    """How many leading keys are DRAM blocks readable one-sided now (one native call: hashing
    and index probes of the whole prefix, no per-key Python object), or -1 when no slot
    region is mapped or a key is invalid (the node's path and its checks then answer).
    Call it only after :func:`one_sided_live` said yes (it checks ``KVSTORED_ONE_SIDED``)."""
    arena = st.arena
    reader = None if arena is None else arena.slots
    if reader is None:
        return -1
    lead = reader.lookup_keys(st.stored_namespace_id, keys, info.min_key_bytes, info.max_key_bytes)
    return max(lead, -1)


_OneSided = tuple[int, int, int, int, bytes]
"""``(key index, slot, version, size_bytes, meta)`` of a block the shared index named."""


def _plan_one_sided(arena: ArenaMap, namespace_id: bytes, sink: _ReadSink) -> tuple[list[_OneSided], list[int]]:
    """Look ``sink``'s keys up in the shared index and their slot headers (no round trip).

    Args:
        arena: the mapped arena (``arena.slots`` set).
        namespace_id: the STORED namespace id (tenant-scoped: docs/tenants.md).
        sink: the read's sink.

    Returns:
        ``(found, left)``: the blocks to copy, tail first, and the indexes of the keys the
        node must read (a miss, an SSD-only block, a slot changing now, a meta too long to
        be inline, a buffer too small: the node's path names that one).
    """
    reader = arena.slots
    assert reader is not None
    keys = sink.keys
    views = sink.views
    found: list[_OneSided] = []
    left: list[int] = []
    ids = idents(namespace_id, keys)
    slots, _lead = reader.probe_many(ids)
    at = slots.tolist()
    for i in range(len(keys) - 1, -1, -1):
        slot = at[i]
        snap = None if slot < 0 else reader.snapshot(slot, int(ids[i, 0]), int(ids[i, 1]))
        if snap is None or (views is not None and snap[2] > len(views[i])):
            left.append(i)
            continue
        found.append((i, slot, snap[0], snap[2], snap[3]))
    return found, left


def _copy_one_sided(arena: ArenaMap, sink: _ReadSink, found: list[_OneSided], _deadline: float) -> list[int]:
    """Copy the planned blocks one by one, each kept only if its slot version held
    (copy_checked): the path of the test seam (``_hooks``), whose hook fires mid-copy;
    without a hook :func:`_read_one_sided` reads the whole batch in one call.

    Tail first: each slot's ``access_ns`` is stamped (CLOCK_MONOTONIC) before its copy, the
    last key's first, so the node's eviction (which reads the stamps) keeps a prefix's head
    longest. Returns the indexes of the keys whose check failed (read through the node).
    """
    reader = arena.slots
    if reader is None or len(arena.view) != arena.size_bytes:
        return [i for i, *_ in found]  # unmapped meanwhile: the node's path says why
    words = reader.words
    full = arena.view
    views = sink.views
    hook = _hooks._hook
    failed: list[int] = []
    for i, slot, version, size, meta in found:
        off = slot * UNIT_BYTES
        dst: memoryview | bytearray = views[i][:size] if views is not None else bytearray(size)
        reader.touch(slot)
        if hook is not None and size > 1:  # test seam: copy half, report, then the rest
            ok = _checked_halves(dst, full[off : off + size], words, slot * SLOT_WORDS, version)
        else:
            ok = copy_checked(dst, full[off : off + size], words, slot * SLOT_WORDS, version)
        if not ok:
            ONE_SIDED_STATS["fallbacks"] += 1
            failed.append(i)
            continue
        ONE_SIDED_STATS["hits"] += 1
        if views is None:
            sink.values[i] = dst  # type: ignore[assignment]  # a bytearray, as the TCP path's
        sink._done(i, size, meta, Tier.DRAM)
    return failed


def _read_one_sided(arena: ArenaMap, namespace_id: bytes, sink: _ReadSink, counts: OneSidedCounts,
                    _deadline: float) -> list[int]:
    """The whole batch one-sided in one call (``SlotReader.read_keys``: native when built):
    hashing, index probes, header checks, the recency stamps (tail first) and the checked
    copies. Fills ``sink`` with what was kept; adds hits (blocks, bytes), fallbacks and
    misses to ``counts`` (reported to the node later); returns the indexes of the keys the
    node must read, in key order."""
    reader = arena.slots
    if reader is None or len(arena.view) != arena.size_bytes:
        return list(range(len(sink.keys)))  # unmapped meanwhile: the node's path says why
    views = sink.views
    sizes, metas, values, fallbacks = reader.read_keys(
        namespace_id, sink.keys, views, time.monotonic_ns()
    )
    if None not in sizes:  # every key kept (the common case): whole lists, no per-key calls
        num_bytes = sum(sizes)  # type: ignore[arg-type]  # no None: checked above
        sink.sizes, sink.metas, sink.tiers = sizes, metas, [Tier.DRAM] * len(sizes)
        if values is not None:
            sink.values = values  # type: ignore[assignment]  # bytes, no None: all kept
        counts.add(len(sizes), num_bytes, 0, 0)  # (a failed check leaves a None: no fallbacks)
        ONE_SIDED_STATS["hits"] += len(sizes)
        return []
    left = [i for i, s in enumerate(sizes) if s is None]
    hits = len(sizes) - len(left)
    num_bytes = 0
    if hits:
        num_bytes = sum(s for s in sizes if s is not None)
        for i, s in enumerate(sizes):
            if s is not None:
                if values is not None:
                    sink.values[i] = values[i]
                sink._done(i, s, metas[i], Tier.DRAM)
    reported, reported_bytes = hits, num_bytes
    if left and hits:  # hits between the first and last key left are pinned and read again
        again = [s for s in sizes[left[0] : left[-1] + 1] if s is not None]  # (the node counts those)
        reported, reported_bytes = hits - len(again), num_bytes - sum(again)
    counts.add(reported, reported_bytes, fallbacks, len(left) - fallbacks)
    ONE_SIDED_STATS["hits"] += hits
    ONE_SIDED_STATS["fallbacks"] += fallbacks
    return left


def _checked_halves(dst: object, src: memoryview, words: np.ndarray, index: int, version: int) -> bool:
    """copy_checked's test seam: half the bytes, ``shm_one_sided_mid`` fired, then the rest
    (the version is checked before the first half and after the second)."""
    d = np.frombuffer(dst, dtype=np.uint8)  # type: ignore[call-overload]  # any writable buffer
    half = len(src) // 2
    if int(words[index]) != version:
        return False
    np.copyto(d[:half], np.frombuffer(src[:half], dtype=np.uint8))
    _hooks.fire("shm_one_sided_mid", slot=index // SLOT_WORDS)
    return copy_checked(d[half:], src[half:], words, index, version)


def _read_shm(st: ClientState, info: NodeInfo, sink: _ReadSink, deadline: float) -> Op[dict[int, int]]:
    """Read ``sink``'s keys: one-sided DRAM hits first (in a live session), the rest pinned
    (PinBlocks, in windows of PIN_CHUNK_KEYS, tail first) and copied out of the arena.

    Returns:
        The misses the node marked ``through`` (a peer holds the block and this node had
        no room to keep a copy): key index -> size in bytes (0 = not known); the caller
        reads exactly those by the inline Get, which streams them through.
    """
    keys = sink.keys
    through: dict[int, int] = {}
    arena = st.arena
    if arena is None:
        raise Unavailable("the arena mapping was dropped; describe the node again")
    first, last = 0, len(keys)
    if (yield from one_sided_live(st, info)):  # DRAM hits: no round trip (in a live session)
        if _hooks._hook is None:  # the whole batch in one call (native when built)
            views = sink.views
            left = yield Blocking(
                functools.partial(_read_one_sided, arena, st.stored_namespace_id, sink, st.one_sided_counts),
                0 if views is None else sum(map(len, views)),
            )
            control = st.control
            if control is not None and len(left) < len(keys):  # hits: the node hears of them
                control.note_report()  # (with the next request, or the idle flusher's)
        else:  # the test seam's path: block by block, each copy in halves around a hook
            planned, left = _plan_one_sided(arena, st.stored_namespace_id, sink)
            misses = len(left)
            if planned:
                failed = yield Blocking(
                    functools.partial(_copy_one_sided, arena, sink, planned), sum(f[3] for f in planned)
                )
                left += failed
                lo, hi = (min(left), max(left)) if left else (len(keys), -1)
                kept = [i for i in set(range(len(keys))) - set(left) if not lo <= i <= hi]  # (as above)
                st.one_sided_counts.add(len(kept), sum(sink.sizes[i] or 0 for i in kept), len(failed), misses)
        if not left:
            return through
        first, last = min(left), max(left) + 1  # hits inside it are read again: same key
    chunk_keys = min(PIN_CHUNK_KEYS, info.max_batch_keys)
    if last - first <= chunk_keys:  # one window (the common case: no list of windows)
        windows: list[tuple[int, int]] = []
        start, end = first, last
    else:
        windows = [(a + first, b + first) for a, b in _chunks(last - first, chunk_keys)]
        start, end = windows.pop()  # tail chunk first: see _tail_first
    while start < end or windows:
        if start >= end:
            start, end = windows.pop()
        lease_s = lease_for(info, deadline)
        session_id = yield Session()
        pinned_at = _clock()
        resp = yield Call(
            "PinBlocks",
            pb.PinBlocksRequest(
                keys=keys[start:end], namespace_id=st.namespace_id,
                lease_ms=int(lease_s * 1000), epoch=info.epoch, session_id=session_id,
                request_id=next_request_id(),
            ),
            pb.PinBlocksResponse, undo=_undo_pin,
        )
        copied = False
        try:
            blocks = resp.blocks
            n = len(blocks)
            if n != end - start:
                raise InternalError(f"PinBlocks answered {n} items for {end - start} keys")
            cut = n
            plan = None if sink.views is None else _fastget.plan_copies(arena, blocks, start, sink)
            if plan is not None:  # get_into, every block found: one pass, one copy
                yield Blocking(functools.partial(_fastget.copy_planned, plan), plan[3])
                _fastget.record(plan, blocks, start, sink)
            else:
                # An SSD hit that could not be promoted because this chunk's own pins fill
                # DRAM (NoCapacity after the first key) is retried in the next chunk, after
                # release.
                if n > 1:
                    cut = next(
                        (j for j in range(1, n) if blocks[j].status.code == ErrorCode.NO_CAPACITY), n
                    )
                    if cut < n:
                        blocks = blocks[:cut]
                num_bytes = 0
                found = False
                for j, b in enumerate(blocks):
                    if b.HasField("status"):  # an item error (an unset status is OK)
                        sink.check_status(start + j, b.status)
                    if b.found:  # empty blocks too: they are hits of 0 bytes
                        found = True
                        num_bytes += b.size_bytes
                    elif b.through:  # a peer's block the node could not keep: read by Get
                        through[start + j] = b.size_bytes
                if found:
                    yield Blocking(
                        functools.partial(_copy_pinned, arena, blocks, start, sink),
                        num_bytes,
                    )
            copied = True
            start += cut
        finally:
            control = st.control
            if resp.pin_id and copied and control is not None and _clock() < pinned_at + lease_s:
                # The copy returned within the lease by this process's clock (the node's lease
                # started later, when it granted): the release rides on this client's next
                # request (kvstored/client/_control.py); the pin holds until that arrives.
                control.defer_release(resp.pin_id)
            elif resp.pin_id:  # after the copy returned; awaited, so the next op sees it
                rel = yield release_call(resp.pin_id)
                if copied and rel is None:
                    raise Unavailable(
                        "the node did not confirm the pin release; the read is discarded"
                    )
                if copied and resp.pin_id in rel.expired_pin_ids:
                    raise LeaseExpired(
                        f"the pins of keys #{start - cut}..#{start - 1} outlived their "
                        f"{lease_s:.1f} s lease before the copy was done; the read is discarded"
                    )
    return through



def _copy_into_arena(arena: ArenaMap, writes: list[tuple[int, memoryview]], _deadline: float) -> None:
    # No lease check here: the node decides at CommitPut whether the lease held.
    if _hooks._hook is None:  # the whole batch in one call (kvstored.native: C if built)
        # non-temporal stores for large blocks: no read-for-ownership of the arena's lines,
        # and the cache is left to the process (others read the blocks later, from memory)
        copy_many(arena.copy_pairs(writes), stream=True)
        _hooks.fire("shm_copy_in_done")
        return
    for k, (offset, value) in enumerate(writes):
        dst, src = arena.region(offset, len(value)), np.frombuffer(value, dtype=np.uint8)
        if k == 0 and _hooks._hook is not None and src.size > 1:  # test seam: half, report, rest
            half = src.size // 2
            np.copyto(dst[:half], src[:half])
            _hooks.fire("shm_copy_in_mid", offset=offset, size_bytes=src.size)
            np.copyto(dst[half:], src[half:])
            continue
        np.copyto(dst, src)
    _hooks.fire("shm_copy_in_done")


def _copy_into_slots(arena: ArenaMap, offsets: Sequence[int], values: Sequence[memoryview],
                     _deadline: float) -> None:
    """A put's copy into its slots: one ``copy_at`` call (C when built: ranges and buffers
    checked, no slice per block), or, with a test hook set, :func:`_copy_into_arena`."""
    if _hooks._hook is not None:
        _copy_into_arena(arena, list(zip(offsets, values, strict=True)), _deadline)
        return
    view = arena.view
    if len(view) != arena.size_bytes:
        raise Unavailable(f"the arena mapping of {arena.path} was closed (the node restarted)")
    try:
        copy_at(view, offsets, values, stream=True)
    except ValueError as exc:  # a slot outside the arena: a bug or a corrupt response
        raise InternalError(f"node sent a slot outside its arena: {exc}") from None
    _hooks.fire("shm_copy_in_done")


def _granted(resp: pb.CommitSlotsResponse) -> tuple[Sequence[int], Sequence[int], Sequence[int]]:
    """The slots a CommitSlots answer granted as columns ``(ids, offsets, sizes)``: packed
    (a node answering a request with columns) or one GrantedSlot each."""
    if resp.slot_ids:
        return resp.slot_ids, resp.slot_offsets, resp.slot_sizes
    slots = resp.slots
    return ([g.slot_id for g in slots], [g.offset for g in slots], [g.size_bytes for g in slots])


def _return_slots_call(session_id: int, slot_ids: list[int]) -> Call:
    """The CommitSlots that only returns slots (always sent, see ``Call.release``)."""
    return Call("CommitSlots", pb.CommitSlotsRequest(session_id=session_id,
                                                     return_slot_ids=slot_ids),
                pb.CommitSlotsResponse, release=True)


def _undo_slots(session_id: int, resp: pb.CommitSlotsResponse) -> Call | None:
    ids = list(_granted(resp)[0])
    return _return_slots_call(session_id, ids) if ids else None


def _commit_slots(
    st: ClientState, info: NodeInfo, owner: tuple[int, int], namespace_id: bytes,
    writes: tuple[Sequence[int], Sequence[bytes], Sequence[int], Sequence[bytes] | None] | None,
    after: bool = False,
) -> Op[pb.CommitSlotsResponse]:
    """One CommitSlots: ``writes`` (slot ids, keys, sizes, metas or None), the pool's
    returns, its refill: in the answer, or (``after``, control channel) in the frame that
    follows it, read with the connection's next request (:func:`_refill_arrived`)."""
    pool = st.slots
    sent_at = _clock()
    request_id = next_request_id()
    req = pb.CommitSlotsRequest(
        namespace_id=namespace_id, session_id=owner[0], epoch=info.epoch,
        request_id=request_id, return_slot_ids=pool.take_returns(owner),
        grant_after_answer=after,
    )
    add_want = req.want.add
    for size, num in pool.wants():
        want = add_want()
        want.size_bytes = size
        want.num_slots = num
    if writes is not None and writes[3] is None and pool.columns_epoch == info.epoch:
        ids, keys, sizes, _ = writes  # a plain batch to a node that takes columns: packed
        req.write_slot_ids.extend(ids)
        req.write_keys.extend(keys)
        req.write_sizes.extend(sizes)
    elif writes is not None:
        add = req.writes.add
        ids, keys, sizes, metas = writes
        for j, sid in enumerate(ids):  # field by field: a keyword SlotWrite costs ~1.5 us (upb)
            w = add()
            w.slot_id = sid
            w.key = keys[j]
            w.size_bytes = sizes[j]
            if metas is not None and metas[j]:
                w.meta = metas[j]
    trailer = (functools.partial(_refill_arrived, st, owner, request_id, info.pin_lease_s, sent_at)
               if after else None)
    resp = yield Call("CommitSlots", req, pb.CommitSlotsResponse,
                      undo=functools.partial(_undo_slots, owner[0]), trailer=trailer)
    if resp.slot_budget_bytes:
        pool.node_budget_bytes = resp.slot_budget_bytes
    if resp.accepts_columns:
        pool.columns_epoch = info.epoch
    if resp.slots or resp.slot_ids:
        pool.add_columns(owner, *_granted(resp), info.pin_lease_s, sent_at)
    return resp


def _refill_arrived(st: ClientState, owner: tuple[int, int], request_id: int, lease_s: float,
                    sent_at: float, resp: pb.ControlResponse | None) -> None:
    """The refill of a CommitSlots answered with ``grant_follows`` (the control channel's
    trailer frame), on whichever thread reads it: its slots join the pool if the session
    that asked is still the pool's (their lease began after ``sent_at``). None: the
    connection failed first, so the slots (if the node granted any) are unknown here: the
    request's orphan ack frees them (kvstored/client/_orphans.py)."""
    if _hooks._hook is not None:
        _hooks.fire("slot_refill_arrived", request_id=request_id, lost=resp is None)
    if resp is None:
        st.orphans.add(owner[0], request_id)
        return
    if resp.error_code:  # refused (session ending, quarantine over its bound): none granted
        return
    got = resp.commit_slots
    if got.slot_budget_bytes:
        st.slots.node_budget_bytes = got.slot_budget_bytes
    st.slots.add_columns(owner, *_granted(got), lease_s, sent_at, current_only=True)


def _put_ahead(
    st: ClientState, info: NodeInfo, items: list[_Item], results: list[PutResult | None],
    arena: ArenaMap,
) -> Op[list[_Item]]:
    """Reserve-ahead puts (kvstored/client/_slots.py): the items copied into slots held in
    advance and committed with one CommitSlots per chunk; returns the items no slot took
    (they go through ReservePut).

    Over the control channel, when two puts' worth of slots fit the pool's budget, each
    CommitSlots asks for its refill after its answer: the pool holds two puts' worth, a put
    copies into the slots the refill of the put before last granted, and the answer, which
    put() waits for, carries no grant."""
    pool = st.slots
    budget = pool.budget_bytes(info.arena_size_bytes)
    first = len(items[0][2])
    if all(len(v) == first for _, _, v, _ in items):  # one size class (the common case)
        classes = [size_class(first)] * len(items)
    else:
        classes = [size_class(len(v)) for _, _, v, _ in items]
    need_bytes = sum(classes)
    if budget <= 0 or need_bytes > budget:
        # a batch larger than the pool: one ReservePut and one CommitPut for all of it cost
        # less than a CommitSlots per pool-sized chunk, each refilling the pool (measured:
        # bench/bench_vllm.py's save of 960 x 192 KiB, 0.10 s against 0.12 s)
        return items
    after = st.control is not None and 2 * need_bytes <= budget and len(items) <= info.max_batch_keys
    counts: dict[int, int] = {}
    for c in classes:
        counts[c] = counts.get(c, 0) + 1
    pool.note_demand(counts, budget, 2 if after else 1)
    session_id = yield Session()
    owner = (session_id, info.epoch)
    if after:  # one chunk, every block in a slot or none
        got = pool.take_all(owner, counts)
        if got is None:  # the first put (of this shape): a grant, then the copy
            yield from _commit_slots(st, info, owner, st.namespace_id, None)
            got = pool.take_all(owner, counts)
        if got is not None:
            return (yield from _write_slots(st, info, owner, items, classes, got, results, arena))
    rest: list[_Item] = []
    chunks = [items] if len(items) <= info.max_batch_keys else _tail_first(
        _chunks_by_bytes(items, budget, info.max_batch_keys))  # (the batch fits the budget)
    for chunk in chunks:
        sizes = classes if chunk is items else [size_class(len(v)) for _, _, v, _ in chunk]
        if pool.lacks(owner, sizes):  # the first put (of this size): a grant, then the copy
            yield from _commit_slots(st, info, owner, st.namespace_id, None)
        slots = pool.take(owner, sizes)
        taken: dict[int, tuple[list[int], list[int]]] = {}
        part: list[_Item] = []
        part_classes: list[int] = []
        for it, slot, c in zip(chunk, slots, sizes, strict=True):
            if slot is None:
                rest.append(it)
                continue
            ids, offs = taken.setdefault(c, ([], []))
            ids.append(slot.slot_id)
            offs.append(slot.offset)
            part.append(it)
            part_classes.append(c)
        if part:
            yield from _write_slots(st, info, owner, part, part_classes, taken, results, arena,
                                    after=False)
    return rest


def _write_slots(
    st: ClientState, info: NodeInfo, owner: tuple[int, int], items: list[_Item],
    classes: list[int], got: dict[int, tuple[list[int], list[int]]],
    results: list[PutResult | None], arena: ArenaMap, *, after: bool = True,
) -> Op[list[_Item]]:
    """Copy ``items`` into the slots ``got`` (per size class, in item order) and commit them
    with one CommitSlots (``after``: its refill after its answer); fills ``results``."""
    pool = st.slots
    if len(got) == 1:  # one size class: the slots in item order
        ids, offsets = next(iter(got.values()))
    else:
        ids, offsets = [], []
        at = dict.fromkeys(got, 0)
        for c in classes:
            j = at[c]
            at[c] = j + 1
            ids.append(got[c][0][j])
            offsets.append(got[c][1][j])
    index, keys, values, metas = zip(*items, strict=True)
    sizes = [len(v) for v in values]
    try:
        yield Blocking(functools.partial(_copy_into_slots, arena, offsets, values), sum(sizes))
        # the node answers LeaseExpired for a slot whose lease lapsed (nothing stored)
        resp = yield from _commit_slots(
            st, info, owner, st.namespace_id,
            (ids, keys, sizes, metas if any(metas) else None),
            after=after)
    except BaseException:
        pool.give_back(owner, ids)  # after the copy returned
        raise
    stored = resp.write_stored
    if stored:  # packed: every write stored or existed
        if len(stored) != len(items):
            raise InternalError(f"CommitSlots answered {len(stored)} items for {len(items)}")
        for i, f in zip(index, stored, strict=True):
            results[i] = _STORED if f else _EXISTED
        return []
    got_results = resp.results
    if len(got_results) != len(items):
        raise InternalError(f"CommitSlots answered {len(got_results)} items for {len(items)}")
    for i, r in zip(index, got_results, strict=True):
        # an unset status is OK (reading r.status would build a message per item)
        if r.HasField("status"):
            results[i] = _result(r.status, r.stored)
        else:
            results[i] = _STORED if r.stored else _EXISTED
    return []


def _put_shm(
    st: ClientState, info: NodeInfo, items: list[_Item], results: list[PutResult | None],
    deadline: float,
) -> Op[None]:
    arena = st.arena
    if arena is None:
        raise Unavailable("the arena mapping was dropped; describe the node again")
    if st.slots.max_bytes:
        items = yield from _put_ahead(st, info, items, results, arena)
    max_bytes = max(1, min(MAX_CHUNK_BYTES, info.arena_size_bytes // 4))
    for chunk in _tail_first(_chunks_by_bytes(items, max_bytes, info.max_batch_keys)):
        lease_s = lease_for(info, deadline)
        session_id = yield Session()
        resp = yield Call(
            "ReservePut",
            pb.ReservePutRequest(
                items=[pb.ReserveItem(key=k, size_bytes=len(v), meta=m) for _, k, v, m in chunk],
                namespace_id=st.namespace_id, lease_ms=int(lease_s * 1000), epoch=info.epoch,
                session_id=session_id, request_id=next_request_id(),
            ),
            pb.ReservePutResponse, undo=_undo_reserve,
        )
        if len(resp.reservations) != len(chunk):
            if resp.reservation_id:
                yield abort_call(resp.reservation_id)
            raise InternalError(f"ReservePut answered {len(resp.reservations)} items for {len(chunk)}")
        writes = []
        for (i, _, value, _), r in zip(chunk, resp.reservations, strict=True):
            err = status_error(r.status)
            if err is not None:
                results[i] = PutResult(False, err)
            elif r.exists:
                results[i] = PutResult(False)
            else:
                writes.append((r.offset, value))
        if not resp.reservation_id:
            continue
        try:
            yield Blocking(
                functools.partial(_copy_into_arena, arena, writes), sum(len(v) for _, v in writes)
            )
            # the node refuses the commit (LeaseExpired, space freed) if the lease lapsed
            commit = yield Call(
                "CommitPut", pb.CommitPutRequest(reservation_id=resp.reservation_id),
                pb.CommitPutResponse,
            )
        except (LeaseExpired, NotFound):
            raise  # the node already released the reservation
        except BaseException:
            yield abort_call(resp.reservation_id)  # after the copy returned
            raise
        if len(commit.results) != len(chunk):
            raise InternalError(f"CommitPut answered {len(commit.results)} items for {len(chunk)}")
        for (i, *_), r in zip(chunk, commit.results, strict=True):
            results[i] = _result(r.status, r.stored)
