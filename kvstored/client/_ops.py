"""The I/O-free core shared by :class:`Client` and :class:`AsyncClient`.

Every client operation is a generator ("sans-I/O"): it yields steps and receives their
results, and the sync and async clients only differ in how they execute a step::

    Call(method, request)   a unary NodeService RPC  -> the response message (or an exception
                            thrown into the generator). ``undo``: what to send if the caller
                            is cancelled while the RPC is in flight (the driver waits for the
                            response, sends undo(response), then raises the cancellation);
                            ``release=True``: a release/abort, always sent (with
                            RELEASE_TIMEOUT_S), shielded from cancellation, awaited until the
                            caller's deadline (plus PAST_DEADLINE_S), then left to go on in
                            the background; errors -> None
    Blocking(fn)            blocking work: shared-memory copies, data-plane socket I/O
                            -> ``fn(deadline)``'s result (async: run in a named thread pool;
                            a cancellation waits for it to finish before it is delivered)
    Session()               this client's session id (opened with the OpenSession stream on
                            first use, again after it ended)

A driver runs the hot Calls (PinBlocks, ReleasePins, ReservePut, CommitPut, LookupPrefix,
Exists) over the node's lean control channel when it offers one over a unix socket
(kvstored/client/_control.py), every other Call over gRPC; the ops do not know which.

So request building, response decoding, validation, chunking, pin release and transport
choice exist once. Module map: _steps (steps, constants, driving), _args (argument checks,
chunking), _state (ClientState, retries, Describe), _shm (the arena, shared-memory get and
put), _put (the put and its paths), _fastget (get_into's one-copy batch), _control (the
control channel), this module (the other operations). Retries wrap a whole operation (every
operation is idempotent: puts are first-writer-wins) and only happen for retriable errors, with jittered
exponential backoff, inside the caller's deadline.

Shared-memory path (same host, arena file mappable and the very file the node uses)::

    put: ReservePut -> copy values into the mapped arena -> CommitPut (abort on any failure)
         (a batch of <= INLINE_PUT_MAX_BYTES: one Put on the control channel, _put.py)
    get: PinBlocks  -> copy out of the mapped arena      -> ReleasePins (always, also on error;
                                                            over the control channel it rides
                                                            on the next request, see below)

Safety of the shared-memory path (fencing, see kvstored/node/sessions.py):

- Every ReservePut/PinBlocks carries this client's session id and the epoch the arena was
  mapped under (a restarted node refuses a stale mapping: retriable Unavailable, remap).
- A release or abort is only sent after the copy that touches the space has returned: the
  copy runs to its end before the op's cleanup runs, also when the caller is cancelled.
- A reservation or pin that a cancelled caller's in-flight RPC obtained is released as soon
  as that RPC answers (``Call.undo``). One whose answer never arrives (deadline, dropped
  connection, stopped process) is released by the client's orphan ack naming the request's
  ``request_id`` (kvstored/client/_orphans.py), sent at once and, if that fails, before the
  next RPC and at close().
- The node decides whether a lease held: CommitPut after the copy is refused (LeaseExpired)
  if the reservation lapsed, and ReleasePins reports lapsed pins, whose copies are reported
  as LeaseExpired. Lapsed space is quarantined by the node, never reused while this client's
  session lives, so even a late copy never touches another block's bytes.
- Releases are awaited before the operation returns, so the next operation of this client
  sees them (``get(K)`` then ``remove(K)`` removes K). Over the control channel a get whose
  copy returned within its lease (by this process's clock, which started before the node's)
  instead hands its pin id to the channel: the id rides on this client's next control
  request, which the node serves first; a gRPC call, an idle moment (IDLE_RELEASE_S) and
  close() send it too. Until then the pin holds: the block is neither evicted nor removed.
  A get that failed or outlived its lease releases explicitly as above.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from kvstored.client._args import (  # noqa: F401  (re-exported: the client's one namespace)
    _TIER_OF,
    _chunks,
    _chunks_by_bytes,
    _Item,
    _key_bytes,
    _key_error,
    _meta_bytes,
    _received,
    _result,
    _tail_first,
    _tier,
    as_byte_view,
    as_writable_view,
    check_keys,
    require_sequence,
    status_error,
    tiers_of,
)
from kvstored.client._put import _put_grpc, _put_tcp, op_put  # noqa: F401  (the put)
from kvstored.client._shm import (  # noqa: F401
    ArenaMap,
    _copy_into_arena,
    _copy_pinned,
    _put_shm,
    _read_shm,
    dram_lead,
    dram_present,
    one_sided_live,
)
from kvstored.client._state import (  # noqa: F401
    MAX_TIMEOUT_S,
    ClientState,
    check_timeout_s,
    ensure_ready,
    final_error,
    node_info_from_proto,
    op_connect,
    op_describe,
    retry_delay,
)
from kvstored.client._steps import (  # noqa: F401
    CHANNEL_OPTIONS,
    INITIAL_BACKOFF_S,
    INLINE_PUT_MAX_BYTES,
    MAX_BACKOFF_S,
    MAX_CHUNK_BYTES,
    MAX_LEASE_S,
    PIN_CHUNK_KEYS,
    PREFAULT_MAX_BYTES,
    RELEASE_TIMEOUT_S,
    SERVICE,
    SESSION_METHOD,
    TRANSPORTS,
    Blocking,
    Call,
    Op,
    Session,
    T,
    _undo_pin,
    _undo_reserve,
    abort_call,
    drive_step,
    lease_for,
    release_call,
)
from kvstored.client.types import Block, NodeInfo
from kvstored.errors import (
    ErrorCode,
    InternalError,
    InvalidArgument,
    Unavailable,
)
from kvstored.keys import format_hash
from kvstored.types import BlockInfo, Tier
from kvstored.v1 import common_pb2 as cpb
from kvstored.v1 import node_pb2 as pb

if TYPE_CHECKING:
    from kvstored.client._rdma import RdmaReads
    from kvstored.transport.base import GetItem, Sink
    from kvstored.transport.tcp import DataPlaneClient

# ---- reads --------------------------------------------------------------------------------------


class _ReadSink:
    """Where a read's blocks go: caller buffers (get_into: ``views``), bytes (get) or Blocks
    (``want_meta``: _fastget.py)."""

    def __init__(self, keys: list[bytes], buffers: Sequence[object] | None, want_meta: bool = True) -> None:
        n = len(keys)
        self.keys = keys
        self.want_meta = want_meta
        self.views: list[memoryview] | None = None
        if buffers is not None:
            if len(buffers) != n:
                raise InvalidArgument(f"got {n} keys but {len(buffers)} buffers; pass one buffer per key")
            views = []
            for i, b in enumerate(buffers):  # the common buffer (flat, writable bytes) inline
                try:
                    mv: memoryview | None = memoryview(b)  # type: ignore[arg-type]  # any buffer; TypeError below
                except TypeError:
                    mv = None
                if mv is None or mv.readonly or not mv.c_contiguous or mv.ndim != 1 or mv.format != "B":
                    mv = as_writable_view(b, i)  # the checks naming what is wrong, and the casts
                views.append(mv)
            self.views = views
        self.values: list[bytes | bytearray | None] = [None] * n
        self.sizes: list[int | None] = [None] * n
        self.metas: list[bytes] = [b""] * n
        self.tiers: list[Tier | None] = [None] * n
        self.too_small: list[str] = []

    def check_status(self, i: int, status: cpb.ItemStatus) -> None:
        """Raise argument errors (namespace mismatch, bad key); other item errors are misses."""
        err = status_error(status)
        if err is None:
            return
        if isinstance(err, InvalidArgument):
            raise type(err)(f"key #{i} ({format_hash(self.keys[i])}): {err}")

    def _fits(self, i: int, size: int) -> np.ndarray | None:
        assert self.views is not None
        view = self.views[i]
        if size > len(view):
            self.too_small.append(f"key #{i} is {size} bytes but buffer #{i} holds {len(view)}")
            return None
        return np.frombuffer(view, dtype=np.uint8, count=size)

    def from_array(self, i: int, src: np.ndarray, meta: bytes, tier: Tier | None) -> None:
        size = src.size
        if self.views is not None:
            dst = self._fits(i, size)
            if dst is None:
                return
            np.copyto(dst, src)
        else:
            self.values[i] = src.tobytes()
        self._done(i, size, meta, tier)

    def from_bytes(self, i: int, value: bytes, meta: bytes, tier: Tier | None) -> None:
        if self.views is not None:
            dst = self._fits(i, len(value))
            if dst is None:
                return
            dst[:] = np.frombuffer(value, dtype=np.uint8)
        else:
            self.values[i] = value
        self._done(i, len(value), meta, tier)

    def tcp_target(self, base: int) -> Callable[[int, int, bytes], memoryview | None]:
        def target(j: int, size: int, meta: bytes) -> memoryview | None:
            i = base + j
            if self.views is not None:
                dst = self._fits(i, size)
                return None if dst is None else dst.data
            buf = bytearray(size)
            self.values[i] = buf
            return memoryview(buf)

        return target

    def _done(self, i: int, size: int, meta: bytes, tier: Tier | None) -> None:
        self.sizes[i] = size
        self.metas[i] = meta
        self.tiers[i] = tier

    def finish(self) -> None:
        if self.too_small:
            shown = "; ".join(self.too_small[:8])
            more = f" (and {len(self.too_small) - 8} more)" if len(self.too_small) > 8 else ""
            raise InvalidArgument(f"get_into: buffer too small for {len(self.too_small)} block(s): {shown}{more}")

    def value(self, i: int) -> bytes | None:
        v = self.values[i]
        if v is None or self.sizes[i] is None:
            return None
        return v if isinstance(v, bytes) else bytes(v)



def _get_wire(
    dp: DataPlaneClient, keys: Sequence[bytes], namespace_id: bytes, target: Sink,
    size_hints: Sequence[int] | None, deadline: float,
) -> list[GetItem]:
    """One data-plane get of ``keys`` into ``target`` (the Blocking step of :func:`_read_tcp`)."""
    return dp.get(keys, namespace_id, target, deadline=deadline, size_hints=size_hints)


def _get_rdma(rdma: RdmaReads, keys: Sequence[bytes], namespace_id: bytes, target: Sink,
              deadline: float) -> list[GetItem]:
    """One get over the RDMA path (kvstored/client/_rdma.py); TCP for what it did not read."""
    got: list[GetItem] = rdma.reads.get(keys, namespace_id, target, deadline=deadline)
    return got


def _read_tcp(st: ClientState, info: NodeInfo, sink: _ReadSink, deadline: float) -> Op[None]:
    dp = st.dataplane
    if dp is None:
        raise Unavailable("the data-plane client was dropped; describe the node again")
    keys = sink.keys
    for start, end in _tail_first(_chunks(len(keys), info.max_batch_keys)):
        chunk = keys[start:end]
        hints = None if sink.views is None else [len(v) for v in sink.views[start:end]]
        rdma = st.rdma
        if rdma is not None and rdma.reads.path == "rdma":  # DRAM hits one-sided, the rest over dp
            items = yield Blocking(functools.partial(
                _get_rdma, rdma, chunk, st.stored_namespace_id, sink.tcp_target(start)))
        else:
            items = yield Blocking(  # hints (buffer sizes) let a large get_into use several streams
                functools.partial(_get_wire, dp, chunk, st.stored_namespace_id, sink.tcp_target(start), hints)
            )
        for j, it in enumerate(items):
            i = start + j
            if it.code:
                sink.check_status(i, cpb.ItemStatus(code=it.code, message=it.message))
                sink.values[i] = None
            elif it.found:
                sink._done(i, it.size_bytes, it.meta, _tier(it.tier))


def _inline_batch(pending: list[int], sizes: dict[int, int], budget_bytes: int, max_keys: int) -> int:
    """How many leading ``pending`` keys one inline Get asks for: at most ``max_keys``, and
    as many as their known sizes (``sizes``; unknown = 0) fit in the node's inline budget,
    at least one (the node answers BatchTooLarge past it anyway: this only spares it
    fetching from peers blocks the reply could not carry)."""
    n, used = 0, 0
    for i in pending[:max_keys]:
        used += sizes.get(i, 0)
        if n and used > budget_bytes:
            break
        n += 1
    return n


def _read_grpc(st: ClientState, info: NodeInfo, sink: _ReadSink, deadline: float,
               only: dict[int, int] | None = None) -> Op[None]:
    """Read ``sink``'s keys with the inline Get (values in the reply), asking again for the
    keys the node answered BatchTooLarge (past its inline budget).

    Args:
        only: read just these keys (index -> size in bytes, 0 = unknown), batched by the
            node's inline budget: the shared-memory path's misses the node marked
            ``through`` (:func:`~kvstored.client._shm._read_shm`); None = every key.

    Raises:
        InternalError: an answer of the wrong length, or one with no value in its budget.
    """
    if only is None:
        pending = [  # batches tail-first (see _tail_first); a budget-split batch refetches first
            i for lo, hi in _tail_first(_chunks(len(sink.keys), info.max_batch_keys)) for i in range(lo, hi)
        ]
        sizes: dict[int, int] = {}
    else:
        pending, sizes = sorted(only), only
    while pending:
        batch = pending[: _inline_batch(pending, sizes, info.max_inline_bytes, info.max_batch_keys)
                        if sizes else info.max_batch_keys]
        resp = yield Call(
            "Get",
            pb.GetRequest(keys=[sink.keys[i] for i in batch], namespace_id=st.namespace_id),
            pb.GetResponse,
        )
        if len(resp.results) != len(batch):
            raise InternalError(f"Get answered {len(resp.results)} items for {len(batch)} keys")
        again = []
        for i, r in zip(batch, resp.results, strict=True):
            if r.status.code == ErrorCode.BATCH_TOO_LARGE:
                again.append(i)  # over the node's inline budget: fetch in the next call
                continue
            sink.check_status(i, r.status)
            if r.found:
                sink.from_bytes(i, r.value, r.meta, _tier(r.tier))
        if len(again) == len(batch):
            raise InternalError("the node returned no value within its inline budget")
        pending = again + pending[len(batch) :]


def op_read(st: ClientState, keys: Sequence[object], buffers: Sequence[object] | None, deadline: float,
            want_meta: bool = True) -> Op[_ReadSink]:
    """Read blocks into a sink over the chosen transport (get, get_into, get_blocks)."""
    if type(keys) is not list:  # (a list is one: the common case, checked for free)
        require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    if buffers is not None and type(buffers) is not list:
        require_sequence(buffers, "buffers", "a sequence (list) with one writable buffer per key")
    info = st.info
    if info is None:  # (described already: no generator to run)
        info = yield from ensure_ready(st)
    sink = _ReadSink(check_keys(keys, info), buffers, want_meta)
    if not sink.keys:
        return sink
    if info.transport == "shm":
        through = yield from _read_shm(st, info, sink, deadline)
        if through:  # a peer's blocks the node had no room to keep: streamed through its Get
            yield from _read_grpc(st, info, sink, deadline, through)
    elif info.transport == "tcp":
        yield from _read_tcp(st, info, sink, deadline)
    else:
        yield from _read_grpc(st, info, sink, deadline)
    sink.finish()
    return sink


def op_get(st: ClientState, keys: Sequence[object], deadline: float) -> Op[list[bytes | None]]:
    sink = yield from op_read(st, keys, None, deadline)
    return [sink.value(i) for i in range(len(sink.keys))]


def op_get_blocks(st: ClientState, keys: Sequence[object], deadline: float) -> Op[list[Block | None]]:
    sink = yield from op_read(st, keys, None, deadline)
    out: list[Block | None] = []
    for i in range(len(sink.keys)):
        v = sink.value(i)
        out.append(None if v is None else Block(v, sink.metas[i], sink.tiers[i]))
    return out


def op_get_into(
    st: ClientState,
    keys: Sequence[object],
    buffers: Sequence[object],
    return_meta: bool,
    deadline: float,
) -> Op[list[Any]]:
    if type(buffers) is not list:  # None too: a get_into is never read as a get
        require_sequence(buffers, "buffers", "a sequence (list) with one writable buffer per key")
    sink = yield from op_read(st, keys, buffers, deadline, return_meta)
    if return_meta:
        return [None if s is None else (s, sink.metas[i]) for i, s in enumerate(sink.sizes)]
    return list(sink.sizes)



# ---- probes and admin ---------------------------------------------------------------------------


def op_lookup_prefix_tiers(st: ClientState, keys: Sequence[object], deadline: float) -> Op[list[Tier]]:
    if type(keys) is not list:  # (a list is one: the common case, checked for free)
        require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    info = st.info
    if info is None:  # (described already: no generator to run)
        info = yield from ensure_ready(st)
    tiers: list[Tier] = []
    if (yield from one_sided_live(st, info)):  # DRAM blocks: no round trip
        # one native call hashes and probes the whole prefix, its keys checked there too
        # (-1: a key it refuses, or no slot region: check_keys below names a bad key)
        as_list = cast(list[bytes], keys if type(keys) is list else list(keys))
        lead = dram_lead(st, as_list, info)
        if lead >= 0:
            if lead:
                st.one_sided_counts.add_lookup(lead, lead)  # the node counts the rest it answers
                if st.control is not None:
                    st.control.note_report()
            if lead == len(as_list):
                return [Tier.DRAM] * lead
            tiers = [Tier.DRAM] * lead
            keys = as_list[lead:]  # the node answers from the first block not known here
    checked = check_keys(keys, info)
    for start, end in _chunks(len(checked), info.max_batch_keys):
        resp = yield Call(
            "LookupPrefix",
            pb.LookupPrefixRequest(keys=checked[start:end], namespace_id=st.namespace_id),
            pb.LookupPrefixResponse,
        )
        # a hit block's tier is DRAM or SSD (None only for a value this client does not know)
        tiers += cast(list[Tier], tiers_of(resp.tiers[: resp.num_hit_blocks]))
        if resp.num_hit_blocks < end - start:
            break
    return tiers


def op_exists(
    st: ClientState, keys: Sequence[object], with_tiers: bool, deadline: float,
    namespace_id: bytes | None = None,
) -> Op[list[Any]]:
    """Exists (or where, ``with_tiers``) in the client's namespace, or in ``namespace_id``."""
    require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    ns_id = st.namespace_id if namespace_id is None else namespace_id
    if not isinstance(ns_id, bytes):
        raise InvalidArgument(f"namespace_id must be bytes; got {type(ns_id).__name__}")
    info = yield from ensure_ready(st)
    checked = check_keys(keys, info)
    live = namespace_id is None and (yield from one_sided_live(st, info))
    present = dram_present(st, checked, info) if live else None
    if present is not None and any(present):  # DRAM blocks: answered here, no round trip
        rest = [k for k, p in zip(checked, present, strict=True) if not p]
        asked = iter((yield from op_exists(st, rest, with_tiers, deadline)) if rest else [])
        hit: Any = Tier.DRAM if with_tiers else True
        return [hit if p else next(asked) for p in present]
    out: list[Any] = []
    for start, end in _chunks(len(checked), info.max_batch_keys):
        resp = yield Call(
            "Exists",
            pb.ExistsRequest(keys=checked[start:end], namespace_id=ns_id, with_tiers=with_tiers),
            pb.ExistsResponse,
        )
        if with_tiers:
            out.extend(_tier(t) if e else None for e, t in zip(resp.exists, resp.tiers, strict=True))
        else:
            out.extend(resp.exists)
    return out


def op_remove(st: ClientState, keys: Sequence[object], deadline: float) -> Op[list[bool]]:
    require_sequence(keys, "keys", "a sequence (list) of block keys (bytes)")
    info = yield from ensure_ready(st)
    checked = check_keys(keys, info)
    out: list[bool] = []
    for start, end in _chunks(len(checked), info.max_batch_keys):
        resp = yield Call(
            "Remove", pb.RemoveRequest(keys=checked[start:end], namespace_id=st.namespace_id),
            pb.RemoveResponse,
        )
        out.extend(bool(r) for r in resp.removed)
    return out


def stats_to_dict(resp: pb.StatsResponse) -> dict[str, Any]:
    """Stats as a plain, JSON-ready dict (stable keys for scripts)."""
    return {
        "node_id": resp.node_id,
        "epoch": resp.epoch,
        "uptime_s": resp.uptime_s,
        "draining": resp.draining,
        "gets": resp.gets,
        "hits": resp.hits,
        "misses": resp.misses,
        "puts": resp.puts,
        "put_failures": resp.put_failures,
        "checksum_failures": resp.checksum_failures,
        "pinned_blocks": resp.pinned_blocks,
        "quarantined_bytes": resp.quarantined_bytes,
        "num_sessions": resp.num_sessions,
        "remote_rdma_blocks": resp.remote_rdma_blocks,
        "remote_tcp_blocks": resp.remote_tcp_blocks,
        "rdma_fallbacks": resp.rdma_fallbacks,
        "rdma_device": resp.rdma_device,
        "rdma_sessions": resp.rdma_sessions,
        "tiers": [
            {
                "tier": Tier(t.tier).name if t.tier in (1, 2) else "UNSPECIFIED",
                "capacity_bytes": t.capacity_bytes,
                "used_bytes": t.used_bytes,
                "num_blocks": t.num_blocks,
                "hits": t.hits,
                "evictions": t.evictions,
            }
            for t in resp.tiers
        ],
    }


def op_stats(st: ClientState) -> Op[dict[str, Any]]:
    resp = yield Call("Stats", pb.StatsRequest(), pb.StatsResponse)
    return stats_to_dict(resp)


def op_list_blocks(
    st: ClientState, namespace_id: bytes | None, limit: int
) -> Op[tuple[list[BlockInfo], bool]]:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InvalidArgument(f"limit must be an int >= 0; got {limit!r}")
    if namespace_id is not None and not isinstance(namespace_id, (bytes, bytearray, memoryview)):
        raise InvalidArgument(
            "namespace_id must be bytes (a Namespace's .id; bytes.fromhex() for a hex id) or "
            f"None for every namespace; got {_received(namespace_id)}"
        )
    resp = yield Call(
        "ListBlocks",
        pb.ListBlocksRequest(namespace_id=bytes(namespace_id or b""), limit=limit),
        pb.ListBlocksResponse,
    )
    blocks = [
        BlockInfo(
            key=b.key, size_bytes=b.size_bytes, namespace_id=b.namespace_id,
            tiers=tuple(Tier(t) for t in b.tiers if t in (1, 2)), pinned=b.pinned,
        )
        for b in resp.blocks
    ]
    return blocks, resp.truncated
