"""DRAM tier: one shared-memory arena carved by :class:`BlockAllocator`, with an LRU index.

The arena is a file in ``arena_dir`` (a tmpfs such as /dev/shm), named
``kvstored-<node_id>-<pid>.arena``, ftruncate'd to the arena size and mmap'd ``MAP_SHARED``
(prefaulted with ``MAP_POPULATE``), so a local client can map the same file and copy blocks
straight into its own buffers. With ``arena_dir=None`` the arena is an anonymous mapping
(tests, benchmarks). The file is unlinked on close.

::

    arena file (MAP_SHARED)          entries: OrderedDict[key -> DramEntry]   (LRU first)
    +------+------+------+-----+      k7 -> (offset=0,     size, pins=0)  <- evicted first
    | k7   | free | k2   | ... |      k2 -> (offset=8192,  size, pins=1)     (pinned: skipped)
    +------+------+------+-----+      k9 -> (offset=...,   size, pins=0)  <- most recent
    0      4K     8K

Not thread-safe on its own: the store's components call it under the store lock (state.py).
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

import structlog
from sortedcontainers import SortedKeyList

from kvstored import native
from kvstored.native import store_release
from kvstored.tiers.allocator import DEFAULT_ALIGNMENT_BYTES, BlockAllocator
from kvstored.tiers.slots import Layout, SlotTable
from kvstored.tiers.ssd_format import _TAG_BYTES, touch_time
from kvstored.types import Tier, TierStats

log = structlog.get_logger(__name__)

_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


class _HasOffset(Protocol):
    """Anything placed in the arena: ``offset`` is its first byte's offset in the arena."""

    offset: int


class DramEntry:
    """Metadata of one committed block in the arena (kept lean: ~1M of these per node).

    Attributes:
        offset: byte offset in the arena (aligned).
        size_bytes: exact block size.
        pins: number of outstanding read pins; > 0 means never evicted nor freed.
        info: ``(namespace_id, meta)``, an interned pair shared by the blocks that have the
            same namespace and meta.
        skey: the block's store key (the same object as its key in ``DramTier.entries``);
            set by :meth:`DramTier.add`.
        generation: this replica's generation, unique per daemon start (epoch): stamped by
            the store's change feed when the entry enters the map (0 until then), or
            inherited from the SSD replica a promotion read (the same bytes). Sent with the
            block on the data plane and to the master in events and inventories.
        touched: monotonic seconds of the block's last use (commit, promotion, read hit,
            a one-sided read absorbed; :func:`~kvstored.tiers.ssd_format.touch_time`):
            the age pool LRU compares across nodes (``TieredStore.coldest_original_age_s``).

    Entries order by offset (``<``); the tier keeps them in one address-ordered
    ``SortedKeyList`` keyed by offset (16 bytes per block, instead of a dict offset -> key).
    """

    __slots__ = ("offset", "size_bytes", "pins", "info", "skey", "generation", "touched")

    def __init__(self, offset: int, size_bytes: int, info: tuple[bytes, bytes],
                 generation: int = 0, touched: float | None = None) -> None:
        self.offset = offset
        self.size_bytes = size_bytes
        self.pins = 0
        self.info = info
        self.skey = b""
        self.generation = generation
        self.touched = touch_time() if touched is None else touched

    def __lt__(self, other: _HasOffset) -> bool:
        return self.offset < other.offset

    def __gt__(self, other: _HasOffset) -> bool:
        return self.offset > other.offset

    @property
    def namespace_id(self) -> bytes:
        """Namespace the block was stored under (b"" = none)."""
        return self.info[0]

    @property
    def meta(self) -> bytes:
        """Opaque metadata stored with the block."""
        return self.info[1]


_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14


_ARENA_FILE = re.compile(r"^kvstored-(?P<node>.*)-(?P<pid>\d+)\.arena$")


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs. A zombie (exited, not yet reaped by its parent: state
    ``Z`` or ``X`` in ``/proc/<pid>/stat``) does not: its mappings are gone, so an arena file
    it owned is stale although ``kill(pid, 0)`` still succeeds."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else: ask /proc
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # no /proc here: trust kill()
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]  # "pid (comm) S ..."
    return state not in (b"Z", b"X")


def arena_file_name(node_id: str, pid: int) -> str:
    """The arena file name of node ``node_id``'s daemon ``pid``: ``kvstored-<node>-<pid>.arena``
    (characters outside ``[A-Za-z0-9_.-]`` of the node id become ``_``)."""
    return f"kvstored-{_SAFE_NAME.sub('_', node_id)}-{pid}.arena"


@dataclass(frozen=True, slots=True)
class ArenaFile:
    """One kvstored arena file found in an arena directory.

    Attributes:
        path: the file's path.
        node_name: the node id in its name (as made safe by :func:`arena_file_name`).
        pid: the pid of the daemon that created it.
        size_bytes: its size (tmpfs memory it may hold).
        owner_running: a process with that pid runs (its daemon, or a later process that
            reused the pid: either way the file is left alone).
    """

    path: str
    node_name: str
    pid: int
    size_bytes: int
    owner_running: bool


def list_arena_files(arena_dir: str | os.PathLike[str]) -> list[ArenaFile]:
    """Every kvstored arena file in ``arena_dir``, by name; none if the directory is missing.

    Reads names and sizes only (never opens or maps a file).
    """
    try:
        names = sorted(os.listdir(arena_dir))
    except OSError:
        return []
    found = []
    for name in names:
        m = _ARENA_FILE.match(name)
        if m is None:
            continue
        path = os.path.join(os.fspath(arena_dir), name)
        try:
            size = os.stat(path).st_size
        except OSError:
            continue  # removed meanwhile
        pid = int(m.group("pid"))
        found.append(ArenaFile(path, m.group("node"), pid, size, _pid_alive(pid)))
    return found


class ArenaInUse(Exception):
    """The arena file's owner pid runs: it is not removed."""


def remove_stale_arena(f: ArenaFile) -> None:
    """Unlink arena file ``f`` if its owner is (still) not running.

    Raises:
        ArenaInUse: its owner pid runs (checked again now, not trusted from ``f``).
        OSError: the unlink failed (FileNotFoundError: someone removed it already).
    """
    if _pid_alive(f.pid):
        raise ArenaInUse(f"{f.path}: its owner pid {f.pid} is running")
    os.unlink(f.path)
    log.info("stale_arena_removed", path=f.path, size_bytes=f.size_bytes)


def reclaim_own_stale_arenas(arena_dir: str | os.PathLike[str], node_id: str) -> int:
    """Unlink the arena files an earlier daemon of node ``node_id`` left when it died.

    A file ``kvstored-<node>-<pid>.arena`` of this node whose pid is not running holds tmpfs
    memory nobody frees otherwise (SIGKILL, OOM kill). Files of other nodes of the host are
    never touched, dead or alive: ``kvstored cleanup`` names and removes those.

    Returns:
        Number of files removed.
    """
    name = _SAFE_NAME.sub("_", node_id)
    removed = 0
    for f in list_arena_files(arena_dir):
        if f.node_name != name or f.owner_running:
            continue
        try:
            remove_stale_arena(f)
        except (ArenaInUse, OSError):
            continue
        removed += 1
    return removed


class DramArena:
    """The arena mapping: a shared-memory file (or anonymous memory) of a fixed size.

    Args:
        size_bytes: arena size; rounded down to a multiple of 4096.
        arena_dir: directory for the arena file (tmpfs), or None for an anonymous mapping.
        node_id: node name used in the file name.

    Raises:
        ValueError: the size holds no 4096-byte page.
        OSError: the file cannot be created, sized or mapped (e.g. /dev/shm too small).
    """

    def __init__(
        self,
        size_bytes: int,
        *,
        arena_dir: str | os.PathLike[str] | None,
        node_id: str = "node",
    ) -> None:
        size = (int(size_bytes) // DEFAULT_ALIGNMENT_BYTES) * DEFAULT_ALIGNMENT_BYTES
        if size <= 0:
            raise ValueError(f"DRAM arena must be at least 4096 bytes, got {size_bytes}")
        self.size_bytes = size
        self.layout = Layout(size)
        """Where the slot headers and the shared index follow the block bytes in the mapping
        (kvstored/tiers/slots.py): the file is ``layout.total_bytes`` long."""
        total = self.layout.total_bytes
        self.path: str | None = None
        self.file_id: tuple[int, int] = (0, 0)
        """``(st_dev, st_ino)`` of the file mapped at creation ((0, 0) when anonymous): what
        clients must find at :attr:`path`, never whatever file sits there later."""
        if arena_dir is None:
            self._mmap = mmap.mmap(-1, total, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        else:
            reclaim_own_stale_arenas(arena_dir, node_id)  # never another node's file
            name = arena_file_name(node_id, os.getpid())
            path = os.path.join(os.fspath(arena_dir), name)
            st = os.statvfs(os.fspath(arena_dir))
            free_bytes = st.f_bavail * st.f_frsize
            if free_bytes < total:
                # tmpfs pages are allocated on first touch: an arena larger than the free
                # space would SIGBUS the daemon later instead of failing now.
                raise OSError(
                    errno.ENOSPC,
                    f"arena_dir {arena_dir} has {free_bytes} bytes free but the DRAM tier needs "
                    f"{total} ({size} of blocks, the rest slot headers and index); lower "
                    "dram_size_bytes or enlarge the tmpfs",
                )
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, total)
                fst = os.fstat(fd)
                self.file_id = (fst.st_dev, fst.st_ino)
                # No MAP_POPULATE: prefaulting a large arena can take seconds per GiB on a
                # VM; start_prefault() does it in the background after the daemon is up.
                self._mmap = mmap.mmap(fd, total, flags=mmap.MAP_SHARED)
            except BaseException:
                os.close(fd)
                os.unlink(path)
                raise
            os.close(fd)
            self.path = path
        self.slot_table = SlotTable(self._mmap, self.layout, store=store_release,
                                    native_publish=native.publish_many,
                                    native_unindex=native.unindex_many)
        """The node's writer of the version-stamped slot headers and the shared index."""
        self._full_view = memoryview(self._mmap)
        self.view = self._full_view[:size]
        """The block bytes (``size_bytes``; the slot region after them is not included)."""
        self._closed = False
        self._prefault_lock = threading.Lock()
        self._prefault_thread: threading.Thread | None = None
        log.info("arena_mapped", path=self.path or "", size_bytes=size)

    @property
    def mapping(self) -> mmap.mmap:
        """The writable mapping of the whole file (``layout.total_bytes``: blocks, slot
        headers, index)."""
        return self._mmap

    def start_prefault(self, chunk_bytes: int = 64 << 20) -> None:
        """Fault the arena's pages in from a background thread (first touch is slow on VMs).

        Uses ``madvise(MADV_POPULATE_WRITE)`` chunk by chunk, so blocks written before the
        thread reaches them just fault on their own; stops when the arena closes. Idempotent.
        """
        if self._prefault_thread is not None or self._closed:
            return

        def run() -> None:
            start = time.monotonic()
            total = self.layout.total_bytes  # the slot headers and index too
            for off in range(0, total, chunk_bytes):
                with self._prefault_lock:
                    if self._closed:
                        return
                    try:
                        self._mmap.madvise(_MADV_POPULATE_WRITE, off, min(chunk_bytes, total - off))
                    except (OSError, ValueError):
                        return  # kernel < 5.14: pages fault in on first use instead
            log.info("arena_prefaulted", size_bytes=self.size_bytes,
                     duration_ms=round((time.monotonic() - start) * 1e3))

        self._prefault_thread = threading.Thread(target=run, name="kvstored-arena-prefault", daemon=True)
        self._prefault_thread.start()

    def close(self) -> None:
        """Unmap the arena and unlink its file; idempotent.

        If a caller still holds a view into the arena the mapping is left to the garbage
        collector (a warning is logged), but the file is unlinked regardless.
        """
        if self._closed:
            return
        with self._prefault_lock:
            self._closed = True
        try:
            self.view.release()
            self._full_view.release()
            self.slot_table.release()
            self._mmap.close()
        except BufferError:
            log.info("arena_unmap_deferred", path=self.path or "")
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            log.info("arena_unlinked", path=self.path)


_OFFSET = attrgetter("offset")


class DramTier:
    """Allocator plus LRU index of committed blocks in one arena (a
    :class:`~kvstored.tiers.base.TierBackend`).

    Reservations (blocks being written) and promotions in flight own allocator space but are
    not in ``entries``, so they are never evicted. ``by_offset`` holds the committed blocks'
    entries in address order (what eviction uses to free contiguous space). Callers hold the
    store lock.
    """

    tier = Tier.DRAM

    def __init__(self, arena: DramArena) -> None:
        self.arena = arena
        self.allocator = BlockAllocator(arena.size_bytes)
        self.entries: OrderedDict[bytes, DramEntry] = OrderedDict()
        # keyed by offset (attrgetter: C-level int compares; DramEntry.__lt__ cost ~2 us per
        # insert of a commit), 8 bytes per block more than a SortedList of the entries
        self.by_offset: SortedKeyList = SortedKeyList(key=_OFFSET)
        self.copies: OrderedDict[bytes, None] = OrderedDict()
        """Store keys of the committed blocks that are remote-fill copies of a peer's block
        (duplicates in the pool), oldest copy first; evicted before any other block and
        dropped, never demoted (spare.py)."""
        self.hits = 0
        self.evictions = 0
        self.pinned_blocks = 0

    @property
    def capacity_bytes(self) -> int:
        """Hard cap of the tier (the arena size)."""
        return self.allocator.capacity_bytes

    @property
    def used_bytes(self) -> int:
        """Arena bytes allocated: committed blocks, reservations and promotions in flight,
        each rounded up to the allocation unit (4096)."""
        return self.allocator.used_bytes

    def stats(self) -> TierStats:
        """The tier's counters and usage now (store lock held)."""
        return TierStats(
            tier=Tier.DRAM, capacity_bytes=self.allocator.capacity_bytes,
            used_bytes=self.allocator.used_bytes, num_blocks=len(self.entries),
            hits=self.hits, evictions=self.evictions,
        )

    def close(self) -> None:
        """Unmap the arena and unlink its file (:meth:`DramArena.close`); idempotent."""
        self.arena.close()

    def round_up(self, size_bytes: int) -> int:
        """Arena bytes a block of ``size_bytes`` occupies."""
        return self.allocator.round_up(size_bytes)

    def add(self, skey: bytes, entry: DramEntry, *, publish: bool = True) -> None:
        """Index a committed block as the most recent (its space is already allocated).

        Publishes it to one-sided readers: its slot header is stamped and made even and the
        shared index maps its (stored namespace id, key) to it (kvstored/tiers/slots.py).
        ``publish=False``: not yet; the caller passes the entry to :meth:`publish` before it
        releases the store lock (a batch of commits publishes in one native call). Until
        then one-sided readers miss it (they ask the node, which finds it in the map)."""
        entry.skey = skey
        self.entries[skey] = entry
        self.by_offset.add(entry)
        if publish:
            self.arena.slot_table.publish(entry.offset, entry.size_bytes, entry.info[0],
                                          skey[_TAG_BYTES:], entry.generation, entry.info[1])

    def add_many(self, items: list[tuple[bytes, DramEntry]], *, checked_new: bool = False) -> None:
        """:meth:`add` of each ``(skey, entry)`` (distinct keys not in the map), in order, the
        last most recent, then one :meth:`publish` of them all (a batch of commits).

        ``checked_new``: the caller checked, under the store lock it still holds, that the
        keys are distinct and none is in the map (the observed map then skips its own check,
        ``ObservedEntries.add_new``); the order, stamps, events and counts are the same."""
        if not items:
            return
        for skey, entry in items:
            entry.skey = skey
        entries = self.entries
        add_new = getattr(entries, "add_new", None)  # the store's observed map (feed.py)
        if add_new is not None:
            add_new(items, checked_new=checked_new)
        else:
            for skey, entry in items:
                entries[skey] = entry
        add = self.by_offset.add
        pub: list[tuple[int, int, bytes, bytes, int, bytes]] = []
        for skey, e in items:  # (after the map: the feed stamped the generations)
            add(e)
            info = e.info
            pub.append((e.offset, e.size_bytes, info[0], skey[_TAG_BYTES:], e.generation, info[1]))
        self.arena.slot_table.publish_many(pub)

    def publish(self, entries: list[DramEntry]) -> None:
        """Publish entries added with ``publish=False``, in order (store lock held; see
        :meth:`add`): ``SlotTable.publish_many``, one native call when built."""
        if entries:
            self.arena.slot_table.publish_many([
                (e.offset, e.size_bytes, e.info[0], e.skey[_TAG_BYTES:], e.generation, e.info[1])
                for e in entries
            ])

    def forget(self, skey: bytes) -> DramEntry:
        """Drop a block from the index but keep its space allocated (a demotion still reads
        it; the demoter frees it). Raises KeyError if not present.

        Unpublishes it first: its slot header is made odd (one-sided readers copying it then
        fall back to the node) and its bucket leaves the shared index, before the space can be
        freed, reused or rewritten."""
        entry = self.entries[skey]
        self.arena.slot_table.unpublish(entry.offset)
        self.arena.slot_table.unindex(entry.info[0], skey[_TAG_BYTES:])
        del self.entries[skey]
        self.by_offset.remove(entry)
        self.copies.pop(skey, None)
        return entry

    def absorb_reads(self, limit: int = 64) -> int:
        """Move the LRU blocks that one-sided readers read since the last call to the most
        recent end (recency without a round trip: kvstored/tiers/slots.py ``access_ns``).

        Looks at the ``limit`` least recent blocks only (eviction's candidates; O(limit) per
        call); those whose slot carries a reader's stamp move, in stamp order (a reader
        stamps a prefix's tail first, so its head ends most recent, as the pinned path's
        chain-aware touch leaves it), and their stamps are cleared. Store lock held.

        Returns:
            The number of blocks moved.
        """
        table = self.arena.slot_table
        read: list[tuple[int, bytes]] = []
        for n, (skey, e) in enumerate(self.entries.items()):
            if n >= limit:
                break
            ns = table.access_ns(e.offset)
            if ns:
                read.append((ns, skey))
        read.sort()
        now = touch_time()
        for _, skey in read:
            e = self.entries[skey]
            table.clear_access(e.offset)
            e.touched = now
            self.entries.move_to_end(skey)
        return len(read)

    def entry_at(self, offset: int) -> DramEntry | None:
        """The committed block starting at ``offset``, if any."""
        bo = self.by_offset
        i = bo.bisect_key_left(offset)
        if i < len(bo) and bo[i].offset == offset:
            return bo[i]
        return None

    def entry_ending_at(self, offset: int) -> DramEntry | None:
        """The committed block whose (rounded) extent ends exactly at ``offset``, if any."""
        bo = self.by_offset
        i = bo.bisect_key_left(offset)
        if i == 0:
            return None
        e: DramEntry = bo[i - 1]
        return e if e.offset + self.round_up(e.size_bytes) == offset else None

    def remove(self, skey: bytes) -> DramEntry:
        """Drop an unpinned block from the index and free its space.

        Raises:
            KeyError: not present.
            AssertionError: the block is pinned (a bug in the caller).
        """
        entry = self.forget(skey)
        assert entry.pins == 0, "freeing a pinned block"
        self.allocator.free(entry.offset, entry.size_bytes)
        return entry
