"""get_into's batch fast path over shared memory: one pass over a PinBlocks answer, one copy.

The general path (kvstored/client/_shm.py ``_read_shm`` and ``_copy_pinned``) handles every
answer: misses, item errors, a chunk cut at NoCapacity, buffers too small, tiers and metas.
It costs ~8-10 us of Python per block (several protobuf field reads, a numpy view and a
``numpy.copyto`` per block). The common answer of a get_into is simpler: every block found.
For it this module reads each block's ``found``, ``offset`` and ``size_bytes`` once (and
``meta`` when the caller asked for metas), checks every destination once, and hands the
whole batch to one :func:`kvstored.native.copy_many` call (C, the GIL released; the numpy
fallback where the extension is not built). Any other answer goes to the general path,
unchanged, with the same response (nothing is pinned or counted twice).

Safety is the general path's: the copy runs while the node holds the batch's pin (the
release is sent only after :func:`copy_planned` returned), every source range is checked
against the mapped arena before any byte is copied, and a buffer too small for its block
makes the general path report it (InvalidArgument naming the key and both sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstored.client import _hooks
from kvstored.errors import InternalError, Unavailable
from kvstored.native import copy_many
from kvstored.v1 import node_pb2 as pb

if TYPE_CHECKING:
    from kvstored.client._ops import _ReadSink
    from kvstored.client._shm import ArenaMap

Plan = tuple[list[tuple[memoryview, memoryview]], list[int], list[int], int]
"""``(pairs (dst, src), sizes, offsets, total bytes)`` of one answer's blocks, in order."""


def plan_copies(
    arena: ArenaMap, blocks: Sequence[pb.PinnedBlock], base: int, sink: _ReadSink
) -> Plan | None:
    """The copies of a PinBlocks answer in which every block was found, or None.

    Args:
        arena: the mapped arena.
        blocks: the answer's blocks, for keys ``base .. base + len(blocks)`` of the sink.
        base: index of the first block's key in the sink.
        sink: a get_into sink (``sink.views`` set).

    Returns:
        The plan, or None when the general path must handle this answer (a block not
        found or with an item error, or a buffer smaller than its block).

    Raises:
        Unavailable: the arena mapping was closed (the node restarted).
        InternalError: the node named a range outside its arena (nothing copied).
    """
    views = sink.views
    assert views is not None
    src_all = arena.view
    limit = arena.size_bytes
    if len(src_all) != limit:
        raise Unavailable(f"the arena mapping of {arena.path} was closed (the node restarted)")
    pairs: list[tuple[memoryview, memoryview]] = []
    sizes: list[int] = []
    offsets: list[int] = []
    total = 0
    for j, b in enumerate(blocks):
        if not b.found:  # a miss, an item error or a cut: the general path
            return None
        off = b.offset
        size = b.size_bytes
        dst = views[base + j]
        if size > len(dst):  # the general path names every buffer too small
            return None
        if off + size > limit:
            raise InternalError(
                f"node sent arena range [{off}, {off + size}) outside its {limit}-byte arena"
            )
        pairs.append((dst[:size], src_all[off : off + size]))
        sizes.append(size)
        offsets.append(off)
        total += size
    return pairs, sizes, offsets, total


def copy_planned(plan: Plan, _deadline: float) -> None:
    """Copy a plan of :func:`plan_copies` (one ``copy_many`` call; blocking, GIL released).

    With a client hook installed (tests), the first block longer than one byte is copied in
    two halves with ``shm_copy_out_mid`` fired between them, as the general path does.
    """
    pairs, sizes, offsets, _ = plan
    if _hooks._hook is None:
        copy_many(pairs)
        return
    k = next((k for k, size in enumerate(sizes) if size > 1), None)
    if k is not None:  # test seam: copy half of that block, report, then the rest
        dst, src = pairs[k]
        half = sizes[k] // 2
        copy_many(pairs[:k] + [(dst[:half], src[:half])])
        _hooks.fire("shm_copy_out_mid", offset=offsets[k], size_bytes=sizes[k])
        copy_many([(dst[half:], src[half:])] + pairs[k + 1 :])
    else:
        copy_many(pairs)
    _hooks.fire("shm_copy_out_done")


def record(plan: Plan, blocks: Sequence[pb.PinnedBlock], base: int, sink: _ReadSink) -> None:
    """Record the sizes (and metas, when wanted) of a copied plan in the sink."""
    sizes = plan[1]
    sink.sizes[base : base + len(sizes)] = sizes
    if sink.want_meta:
        sink.metas[base : base + len(sizes)] = [b.meta for b in blocks]
