"""Admin views of the master's index (``kvstorectl where|blocks|evict --address MASTER``).

Both views are probes: they read the membership and the :class:`BlockIndex` and never pin,
renew, touch or change anything (not even a lapsed lease is expired here beyond what every
membership view does). They are meant for operators, not the engine's hot path:

- :func:`list_replicas` walks each given block's replica chain (O(replicas of those blocks)).
- :func:`list_node_blocks` collects a node's rows (one vectorized pass over the row columns,
  O(rows of that node) Python work to sort them) for every page it serves.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from kvstored.errors import InvalidArgument, NotFound
from kvstored.master.membership import Membership
from kvstored.master.types import ReplicaState
from kvstored.types import Tier

MAX_PAGE_BLOCKS = 10000
DEFAULT_PAGE_BLOCKS = 1000
_TOKEN_VERSION = b"\x01"


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One indexed replica of a block, with its node's addresses.

    Attributes:
        node_id: the holder node.
        epoch: the node's live epoch.
        tier: DRAM or SSD on that node.
        size_bytes: the block's size.
        generation: the write (or event) that created the row.
        state: WRITING or COMMITTED.
        readable: lookups may return it (committed, node synced and healthy).
        grpc_address: the node's gRPC API (``Remove`` goes there).
        data_address: the node's data plane.
        copy: the holder reported it as a remote-fill copy of another node's block.
    """

    node_id: str
    epoch: int
    tier: Tier
    size_bytes: int
    generation: int
    state: ReplicaState
    readable: bool
    grpc_address: str
    data_address: str
    copy: bool = False


@dataclass(frozen=True, slots=True)
class NodeBlockView:
    """One replica indexed on a node (a row of ``kvstorectl blocks --node``; ``copy`` as in
    :class:`ReplicaView`)."""

    namespace_id: bytes
    key: bytes
    tier: Tier
    size_bytes: int
    generation: int
    state: ReplicaState
    copy: bool = False


def list_replicas(membership: Membership, namespace_id: bytes,
                  keys: list[bytes]) -> list[list[ReplicaView]]:
    """Every replica of each block the master knows of, in the order of ``keys``.

    Replicas of a holder that has no live node (a retired epoch, a sync still in progress)
    are left out: they are invisible to lookups too. Readable replicas come first, then
    DRAM before SSD, then by node id.

    Args:
        membership: the master's membership (and its index).
        namespace_id: the blocks' namespace.
        keys: block hashes, in the caller's order (duplicates answered twice).

    Returns:
        One list per key (empty: missing cluster-wide).
    """
    index = membership.index
    membership.expire_lapsed()
    out: list[list[ReplicaView]] = []
    for key in keys:
        views = []
        for r in index.replicas(namespace_id, key):
            rec = membership.record_of_holder(r.holder)
            if rec is None:
                continue
            s = rec.spec
            readable = index.is_readable(r.holder) and r.state is ReplicaState.COMMITTED
            views.append(ReplicaView(s.node_id, s.epoch, r.tier, r.size_bytes, r.generation,
                                     r.state, readable, s.grpc_address, s.data_address,
                                     r.copy))
        views.sort(key=lambda v: (not v.readable, int(v.tier), v.node_id))
        out.append(views)
    return out


def _encode_token(namespace_id: bytes, key: bytes, tier: int) -> bytes:
    return (_TOKEN_VERSION + len(namespace_id).to_bytes(2, "big") + namespace_id
            + bytes([tier]) + key)


def _decode_token(token: bytes) -> tuple[bytes, bytes, int]:
    if len(token) < 4 or token[:1] != _TOKEN_VERSION:
        raise InvalidArgument(f"page_token {token[:16].hex()!r}... is not one this master issued")
    n = int.from_bytes(token[1:3], "big")
    if len(token) < 4 + n:
        raise InvalidArgument("page_token is truncated")
    return token[3 : 3 + n], token[4 + n :], token[3 + n]


def list_node_blocks(
    membership: Membership, node_id: str, *, namespace_id: bytes | None = None,
    limit: int = DEFAULT_PAGE_BLOCKS, page_token: bytes = b"",
) -> tuple[list[NodeBlockView], bytes, int, int]:
    """One page of the replicas the master indexes on a node.

    Pages are ordered by (namespace id, key, tier); a page token names the last entry of
    the previous page, so entries added or removed between pages never shift the rest.

    Args:
        membership: the master's membership (and its index).
        node_id: the node (its live epoch).
        namespace_id: only this namespace (None: every namespace).
        limit: entries per page, 1..MAX_PAGE_BLOCKS (0: DEFAULT_PAGE_BLOCKS).
        page_token: empty for the first page, else the previous page's next token.

    Returns:
        ``(entries, next_page_token, node_epoch, node_num_replicas)``; the token is empty
        on the last page.

    Raises:
        NotFound: no live node has this id (the message lists the live ones).
        InvalidArgument: limit out of range, or a page token this master did not issue.
    """
    if limit == 0:
        limit = DEFAULT_PAGE_BLOCKS
    if not 1 <= limit <= MAX_PAGE_BLOCKS:
        raise InvalidArgument(f"limit must be in 1..{MAX_PAGE_BLOCKS}, got {limit}")
    after = _decode_token(page_token) if page_token else None
    rec = membership.node(node_id)
    if rec is None:
        live = [r.spec.node_id for r in membership.nodes()]
        raise NotFound(
            f"no live node {node_id!r} in the cluster; live nodes: {', '.join(live) or 'none'}"
        )
    index = membership.index
    rows = sorted((ns, key, int(tier)) for ns, key, tier in index.holder_keys(rec.holder)
                  if namespace_id is None or ns == namespace_id)
    if after is not None:
        rows = rows[bisect.bisect_right(rows, after):]
    page = rows[:limit]
    entries = []
    for ns, key, tier in page:
        found = next((r for r in index.replicas(ns, key)
                      if r.holder == rec.holder and int(r.tier) == tier), None)
        if found is not None:
            entries.append(NodeBlockView(ns, key, Tier(tier), found.size_bytes,
                                         found.generation, found.state, found.copy))
    token = _encode_token(*page[-1]) if len(rows) > limit else b""
    return entries, token, rec.spec.epoch, index.num_holder_replicas(rec.holder)
