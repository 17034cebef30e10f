"""Value types of the master: replica state, replicas and lookup answers of the block index;
what nodes report (specs, tier usage, block refs and events) and are told (actions, health);
placement's policies and answers.

Frozen values and enums only: no component state lives here, so every master module (and a
fresh :class:`~kvstored.master.state.MasterState` of a new term) shares them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum

import numpy as np

from kvstored.types import Tier

MAX_REPLICAS = 8
"""Most replicas of one block (a put's ``replicas``, a block's replication factor)."""
MAX_SIZE_BYTES = (1 << 32) - 1
"""Largest replica size the packed ``u4`` size column holds (4 GiB - 1)."""


class ReplicaState(IntEnum):
    """State of a replica (mirrors ``kvstored.v1.ReplicaState``)."""

    WRITING = 1
    COMMITTED = 2


COPY_BIT = 0x80
"""Set in a row's ``state`` byte (with COMMITTED) when the replica is a remote-fill copy of
another node's block (``BlockRef.copy``): packed there, so a replica stays 34 bytes."""
STATE_MASK = 0x7F
"""The :class:`ReplicaState` bits of a row's ``state`` byte."""


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica of one block, as the index knows it.

    Attributes:
        holder: the holder (node incarnation) id of the membership.
        tier: DRAM or SSD on that node.
        size_bytes: the block's size.
        generation: the write that created it (placement) or the event that reported it.
        state: WRITING (placed, not committed) or COMMITTED.
        copy: the holder reported it as a remote-fill copy of another node's block (a
            duplicate it evicts first): never counted as the block's original.
    """

    holder: int
    tier: Tier
    size_bytes: int
    generation: int
    state: ReplicaState
    copy: bool = False


@dataclass(frozen=True, slots=True)
class Alternates:
    """The other readable replicas of each block a lookup answered (read fallback), ranked
    best first, on distinct holders, none on the block's best holder; flat columns.

    Attributes:
        counts: ``(num_blocks,)`` int64, alternates of each answered block; block i's are
            the ``counts[i]`` entries after those of blocks 0..i-1.
        holders: ``(sum(counts),)`` int64, each alternate's holder.
        tiers: uint8, its tier (1 DRAM, 2 SSD).
        sizes: uint32, its size in bytes.
        generations: uint64, its generation.
    """

    counts: np.ndarray
    holders: np.ndarray
    tiers: np.ndarray
    sizes: np.ndarray
    generations: np.ndarray


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Answer of :meth:`BlockIndex.lookup_prefix`: the best replica of each leading block,
    as columns (no Python object per block on the hot path).

    Attributes:
        holders: ``(num_blocks,)`` int64, the holder of each block's best replica.
        tiers: ``(num_blocks,)`` uint8, its tier (1 DRAM, 2 SSD).
        sizes: ``(num_blocks,)`` uint32, its size in bytes.
        generations: ``(num_blocks,)`` uint64, its generation.
        alternates: the other replicas of each block when the lookup asked for them
            (``max_alternates``), else None.
    """

    holders: np.ndarray
    tiers: np.ndarray
    sizes: np.ndarray
    generations: np.ndarray
    alternates: Alternates | None = None

    def __len__(self) -> int:
        return len(self.holders)

    def __iter__(self) -> Iterator[Replica]:
        """Per-block :class:`Replica` objects (convenience for tests and admin views)."""
        for h, t, s, g in zip(self.holders.tolist(), self.tiers.tolist(), self.sizes.tolist(),
                              self.generations.tolist(), strict=True):
            yield Replica(h, Tier(t), s, g, ReplicaState.COMMITTED)


EMPTY_HIT = PrefixHit(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint8),
                       np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.uint64))
"""The answer for a prefix whose first block is missing."""


class NodeAction(IntEnum):
    """What a node must do next (mirrors ``kvstored.v1.NodeAction``)."""

    NONE = 0
    REREGISTER = 1
    RESYNC = 2


class NodeHealth(IntEnum):
    """Mirrors ``kvstored.v1.NodeHealth``."""

    HEALTHY = 1
    UNHEALTHY = 2
    SYNCING = 3


class EventKind(IntEnum):
    """Mirrors ``kvstored.v1.BlockEventKind``."""

    ADDED = 1
    REMOVED = 2


@dataclass(frozen=True, slots=True)
class TierUsage:
    """Capacity and usage of one tier of a node, bytes."""

    tier: Tier
    capacity_bytes: int
    used_bytes: int = 0
    num_blocks: int = 0
    spare_bytes: int = 0
    """Of ``used_bytes``, what the node can free without dropping a block from the pool
    (DRAM: remote-fill copies and blocks also on its SSD; ``TieredStore.spare_bytes``)."""

    @property
    def free_bytes(self) -> int:
        """Capacity not used (never negative)."""
        return max(0, self.capacity_bytes - self.used_bytes)

    @property
    def held_bytes(self) -> int:
        """Bytes of blocks the pool would lose without this tier: ``used_bytes`` less
        ``spare_bytes`` (never negative; what placement's room is measured from)."""
        return max(0, self.used_bytes - min(self.spare_bytes, self.used_bytes))


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """What a node tells the master when it registers.

    Attributes:
        node_id: unique name of the node (1-128 characters).
        epoch: the daemon start (ns); larger for every restart.
        grpc_address: ``host:port`` of its gRPC API.
        data_address: ``host:port`` of its data plane.
        tiers: capacity (and usage) per tier.
        transports: data-plane transports it speaks, e.g. ``("tcp",)``.
        zone: its failure domain (``kvstored node --zone``; "" = none declared): replicas
            of one block go to distinct zones first.
    """

    node_id: str
    epoch: int
    grpc_address: str
    data_address: str
    tiers: tuple[TierUsage, ...]
    transports: tuple[str, ...] = ("tcp",)
    zone: str = ""


@dataclass(frozen=True, slots=True)
class BlockRef:
    """One block on a node: namespace id, key, tier, size and the holder's generation of
    the replica (0 = the node does not know it: the master issues one); ``copy``: the
    replica is a remote-fill copy of another node's block (an ADDED event of an indexed
    replica sets or clears it); ``replicas``: the block's wanted replication factor as the
    holder knows it (0 = unknown)."""

    namespace_id: bytes
    key: bytes
    tier: Tier
    size_bytes: int
    generation: int = 0
    copy: bool = False
    replicas: int = 0


@dataclass(frozen=True, slots=True)
class BlockEvent:
    """One ordered change on a node (``seq`` 1, 2, 3... per epoch)."""

    seq: int
    kind: EventKind
    block: BlockRef


@dataclass(frozen=True, slots=True)
class BlockColumns:
    """Block refs as columns, one entry per block (an inventory chunk or the blocks of a
    ReportEvents batch as the master applies them: no object per block).

    ``tiers``: int tiers (1 DRAM, 2 SSD); ``sizes``: bytes; ``generations``: the holder's
    (uint64, 0 = unknown); ``copies``: remote-fill copies (bool); ``replicas``: wanted
    replication factors (0 = unknown). Arrays int64 unless said, one entry per block."""

    namespace_ids: list[bytes]
    keys: list[bytes]
    tiers: np.ndarray
    sizes: np.ndarray
    generations: np.ndarray
    copies: np.ndarray
    replicas: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def of(cls, blocks: Sequence[BlockRef]) -> BlockColumns:
        """The columns of some :class:`BlockRef` values."""
        return cls([b.namespace_id for b in blocks], [b.key for b in blocks],
                   np.array([int(b.tier) for b in blocks], dtype=np.int64),
                   np.array([b.size_bytes for b in blocks], dtype=np.int64),
                   np.array([b.generation for b in blocks], dtype=np.uint64),
                   np.array([b.copy for b in blocks], dtype=np.bool_),
                   np.array([b.replicas for b in blocks], dtype=np.int64))

    def by_namespace(self) -> dict[bytes, np.ndarray]:
        """Positions (int64, in order) of the blocks of each namespace, in first-seen order."""
        nss = self.namespace_ids
        if nss and nss.count(nss[0]) == len(nss):  # (the common case: one namespace)
            return {nss[0]: np.arange(len(nss), dtype=np.int64)}
        groups: dict[bytes, list[int]] = {}
        for i, ns in enumerate(nss):
            groups.setdefault(ns, []).append(i)
        return {ns: np.asarray(ix, dtype=np.int64) for ns, ix in groups.items()}


@dataclass(frozen=True, slots=True)
class EventColumns:
    """A node's ordered events as columns, one entry per event (a ReportEvents batch as
    the master applies it: master/membership.py); ``kinds``: :class:`EventKind` values."""

    seqs: list[int]
    kinds: list[int]
    blocks: BlockColumns
    consecutive: bool | None = None
    """Each seq is the one before + 1, as the reader found it (None: not known; the master
    checks)."""
    distinct: bool | None = None
    """No (namespace_id, key) pair twice, as the reader found it (None: not known)."""
    kinds_checked: bool = False
    """Every kind is ADDED or REMOVED, as the reader checked (False: the master checks)."""

    def __len__(self) -> int:
        return len(self.seqs)

    @classmethod
    def of(cls, events: Sequence[BlockEvent]) -> EventColumns:
        """The columns of some :class:`BlockEvent` values."""
        return cls([e.seq for e in events], [int(e.kind) for e in events],
                   BlockColumns.of([e.block for e in events]))


@dataclass(frozen=True, slots=True)
class RegisterOutcome:
    """Answer to a registration."""

    lease_s: float
    superseded_epoch: bool


class PlacementPolicy(StrEnum):
    """How ``start_put`` orders candidate nodes."""

    LOCAL_FIRST = "local-first"
    MOST_FREE = "most-free"
    RANDOM = "random"


@dataclass(frozen=True, slots=True)
class PlacedReplica:
    """Where one replica of a write goes."""

    node_id: str
    epoch: int
    holder: int
    tier: Tier
    data_address: str


@dataclass(frozen=True, slots=True)
class PutStartOutcome:
    """Answer to ``start_put``.

    Attributes:
        exists: the block is already committed somewhere readable (nothing to write).
        generation: the write's generation (0 when ``exists``).
        replicas: where to write, in policy order (empty when ``exists``).
        num_held: a top-up (``Placement.start_replicas``): the holders the block had
            before this write, the writer's node included; else 0.
    """

    exists: bool
    generation: int
    replicas: tuple[PlacedReplica, ...]
    num_held: int = 0
