"""MasterAdminClient: the master's admin views and a cluster-wide evict (kvstorectl).

The master never touches payload bytes, so :meth:`MasterAdminClient.evict` resolves the
holders of each block through the master (``ListReplicas`` / ``ListNodeBlocks``) and calls
each holder node's own ``Remove`` RPC at the gRPC address the node registered with. A block
pinned by a reader on its node is kept there (``Remove`` answers False) and reported so.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from kvstored.rpc_status import error_from_rpc
from kvstored.security.tls import open_channel
from kvstored.transport.master_rpc import MasterClient
from kvstored.types import Tier
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import node_pb2 as node_pb
from kvstored.v1 import node_pb2_grpc as node_grpc

REMOVE_CHUNK_KEYS = 512
"""Keys per node Remove call (well under a node's max_batch_keys)."""

_STATE = {pb.REPLICA_STATE_WRITING: "writing", pb.REPLICA_STATE_COMMITTED: "committed"}


def _tier_name(value: int) -> str:
    return Tier(value).name if value in (int(Tier.DRAM), int(Tier.SSD)) else str(value)


@dataclass
class NodeEviction:
    """What one holder node removed (a row of ``kvstorectl evict``).

    Attributes:
        node_id: the holder node.
        grpc_address: where its ``Remove`` was called.
        requested: keys asked to remove there, hex, per namespace id hex.
        removed: keys the node removed.
        kept: keys the node kept (pinned by a reader) or no longer had.
        error: why the node could not be asked (None when it answered).
    """

    node_id: str
    grpc_address: str
    requested: dict[str, list[str]] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form (``kvstorectl evict --output json``)."""
        return {"node_id": self.node_id, "grpc_address": self.grpc_address,
                "num_requested": sum(len(v) for v in self.requested.values()),
                "removed": self.removed, "kept": self.kept, "error": self.error}


class MasterAdminClient(MasterClient):
    """A :class:`MasterClient` with the admin views (``where``, ``blocks --node``, evict).

    Raises (from every call): as :class:`MasterClient`; ``InvalidArgument`` when the
    address answers gRPC but is not a master.
    """

    def is_master(self, timeout_s: float | None = None) -> bool:
        """Whether the address serves the MasterService (False: it is a node).

        Raises:
            Unavailable: nothing answers at the address within the deadline.
        """
        try:
            self._invoke("ListNodes", pb.ListNodesRequest(), timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return False
            raise error_from_rpc(exc) from None
        return True

    def list_replicas(self, namespace_id: bytes, keys: Sequence[bytes]
                      ) -> tuple[list[list[dict[str, Any]]], bool]:
        """Every replica of each block, in the order of ``keys`` (a probe).

        Returns:
            ``(per_key, complete)``: per key a list of ``{"node_id", "epoch", "tier",
            "size_bytes", "generation", "state", "readable", "grpc_address",
            "data_address", "copy"}`` (empty: missing cluster-wide; ``copy``: a remote-fill
            copy of another node's block); ``complete`` is False while some node is still
            (re)syncing.

        Raises:
            InvalidArgument: too many keys, or an empty or oversized key.
        """
        per_key, _, complete = self.list_replicas_and_factors(namespace_id, keys)
        return per_key, complete

    def list_replicas_and_factors(self, namespace_id: bytes, keys: Sequence[bytes]
                                  ) -> tuple[list[list[dict[str, Any]]], list[int], bool]:
        """:meth:`list_replicas` and each block's wanted replication factor (a probe).

        Returns:
            ``(per_key, factors, complete)``: as :meth:`list_replicas`, with ``factors[i]``
            the replicas the master wants of ``keys[i]`` (1 = the default; 0 = not indexed,
            or a master older than the factor).

        Raises:
            InvalidArgument: too many keys, or an empty or oversized key.
        """
        req = pb.ListReplicasRequest(namespace_id=namespace_id, keys=list(keys))
        try:
            resp = self._invoke("ListReplicas", req, None)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        out = [[{"node_id": r.node_id, "epoch": r.epoch, "tier": _tier_name(r.tier),
                 "size_bytes": r.size_bytes, "generation": r.generation,
                 "state": _STATE.get(r.state, "unknown"), "readable": r.readable,
                 "grpc_address": r.grpc_address, "data_address": r.data_address,
                 "copy": r.copy}
                for r in b.replicas] for b in resp.blocks]
        return out, [b.replication_factor for b in resp.blocks], resp.complete

    def list_node_blocks(
        self, node_id: str, *, namespace_id: bytes | None = None, limit: int = 1000,
        page_token: bytes = b"",
    ) -> dict[str, Any]:
        """One page of the replicas the master indexes on a node.

        Returns:
            ``{"node_id", "epoch", "num_replicas", "next_page_token" (hex, "" on the last
            page), "blocks": [{"namespace_id", "key", "tier", "size_bytes", "generation",
            "state", "copy"}]}`` (ids and keys in hex; ``copy`` as in :meth:`list_replicas`).

        Raises:
            NotFound: no live node has this id.
            InvalidArgument: limit out of 1..10000, or a page token not from this master.
        """
        req = pb.ListNodeBlocksRequest(node_id=node_id, any_namespace=namespace_id is None,
                                       namespace_id=namespace_id or b"", limit=limit,
                                       page_token=page_token)
        try:
            resp = self._invoke("ListNodeBlocks", req, None)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return {
            "node_id": node_id, "epoch": resp.epoch, "num_replicas": resp.num_replicas,
            "next_page_token": resp.next_page_token.hex(),
            "blocks": [{"namespace_id": b.namespace_id.hex(), "key": b.key.hex(),
                        "tier": _tier_name(b.tier), "size_bytes": b.size_bytes,
                        "generation": b.generation, "state": _STATE.get(b.state, "unknown"),
                        "copy": b.copy}
                       for b in resp.blocks],
        }

    def iter_node_blocks(self, node_id: str, *, namespace_id: bytes | None = None,
                         page_blocks: int = 1000) -> Iterator[dict[str, Any]]:
        """Every replica indexed on a node, page after page (see :meth:`list_node_blocks`)."""
        token = b""
        while True:
            page = self.list_node_blocks(node_id, namespace_id=namespace_id,
                                         limit=page_blocks, page_token=token)
            yield from page["blocks"]
            if not page["next_page_token"]:
                return
            token = bytes.fromhex(page["next_page_token"])

    def evict(self, targets: dict[tuple[str, str], dict[bytes, list[bytes]]]
              ) -> list[NodeEviction]:
        """Remove blocks from their holder nodes through each node's ``Remove`` RPC.

        Args:
            targets: ``{(node_id, grpc_address): {namespace_id: [keys]}}`` (resolved through
                :meth:`list_replicas` or :meth:`iter_node_blocks`).

        Returns:
            One :class:`NodeEviction` per node, sorted by node id; a node that could not be
            reached has ``error`` set and nothing removed (the others are still asked).
        """
        out = []
        for (node_id, address), by_ns in sorted(targets.items()):
            ev = NodeEviction(node_id, address)
            out.append(ev)
            try:
                with open_channel(address, self.tls) as channel:
                    stub = node_grpc.NodeServiceStub(channel)
                    for ns, keys in sorted(by_ns.items()):
                        ev.requested[ns.hex()] = [k.hex() for k in keys]
                        for i in range(0, len(keys), REMOVE_CHUNK_KEYS):
                            chunk = keys[i : i + REMOVE_CHUNK_KEYS]
                            resp = stub.Remove(node_pb.RemoveRequest(keys=chunk, namespace_id=ns),
                                               timeout=self.timeout_s)
                            for k, removed in zip(chunk, resp.removed, strict=True):
                                (ev.removed if removed else ev.kept).append(k.hex())
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                ev.error = f"{err.code.name}: {err}"
        return out
