"""On-disk formats of the SSD tier: store keys, file names, index records, block trailers,
and the in-memory records of its blocks (:class:`SsdEntry`) and writes (:class:`SsdWrite`).

Pure functions and value types, no I/O. See :mod:`kvstored.tiers.ssd` for the directory
layout.

Store key. The store's identity of a block is ``(namespace_id, key)``: the same key under two
namespaces names two blocks. Both tiers index blocks in memory by one bytes object, the
*store key*: a 3-byte tag of the namespace (a per-process table, so a 16-byte namespace id
costs no bytes per block) followed by the key::

    store_key = tag(namespace_id) (3 bytes) | key            (in memory only)
    persistent_key = len(namespace_id) (1 byte) | namespace_id | key   (index keys, file
                                                 names, trailers: the same on every start)

Index record (RocksDB value, version 2, under ``b"N" + persistent_key``)::

    <BQQQHHI  version=2, size, xxh3_64 checksum, seq, ns_len, name_len, meta_len
    namespace_id | file name | meta

Version 1 records (``b"B" + key``, written before namespaces scoped identity) carry the same
fields; :class:`~kvstored.tiers.ssd.SsdTier` migrates them on open.

Block file: ``data | trailer | footer``, so that the index can be rebuilt from the files
alone when RocksDB is corrupt::

    trailer  <QQHI  size, xxh3_64 checksum of data, persistent_key_len, meta_len
             persistent_key | meta
    footer   <IQ8s  trailer_len, xxh3_64 of trailer, magic b"KVSTBLK2"
"""

from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass, field

import xxhash

from kvstored.errors import InvalidArgument

PAGE_BYTES = 4096
REC_VERSION = 2
LEGACY_REC_VERSION = 1
REC_HEADER = struct.Struct("<BQQQHHI")  # version, size, checksum, seq, ns_len, name_len, meta_len
BLOCK_PREFIX = b"N"
LEGACY_BLOCK_PREFIX = b"B"
DATA_SUFFIX = ".blk"
TMP_SUFFIX = ".blk.tmp"
_TRAILER = struct.Struct("<QQHI")
_FOOTER = struct.Struct("<IQ8s")
_MAGIC = b"KVSTBLK2"
FOOTER_BYTES = _FOOTER.size
MAX_NAMESPACE_ID_BYTES = 255


_TAG_BYTES = 3
_MAX_NAMESPACES = 1 << (8 * _TAG_BYTES)
_tags: dict[bytes, bytes] = {}
_namespaces: list[bytes] = []
_tags_lock = threading.Lock()


def _tag(namespace_id: bytes) -> bytes:
    tag = _tags.get(namespace_id)
    if tag is not None:
        return tag
    with _tags_lock:
        tag = _tags.get(namespace_id)
        if tag is None:
            if len(_namespaces) >= _MAX_NAMESPACES:
                raise InvalidArgument(
                    f"more than {_MAX_NAMESPACES} distinct namespaces in one process"
                )
            tag = len(_namespaces).to_bytes(_TAG_BYTES, "big")
            _namespaces.append(namespace_id)
            _tags[namespace_id] = tag
    return tag


def store_key(namespace_id: bytes, key: bytes) -> bytes:
    """The store's in-memory identity of a block: its namespace's tag, then its key.

    Thread-safe; the tag table is per process (never persisted: see :func:`persistent_key`).

    Raises:
        InvalidArgument: ``namespace_id`` is longer than 255 bytes.
    """
    n = len(namespace_id)
    if n > MAX_NAMESPACE_ID_BYTES:
        raise InvalidArgument(
            f"namespace_id is {n} bytes; at most {MAX_NAMESPACE_ID_BYTES} are accepted"
        )
    return _tag(bytes(namespace_id)) + key


def split_store_key(skey: bytes) -> tuple[bytes, bytes]:
    """``(namespace_id, key)`` of a store key made by :func:`store_key`."""
    return _namespaces[int.from_bytes(skey[:_TAG_BYTES], "big")], skey[_TAG_BYTES:]


def persistent_key(skey: bytes) -> bytes:
    """The on-disk form of a store key: ``len(ns) | ns | key`` (stable across restarts)."""
    ns, key = split_store_key(skey)
    return bytes((len(ns),)) + ns + key


def from_persistent(pkey: bytes) -> bytes:
    """The store key of an on-disk key made by :func:`persistent_key`.

    Raises:
        ValueError: not a persistent key (empty, or its namespace length runs past its end).
    """
    if not pkey or pkey[0] + 1 > len(pkey):
        raise ValueError("not a persistent store key")
    n = pkey[0]
    return store_key(bytes(pkey[1 : 1 + n]), bytes(pkey[1 + n :]))


def index_key(skey: bytes) -> bytes:
    """The RocksDB key of a block's index record."""
    return BLOCK_PREFIX + persistent_key(skey)


def round_up_page(size_bytes: int) -> int:
    """``size_bytes`` rounded up to a multiple of 4096 (at least 4096)."""
    return max(PAGE_BYTES, (size_bytes + PAGE_BYTES - 1) // PAGE_BYTES * PAGE_BYTES)


def checksum_of(data: memoryview | bytes) -> int:
    """The block checksum stored in the index: xxh3_64 of the bytes."""
    return xxhash.xxh3_64_intdigest(data)


def _name_rel(name_key: bytes) -> str:
    shard = f"{xxhash.xxh3_64_intdigest(name_key) & 0xFF:02x}"
    name = name_key.hex() if len(name_key) <= 100 else "h" + xxhash.xxh3_128_hexdigest(name_key)
    return f"{shard}/{name}{DATA_SUFFIX}"


def file_rel(skey: bytes) -> str:
    """Data file of a block, relative to ``ssd_dir/data``: ``<shard>/<hex>.blk``, named after
    its persistent key.

    ``shard`` is two hex digits of xxh3_64(persistent key); keys longer than 100 bytes are
    named ``h`` + their xxh3_128.
    """
    return _name_rel(persistent_key(skey))


def legacy_file_rel(key: bytes) -> str:
    """File name used by version-1 records (named after the bare key)."""
    return _name_rel(key)


def trailer_of(skey: bytes, size_bytes: int, checksum: int, meta: bytes) -> bytes:
    """Trailer + footer appended to a block file after its ``size_bytes`` of data."""
    pkey = persistent_key(skey)
    body = _TRAILER.pack(size_bytes, checksum, len(pkey), len(meta)) + pkey + meta
    return body + _FOOTER.pack(len(body), xxhash.xxh3_64_intdigest(body), _MAGIC)


def trailer_bytes(skey: bytes, meta: bytes) -> int:
    """Length of :func:`trailer_of` for this block."""
    ns_len = len(split_store_key(skey)[0])
    return _TRAILER.size + len(skey) - _TAG_BYTES + 1 + ns_len + len(meta) + FOOTER_BYTES


def parse_trailer(footer: bytes, read_body: object) -> tuple[bytes, int, int, bytes, int]:
    """Parse a block file's trailer.

    Args:
        footer: the file's last :data:`FOOTER_BYTES` bytes.
        read_body: ``callable(length) -> bytes`` returning the ``length`` bytes before the
            footer.

    Returns:
        ``(store key, size_bytes, checksum, meta, file_bytes)``; ``file_bytes`` is the
        length the file must have.

    Raises:
        ValueError: not a trailer of this format, or damaged.
    """
    body_len, body_hash, magic = _FOOTER.unpack(footer)
    if magic != _MAGIC or body_len < _TRAILER.size or body_len > 1 << 20:
        raise ValueError("no block trailer")
    body = read_body(body_len)  # type: ignore[operator]  # read_body is typed object (parse_trailer's signature); callers pass a callable
    if len(body) != body_len or xxhash.xxh3_64_intdigest(body) != body_hash:
        raise ValueError("damaged block trailer")
    size, csum, skey_len, meta_len = _TRAILER.unpack_from(body)
    p = _TRAILER.size
    if p + skey_len + meta_len != body_len:
        raise ValueError("block trailer length mismatch")
    skey = from_persistent(bytes(body[p : p + skey_len]))
    meta = bytes(body[p + skey_len :])
    return skey, size, csum, meta, size + body_len + FOOTER_BYTES


def encode_record(
    size_bytes: int, checksum: int, seq: int, namespace_id: bytes, name: str, meta: bytes
) -> bytes:
    """A version-2 index record."""
    raw = name.encode()
    return (
        REC_HEADER.pack(
            REC_VERSION, size_bytes, checksum, seq, len(namespace_id), len(raw), len(meta)
        )
        + namespace_id
        + raw
        + meta
    )


def decode_record(rec: bytes) -> tuple[int, int, int, int, bytes, str, bytes]:
    """``(version, size, checksum, seq, namespace_id, name, meta)`` of an index record.

    Raises:
        ValueError, struct.error, UnicodeDecodeError: not a record of version 1 or 2.
    """
    ver, size, csum, seq, ns_len, name_len, meta_len = REC_HEADER.unpack_from(rec)
    if ver not in (LEGACY_REC_VERSION, REC_VERSION):
        raise ValueError(f"unknown record version {ver}")
    p = REC_HEADER.size
    ns = rec[p : p + ns_len]
    p += ns_len
    name = rec[p : p + name_len].decode()
    p += name_len
    meta = rec[p : p + meta_len]
    if p + meta_len != len(rec):
        raise ValueError("record length mismatch")
    return ver, size, csum, seq, bytes(ns), name, bytes(meta)


_TOUCHED = [0.0]  # the last stamp handed out, shared by the entries touched in the same ms


def touch_time() -> float:
    """``time.monotonic()`` to the millisecond, for an entry's ``touched`` (pool LRU ages).

    Entries touched within one millisecond share one float object, so a stamp costs the
    block map a pointer, not a float per entry. Thread-safe (a race hands out either value).
    """
    now = time.monotonic()
    last = _TOUCHED[0]
    if 0.0 <= now - last < 0.001:  # (a clock that went back, e.g. a test's fake: a new stamp)
        return last
    _TOUCHED[0] = now
    return now


class SsdEntry:
    """In-memory metadata of one block on the SSD tier (lean: no file name, no sequence).

    ``generation``: as :class:`~kvstored.tiers.dram.DramEntry`'s (stamped by the change feed,
    or inherited from the DRAM replica a demotion wrote; never persisted: a restart is a new
    epoch, whose feed stamps the recovered entries anew).

    ``touched``: monotonic seconds of the block's last use (:func:`touch_time`): a
    demotion inherits the DRAM entry's, an SSD hit stamps it anew, a recovered entry gets
    the time it was recovered (pool LRU: ``TieredStore.coldest_original_age_s``).
    """

    __slots__ = ("size_bytes", "checksum", "info", "generation", "touched")

    def __init__(self, size_bytes: int, checksum: int, info: tuple[bytes, bytes],
                 generation: int = 0) -> None:
        self.size_bytes = size_bytes
        self.checksum = checksum
        self.info = info  # (namespace_id, meta), interned
        self.generation = generation
        self.touched = touch_time()

    @property
    def namespace_id(self) -> bytes:
        """Namespace the block was stored under (b"" = none)."""
        return self.info[0]

    @property
    def meta(self) -> bytes:
        """Opaque metadata stored with the block."""
        return self.info[1]


@dataclass(slots=True)
class SsdWrite:
    """A write between :meth:`~kvstored.tiers.ssd.SsdTier.begin_write` and
    :meth:`~kvstored.tiers.ssd.SsdTier.end_write`."""

    skey: bytes
    size_bytes: int
    namespace_id: bytes
    meta: bytes
    charge_bytes: int
    doomed: list[bytes] = field(default_factory=list)  # store keys whose files go first
    entry: SsdEntry | None = None
    seq: int = 0
    reuse: bytes | None = None  # an evicted block (same charge) whose file this write takes
    generation: int = 0  # a demotion's: the DRAM replica's (0 = the change feed stamps one)
    touched: float = 0.0  # a demotion's: the DRAM replica's last use (0 = now)
