"""The scheduler on the master: its two ports onto the cluster.

``kvstored master`` hosts the SchedulerService (kvstored/scheduler/service.py) next to the
MasterService; the scheduler reaches the cluster only through these two adapters, so its
core stays free of the master's types::

    Schedule(keys, namespace)
      -> IndexBlockLocator(keys, namespace)     where each leading block lives: every readable,
                                                committed replica, by node id and tier, read
                                                from this term's BlockIndex (its public
                                                lookup_prefix / replicas API: metadata only,
                                                nothing pinned, touched or changed)
      -> the core decides: prefill instance, prefix_node_id, replicate_keys
      -> NodePrefetcher.prefetch(prefill node, namespace, replicate_keys)
                                                NodeService.Prefetch on that node: it copies
                                                the blocks it lacks through the cluster get
                                                path (kvstored/node/remote.py: master lookup,
                                                peer data plane, verified against the
                                                replica's generation, committed as
                                                remote-fill copies), so the engine's own load
                                                finds them on its node

Safety does not rest on the copy: a block the copy did not bring (failed, evicted since,
the deadline passed) is a miss for the engine's load, which then fetches it itself through
the same path or recomputes it. The copy never writes anything the cluster get path would
not write for the engine's own read.

The master dials the node's registered ``grpc_address`` (TLS with the master's certificate
when ``[tls]`` is set; the node allows Prefetch to callers with the ``node`` or ``admin``
role). A node that registered no TCP gRPC address cannot be asked: its copy is FAILED and
the engine's load does the fetch.

Loop only (the master's event loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grpc
import structlog

from kvstored.errors import KvstoredError
from kvstored.rpc_status import error_from_rpc
from kvstored.scheduler.service import CopyOutcome
from kvstored.security.tls import TlsFiles, open_aio_channel
from kvstored.transport.master_targets import RECONNECT_BACKOFF_OPTIONS
from kvstored.types import Tier
from kvstored.v1 import node_pb2

if TYPE_CHECKING:
    from kvstored.master.state import MasterState

log = structlog.get_logger(__name__)

_PREFETCH_METHOD = "/kvstored.v1.NodeService/Prefetch"
MAX_PREFETCH_KEYS = 4096
"""Keys per Prefetch call (a node's default ``max_batch_keys``); longer plans are split."""


class IndexBlockLocator:
    """A scheduler ``BlockLocator`` over the leading master's block index.

    Args:
        state: returns the current term's :class:`~kvstored.master.state.MasterState` (a new
            term swaps its state in whole: the locator always reads the current one).
    """

    def __init__(self, state: Callable[[], MasterState | None]) -> None:
        self._state = state

    def __call__(self, keys: Sequence[bytes], namespace_id: bytes = b"") -> list[
            list[tuple[str, Tier]]]:
        """Every readable committed replica of each leading present block.

        Args:
            keys: the request's block keys, in prefix order.
            namespace_id: their stored namespace id.

        Returns:
            One list of ``(node_id, tier)`` per leading block that has at least one
            replica on a registered node (stops at the first block without one).
        """
        st = self._state()
        if st is None or not keys:
            return []
        index, members = st.index, st.membership
        count = len(index.lookup_prefix(namespace_id, keys))
        out: list[list[tuple[str, Tier]]] = []
        for key in keys[:count]:
            entry = []
            for r in index.replicas(namespace_id, key, readable_only=True):
                rec = members.record_of_holder(r.holder)
                if rec is not None:
                    entry.append((rec.spec.node_id, r.tier))
            if not entry:
                break
            out.append(entry)
        return out

    def block_bytes(self, keys: Sequence[bytes], namespace_id: bytes = b"") -> int:
        """Total size of ``keys`` as the index knows them (the first replica of each; a key
        the index does not know counts 0)."""
        st = self._state()
        if st is None:
            return 0
        total = 0
        for key in keys:
            reps = st.index.replicas(namespace_id, key, readable_only=True)
            if reps:
                total += reps[0].size_bytes
        return total


class NodePrefetcher:
    """The scheduler's copier: asks a node to pull blocks in (``NodeService.Prefetch``).

    Args:
        state: the current term's state (for the node's address).
        tls: the master's TLS files (None: plaintext).
        sizes: ``sizes(keys, namespace_id)`` -> bytes of those blocks (for the byte count).
    """

    def __init__(self, state: Callable[[], MasterState | None], tls: TlsFiles | None = None,
                 *, sizes: Callable[[Sequence[bytes], bytes], int] | None = None) -> None:
        self._state = state
        self._tls = tls
        self._sizes = sizes
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_aio_channel(address, self._tls,
                                                             options=RECONNECT_BACKOFF_OPTIONS)
        return ch

    async def prefetch(self, node_id: str, namespace_id: bytes, keys: Sequence[bytes],
                       timeout_s: float) -> CopyOutcome:
        """Have ``node_id`` copy in the blocks of ``keys`` it lacks, within ``timeout_s``.

        Never raises for the node's or the network's failure: the outcome says what is
        missing and why (``message``).
        """
        t0 = time.monotonic()
        st = self._state()
        rec = st.membership.node(node_id) if st is not None else None
        if rec is None or not rec.spec.grpc_address:
            why = ("is not registered" if rec is None else "registered no gRPC address")
            return CopyOutcome(0, len(keys), 0.0, 0, f"node {node_id!r} {why}")
        call = self._channel(rec.spec.grpc_address).unary_unary(
            _PREFETCH_METHOD, request_serializer=node_pb2.PrefetchRequest.SerializeToString,
            response_deserializer=node_pb2.PrefetchResponse.FromString)
        fetched = missing = 0
        message = ""
        for i in range(0, len(keys), MAX_PREFETCH_KEYS):
            batch = list(keys[i:i + MAX_PREFETCH_KEYS])
            left = timeout_s - (time.monotonic() - t0)
            if left <= 0:
                missing += len(keys) - i
                message = f"the copy ran past its {timeout_s:g} s deadline"
                break
            try:
                resp = await call(node_pb2.PrefetchRequest(namespace_id=namespace_id,
                                                           keys=batch), timeout=left)
            except grpc.RpcError as exc:
                err: KvstoredError = error_from_rpc(exc)
                missing += len(batch)
                message = f"NodeService.Prefetch on {node_id!r} failed: {err}"
                log.info("scheduler_prefetch_failed", node_id=node_id, error=str(err))
                continue
            fetched += resp.num_fetched
            missing += resp.num_missing
        if missing and not message:
            message = f"{missing} of {len(keys)} blocks could not be copied to {node_id!r}"
        nbytes = 0
        if fetched and self._sizes is not None and keys:
            nbytes = self._sizes(keys, namespace_id) * fetched // len(keys)
        return CopyOutcome(fetched, missing, time.monotonic() - t0, nbytes, message)

    async def close(self) -> None:
        """Close the channels to the nodes."""
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
