"""Value types of the scheduler: instances, requests, decisions, statuses, the prefix index.

Frozen values, enums and the :class:`PrefixIndex` port only (no scheduler state), shared by the
core, its admission strategies, the gRPC service and the trace replay.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

Clock = Callable[[], float]
"""Returns the current time in seconds (monotonic)."""


class Role(StrEnum):
    """What an instance does."""

    PREFILL = "prefill"
    DECODE = "decode"


class RejectReason(StrEnum):
    """Why a request was refused."""

    TTFT_SLO = "ttft_slo"
    """At arrival: the predicted TTFT misses the TTFT SLO."""
    TBT_SLO = "tbt_slo"
    """At arrival: the decode load (now or predicted) misses the TBT SLO or KV capacity."""
    DECODE_OVERLOADED = "decode_overloaded"
    """After prefill: no decode instance can take it (the prefill was wasted)."""
    NO_INSTANCE = "no_instance"
    """No live prefill or decode instance is registered."""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """A prefill or decode engine instance as it registers.

    Attributes:
        instance_id: unique name of the instance.
        node_id: the store node on its host (whose cache is "local" to it).
        role: prefill or decode.
        relative_speed: speed relative to the cost profile (2.0 = twice as fast), > 0.
        max_running_requests: decode batch limit; 0 = the profile's.
        kv_capacity_tokens: decode KV capacity; 0 = the profile's.
    """

    instance_id: str
    node_id: str
    role: Role
    relative_speed: float = 1.0
    max_running_requests: int = 0
    kv_capacity_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ScheduleRequest:
    """One inference request to place.

    Attributes:
        request_id: unique while the request is in flight.
        block_keys: the prompt's chained block hashes (any hashable: bytes on the wire, ints in
            traces), one per ``block_tokens`` tokens.
        input_tokens: prompt length, > 0.
        expected_output_tokens: expected output length; 0 = the configured default.
        ttft_slo_s: TTFT objective, seconds; None = the configured default.
        tbt_slo_s: TBT objective, seconds; None = the configured default.
    """

    request_id: str
    block_keys: Sequence[Hashable]
    input_tokens: int
    expected_output_tokens: int = 0
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to :meth:`Scheduler.schedule`.

    For a rejection, the instance fields name the instances that would have been used and the
    ``predicted_*`` fields the values that caused it. Times are seconds; ``prefill_finish_s`` is
    on the scheduler's clock.

    Attributes:
        request_id: the request.
        admitted: True when placed.
        reason: why it was rejected, or None.
        prefill_instance_id / decode_instance_id: the chosen instances (None: none available).
        num_blocks: blocks in the request.
        reused_blocks: leading blocks whose KV is reused (local + fetched).
        local_blocks: of those, blocks already on the prefill instance's node.
        fetched_blocks: of those, blocks fetched from ``prefix_node_id``.
        fetched_ssd_blocks: of the fetched blocks, how many come from that node's SSD.
        prefix_node_id: the node holding the longest cached prefix (the fetch source), or None.
        replicate_keys: keys the prefill node should copy in (the planned fetch); the copy makes
            hot prefixes spread to where they are used.
        predicted_queue_s / predicted_transfer_s / predicted_prefill_s: parts of the TTFT.
        predicted_ttft_s: queue + transfer + prefill.
        predicted_tbt_s: step time of the decode instance once this request joins.
        predicted_decode_load: its decode load then (see module doc).
        prefill_finish_s: when the prefill is predicted to end (clock seconds).
    """

    request_id: str
    admitted: bool
    reason: RejectReason | None
    prefill_instance_id: str | None
    decode_instance_id: str | None
    num_blocks: int = 0
    reused_blocks: int = 0
    local_blocks: int = 0
    fetched_blocks: int = 0
    fetched_ssd_blocks: int = 0
    prefix_node_id: str | None = None
    replicate_keys: tuple[Hashable, ...] = ()
    predicted_queue_s: float = 0.0
    predicted_transfer_s: float = 0.0
    predicted_prefill_s: float = 0.0
    predicted_ttft_s: float = 0.0
    predicted_tbt_s: float = 0.0
    predicted_decode_load: float = 0.0
    prefill_finish_s: float = 0.0


@dataclass(frozen=True, slots=True)
class HandoffDecision:
    """The answer to :meth:`Scheduler.start_decode` (the decode side, after prefill).

    Attributes:
        request_id: the request.
        admitted: True when a decode instance takes it.
        decode_instance_id: that instance (the planned one when it fits), or None.
        reason: ``DECODE_OVERLOADED`` when refused (the prefill was wasted), else None.
        decode_load: load of the instance with this request (the least loaded when refused).
        predicted_ttft_s: the TTFT predicted when the request was scheduled, seconds.
    """

    request_id: str
    admitted: bool
    decode_instance_id: str | None
    reason: RejectReason | None
    decode_load: float
    predicted_ttft_s: float = 0.0


class PrefixIndex(Protocol):
    """Where the leading blocks of a prompt are cached.

    ``match_prefix(keys, node_ids)`` returns, for nodes that hold a prefix, ``node_id ->
    (num_blocks, num_ssd_blocks)``: how many leading blocks of ``keys`` that node holds, and how
    many of those (the tail, which the store demotes first) are only on its SSD. Nodes not in
    the result hold none. Must not change recency or pin anything.
    """

    def match_prefix(
        self, keys: Sequence[Hashable], node_ids: Sequence[str]
    ) -> Mapping[str, tuple[int, int]]:
        """``node_id -> (num_blocks, num_ssd_blocks)`` for the nodes of ``node_ids`` that hold
        a leading run of ``keys`` (contract in the class docstring)."""


class NoPrefixIndex:
    """A :class:`PrefixIndex` that knows no cached blocks (every prompt is computed in full)."""

    def match_prefix(
        self, keys: Sequence[Hashable], node_ids: Sequence[str]
    ) -> Mapping[str, tuple[int, int]]:
        return {}


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """Admin view of one instance (for ``kvstorectl scheduler`` and metrics).

    Attributes:
        spec: how it registered.
        load: prefill: queue time / TTFT SLO; decode: decode load (see module doc).
        queued_prefill_s: prefill: predicted seconds of queued work.
        num_running: decode: running requests; prefill: 0.
        num_context_tokens: decode: KV tokens held.
        num_incoming: decode: admitted requests still in prefill and planned here.
        step_s: decode: current step time (reported or predicted), seconds.
        last_seen_age_s: seconds since it registered or reported.
    """

    spec: InstanceSpec
    load: float
    queued_prefill_s: float = 0.0
    num_running: int = 0
    num_context_tokens: int = 0
    num_incoming: int = 0
    step_s: float = 0.0
    last_seen_age_s: float = 0.0
