"""KV events for routers: msgspec structs that encode exactly like vLLM's KV events.

vLLM's publisher (``vllm/distributed/kv_events.py``) sends a msgpack ``KVEventBatch`` per
ZeroMQ message; routers (vLLM's own consumers, llm-d's KV-cache indexer, Dynamo's KV router)
decode it with ``msgspec.msgpack.Decoder(KVEventBatch)``. These structs have the same names,
tags, field names, field order and options, so that decoder reads what the master publishes
(tests/e2e/test_kv_events_e2e.py decodes it with vLLM's own classes)::

    KVEventBatch   array  [ts (float s since the Unix epoch), events, data_parallel_rank?]
    BlockStored    map    {"type": "BlockStored", block_hashes, parent_block_hash, token_ids,
                           block_size, lora_id, medium, lora_name, <extensions>}
    BlockRemoved   map    {"type": "BlockRemoved", block_hashes, medium, <extensions>}
    AllBlocksCleared map  {"type": "AllBlocksCleared"}

What kvstored puts in vLLM's fields: ``block_hashes`` are kvstored block keys (bytes, one
or more blocks of one node, tier and namespace); ``parent_block_hash`` None; ``token_ids``
[]; ``block_size`` 0 (the master does not know it); ``medium`` ``"CPU"`` for the DRAM tier
and ``"STORAGE"`` for the SSD tier (vLLM's MEDIUM_CPU / MEDIUM_STORAGE).

Extensions (map fields vLLM's structs do not declare; msgspec skips unknown map fields, so
vLLM's decoder ignores them; omitted when None): ``node_id`` (the holder node), ``tier``
(``"DRAM"`` / ``"SSD"``), ``namespace_id`` (the *stored* namespace id, tenant-scoped as
kvstored/tenancy.py encodes it: :func:`kvstored.tenancy.split_namespace` gives (tenant,
namespace id)).

Pure: no I/O (the publisher is kvstored/master/events.py, the subscriber
kvstored/client/events.py).
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvstored.errors import InvalidArgument
from kvstored.types import Tier

MEDIUM_CPU = "CPU"
"""vLLM's medium of blocks in CPU memory (kvstored's DRAM tier)."""
MEDIUM_STORAGE = "STORAGE"
"""vLLM's medium of blocks on storage (kvstored's SSD tier)."""
END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame of the replay socket's end marker (as vLLM's ZmqEventPublisher)."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A batch of events (vLLM's EventBatch: encoded as an array).

    Attributes:
        ts: when the batch was sealed, float seconds since the Unix epoch.
        events: the events, oldest first.
        data_parallel_rank: vLLM's DP rank of the publisher; None (omitted) for kvstored.
    """

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged event structs (a map with ``"type"`` = the class name)."""


class BlockStored(KVCacheEvent):
    """Blocks became readable on a node's tier (vLLM's BlockStored plus extensions).

    Attributes:
        block_hashes: block keys (bytes), in the order they were indexed.
        parent_block_hash: the key before ``block_hashes[0]`` when known; None here.
        token_ids: [] (the master never sees tokens).
        block_size: tokens per block; 0 when unknown (the master does not know it).
        lora_id / lora_name: None (LoRA identity is inside kvstored's keys).
        medium: ``"CPU"`` (DRAM) or ``"STORAGE"`` (SSD).
        node_id / tier / namespace_id: kvstored extensions (see the module docstring).
    """

    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    node_id: str | None = None
    tier: str | None = None
    namespace_id: bytes | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks stopped being readable on a node's tier (vLLM's BlockRemoved plus extensions).

    Attributes:
        block_hashes: block keys (bytes).
        medium: ``"CPU"`` (DRAM) or ``"STORAGE"`` (SSD).
        node_id / tier / namespace_id: kvstored extensions (see the module docstring).
    """

    block_hashes: list[bytes | int]
    medium: str | None
    node_id: str | None = None
    tier: str | None = None
    namespace_id: bytes | None = None


class AllBlocksCleared(KVCacheEvent):
    """Forget every block: a new master term starts (its index is rebuilt from the nodes'
    inventories, which follow as BlockStored)."""


class KVEventBatch(EventBatch):
    """vLLM's KVEventBatch: ``events`` are BlockStored / BlockRemoved / AllBlocksCleared."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def medium_of(tier: Tier) -> str:
    """vLLM's medium of a kvstored tier: ``"CPU"`` for DRAM, ``"STORAGE"`` for SSD.

    Raises:
        InvalidArgument: a tier that is neither.
    """
    if tier == Tier.DRAM:
        return MEDIUM_CPU
    if tier == Tier.SSD:
        return MEDIUM_STORAGE
    raise InvalidArgument(f"no KV-event medium for tier {tier!r} (expected DRAM or SSD)")


def stored_event(keys: list[bytes], *, node_id: str, tier: Tier, namespace_id: bytes,
                 block_size: int = 0) -> BlockStored:
    """A BlockStored of ``keys`` on ``node_id``'s ``tier`` in stored namespace ``namespace_id``."""
    return BlockStored(block_hashes=list(keys), parent_block_hash=None, token_ids=[],
                       block_size=block_size, lora_id=None, medium=medium_of(tier),
                       lora_name=None, node_id=node_id, tier=tier.name,
                       namespace_id=namespace_id)


def removed_event(keys: list[bytes], *, node_id: str, tier: Tier,
                  namespace_id: bytes) -> BlockRemoved:
    """A BlockRemoved of ``keys`` on ``node_id``'s ``tier`` in stored namespace ``namespace_id``."""
    return BlockRemoved(block_hashes=list(keys), medium=medium_of(tier), node_id=node_id,
                        tier=tier.name, namespace_id=namespace_id)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload of one batch (what goes in the third frame)."""
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode one payload.

    Raises:
        InvalidArgument: the payload is not a msgpack KVEventBatch (the decoder's reason
            and the payload's length are in the message).
    """
    try:
        return _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise InvalidArgument(
            f"not a KV event batch ({len(payload)} bytes): {exc}") from None


def event_to_dict(event: KVEvent) -> dict[str, Any]:
    """One event as JSON-ready dict: ``type``, keys as hex, extensions when set."""
    out: dict[str, Any] = {"type": type(event).__name__}
    if isinstance(event, AllBlocksCleared):
        return out
    out["block_hashes"] = [h.hex() if isinstance(h, bytes) else h for h in event.block_hashes]
    out["medium"] = event.medium
    out["node_id"] = event.node_id
    out["tier"] = event.tier
    out["namespace_id"] = event.namespace_id.hex() if event.namespace_id is not None else None
    return out
