"""MasterClient: the synchronous wrapper of the master's gRPC stub, shared by node and client.

Engines never call the master themselves: they talk to their local node. A node uses this
wrapper for its remote reads and spills (kvstored/node/remote.py, spill.py); the client
package re-exports it as ``kvstored.client.master.MasterClient`` for
``kvstorectl --address MASTER nodes`` and the cluster tests. It lives below both (here in
transport/) so that node/ never imports client/.

The address may name several masters (``HOST:PORT,HOST:PORT``) or an etcd election
(``etcd://HOST:PORT/PFX``; kvstored/transport/master_targets.py). A call answered
``NotLeader`` is sent again to the leader the answer names (else the next address, or the
leader etcd names), and one that finds its master ``Unavailable`` or past its deadline is
sent to the next one: at most one try per address plus one. With a single address a call
is tried once, as before. Every answer's term goes through a :class:`TermFence` (shared
with the node's other master users when one is passed): an answer from an older term than
one already seen is refused as ``StaleTerm`` (and, with several masters, the next one is
tried). A PutStart re-sent after an Unavailable may find the first one's write open on the
same leader (ReplicaNotReady, retriable); a new leader knows nothing of it.

Channels are made by kvstored.security.tls.open_channel only (one place for credentials).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import grpc

from kvstored.errors import (
    DeadlineExceeded,
    InternalError,
    KvstoredError,
    NotLeader,
    StaleTerm,
    Unavailable,
    error_from_code,
)
from kvstored.rpc_status import error_from_rpc, no_answer_error
from kvstored.security.tls import TlsFiles, open_channel
from kvstored.transport.master_targets import (
    RECONNECT_BACKOFF_OPTIONS,
    MasterTargets,
    TermFence,
    leader_hint,
    parse_master_targets,
    read_leader_sync,
)
from kvstored.types import Tier
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc

T = TypeVar("T")
_HEALTH = {pb.NODE_HEALTH_HEALTHY: "healthy", pb.NODE_HEALTH_UNHEALTHY: "unhealthy",
           pb.NODE_HEALTH_SYNCING: "syncing"}


@dataclass(frozen=True, slots=True)
class ClusterReplica:
    """The best replica of one block, as the master answers a cluster lookup.

    ``alternates``: the block's other readable replicas on distinct nodes, ranked best
    first, when the lookup asked for them (``max_alternates``; read fallback,
    kvstored/node/remote.py); empty otherwise or from an older master. An alternate has no
    alternates of its own.
    """

    node_id: str
    epoch: int
    tier: Tier
    size_bytes: int
    generation: int
    data_address: str
    alternates: tuple[ClusterReplica, ...] = ()


def _replicas(resp: pb.MasterLookupPrefixResponse) -> list[ClusterReplica]:
    """The answered blocks' replicas of a LookupPrefix answer, in answer order, each with
    its alternates (the flat ``alternate_*`` columns split by ``num_alternates``)."""
    nodes = list(resp.nodes)
    counts = list(resp.num_alternates)
    alts: list[tuple[ClusterReplica, ...]] = []
    if counts:
        if len(counts) != len(resp.node_index):
            raise InternalError(f"the master answered {len(counts)} num_alternates for "
                                f"{len(resp.node_index)} blocks")
        flat = [ClusterReplica(nodes[i].node_id, nodes[i].epoch, Tier(t), s, g,
                               nodes[i].data_address)
                for i, t, s, g in zip(resp.alternate_node_index, resp.alternate_tier,
                                      resp.alternate_size_bytes, resp.alternate_generation,
                                      strict=True)]
        if sum(counts) != len(flat):
            raise InternalError(f"the master answered {len(flat)} alternates, its counts "
                                f"sum to {sum(counts)}")
        start = 0
        for n in counts:
            alts.append(tuple(flat[start:start + n]))
            start += n
    else:
        alts = [()] * len(resp.node_index)
    return [
        ClusterReplica(nodes[i].node_id, nodes[i].epoch, Tier(t), s, g, nodes[i].data_address, a)
        for i, t, s, g, a in zip(resp.node_index, resp.tier, resp.size_bytes, resp.generation,
                                 alts, strict=True)
    ]


class MasterClient:
    """Blocking calls to the leading master; use as a context manager.

    Args:
        address: ``HOST:PORT``, ``HOST:PORT,HOST:PORT,...`` or ``etcd://HOST:PORT/PFX``
            (see the module docstring).
        timeout_s: deadline of each call (each try), seconds.
        fence: the newest term seen, shared with other users (a private one if None).
        tls: mutual TLS to the master (kvstored/security/tls.py); None = plaintext.

    Raises (from every call):
        Unavailable: no master could be reached, or the last one tried did not answer
            within ``timeout_s`` ("master at X did not answer M within N ms": a stopped,
            overloaded or cut-off master; retriable).
        NotLeader: every master tried answered that it does not lead (retriable: an
            election is under way).
        StaleTerm: the answer came from a term older than one already seen.
        DeadlineExceeded: the master itself answered that a deadline passed.
        InvalidArgument: ``address`` is malformed (at construction).
    """

    def __init__(self, address: str, *, timeout_s: float = 5.0, tls: TlsFiles | None = None,
                 fence: TermFence | None = None) -> None:
        self.targets: MasterTargets = parse_master_targets(address)
        self.address = self.targets.first()  # "" with etcd only: read the leader first
        self.timeout_s = timeout_s
        self.tls = tls
        self.fence = fence if fence is not None else TermFence()
        self._following = len(self.targets.addresses) > 1 or self.targets.uses_etcd
        self._channel: Any = None
        self._stub: Any = None
        if self.address:
            self._connect(self.address)
        self._single_puts = False  # the master predates PutStartBatch: one call per item

    def _connect(self, address: str) -> None:
        if self._channel is not None:
            self._channel.close()
        self.address = address
        self._channel = open_channel(address, self.tls,  # one function per side: security/tls.py
                                     options=RECONNECT_BACKOFF_OPTIONS)
        self._stub = pb_grpc.MasterServiceStub(self._channel)

    def _move(self, hint: str) -> None:
        """Talk to ``hint`` next; without one, the next address (or the leader etcd names)."""
        if hint:
            self._connect(hint)
        elif self.targets.uses_etcd:
            self.address = ""
        else:
            addrs = self.targets.addresses
            i = addrs.index(self.address) if self.address in addrs else -1
            self._connect(addrs[(i + 1) % len(addrs)])

    def _resolve(self) -> None:
        leader, _ = read_leader_sync(self.targets, timeout_s=self.timeout_s)
        if not leader:
            raise NotLeader(f"no master leads under {self.targets.election_prefix!r} in etcd "
                            f"{','.join(self.targets.etcd_endpoints)} right now")
        self._connect(leader)

    def _invoke(self, name: str, request: Any, timeout_s: float | None) -> Any:
        """``MasterService.name(request)`` at the leader, following NotLeader / Unavailable
        (module docstring); the answer's term checked against the fence.

        Raises:
            grpc.RpcError: the last try's failure (or the only one, with a single address).
            StaleTerm: the answer's term is older than the newest seen.
            Unavailable / NotLeader: etcd could not be read, or names no leader; or
                Unavailable "master at X did not answer M within N ms": the last master
                tried never answered (:func:`~kvstored.rpc_status.no_answer_error`).
        """
        tries = len(self.targets.addresses) + 1 if self._following else 1
        last: BaseException | None = None
        timeout = timeout_s or self.timeout_s
        for _ in range(max(tries, 2) if self.targets.uses_etcd else tries):
            try:
                if not self.address:
                    self._resolve()
                resp = getattr(self._stub, name)(request, timeout=timeout)
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                # no answer at all (a SIGSTOPped or cut-off master): Unavailable naming it
                late = no_answer_error(exc, f"master at {self.address}", name, timeout)
                if not self._following or not (isinstance(err, NotLeader)
                                               or type(err) in (Unavailable, DeadlineExceeded)):
                    if late is not None:
                        raise late from None
                    raise
                last = late if late is not None else exc
                self._move(leader_hint(exc) if isinstance(err, NotLeader) else "")
                continue
            except (NotLeader, Unavailable) as exc:  # etcd unreadable or no leader yet
                last = exc
                continue
            try:
                self.fence.observe(getattr(resp, "term", 0), f"master {self.address} {name}")
            except StaleTerm as exc:
                if not self._following:
                    raise
                last = exc
                self._move("")
                continue
            return resp
        assert last is not None
        raise last

    def close(self) -> None:
        """Close the channel (idempotent)."""
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _call(self, name: str, request: Any, timeout_s: float | None) -> Any:
        """:meth:`_invoke` with ``timeout_s`` (None/0: the client's ``timeout_s``); a gRPC
        error raised as the matching :class:`~kvstored.errors.KvstoredError`."""
        try:
            return self._invoke(name, request, timeout_s)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def drain_node(self, node_id: str, timeout_s: float | None = None) -> dict[str, object]:
        """Start (or report) a node's drain (``kvstorectl drain``): nothing new is placed
        there, its blocks with no other replica are copied to other nodes, then it leaves.

        Returns:
            ``{"node_id", "draining", "num_blocks", "num_blocks_to_move",
            "num_copies_issued", "leave_sent"}`` (idempotent: asking again reports progress).

        Raises:
            NotFound: the node is not registered (it left already, or never joined).
        """
        r = self._call("DrainNode", pb.DrainNodeRequest(node_id=node_id), timeout_s)
        return {"node_id": node_id, "draining": r.draining, "num_blocks": r.num_blocks,
                "num_blocks_to_move": r.num_blocks_to_move,
                "num_copies_issued": r.num_copies_issued, "leave_sent": r.leave_sent}

    def set_replication(self, namespace_id: bytes, keys: Sequence[bytes], replicas: int,
                        timeout_s: float | None = None) -> int:
        """Set the wanted replication factor of blocks (the master's repair keeps that many
        replicas on distinct nodes; 1 forgets it).

        Returns:
            Keys set.

        Raises:
            InvalidArgument: ``replicas`` outside 1..8, or a bad key or namespace id.
        """
        r = self._call("SetReplication", pb.SetReplicationRequest(
            namespace_id=namespace_id, keys=list(keys), replicas=replicas), timeout_s)
        return int(r.num_keys)

    def list_nodes(self, timeout_s: float | None = None) -> dict[str, object]:
        """The membership, as the stable dict ``kvstorectl nodes --output json`` prints.

        Returns:
            ``{"master_epoch", "term", "leader" (the address that answered), "num_replicas",
            "nodes": [{"node_id", "epoch", "grpc_address",
            "data_address", "zone", "health", "load", "num_replicas", "lease_left_s", "last_seq",
            "draining", "coldest_age_s", "transports", "tiers": [{"tier", "used_bytes",
            "capacity_bytes", "num_blocks", "spare_bytes"}]}]}`` (spare_bytes: of used_bytes,
            what the node can free without dropping a block; coldest_age_s: seconds since the last use
            of its coldest original block, 0 = none; transports: what the node advertised,
            e.g. ``["tcp", "rdma"]``)
            (draining: ``kvstorectl drain`` is re-homing its blocks); health
            is "healthy", "unhealthy", "probation" (unhealthy, tried again: its replicas are
            named, nothing is placed on it) or "syncing"; and ``"departed": [{"node_id",
            "epoch", "grpc_address", "data_address", "reason", "departed_s_ago",
            "num_replicas"}]``, the nodes that left recently (reason "expired": its lease
            lapsed; "left": it unregistered), newest first, until they register again
        """
        resp = self._call("ListNodes", pb.ListNodesRequest(), timeout_s)
        nodes = []
        for st in resp.nodes:
            n = st.node
            nodes.append({
                "node_id": n.node_id, "epoch": n.epoch, "grpc_address": n.grpc_address,
                "data_address": n.data_address, "zone": n.zone,
                "health": "probation" if st.probation and st.health == pb.NODE_HEALTH_UNHEALTHY
                else _HEALTH.get(st.health, "unknown"),
                "load": st.load, "num_replicas": st.num_replicas,
                "lease_left_s": round(st.lease_left_s, 3), "last_seq": st.last_seq,
                "draining": st.draining, "coldest_age_s": round(st.coldest_age_s, 3),
                "transports": list(n.transports) or ["tcp"],
                "tiers": [{"tier": Tier(t.tier).name, "used_bytes": t.used_bytes,
                           "capacity_bytes": t.capacity_bytes, "num_blocks": t.num_blocks,
                           "spare_bytes": t.spare_bytes}
                          for t in n.tiers if t.tier in (1, 2)],
            })
        departed = [
            {"node_id": d.node.node_id, "epoch": d.node.epoch, "grpc_address": d.node.grpc_address,
             "data_address": d.node.data_address, "reason": d.reason,
             "departed_s_ago": round(d.departed_s_ago, 3), "num_replicas": d.num_replicas}
            for d in resp.departed
        ]
        return {"master_epoch": resp.master_epoch, "term": resp.term, "leader": self.address,
                "num_replicas": resp.num_replicas, "nodes": nodes, "departed": departed}

    def lookup_prefix(
        self, namespace_id: bytes, keys: Sequence[bytes], *, local_node_id: str = "",
        timeout_s: float | None = None, avoid: Sequence[str] = (), max_alternates: int = 0,
    ) -> tuple[list[ClusterReplica], bool]:
        """Cluster-wide longest prefix (never pins anything).

        Returns:
            ``(replicas, complete)``: the best replica of each leading block present
            cluster-wide; ``complete`` is False while some node is still (re)syncing.

        Args and Raises: as :meth:`lookup_prefix_term`.
        """
        got, complete, _ = self.lookup_prefix_term(
            namespace_id, keys, local_node_id=local_node_id, timeout_s=timeout_s, avoid=avoid,
            max_alternates=max_alternates)
        return got, complete

    def lookup_prefix_term(
        self, namespace_id: bytes, keys: Sequence[bytes], *, local_node_id: str = "",
        timeout_s: float | None = None, avoid: Sequence[str] = (), max_alternates: int = 0,
    ) -> tuple[list[ClusterReplica], bool, int]:
        """:meth:`lookup_prefix` with the answering leader's term: ``(replicas, complete,
        term)`` (term 0: a master without terms).

        Args:
            timeout_s: this call's deadline (default: the client's ``timeout_s``).
            avoid: node ids the caller found unreachable: ranked after every other readable
                replica (still answered when they are the only ones); at most 64.
            max_alternates: also answer up to this many other replicas per block (each
                replica's ``alternates``; the master caps it at 3, an older one sends none).

        Raises:
            InvalidArgument: too many keys or avoided nodes, or an empty or oversized key.
        """
        req = pb.MasterLookupPrefixRequest(namespace_id=namespace_id, keys=list(keys),
                                           local_node_id=local_node_id,
                                           avoid_node_ids=list(avoid),
                                           max_alternates=max_alternates)
        resp = self._call("LookupPrefix", req, timeout_s)
        return _replicas(resp), resp.complete, int(resp.term)

    def lookup_each(
        self, namespace_id: bytes, keys: Sequence[bytes], *, local_node_id: str = "",
        timeout_s: float | None = None, avoid: Sequence[str] = (), max_alternates: int = 0,
    ) -> tuple[dict[int, ClusterReplica], bool] | None:
        """Cluster-wide presence of every key (an Exists probe; never pins anything).

        ``avoid`` and ``max_alternates`` as in :meth:`lookup_prefix`.

        Returns:
            ``({index into keys: best replica}, complete)`` for the keys present anywhere,
            or None when the master is older and answered only the leading prefix (the
            caller looks up runs with :meth:`lookup_prefix` then).

        Raises:
            InvalidArgument: too many keys or avoided nodes, or an empty or oversized key.
        """
        got = self.lookup_each_term(namespace_id, keys, local_node_id=local_node_id,
                                    timeout_s=timeout_s, avoid=avoid,
                                    max_alternates=max_alternates)
        return None if got is None else (got[0], got[1])

    def lookup_each_term(
        self, namespace_id: bytes, keys: Sequence[bytes], *, local_node_id: str = "",
        timeout_s: float | None = None, avoid: Sequence[str] = (), max_alternates: int = 0,
    ) -> tuple[dict[int, ClusterReplica], bool, int] | None:
        """:meth:`lookup_each` with the answering leader's term (0: a master without
        terms, no ``--etcd``): ``(found, complete, term)``, or None from an older master.

        A node's read compares the term with the one under which its cached peer view
        last saw each peer synced (kvstored/node/remote.py): ``complete`` is the leader's
        word on the nodes it knows, not on a node it has not heard from yet.

        Raises:
            InvalidArgument: as :meth:`lookup_each`.
        """
        req = pb.MasterLookupPrefixRequest(namespace_id=namespace_id, keys=list(keys),
                                           local_node_id=local_node_id, every_key=True,
                                           avoid_node_ids=list(avoid),
                                           max_alternates=max_alternates)
        resp = self._call("LookupPrefix", req, timeout_s)
        if not resp.every_key:
            return None
        return ({int(k): rep for k, rep in zip(resp.key_index, _replicas(resp), strict=True)},
                resp.complete, int(resp.term))

    def report_transfer(self, node_id: str, epoch: int, *, ok: bool, reporter_node_id: str = "",
                        timeout_s: float | None = None) -> str:
        """Report one data-plane transfer with ``node_id`` (epoch ``epoch``) to the master.

        Returns:
            The peer's health after the report ("healthy", "unhealthy", "syncing").

        Raises:
            NotFound: the peer is not registered.
        """
        req = pb.ReportTransferRequest(node_id=node_id, epoch=epoch, ok=ok,
                                       reporter_node_id=reporter_node_id)
        resp = self._call("ReportTransfer", req, timeout_s)
        return _HEALTH.get(resp.health, "unknown")

    # ---- two-phase put (spill, tests) -------------------------------------------------
    def put_start(
        self, namespace_id: bytes, key: bytes, size_bytes: int, *, writer_node_id: str = "",
        exclude_writer: bool = False, max_used_fraction: float = 0.0, headroom_bytes: int = 0,
        holder_reports: bool = False, timeout_s: float | None = None,
    ) -> tuple[bool, int, list[ClusterReplica]]:
        """Open a write of one block on the master (placement and a new generation).

        Returns:
            ``(exists, generation, replicas)``: ``exists`` True = already committed
            elsewhere (nothing to write); else where to write and the write's generation.

        Raises:
            NoCapacity: no candidate node has room.  ReplicaNotReady: another write of the
            block is open (retriable).  InvalidArgument: bad key, size or limits.
        """
        req = pb.PutStartRequest(
            namespace_id=namespace_id, key=key, size_bytes=size_bytes,
            writer_node_id=writer_node_id, num_replicas=1, exclude_writer=exclude_writer,
            max_used_fraction=max_used_fraction, headroom_bytes=headroom_bytes,
            holder_reports=holder_reports)
        resp = self._call("PutStart", req, timeout_s)
        return resp.exists, resp.generation, [
            ClusterReplica(r.node_id, r.epoch, Tier(r.tier), r.size_bytes, r.generation,
                           r.data_address) for r in resp.replicas]

    def put_end(self, namespace_id: bytes, key: bytes, generation: int, *, commit: bool,
                timeout_s: float | None = None) -> int:
        """Commit or abort exactly the write ``generation`` of a block.

        Returns:
            Replicas committed (or dropped); see ``Placement.end_put``.

        Raises:
            NotFound: that write is not open (ended, its write lease lapsed, or replaced by
            a newer write): a stale end is refused.
        """
        req = pb.PutEndRequest(namespace_id=namespace_id, key=key, generation=generation,
                               commit=commit)
        resp = self._call("PutEnd", req, timeout_s)
        return resp.num_replicas

    def put_start_batch(
        self, items: Sequence[tuple[bytes, bytes, int]], *, writer_node_id: str = "",
        exclude_writer: bool = False, max_used_fraction: float = 0.0, headroom_bytes: int = 0,
        holder_reports: bool = False, timeout_s: float | None = None,
    ) -> list[tuple[bool, int, list[ClusterReplica]] | KvstoredError]:
        """:meth:`put_start` of many blocks in one call (``PutStartBatch``).

        Args:
            items: ``(namespace_id, key, size_bytes)`` per block (at most 4096); the other
                arguments apply to every item, as in :meth:`put_start`.

        Returns:
            Per item, in order: ``(exists, generation, replicas)`` as :meth:`put_start`
            returns, or the error it would have raised (NoCapacity, ReplicaNotReady,
            InvalidArgument...), returned, not raised.

        A master without the batched calls (an older version: UNIMPLEMENTED) is asked
        with one :meth:`put_start` per item instead, from then on.

        Raises:
            InvalidArgument: too many items or an unknown policy (the whole call).
        """
        return self.put_end_and_start_batch(
            (), items, writer_node_id=writer_node_id, exclude_writer=exclude_writer,
            max_used_fraction=max_used_fraction, headroom_bytes=headroom_bytes,
            holder_reports=holder_reports, timeout_s=timeout_s)[1]

    def put_end_and_start_batch(
        self, ends: Sequence[tuple[bytes, bytes, int, bool]],
        items: Sequence[tuple[bytes, bytes, int]], *, writer_node_id: str = "",
        exclude_writer: bool = False, max_used_fraction: float = 0.0, headroom_bytes: int = 0,
        holder_reports: bool = False, timeout_s: float | None = None,
    ) -> tuple[list[int | KvstoredError],
               list[tuple[bool, int, list[ClusterReplica]] | KvstoredError]]:
        """:meth:`put_end_batch` of ``ends``, then :meth:`put_start_batch` of ``items``, in
        one call (``PutStartBatch`` carrying the ends: spill ends a batch on the call that
        starts the next).

        Returns:
            ``(per end as put_end_batch answers, per item as put_start_batch answers)``.

        Raises:
            InvalidArgument: too many items or ends, or an unknown policy (the whole call).
            InternalError: the master answered another number of results (a master that
                ignores the carried ends): nothing may be assumed ended.
        """
        if self._single_puts:
            ended = self.put_end_batch(ends, timeout_s=timeout_s) if ends else []
            return ended, [
                self._one(self.put_start, ns, k, n, writer_node_id=writer_node_id,
                          exclude_writer=exclude_writer, max_used_fraction=max_used_fraction,
                          headroom_bytes=headroom_bytes, holder_reports=holder_reports,
                          timeout_s=timeout_s) for ns, k, n in items]
        req = pb.PutStartBatchRequest(
            items=[pb.PutStartItem(namespace_id=ns, key=k, size_bytes=n) for ns, k, n in items],
            writer_node_id=writer_node_id, num_replicas=1, exclude_writer=exclude_writer,
            max_used_fraction=max_used_fraction, headroom_bytes=headroom_bytes,
            holder_reports=holder_reports,
            ends=[pb.PutEndRequest(namespace_id=ns, key=k, generation=g, commit=c)
                  for ns, k, g, c in ends])
        try:
            resp = self._invoke("PutStartBatch", req, timeout_s)
        except grpc.RpcError as exc:
            if _unimplemented(exc):
                self._single_puts = True
                return self.put_end_and_start_batch(
                    ends, items, writer_node_id=writer_node_id, exclude_writer=exclude_writer,
                    max_used_fraction=max_used_fraction, headroom_bytes=headroom_bytes,
                    holder_reports=holder_reports, timeout_s=timeout_s)
            raise error_from_rpc(exc) from None
        if len(resp.results) != len(items) or len(resp.end_results) != len(ends):
            raise InternalError(
                f"PutStartBatch answered {len(resp.results)} results for {len(items)} items "
                f"and {len(resp.end_results)} for {len(ends)} ends")
        out: list[tuple[bool, int, list[ClusterReplica]] | KvstoredError] = []
        for r in resp.results:
            if r.outcome in (pb.PUT_START_OUTCOME_PLACED, pb.PUT_START_OUTCOME_EXISTS):
                out.append((r.outcome == pb.PUT_START_OUTCOME_EXISTS, r.generation, [
                    ClusterReplica(x.node_id, x.epoch, Tier(x.tier), x.size_bytes, x.generation,
                                   x.data_address) for x in r.replicas]))
            else:
                out.append(error_from_code(r.error_code, r.message))
        return [error_from_code(r.error_code, r.message) if r.error_code else r.num_replicas
                for r in resp.end_results], out

    def top_up_batch(
        self, items: Sequence[tuple[bytes, bytes, int, int]], *, writer_node_id: str,
        max_used_fraction: float = 0.0, timeout_s: float | None = None,
    ) -> list[tuple[bool, int, list[ClusterReplica], int] | KvstoredError]:
        """Open writes of the replicas blocks lack (``PutStartBatch`` with ``top_up``): a
        put(replicas=N) whose first replica is on ``writer_node_id``.

        Args:
            items: ``(namespace_id, key, size_bytes, factor)`` per block (at most 4096),
                ``factor`` in 1..8.
            writer_node_id: the node holding the first replica (it sends the others).
            max_used_fraction: a candidate's last tier must stay at or below it (0 = no
                such limit: free DRAM decides).

        Returns:
            Per item, in order: ``(exists, generation, replicas, num_held)``: ``exists``
            when the block has its factor (``num_held`` holders, the writer included);
            else where to write the replicas it lacks (fewer when fewer nodes have room)
            under ``generation`` (no replicas, generation 0: no other node has room, nothing
            opened); or the item's error (ReplicaNotReady...), returned, not raised.

        Raises:
            InvalidArgument: too many items (the whole call).
            InternalError: a master older than top-ups (it ignored the flag and placed the
            block anew: those writes lapse with their write lease). The RPC's errors.
        """
        req = pb.PutStartBatchRequest(
            items=[pb.PutStartItem(namespace_id=ns, key=k, size_bytes=n, replicas=f)
                   for ns, k, n, f in items],
            writer_node_id=writer_node_id, num_replicas=7,  # at most factor - 1 (8 - 1) more
            exclude_writer=True, max_used_fraction=max_used_fraction,
            headroom_bytes=0, holder_reports=True, top_up=True)
        resp = self._call("PutStartBatch", req, timeout_s)
        if len(resp.results) != len(items):
            raise InternalError(f"PutStartBatch answered {len(resp.results)} results for "
                                f"{len(items)} items")
        out: list[tuple[bool, int, list[ClusterReplica], int] | KvstoredError] = []
        for r in resp.results:
            if r.outcome in (pb.PUT_START_OUTCOME_PLACED, pb.PUT_START_OUTCOME_EXISTS):
                if r.num_held == 0:  # a master that ignored top_up: it placed the block anew
                    raise InternalError("the master does not know replica top-ups "
                                        "(PutStartBatchRequest.top_up); upgrade it")
                out.append((r.outcome == pb.PUT_START_OUTCOME_EXISTS, r.generation, [
                    ClusterReplica(x.node_id, x.epoch, Tier(x.tier), x.size_bytes, x.generation,
                                   x.data_address) for x in r.replicas], r.num_held))
            elif r.outcome == pb.PUT_START_OUTCOME_NO_CAPACITY and r.num_held:
                out.append((False, 0, [], r.num_held))  # no room anywhere: what it has
            else:
                out.append(error_from_code(r.error_code, r.message))
        return out

    def put_end_batch(
        self, items: Sequence[tuple[bytes, bytes, int, bool]], *, timeout_s: float | None = None
    ) -> list[int | KvstoredError]:
        """:meth:`put_end` of many writes in one call (``PutEndBatch``).

        Args:
            items: ``(namespace_id, key, generation, commit)`` per write (at most 4096).

        Returns:
            Per item, in order: the replicas committed (or dropped), or the error
            :meth:`put_end` would have raised (NotFound: a stale end, refused), returned.

        A master without the batched calls is asked with one :meth:`put_end` per item.

        Raises:
            InvalidArgument: too many items (the whole call).
        """
        if self._single_puts:
            return [self._one(self.put_end, ns, k, g, commit=c, timeout_s=timeout_s)
                    for ns, k, g, c in items]
        req = pb.PutEndBatchRequest(items=[
            pb.PutEndRequest(namespace_id=ns, key=k, generation=g, commit=c)
            for ns, k, g, c in items])
        try:
            resp = self._invoke("PutEndBatch", req, timeout_s)
        except grpc.RpcError as exc:
            if _unimplemented(exc):
                self._single_puts = True
                return self.put_end_batch(items, timeout_s=timeout_s)
            raise error_from_rpc(exc) from None
        if len(resp.results) != len(items):
            raise InternalError(f"PutEndBatch answered {len(resp.results)} results for "
                                f"{len(items)} items")
        return [error_from_code(r.error_code, r.message) if r.error_code else r.num_replicas
                for r in resp.results]

    @staticmethod
    def _one(call: Callable[..., T], *args: Any, **kw: Any) -> T | KvstoredError:
        try:
            return call(*args, **kw)
        except KvstoredError as exc:
            return exc


def _unimplemented(exc: grpc.RpcError) -> bool:
    code = getattr(exc, "code", None)
    return callable(code) and code() == grpc.StatusCode.UNIMPLEMENTED
