"""The client's put (a sans-I/O operation, see kvstored/client/_ops.py): checks, then a path.

::

    op_put --> per item: key, value buffer, meta checked (bad items get their own error)
           --> shm, batch <= INLINE_PUT_MAX_BYTES, control channel open:
                   Put (values inline) on the control channel: ONE round trip; the node
                   copies the values in and commits before it answers
           --> shm otherwise:  copy into reserve-ahead slots -> CommitSlots, which also
                               grants the next put's slots (on the control channel after
                               its answer, read with the next request): ONE round trip
                               (_slots.py); what no slot takes: ReservePut -> copy ->
                               CommitPut (_shm.py)
           --> tcp (large):    the data plane's PUT
           --> else:           Put, inline (gRPC, or the control channel when open)

The blocking client tries the steady state of the slots path first as one call with no op
driver (kvstored/client/_fastput.py: same slots, same CommitSlots, same fencing); whatever it
does not take, and every retry, runs here.

Every path reports a put done only once the node answered its commit, so a put that
returned is readable by any other client. A put that wants N > 1 replicas (``replicas=``,
else the client's, else the node's default for the namespace) then asks the node to
``Replicate`` the stored keys (kvstored/node/put_replicas.py: the node writes the other
N - 1 to peers, two-phase through the master) and returns once those writes ended; each
PutResult says how many replicas were written (``replicas_written``, ``short``).

Why small batches go inline and larger ones copy into slots reserved ahead (no commit is
left in flight when put() returns): docs/performance.md "One round trip per put?" and
"Reserve-ahead puts".
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from kvstored.client._args import (
    _chunks_by_bytes,
    _Item,
    _key_bytes,
    _key_error,
    _meta_bytes,
    _result,
    _tail_first,
    as_byte_view,
    require_sequence,
)
from kvstored.client._shm import _put_shm
from kvstored.client._state import ClientState, check_replicas, ensure_ready
from kvstored.client._steps import INLINE_PUT_MAX_BYTES, MAX_CHUNK_BYTES, Blocking, Call, Op
from kvstored.client.types import NodeInfo, PutResult
from kvstored.errors import (
    BlockTooLarge,
    InternalError,
    InvalidArgument,
    KvstoredError,
    Unavailable,
    error_from_code,
)
from kvstored.keys import format_hash
from kvstored.transport.control import MAX_FRAME_BYTES
from kvstored.v1 import common_pb2 as cpb
from kvstored.v1 import node_pb2 as pb

if TYPE_CHECKING:
    from kvstored.transport.base import PutItem
    from kvstored.transport.tcp import DataPlaneClient

CONTROL_PUT_MAX_BYTES = MAX_FRAME_BYTES // 2
"""Most value bytes one inline Put carries on the control channel (its frames are bounded)."""


def _put_wire(
    dp: DataPlaneClient, wire: Sequence[tuple[bytes, memoryview, bytes]], namespace_id: bytes,
    deadline: float,
) -> list[PutItem]:
    """One data-plane put of ``wire`` (the Blocking step of :func:`_put_tcp`)."""
    return dp.put(wire, namespace_id, deadline=deadline)


def _put_tcp(
    st: ClientState, info: NodeInfo, items: list[_Item], results: list[PutResult | None],
    deadline: float,
) -> Op[None]:
    dp = st.dataplane
    if dp is None:
        raise Unavailable("the data-plane client was dropped; describe the node again")
    max_bytes = max(1, min(MAX_CHUNK_BYTES, info.arena_size_bytes // 4))
    for chunk in _tail_first(_chunks_by_bytes(items, max_bytes, info.max_batch_keys)):
        wire = [(k, v, m) for _, k, v, m in chunk]
        got = yield Blocking(
            functools.partial(_put_wire, dp, wire, st.stored_namespace_id),
            sum(len(v) for _, _, v, _ in chunk),
        )
        for (i, *_), r in zip(chunk, got, strict=True):
            results[i] = _result(cpb.ItemStatus(code=r.code, message=r.message), r.stored)


def _put_grpc(
    st: ClientState, info: NodeInfo, items: list[_Item], results: list[PutResult | None],
    deadline: float,
) -> Op[None]:
    max_bytes = max(1, info.max_inline_bytes)
    if st.control is not None:  # the Put may travel on the control channel
        max_bytes = min(max_bytes, CONTROL_PUT_MAX_BYTES)
    for chunk in _tail_first(_chunks_by_bytes(items, max_bytes, info.max_batch_keys)):
        resp = yield Call(
            "Put",
            pb.PutRequest(
                items=[pb.PutItem(key=k, value=bytes(v), meta=m) for _, k, v, m in chunk],
                namespace_id=st.namespace_id,
            ),
            pb.PutResponse,
        )
        if len(resp.results) != len(chunk):
            raise InternalError(f"Put answered {len(resp.results)} items for {len(chunk)}")
        for (i, *_), r in zip(chunk, resp.results, strict=True):
            results[i] = _result(r.status, r.stored)


def _check_items(
    keys: Sequence[object], values: Sequence[object], metas: Sequence[object] | None,
    info: NodeInfo, results: list[PutResult | None],
) -> list[_Item]:
    """The valid items ``(index, key, value view, meta)``; a bad one gets its own error."""
    lo, hi = max(info.min_key_bytes, 1), info.max_key_bytes
    max_block = info.max_block_bytes
    items: list[_Item] = []
    append = items.append
    for i, key in enumerate(keys):
        meta_in = None if metas is None else metas[i]
        value_in = values[i]
        try:  # the common case inline: a flat byte buffer (bytes, uint8 numpy array)
            value = memoryview(value_in)  # type: ignore[arg-type]  # a non-buffer raises TypeError
            if not (value.ndim == 1 and value.format == "B" and value.c_contiguous):
                value = as_byte_view(value_in, "value", i)
        except TypeError:
            value = None
        except InvalidArgument as exc:
            results[i] = PutResult(False, exc)
            continue
        if value is None:
            try:
                value = as_byte_view(value_in, "value", i)  # raises, naming what it got
            except InvalidArgument as exc:
                results[i] = PutResult(False, exc)
                continue
        if type(key) is bytes and lo <= len(key) <= hi and meta_in is None and len(value) <= max_block:
            append((i, key, value, b""))  # the common case: nothing more to check
            continue
        try:
            kb = _key_bytes(key, i)
            err: KvstoredError | None = _key_error(kb, i, info)
            meta = _meta_bytes(meta_in, i)
        except InvalidArgument as exc:
            results[i] = PutResult(False, exc)
            continue
        if err is None and len(value) > max_block:
            err = BlockTooLarge(
                f"value #{i} (key {format_hash(kb)}) is {len(value)} bytes; the node's limit is "
                f"{max_block} bytes (node.max_block_bytes)"
            )
        if err is None and len(meta) > info.max_meta_bytes:
            err = InvalidArgument(
                f"meta #{i} is {len(meta)} bytes; at most {info.max_meta_bytes} bytes are stored "
                "with a block"
            )
        if err is not None:
            results[i] = PutResult(False, err)
        else:
            items.append((i, kb, value, meta))
    return items


def _replicate(
    st: ClientState, info: NodeInfo, results: list[PutResult | None], keys: list[tuple[int, bytes]],
    factor: int,
) -> Op[None]:
    """Ask the node for the extra replicas of the stored ``keys`` (index, key); each result
    then carries the replicas written. A failed or refused call never fails the put: the
    blocks are stored on this node, so they are reported short, with the reason."""
    for start in range(0, len(keys), max(1, info.max_batch_keys)):
        chunk = keys[start : start + max(1, info.max_batch_keys)]
        try:
            resp = yield Call(
                "Replicate",
                pb.ReplicateRequest(namespace_id=st.namespace_id, keys=[k for _, k in chunk],
                                    replicas=factor),
                pb.ReplicateResponse,
            )
        except KvstoredError as exc:
            if "UNIMPLEMENTED" in str(exc):  # a node older than replicas
                exc = InvalidArgument(f"the node at {st.address} does not write replicas "
                                      "(a version without Replicate); upgrade it")
            for i, _ in chunk:
                r = results[i]
                assert r is not None
                results[i] = replace(r, replicas_written=1, replicas_wanted=factor,
                                     replica_error=exc)
            continue
        if len(resp.results) != len(chunk):
            raise InternalError(f"Replicate answered {len(resp.results)} items for {len(chunk)}")
        for (i, _), rr in zip(chunk, resp.results, strict=True):
            r = results[i]
            assert r is not None
            err = (error_from_code(rr.status.code, rr.status.message)
                   if rr.status.code else None)
            results[i] = replace(r, replicas_written=max(1, rr.num_replicas),
                                 replicas_wanted=factor, replica_error=err)


def op_put(
    st: ClientState,
    keys: Sequence[object],
    values: Sequence[object],
    metas: Sequence[bytes] | None,
    deadline: float,
    replicas: int | None = None,
) -> Op[list[PutResult]]:
    """Put a batch; bad items get their own error, good ones go over the chosen transport;
    with more than one replica wanted, the node then writes the others (:func:`_replicate`)."""
    if replicas is not None:
        check_replicas(replicas, "put(replicas=...)")
    if type(keys) is not list or type(values) is not list:  # (lists: nothing to check)
        if isinstance(keys, (bytes, bytearray, str)):
            raise InvalidArgument("keys must be a sequence of keys; wrap a single key in a list")
        require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
        require_sequence(values, "values", "a sequence (list) with one buffer (bytes, numpy array...) per key")
    if metas is not None:
        require_sequence(metas, "metas", "None or a sequence (list) with one bytes (or None) per key")
    if len(values) != len(keys):
        raise InvalidArgument(f"got {len(keys)} keys but {len(values)} values; pass one value per key")
    if metas is not None and len(metas) != len(keys):
        raise InvalidArgument(f"got {len(keys)} keys but {len(metas)} metas; pass one meta per key")
    info = yield from ensure_ready(st)
    results: list[PutResult | None] = [None] * len(keys)
    items = _check_items(keys, values, metas, info, results)
    if items:
        total = sum([len(v) for _, _, v, _ in items])
        inline = min(INLINE_PUT_MAX_BYTES, info.max_inline_bytes)
        if info.transport == "shm":
            if (st.control is not None and total <= inline
                    and len(items) <= info.max_batch_keys):
                yield from _put_grpc(st, info, items, results, deadline)  # one round trip
            else:
                yield from _put_shm(st, info, items, results, deadline)
        elif info.transport == "tcp" and total > inline:
            yield from _put_tcp(st, info, items, results, deadline)
        else:
            yield from _put_grpc(st, info, items, results, deadline)
    missing = [i for i, r in enumerate(results) if r is None]  # (by identity: no __eq__ calls)
    if missing:
        raise InternalError(f"no result for put items {missing[:8]}")
    factor = replicas or st.replicas or info.default_replicas
    if factor > 1:
        ok = [(i, k) for i, k, _, _ in items if results[i] is not None and results[i].ok]  # type: ignore[union-attr]  # None ruled out just above
        if ok:
            yield from _replicate(st, info, results, ok, factor)
    return results  # type: ignore[return-value]  # no None is left: checked just above (InternalError)
