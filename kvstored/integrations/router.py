"""A small KV-aware router: follows KV events and picks the node with the longest cached prefix.

It keeps, per node, the set of block keys that node holds (any tier), from a stream of
BlockStored / BlockRemoved / AllBlocksCleared events, and answers "which node holds the
longest leading run of these block hashes" as llm-d's and Dynamo's routers do (without their
load terms). The events may be kvstored's structs (kvstored/kv_events.py) or any classes
with the same names and fields, such as vLLM's own (``vllm.distributed.kv_events``)
extended with kvstored's ``node_id`` / ``tier`` / ``namespace_id`` fields: events are
matched by their msgspec tag (or class name) and read by attribute, so this module imports no engine. An event
without a ``node_id`` (a plain vLLM publisher's) is credited to ``default_node``.

Pure (no I/O): feed it batches from :class:`kvstored.client.events.EventSubscriber`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def _kind(event: Any) -> str:
    """A msgspec struct's tag (what the wire says; a subclass adding fields keeps it), else
    the class name."""
    tag = getattr(getattr(type(event), "__struct_config__", None), "tag", None)
    return tag if isinstance(tag, str) else type(event).__name__


@dataclass(frozen=True, slots=True)
class RoutePick:
    """Answer of :meth:`PrefixRouter.pick`.

    Attributes:
        node_id: the node with the longest cached prefix (None: no node holds block 0).
        num_blocks: how many leading blocks it holds.
    """

    node_id: str | None
    num_blocks: int


class PrefixRouter:
    """Per-node block sets built from KV events (see the module docstring).

    Args:
        default_node: the node credited with events that carry no ``node_id``.
        namespace_id: only follow blocks of this stored namespace id (None = every one;
            keys of different namespaces never collide, as they are hashed from the
            namespace).
    """

    def __init__(self, *, default_node: str = "", namespace_id: bytes | None = None) -> None:
        self.default_node = default_node
        self.namespace_id = namespace_id
        # node -> key -> tiers (a key counts while the node holds it on some tier)
        self._blocks: dict[str, dict[bytes, set[str]]] = {}
        self.num_events = 0

    def nodes(self) -> dict[str, int]:
        """Blocks known per node."""
        return {n: len(keys) for n, keys in self._blocks.items()}

    def apply_batch(self, batch: Any) -> None:
        """Apply every event of one decoded KVEventBatch (anything with ``.events``)."""
        for event in batch.events:
            self.apply(event)

    def apply(self, event: Any) -> None:
        """Apply one event (matched by its msgspec tag, else its class name: BlockStored,
        BlockRemoved, AllBlocksCleared; anything else is ignored)."""
        kind = _kind(event)
        self.num_events += 1
        if kind == "AllBlocksCleared":
            self._blocks.clear()
            return
        if kind not in ("BlockStored", "BlockRemoved"):
            return
        ns = getattr(event, "namespace_id", None)
        if self.namespace_id is not None and ns is not None and ns != self.namespace_id:
            return
        node = getattr(event, "node_id", None) or self.default_node
        tier = getattr(event, "tier", None) or getattr(event, "medium", None) or ""
        held = self._blocks.setdefault(node, {})
        for h in event.block_hashes:
            key = h if isinstance(h, bytes) else int(h).to_bytes(8, "big", signed=True)
            if kind == "BlockStored":
                held.setdefault(key, set()).add(tier)
            else:
                tiers = held.get(key)
                if tiers is not None:
                    tiers.discard(tier)
                    if not tiers:
                        del held[key]

    def prefix_len(self, node_id: str, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` ``node_id`` holds."""
        held = self._blocks.get(node_id, {})
        n = 0
        for k in keys:
            if k not in held:
                break
            n += 1
        return n

    def pick(self, keys: Sequence[bytes]) -> RoutePick:
        """The node holding the longest leading run of ``keys`` (ties: the smallest node
        id, so the answer is deterministic); ``RoutePick(None, 0)`` when none holds the
        first."""
        best: RoutePick = RoutePick(None, 0)
        for node in sorted(self._blocks):
            n = self.prefix_len(node, keys)
            if n > best.num_blocks:
                best = RoutePick(node, n)
        return best
