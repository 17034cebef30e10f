"""The one-call put of the sync client: a steady shared-memory put with no op driver.

The general put (kvstored/client/_put.py ``op_put``, then kvstored/client/_shm.py
``_put_ahead`` / ``_write_slots`` / ``_commit_slots``) is a generator driven step by step
(Session, Blocking, Call steps through the client's driver, items checked into tuples,
unzipped again, per-size-class dicts). For the steady state of reserve-ahead puts it does
exactly this: take the batch's slots from the pool, copy every value into its slot in one
``copy_at`` call, send one CommitSlots of packed columns whose refill comes after its
answer, and map the answer's packed ``write_stored`` to results. :func:`put` does that,
inline, and returns the results, or returns None to say "take the general path", which
then runs from the start exactly as before (nothing was taken, sent or counted here).

When this path answers (every case below is checked before a slot is taken):
- the node was described (``st.info``), its transport is ``shm``, its arena is mapped, the
  control channel is open and no client hook is installed (tests: the hooks' seams are the
  general path's), and no orphan ack is pending (the general path starts those with its call);
- the session is open now and was opened by the epoch the arena was mapped under, and that
  epoch's node said it takes packed write columns (``SlotPool.columns_epoch``);
- no metas, no ``replicas=``, and the client's and the node's replicas are 1;
- ``keys`` and ``values`` are lists of the same length, 1..``max_batch_keys``; every key is
  ``bytes`` of an allowed length; every value a flat, C-contiguous byte buffer
  (``memoryview(v).format == "B"``, 1-D: bytes, bytearray, a uint8 numpy array), all of one
  size in 1..``max_block_bytes`` (anything else, a bad item included: the general path, which
  names what is wrong per item);
- the batch is larger than the inline threshold, two puts' worth of its slots fit the
  pool's budget (the refill after the answer), and the pool holds the batch's slots now
  (the first put of a shape: the general path asks for them).

Once slots are taken the rules are the general path's, unchanged (kvstored/client/_shm.py):
a copy or commit that fails hands the slots back to the pool (returned with the next
CommitSlots: the ack that frees them, quarantined or not); a CommitSlots that got no answer
is an orphaned grant (its request id is acked so the node frees its refill); the node's
error raises to the caller's retry loop (kvstored/client/sync.py ``Client.put``), which goes
on through the general path. The node stays the only writer of the shared index: this path
copies into slots the node granted this session and asks the node to commit them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvstored.client import _hooks, _shm
from kvstored.client._args import _EXISTED, _STORED, _result
from kvstored.client._control import NO_ANSWER
from kvstored.client._orphans import next_request_id
from kvstored.client._shm import _granted, _refill_arrived
from kvstored.client._slots import size_class
from kvstored.client._steps import INLINE_PUT_MAX_BYTES
from kvstored.client.types import PutResult
from kvstored.errors import DeadlineExceeded, InternalError, KvstoredError
from kvstored.native import copy_at
from kvstored.v1 import node_pb2 as pb

if TYPE_CHECKING:
    from kvstored.client._state import ClientState

FAST_PUT_STATS = {"taken": 0, "passed": 0}
"""This process's calls of this path: ``taken`` (answered here), ``passed`` (handed to the
general path before any slot was taken: not eligible, or the pool lacked the slots)."""


def put(
    st: ClientState,
    live_session_id: Callable[[], int],
    keys: object,
    values: object,
    deadline: float,
    start_orphan_acks: Callable[[], None],
) -> list[PutResult] | None:
    """A steady shm put of one size class in one CommitSlots (the module's rules), or None.

    Args:
        st: the client's state.
        live_session_id: the open session's id now, 0 when none is open (no wait).
        keys: the put's keys (a list of bytes here; anything else: None).
        values: one buffer per key (a list here).
        deadline: this process's monotonic deadline (s) for the whole put.
        start_orphan_acks: starts the pending orphan acks in the background (called after a
            CommitSlots that got no answer, as the general driver does).

    Returns:
        One PutResult per key (stored, existed, or that key's error from the node), or None:
        take the general path (nothing was taken or sent).

    Raises:
        DeadlineExceeded: the deadline passed before the call. NoAnswer, NoAnswerInTime
        (retriable): the CommitSlots got no answer (its slots are handed back, its request
        acked as an orphan). A KvstoredError of the node for the whole request (Draining,
        Unavailable, ...). InternalError: the answer does not match the request.
    """
    info = st.info
    if (info is None or info.transport != "shm" or _hooks._hook is not None
            or type(keys) is not list or type(values) is not list):
        return None
    control, arena, pool = st.control, st.arena, st.slots
    if control is None or arena is None or not pool.max_bytes or st.orphans:
        return None
    epoch = info.epoch
    if pool.columns_epoch != epoch or st.session_epoch != epoch:
        return None
    if (st.replicas or info.default_replicas) != 1:
        return None
    n = len(keys)
    if not 0 < n <= info.max_batch_keys or len(values) != n:
        return None
    lo, hi = max(info.min_key_bytes, 1), info.max_key_bytes
    views: list[memoryview] = []
    append = views.append
    size = -1
    try:
        for key, value in zip(keys, values, strict=True):  # (equal lengths: checked above)
            v = memoryview(value)
            if (type(key) is not bytes or not lo <= len(key) <= hi or v.format != "B"
                    or v.ndim != 1 or not v.c_contiguous):
                return None
            if len(v) != size:
                if size >= 0:
                    return None
                size = len(v)
            append(v)
    except TypeError:  # not a buffer: the general path names it
        return None
    if not 0 < size <= info.max_block_bytes or n * size <= min(INLINE_PUT_MAX_BYTES,
                                                                  info.max_inline_bytes):
        return None
    cls = size_class(size)
    budget = pool.budget_bytes(info.arena_size_bytes)
    if 2 * n * cls > budget:  # the refill stays in the answer: the general path
        return None
    session_id = live_session_id()
    if not session_id:
        return None
    view = arena.view
    if len(view) != arena.size_bytes:
        return None  # the mapping was closed: the general path raises Unavailable
    counts = {cls: n}
    pool.note_demand(counts, budget, 2)
    owner = (session_id, epoch)
    got = pool.take_all(owner, counts)
    if got is None:
        FAST_PUT_STATS["passed"] += 1
        return None
    ids, offsets = got[cls]
    request_id = next_request_id()
    try:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("deadline passed before calling CommitSlots")
        try:
            copy_at(view, offsets, views, stream=True)
        except ValueError as exc:  # a slot outside the arena: a bug or a corrupt response
            raise InternalError(f"node sent a slot outside its arena: {exc}") from None
        sent_at = _shm._clock()  # (a module attribute: tests move the lease clock)
        req = pb.CommitSlotsRequest(
            namespace_id=st.namespace_id, session_id=session_id, epoch=epoch,
            request_id=request_id, return_slot_ids=pool.take_returns(owner),
            grant_after_answer=True, write_slot_ids=ids, write_keys=keys,
            write_sizes=[size] * n,
        )
        add_want = req.want.add
        for s, num in pool.wants():
            w = add_want()
            w.size_bytes = s
            w.num_slots = num
        trailer = functools.partial(_refill_arrived, st, owner, request_id, info.pin_lease_s,
                                    sent_at)
        try:
            resp = control.call("CommitSlots", req, remaining, trailer)
        except NO_ANSWER:  # the node may have granted a refill we never saw
            st.orphans.add(session_id, request_id)
            start_orphan_acks()
            raise
        except KvstoredError:
            raise  # the node answered: nothing was granted
        except BaseException:  # interrupted mid-call: acked with the next call or at close()
            st.orphans.add(session_id, request_id)
            raise
    except BaseException:
        pool.give_back(owner, ids)  # after the copy returned (or before it began)
        raise
    st.connected = True
    if resp.slot_budget_bytes:
        pool.node_budget_bytes = resp.slot_budget_bytes
    if resp.slots or resp.slot_ids:  # (granted in the answer: a node that ignored "after")
        pool.add_columns(owner, *_granted(resp), info.pin_lease_s, sent_at)
    stored = resp.write_stored
    if stored:  # packed: every write stored or existed
        if len(stored) != n:
            raise InternalError(f"CommitSlots answered {len(stored)} items for {n}")
        FAST_PUT_STATS["taken"] += 1
        return [_STORED if f else _EXISTED for f in stored]
    results = resp.results
    if len(results) != n:
        raise InternalError(f"CommitSlots answered {len(results)} items for {n}")
    FAST_PUT_STATS["taken"] += 1
    return [_result(r.status, r.stored) if r.HasField("status")
            else (_STORED if r.stored else _EXISTED) for r in results]


__all__ = ["FAST_PUT_STATS", "put"]
