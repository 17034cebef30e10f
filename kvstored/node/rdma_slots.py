"""RDMA reads of a peer's DRAM blocks checked by the peer's slot headers (issue 18).

The glue between :func:`kvstored.transport.rdma.read_header_checked` (which knows nothing of
the layout: kvstored/transport imports no tiers) and :mod:`kvstored.tiers.slots` (the one
place the slot layout is written down). The peer registers its whole arena FILE as the
memory region (block bytes, then the region header, slot headers and index), so a block's
slot header lies at ``slots_off + (offset // UNIT_BYTES) * SLOT_BYTES`` of the same region.

:func:`lookup_slots` finds blocks in the peer's shared index by READs of its buckets, and
:func:`read_peer_blocks` combines the two: a DRAM hit on a peer costs NIC round trips only.

A block READ between two READs of its header is kept only when both header copies show the
same even version, the expected ident (stored namespace id, key), size and, when known, the
generation; otherwise it reads as not found and the caller uses the granted or TCP path.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from kvstored.errors import InvalidArgument
from kvstored.tiers.slots import BUCKET_BYTES, SLOT_BYTES, UNIT_BYTES, Layout, ident
from kvstored.transport.base import RemoteRegion, Sink
from kvstored.transport.rdma import HeaderCheck, read_header_checked

_HEAD = struct.Struct("<QQQQQ")  # version, generation, ident_lo, ident_hi, size_bytes
_BUCKET = struct.Struct("<QQQQ")  # version, ident_lo, ident_hi, slot + 1


def slot_header_region(lay: Layout, block: RemoteRegion) -> RemoteRegion:
    """Where the slot header of the block at ``block.offset`` lies in the registered file.

    Raises InvalidArgument for an offset outside the arena or not on a 4096-byte unit.
    """
    if block.offset % UNIT_BYTES or not 0 <= block.offset < lay.arena_size:
        raise InvalidArgument(
            f"rdma slots: block offset must be a multiple of {UNIT_BYTES} below "
            f"{lay.arena_size}, received {block.offset}")
    return RemoteRegion(lay.slots_off + (block.offset // UNIT_BYTES) * SLOT_BYTES, SLOT_BYTES)


def slot_check(namespace_id: bytes, keys: Sequence[bytes], regions: Sequence[RemoteRegion]) -> HeaderCheck:
    """The seqlock check of :func:`read_header_checked` for ``keys[i]`` at ``regions[i]``."""
    idents = [ident(namespace_id, k) for k in keys]

    def check(i: int, before: bytes, after: bytes) -> bool:
        v1, gen, lo, hi, size = _HEAD.unpack_from(before)
        v2 = _HEAD.unpack_from(after)[0]
        r = regions[i]
        return (v1 % 2 == 0 and v1 == v2 and (lo, hi) == idents[i] and size == r.size_bytes
                and (r.generation == 0 or gen == r.generation))
    return check


def lookup_slots(
    transport: Any, lay: Layout, keys: Sequence[bytes], namespace_id: bytes, *,
    deadline: float, max_probes: int = 8,
) -> list[RemoteRegion | None]:
    """Find ``keys`` in a peer's shared index by one-sided READs of its buckets and slots.

    Linear probing as :class:`~kvstored.tiers.slots.SlotTable` writes it: round ``r`` READs
    bucket ``(ident_lo + r) & (nbuckets - 1)`` of every key not yet resolved (a bucket holds
    the slot only); a matching bucket's slot header is then READ for the block's size and
    generation. A key resolves to None on an empty bucket, an odd bucket or slot header
    (being changed), a header naming another block, or after ``max_probes`` probes. Never
    wrong bytes: :func:`read_slots_checked` checks every hit again around its block READ.
    Raises what the transport raises.
    """
    ids = [ident(namespace_id, k) for k in keys]
    mask = lay.nbuckets - 1
    slots: dict[int, int] = {}
    todo = list(range(len(keys)))
    for probe in range(max_probes):
        if not todo:
            break
        buckets = [RemoteRegion(lay.index_off + ((ids[i][0] + probe) & mask) * BUCKET_BYTES,
                                BUCKET_BYTES) for i in todo]
        got = _read_all(transport, buckets, deadline)
        nxt = []
        for j, i in enumerate(todo):
            v, lo, hi, slot1 = _BUCKET.unpack_from(got[j])
            if v % 2 or slot1 == 0:
                continue  # being changed, or the end of the probe run: a miss
            if (lo, hi) == ids[i]:
                slots[i] = slot1 - 1
            else:
                nxt.append(i)
        todo = nxt
    out: list[RemoteRegion | None] = [None] * len(keys)
    idx = [i for i in range(len(keys)) if i in slots and slots[i] < lay.nslots]
    heads = _read_all(transport, [RemoteRegion(lay.slots_off + slots[i] * SLOT_BYTES, SLOT_BYTES)
                                  for i in idx], deadline)
    for j, i in enumerate(idx):
        v, gen, lo, hi, size = _HEAD.unpack_from(heads[j])
        if v % 2 == 0 and (lo, hi) == ids[i] and 0 < size <= lay.arena_size:
            out[i] = RemoteRegion(slots[i] * UNIT_BYTES, size, gen)
    return out


def _read_all(transport: Any, regions: Sequence[RemoteRegion], deadline: float) -> list[bytearray]:
    got: list[bytearray] = [bytearray(r.size_bytes) for r in regions]
    if regions:
        transport.read_regions(regions, lambda j, size, meta: memoryview(got[j]), deadline=deadline)
    return got


def read_peer_blocks(
    transport: Any, lay: Layout, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *,
    deadline: float, max_probes: int = 8,
) -> list[bool]:
    """A peer's DRAM blocks with no call to the peer's CPU: :func:`lookup_slots`, then
    :func:`read_slots_checked` of the hits. Per key whether its bytes reached ``sink``
    (False: a miss, or a block that changed: ask the node)."""
    located = lookup_slots(transport, lay, keys, namespace_id, deadline=deadline, max_probes=max_probes)
    idx = [i for i, r in enumerate(located) if r is not None]
    regions = [r for r in located if r is not None]
    found = [False] * len(keys)
    if not regions:
        return found

    def to_sink(j: int, size: int, meta: bytes) -> memoryview | None:
        return sink(idx[j], size, meta)
    hits = read_slots_checked(transport, lay, [keys[i] for i in idx], namespace_id, regions,
                              to_sink, deadline=deadline)
    for j, ok in enumerate(hits):
        found[idx[j]] = ok
    return found


def read_slots_checked(
    transport: Any, lay: Layout, keys: Sequence[bytes], namespace_id: bytes,
    regions: Sequence[RemoteRegion], sink: Sink, *, deadline: float,
    check: HeaderCheck | None = None, after_copy: Any = None,
) -> list[bool]:
    """READ ``regions`` (the blocks of ``keys``, stored namespace id ``namespace_id``) from a
    peer's arena and keep each only if its slot header proves it stable (see module doc).

    ``check`` replaces :func:`slot_check` (tests: a mutation that must turn a test red).
    Returns per key whether its bytes reached ``sink``. Raises InvalidArgument (a bad
    offset) and what the transport raises (TransferFailed, DeadlineExceeded).
    """
    if len(keys) != len(regions):
        raise InvalidArgument(f"rdma slots: {len(keys)} keys for {len(regions)} regions")
    headers = [slot_header_region(lay, r) for r in regions]
    return read_header_checked(transport, regions, headers,
                               check or slot_check(namespace_id, keys, regions), sink,
                               deadline=deadline, after_copy=after_copy)
