"""The scheduler core: instance choice and admission. Pure Python: no gRPC, no I/O, no threads.

Time comes from an injected clock (a callable returning seconds), so the gRPC service (wall
clock) and the trace replay (simulated clock) drive exactly this code.

Life of a request::

    schedule(req) ──rejected (ttft_slo | tbt_slo | no_instance)──► done
        │ admitted: queued on a prefill instance, planned onto a decode instance ("incoming")
        ▼
    start_decode(id) after its prefill ──rejected (decode_overloaded: prefill wasted)──► done
        │ admitted: running on a decode instance
        ▼
    finish_request(id) ──► done (its decode time feeds the uniform-decode-time EWMA)

Per prefill instance ``i`` (Algorithm 1 of FAST'25, "Conductor")::

    TTFT_i = queue_i + min over reuse options k of (transfer_i(k) + prefill(n, cached(k)))

where the options are: recompute everything (k = 0), reuse the prefix on ``i``'s own node, and
(kvcache-centric only) fetch the longest prefix held by any node. The policy picks ``i``:
random, shortest queue (load-balancing), or minimum TTFT (cache-aware: own node only;
kvcache-centric: all options). The decode instance is the one with the lowest decode load as
the admission mode sees it (now, or when this request's prefill ends).

Decode load of an instance = max(TBT(b, c) / TBT SLO, c / KV capacity, b / max batch), for the
``b`` requests and ``c`` context tokens it runs (see :class:`CostModel`).

Source: Mooncake arXiv 2407.00079 §6-7 and FAST'25 §5 (Algorithm 1, early rejection,
prediction-based early rejection). The ``predicted-length``, ``predicted-adaptive`` and
``predicted-quantile`` modes are ours (the last one: kvstored/scheduler/lengths.py).

Concurrency: not thread-safe; call from one thread or one event loop.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np
from sortedcontainers import SortedList

from kvstored.errors import InvalidArgument, NotFound
from kvstored.scheduler.config import AdmissionMode, Policy, SchedulerConfig
from kvstored.scheduler.costmodel import CostModel
from kvstored.scheduler.lengths import OutputLengthModel, pick_decode_quantile

_EARLY_MODES = frozenset({
    AdmissionMode.EARLY, AdmissionMode.PREDICTED, AdmissionMode.PREDICTED_LENGTH,
    AdmissionMode.PREDICTED_ADAPTIVE, AdmissionMode.PREDICTED_QUANTILE,
})
_PREDICTED_MODES = frozenset({
    AdmissionMode.PREDICTED, AdmissionMode.PREDICTED_LENGTH, AdmissionMode.PREDICTED_ADAPTIVE,
    AdmissionMode.PREDICTED_QUANTILE,
})


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
    ) -> Mapping[str, tuple[int, int]]: ...


class NoPrefixIndex:
    """A :class:`PrefixIndex` that knows no cached blocks (every prompt is computed in full)."""

    def match_prefix(
        self, keys: Sequence[Hashable], node_ids: Sequence[str]
    ) -> Mapping[str, tuple[int, int]]:
        return {}


@dataclass(slots=True)
class _Prefill:
    spec: InstanceSpec
    busy_until_s: float = 0.0
    last_seen_s: float = 0.0
    num_scheduled: int = 0


@dataclass(slots=True)
class _Dec:
    input_tokens: int
    expected_tokens: int
    start_s: float  # incoming: predicted prefill finish; running: decode start
    slot: int  # row in the _DecodeTable


class _DecodeTable:
    """Decode-side requests (incoming and running) of every decode instance, as numpy columns.

    Lets the predicted modes count, for all instances at once, the requests that will be
    decoding at a future time. Free rows are reused lowest first so the used prefix stays short.
    """

    __slots__ = ("inst", "start", "inp", "exp", "vjoin", "run", "act", "free", "hi")

    def __init__(self, capacity: int = 256) -> None:
        self.inst = np.zeros(capacity, np.int64)
        self.start = np.zeros(capacity)  # incoming: predicted prefill end; running: decode start
        self.inp = np.zeros(capacity)
        self.exp = np.zeros(capacity)
        self.vjoin = np.zeros(capacity)  # running: the instance's token clock when it joined
        self.run = np.zeros(capacity, bool)
        self.act = np.zeros(capacity, bool)
        self.free: list[int] = list(range(capacity))  # a heap (sorted list is a valid heap)
        self.hi = 0

    def add(
        self, inst: int, start_s: float, input_tokens: int, expected_tokens: int,
        vjoin: float | None = None,
    ) -> int:
        """Add a row: incoming (``vjoin`` None) or running since ``start_s``; returns its slot."""
        if not self.free:
            cap = len(self.act)
            for name in ("inst", "start", "inp", "exp", "vjoin", "run", "act"):
                old = getattr(self, name)
                new = np.zeros(2 * cap, old.dtype)
                new[:cap] = old
                setattr(self, name, new)
            self.free = list(range(cap, 2 * cap))
        slot = heapq.heappop(self.free)
        self.inst[slot] = inst
        self.start[slot] = start_s
        self.inp[slot] = input_tokens
        self.exp[slot] = expected_tokens
        self.run[slot] = vjoin is not None
        self.vjoin[slot] = 0.0 if vjoin is None else vjoin
        self.act[slot] = True
        if slot >= self.hi:
            self.hi = slot + 1
        return slot

    def remove(self, slot: int) -> None:
        self.act[slot] = False
        heapq.heappush(self.free, slot)

    def at(
        self, t: float, now: float, inv_step: np.ndarray, vtok_now: np.ndarray,
        uniform_s: float | None, num_inst: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per instance index: (requests decoding at time t, their context tokens).

        Tokens generated by t: for a running request, those generated so far (the instance's
        token clock now minus at its join) plus ``(t - now) * inv_step``; for an incoming one,
        ``(t - start) * inv_step``. A request decodes from ``start`` for ``uniform_s`` seconds
        or, when that is None, until it generated its expected tokens.
        """
        h = self.hi
        inst = self.inst[:h]
        el = t - self.start[:h]
        inv = inv_step[inst]
        gen = np.where(self.run[:h], vtok_now[inst] - self.vjoin[:h] + (t - now) * inv, el * inv)
        if uniform_s is None:
            m = self.act[:h] & (el >= 0) & (gen < self.exp[:h])
            ctxv = self.inp[:h] + gen
        else:
            m = self.act[:h] & (el >= 0) & (el < uniform_s)
            ctxv = self.inp[:h] + np.minimum(gen, uniform_s * inv)
        im = inst[m]
        n = np.bincount(im, minlength=num_inst)
        ctx = np.bincount(im, weights=ctxv[m], minlength=num_inst)
        return n, ctx


@dataclass(slots=True)
class _Decode:
    spec: InstanceSpec
    kv_capacity_tokens: int
    max_batch: int
    idx: int  # column index in the _DecodeTable
    running: dict[str, _Dec] = field(default_factory=dict)
    incoming: dict[str, _Dec] = field(default_factory=dict)
    incoming_tokens: int = 0  # sum of input_tokens over incoming
    # last engine report (num_running, context_tokens, step_s) and changes since then
    reported: tuple[int, float, float] | None = None
    delta_n: int = 0
    delta_ctx: float = 0.0
    last_seen_s: float = 0.0
    # token clock: tokens each running request has generated = vtok(now) - its vjoin
    vtok: float = 0.0
    vtok_t: float = 0.0
    vtok_step: float = 1.0


@dataclass(slots=True)
class _Pending:
    request: ScheduleRequest
    prefill_id: str
    decode_id: str
    arrival_s: float
    predicted_ttft_s: float
    expected_tokens: int
    tbt_slo_s: float
    rec: _Dec
    predicted_load: float  # the planned instance's predicted load at handoff, with this request


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


class Scheduler:
    """SLO-aware placement and admission of requests onto prefill and decode instances.

    Args:
        config: policy, admission mode, SLO defaults and tunables.
        cost_model: predicted durations.
        clock: seconds, monotonic; the simulator passes its own.
        prefix_index: where prompts' prefixes are cached (default: nowhere).

    Not thread-safe.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        cost_model: CostModel,
        clock: Clock,
        prefix_index: PrefixIndex | None = None,
    ) -> None:
        self.config = config
        self.cost = cost_model
        self.clock = clock
        self.prefix_index: PrefixIndex = prefix_index or NoPrefixIndex()
        self.policy = config.policy
        self.admission = config.admission
        self._rng = random.Random(config.seed)
        self._prefills: dict[str, _Prefill] = {}
        self._decodes: dict[str, _Decode] = {}
        self._pending: dict[str, _Pending] = {}
        self._running: dict[str, tuple[str, _Dec]] = {}
        self._table = _DecodeTable()
        self._num_decode_idx = 0
        self.uniform_decode_s = config.initial_decode_s
        # predicted-adaptive: recent (measured - predicted) decode loads at handoff
        self._errors: deque[float] = deque(maxlen=config.error_window)
        self._errors_sorted = SortedList()
        # predicted-quantile: output-length distributions (rows keyed by _DecodeTable slot)
        self.lengths = OutputLengthModel(config.default_output_tokens,
                                         length_sigma=config.length_sigma)
        self.num_admitted = 0
        self.num_rejected: dict[RejectReason, int] = {r: 0 for r in RejectReason}
        self.num_completed = 0

    # ---- membership ------------------------------------------------------------------
    def register_instance(self, spec: InstanceSpec) -> None:
        """Add an instance, or update one that registers again (its load state is kept).

        Raises:
            InvalidArgument: empty id or node, speed not > 0, negative capacities, or the id is
                registered with the other role.
        """
        if not spec.instance_id or not spec.node_id:
            raise InvalidArgument(
                f"instance_id and node_id must be non-empty, got {spec.instance_id!r}, "
                f"{spec.node_id!r}"
            )
        if not spec.relative_speed > 0:
            raise InvalidArgument(f"relative_speed must be > 0, got {spec.relative_speed}")
        if spec.max_running_requests < 0 or spec.kv_capacity_tokens < 0:
            raise InvalidArgument("max_running_requests and kv_capacity_tokens must be >= 0")
        now = self.clock()
        other = self._decodes if spec.role is Role.PREFILL else self._prefills
        if spec.instance_id in other:
            raise InvalidArgument(
                f"instance {spec.instance_id!r} is already registered with the other role; "
                "unregister it first"
            )
        if spec.role is Role.PREFILL:
            old = self._prefills.get(spec.instance_id)
            if old is None:
                self._prefills[spec.instance_id] = _Prefill(spec, busy_until_s=now, last_seen_s=now)
            else:
                old.spec, old.last_seen_s = spec, now
        else:
            d = self.cost.profile.decode
            kv = spec.kv_capacity_tokens or d.kv_capacity_tokens
            mb = spec.max_running_requests or d.max_batch_requests
            olddec = self._decodes.get(spec.instance_id)
            if olddec is None:
                self._decodes[spec.instance_id] = _Decode(
                    spec, kv, mb, self._num_decode_idx, last_seen_s=now, vtok_t=now,
                    vtok_step=self.cost.tbt_s(0, 0) / spec.relative_speed,
                )
                self._num_decode_idx += 1
            else:
                olddec.spec, olddec.kv_capacity_tokens, olddec.max_batch = spec, kv, mb
                olddec.last_seen_s = now

    def unregister_instance(self, instance_id: str) -> None:
        """Remove an instance. Requests planned or running on it stay tracked until finished.

        Raises:
            NotFound: no such instance.
        """
        if self._prefills.pop(instance_id, None) is None and \
                self._decodes.pop(instance_id, None) is None:
            raise NotFound(f"no instance {instance_id!r} is registered")

    def instance_ids(self, role: Role) -> list[str]:
        """Registered instance ids of one role, in registration order."""
        return list(self._prefills if role is Role.PREFILL else self._decodes)

    def report_prefill_load(self, instance_id: str, queued_s: float) -> None:
        """A prefill instance reports how much work it has queued (including the running one).

        Replaces the scheduler's own estimate (the sum of what it scheduled there).

        Raises:
            NotFound: no such prefill instance.
            InvalidArgument: ``queued_s`` < 0.
        """
        p = self._prefills.get(instance_id)
        if p is None:
            raise NotFound(f"no prefill instance {instance_id!r} is registered")
        if queued_s < 0:
            raise InvalidArgument(f"queued_s must be >= 0, got {queued_s}")
        now = self.clock()
        p.busy_until_s = now + queued_s
        p.last_seen_s = now

    def report_decode_load(
        self, instance_id: str, num_running: int, context_tokens: float, step_s: float = 0.0
    ) -> None:
        """A decode instance reports its batch: running requests, KV tokens, step time.

        Until the next report, requests the scheduler admits or finishes there adjust it.

        Raises:
            NotFound: no such decode instance.
            InvalidArgument: a negative value.
        """
        d = self._decodes.get(instance_id)
        if d is None:
            raise NotFound(f"no decode instance {instance_id!r} is registered")
        if num_running < 0 or context_tokens < 0 or step_s < 0:
            raise InvalidArgument(
                f"load values must be >= 0, got num_running={num_running}, "
                f"context_tokens={context_tokens}, step_s={step_s}"
            )
        now = self.clock()
        self._advance_vtok(d, now)
        d.reported = (num_running, context_tokens, step_s)
        d.delta_n = 0
        d.delta_ctx = 0.0
        d.last_seen_s = now
        d.vtok_step = self._decode_now(d, now)[2]

    @staticmethod
    def _vtok_at(d: _Decode, now: float) -> float:
        return d.vtok + (now - d.vtok_t) / d.vtok_step

    def _advance_vtok(self, d: _Decode, now: float) -> None:
        """Run the token clock up to now at the step time that held since the last change."""
        d.vtok = self._vtok_at(d, now)
        d.vtok_t = now

    def touch_instance(self, instance_id: str) -> None:
        """Mark an instance as alive (a load report without values).

        Raises:
            NotFound: no such instance.
        """
        inst = self._prefills.get(instance_id) or self._decodes.get(instance_id)
        if inst is None:
            raise NotFound(f"no instance {instance_id!r} is registered")
        inst.last_seen_s = self.clock()

    # ---- state estimates -------------------------------------------------------------
    def _is_live(self, last_seen_s: float, now: float) -> bool:
        ttl = self.config.instance_ttl_s
        return ttl is None or now - last_seen_s <= ttl

    def _decode_now(self, d: _Decode, now: float) -> tuple[int, float, float]:
        """(num_running, context_tokens, step_s) of a decode instance now."""
        speed = d.spec.relative_speed
        if d.reported is not None:
            n0, c0, s0 = d.reported
            n = n0 + d.delta_n
            ctx = max(0.0, c0 + d.delta_ctx)
            step = s0 if s0 > 0 and d.delta_n == 0 else self.cost.tbt_s(n, ctx) / speed
            return n, ctx, step
        n = len(d.running)
        base = sum(r.input_tokens for r in d.running.values())
        step = self.cost.tbt_s(n, base) / speed
        ctx = float(base)
        for r in d.running.values():
            ctx += min(r.expected_tokens, max(0.0, now - r.start_s) / step)
        return n, ctx, self.cost.tbt_s(n, ctx) / speed

    def _decode_load(self, d: _Decode, n: int, ctx: float, tbt_slo_s: float) -> float:
        load = self.cost.tbt_s(n, ctx) / d.spec.relative_speed / tbt_slo_s
        if d.kv_capacity_tokens:
            load = max(load, ctx / d.kv_capacity_tokens)
        if d.max_batch:
            load = max(load, n / d.max_batch)
        return load

    def _pick_decode(
        self, now: float, t_join: float, input_tokens: int, expected_tokens: int,
        tbt_slo_s: float, mode: AdmissionMode,
    ) -> tuple[_Decode | None, float, float, float]:
        """Least-loaded live decode instance as ``mode`` sees it.

        Returns:
            (instance, load judged for admission, its TBT with this request, its own load with
            this request).
        """
        live = [d for d in self._decodes.values() if self._is_live(d.last_seen_s, now)]
        if not live:
            return None, 0.0, 0.0, 0.0
        nows = [self._decode_now(d, now) for d in live]  # (n, ctx, step) each
        if mode is AdmissionMode.PREDICTED_QUANTILE:
            q = self.config.admit_probability
            if q is None:
                c = min(1.0, self.mean_prefill_load())
                q = c / (1.0 + c)
            vnow = [self._vtok_at(d, now) for d in live]
            return pick_decode_quantile(self, live, nows, vnow, now, t_join, input_tokens,
                                        tbt_slo_s, q)
        predicted = mode in _PREDICTED_MODES
        if predicted:
            # Requests running now leave after the uniform decode time (paper) or after their
            # own expected tokens (ours); requests still in prefill join when it is predicted
            # to end.
            k = self._num_decode_idx
            inv = np.zeros(k)
            vnow = np.zeros(k)
            for d, (_, _, step) in zip(live, nows, strict=True):
                inv[d.idx] = 1.0 / step
                vnow[d.idx] = self._vtok_at(d, now)
            uniform = self.uniform_decode_s if mode is AdmissionMode.PREDICTED else None
            n_at, ctx_at = self._table.at(t_join, now, inv, vnow, uniform, k)
            if uniform is None:
                # ours, second pass: the tokens until t_join come at the mean of the step time
                # now and the step time predicted for t_join (the batch changes meanwhile)
                d0, db, dc = self.cost.decode_coefficients
                for d in live:
                    i = d.idx
                    later = (d0 + db * n_at[i] + dc * ctx_at[i]) / d.spec.relative_speed
                    inv[i] = 2.0 / (1.0 / inv[i] + later)
                n_at, ctx_at = self._table.at(t_join, now, inv, vnow, uniform, k)
            states = []
            for d, (n_rep, ctx_rep, _) in zip(live, nows, strict=True):
                n, ctx = int(n_at[d.idx]), float(ctx_at[d.idx])
                extra = n_rep - len(d.running)
                if d.reported is not None and extra > 0:
                    # requests the engine runs that this scheduler did not place (another
                    # router, or before a restart): assume they all stay
                    n += extra
                    ctx += ctx_rep * extra / n_rep
                states.append((d, n, ctx))
        else:
            # The measured load now: it does not count requests still in prefill (early
            # rejection's stale view).
            states = [(d, n0, c0) for d, (n0, c0, _) in zip(live, nows, strict=True)]
        d0, db, dc = self.cost.decode_coefficients
        best: _Decode | None = None
        best_load = best_tbt = best_alone = best_key = 0.0
        total = 0.0
        for d, n, ctx in states:
            speed_slo = d.spec.relative_speed * tbt_slo_s
            kv, mb = d.kv_capacity_tokens, d.max_batch
            alone = (d0 + db * n + dc * ctx) / speed_slo
            if kv:
                alone = max(alone, ctx / kv)
            if mb:
                alone = max(alone, n / mb)
            n1, c1 = n + 1, ctx + input_tokens
            tbt1 = (d0 + db * n1 + dc * c1) / d.spec.relative_speed
            load = tbt1 / tbt_slo_s
            if kv:
                load = max(load, c1 / kv)
            if mb:
                load = max(load, n1 / mb)
            total += alone
            key = load
            if not predicted and d.incoming:
                # choose as plain in-flight load balancing does: requests sent there and still
                # in prefill count as if they ran now
                key = self._decode_load(d, n1 + len(d.incoming), c1 + d.incoming_tokens,
                                        tbt_slo_s)
            if best is None or key < best_key:
                best, best_load, best_alone, best_key, best_tbt = d, load, alone, key, tbt1
        admit_load = best_load
        if self.config.decode_load_scope == "mean" and \
                mode is not AdmissionMode.PREDICTED_ADAPTIVE:
            # Mooncake's wording: the mean decode load, with this request added.
            admit_load = (total - best_alone + best_load) / len(states)
        return best, admit_load, best_tbt, best_load

    # ---- scheduling ------------------------------------------------------------------
    def schedule(
        self, request: ScheduleRequest, prefix_index: PrefixIndex | None = None
    ) -> Decision:
        """Choose prefill and decode instances for a request, or reject it.

        ``prefix_index`` overrides the scheduler's own index for this call (the gRPC service
        passes a snapshot that includes the store's block locations).

        On admission the prefill instance's queue grows by the predicted prefill time and the
        decode instance expects the request when its prefill ends; call :meth:`start_decode`
        then and :meth:`finish_request` at the end (or to cancel).

        Raises:
            InvalidArgument: empty or duplicate ``request_id``, ``input_tokens`` <= 0, negative
                ``expected_output_tokens``, or an SLO that is not > 0.
        """
        self._check_request(request)
        cfg = self.config
        now = self.clock()
        ttft_slo = request.ttft_slo_s if request.ttft_slo_s is not None else cfg.ttft_slo_s
        tbt_slo = request.tbt_slo_s if request.tbt_slo_s is not None else cfg.tbt_slo_s
        n_tok = request.input_tokens
        keys = request.block_keys
        expected = request.expected_output_tokens or cfg.default_output_tokens
        mode = self.admission

        prefills = [p for p in self._prefills.values() if self._is_live(p.last_seen_s, now)]
        if not prefills or not any(self._is_live(d.last_seen_s, now) for d in
                                   self._decodes.values()):
            self.num_rejected[RejectReason.NO_INSTANCE] += 1
            return Decision(request.request_id, False, RejectReason.NO_INSTANCE, None, None,
                            num_blocks=len(keys))

        policy = self.policy
        # every policy reuses what the chosen instance's node holds (engines do); only
        # kvcache-centric also looks at other nodes' prefixes
        match = (
            (prefix_index or self.prefix_index).match_prefix(
                keys, sorted({p.spec.node_id for p in prefills})
            )
            if keys else {}
        )
        holder: str | None = None
        g_blocks = 0
        g_ssd = 0
        if policy is Policy.KVCACHE_CENTRIC:
            for node, (nb, ns) in match.items():
                if nb > g_blocks or (nb == g_blocks and holder is not None and node < holder):
                    holder, g_blocks, g_ssd = node, nb, ns

        cost = self.cost
        cached = cost.cached_tokens
        tr = cost.transfer_s
        thr = cfg.kvcache_balancing_threshold

        memo: dict[tuple[int, int, float], tuple[float, float, int, int, int]] = {}

        def option(lb: int, ls: int, speed: float) -> tuple[float, float, int, int, int]:
            """Cheapest reuse option for an instance whose node holds ``lb`` leading blocks
            (``ls`` of them on SSD): (transfer, prefill, local_used, fetched, fetched_ssd)."""
            key = (lb, ls, speed)
            got = memo.get(key)
            if got is not None:
                return got
            best = (0.0, cost.prefill_s(n_tok, 0) / speed, 0, 0, 0)
            best_sum = best[1]
            if lb:
                t_loc = tr(lb - ls, remote=False) + tr(ls, remote=False, ssd=True)
                pf = cost.prefill_s(n_tok, cached(n_tok, lb)) / speed
                if pf + t_loc < best_sum:
                    best, best_sum = (t_loc, pf, lb, 0, 0), pf + t_loc
            if holder is not None and g_blocks > lb and g_blocks >= thr * lb:
                extra = g_blocks - lb
                fs = min(g_ssd, extra)
                t_f = (tr(lb - ls, remote=False) + tr(ls, remote=False, ssd=True)
                       + tr(extra - fs, remote=True) + tr(fs, remote=True, ssd=True))
                pf = cost.prefill_s(n_tok, cached(n_tok, g_blocks)) / speed
                if pf + t_f < best_sum:
                    best = (t_f, pf, lb, extra, fs)
            memo[key] = best
            return best

        no_hit = (0, 0)
        if policy is Policy.RANDOM:
            chosen = prefills[self._rng.randrange(len(prefills))]
        elif policy is Policy.LOAD_BALANCING:
            chosen = min(prefills, key=lambda p: p.busy_until_s)
        else:
            chosen = prefills[0]
            best_ttft = math.inf
            for p in prefills:
                lb, ls = match.get(p.spec.node_id, no_hit)
                o = option(lb, ls, p.spec.relative_speed)
                t = max(0.0, p.busy_until_s - now) + o[0] + o[1]
                if t < best_ttft:
                    chosen, best_ttft = p, t
        lb, ls = match.get(chosen.spec.node_id, no_hit)
        t_x, t_p, local_used, fetched, fetched_ssd = option(lb, ls, chosen.spec.relative_speed)
        q = max(0.0, chosen.busy_until_s - now)
        ttft = q + t_x + t_p
        finish = now + ttft

        dec, dload, dtbt, inst_load = self._pick_decode(now, finish, n_tok, expected, tbt_slo,
                                                        mode)
        assert dec is not None  # checked above that one is live
        reused = local_used + fetched
        decision_kw = dict(
            num_blocks=len(keys), reused_blocks=reused, local_blocks=local_used,
            fetched_blocks=fetched, fetched_ssd_blocks=fetched_ssd,
            prefix_node_id=holder if fetched else None,
            predicted_queue_s=q, predicted_transfer_s=t_x, predicted_prefill_s=t_p,
            predicted_ttft_s=ttft, predicted_tbt_s=dtbt, predicted_decode_load=dload,
            prefill_finish_s=finish,
        )
        reason: RejectReason | None = None
        if mode is not AdmissionMode.NONE and ttft > ttft_slo:
            reason = RejectReason.TTFT_SLO
        elif mode in _EARLY_MODES and dload + self._admission_margin(mode) > cfg.max_load_ratio:
            reason = RejectReason.TBT_SLO
        if reason is not None:
            self.num_rejected[reason] += 1
            return Decision(request.request_id, False, reason, chosen.spec.instance_id,
                            dec.spec.instance_id, **decision_kw)  # type: ignore[arg-type]

        chosen.busy_until_s = max(now, chosen.busy_until_s) + t_x + t_p
        chosen.num_scheduled += 1
        rec = _Dec(n_tok, expected, finish, self._table.add(dec.idx, finish, n_tok, expected))
        if mode is AdmissionMode.PREDICTED_QUANTILE:
            given = request.expected_output_tokens
            self.lengths.set_row(rec.slot, self.lengths.length_quantiles(n_tok, given), given)
        dec.incoming[request.request_id] = rec
        dec.incoming_tokens += n_tok
        self._pending[request.request_id] = _Pending(
            request, chosen.spec.instance_id, dec.spec.instance_id, now, ttft, expected, tbt_slo,
            rec, inst_load,
        )
        self.num_admitted += 1
        replicate: tuple[Hashable, ...] = (
            tuple(keys[local_used:local_used + fetched]) if fetched else ()
        )
        return Decision(request.request_id, True, None, chosen.spec.instance_id,
                        dec.spec.instance_id, replicate_keys=replicate,
                        **decision_kw)  # type: ignore[arg-type]

    def _record_error(self, err: float) -> None:
        if len(self._errors) == self._errors.maxlen:
            self._errors_sorted.remove(self._errors[0])
        self._errors.append(err)
        self._errors_sorted.add(err)

    def _admission_margin(self, mode: AdmissionMode) -> float:
        """What to add to the predicted decode load before comparing it with the limit.

        0 except for predicted-adaptive: the ``c / (1 + c)`` quantile of recent prediction
        errors (measured minus predicted load at handoff), ``c`` = mean prefill load capped at 1.
        Admitting is worth it when P(fit) * 1 >= P(no fit) * c, since a request that does not fit
        wastes a prefill, which costs another request with probability about c.
        """
        if mode is not AdmissionMode.PREDICTED_ADAPTIVE or len(self._errors_sorted) < 32:
            return 0.0
        c = min(1.0, self.mean_prefill_load())
        q = c / (1.0 + c)
        errs = self._errors_sorted
        return float(errs[int(q * (len(errs) - 1))])

    def _check_request(self, request: ScheduleRequest) -> None:
        if not request.request_id:
            raise InvalidArgument("request_id must be non-empty")
        if request.request_id in self._pending or request.request_id in self._running:
            raise InvalidArgument(
                f"request {request.request_id!r} is already in flight; finish it first or use a "
                "new id"
            )
        if request.input_tokens <= 0:
            raise InvalidArgument(f"input_tokens must be > 0, got {request.input_tokens}")
        if request.expected_output_tokens < 0:
            raise InvalidArgument(
                f"expected_output_tokens must be >= 0, got {request.expected_output_tokens}"
            )
        for name in ("ttft_slo_s", "tbt_slo_s"):
            v = getattr(request, name)
            if v is not None and not v > 0:
                raise InvalidArgument(f"{name} must be > 0 or unset, got {v}")

    def start_decode(self, request_id: str) -> HandoffDecision:
        """The request's prefill finished: hand it to a decode instance, or refuse it.

        In the predicted modes the planned instance takes it when it fits (load with it <=
        ``max_load_ratio``, judged on its current state); otherwise, and in the other modes, the
        instance with the least current load takes it if it fits; otherwise it is refused with
        ``DECODE_OVERLOADED`` (its prefill was wasted) and forgotten. With admission ``none`` or
        ``decode_hard_limit`` off, nothing is refused.

        Raises:
            NotFound: the request is not waiting for decode (unknown, already handed off, or
                finished).
        """
        pend = self._pending.pop(request_id, None)
        if pend is None:
            raise NotFound(f"request {request_id!r} is not waiting for a decode instance")
        now = self.clock()
        n_tok = pend.request.input_tokens
        planned = self._decodes.get(pend.decode_id)
        self._table.remove(pend.rec.slot)
        if planned is not None and planned.incoming.pop(request_id, None) is not None:
            planned.incoming_tokens -= n_tok
        enforce = self.admission is not AdmissionMode.NONE and self.config.decode_hard_limit
        limit = self.config.max_load_ratio
        chosen: _Decode | None = None
        chosen_load = 0.0
        # The planned instance takes it if it is still live and it fits (Mooncake: the decode
        # instance chosen at arrival refuses when overloaded). Only a planned instance that
        # went away, or ``repick_decode`` in the config, sends it to the least loaded one.
        if planned is not None and self._is_live(planned.last_seen_s, now):
            n, ctx, _ = self._decode_now(planned, now)
            chosen_load = self._decode_load(planned, n + 1, ctx + n_tok, pend.tbt_slo_s)
            if self.admission is AdmissionMode.PREDICTED_ADAPTIVE:
                self._record_error(chosen_load - pend.predicted_load)

            if not enforce or chosen_load <= limit:
                chosen = planned
        if chosen is None and (planned is None or self.config.repick_decode
                               or not self._is_live(planned.last_seen_s, now)):
            best: _Decode | None = None
            best_load = 0.0
            for d in self._decodes.values():
                if not self._is_live(d.last_seen_s, now):
                    continue
                n, ctx, _ = self._decode_now(d, now)
                load = self._decode_load(d, n + 1, ctx + n_tok, pend.tbt_slo_s)
                if best is None or load < best_load:
                    best, best_load = d, load
            if best is not None and (not enforce or best_load <= limit):
                chosen, chosen_load = best, best_load
            elif best is not None:
                chosen_load = best_load
        if chosen is None:
            self.num_rejected[RejectReason.DECODE_OVERLOADED] += 1
            return HandoffDecision(request_id, False, None, RejectReason.DECODE_OVERLOADED,
                                   chosen_load, pend.predicted_ttft_s)
        self._advance_vtok(chosen, now)
        rec = _Dec(n_tok, pend.expected_tokens, now,
                   self._table.add(chosen.idx, now, n_tok, pend.expected_tokens, chosen.vtok))
        if self.admission is AdmissionMode.PREDICTED_QUANTILE and rec.slot != pend.rec.slot:
            lm = self.lengths
            lm.set_row(rec.slot, lm.quantiles[pend.rec.slot].copy(),
                       int(lm.predicted[pend.rec.slot]))
        chosen.running[request_id] = rec
        chosen.delta_n += 1
        chosen.delta_ctx += n_tok
        chosen.vtok_step = self._decode_now(chosen, now)[2]
        self._running[request_id] = (chosen.spec.instance_id, rec)
        return HandoffDecision(request_id, True, chosen.spec.instance_id, None, chosen_load,
                               pend.predicted_ttft_s)

    def finish_request(self, request_id: str, num_output_tokens: int | None = None) -> bool:
        """The request completed (or was cancelled): forget it.

        A request that was decoding updates the uniform decode-time estimate (EWMA).

        Args:
            request_id: the request.
            num_output_tokens: tokens it generated, to adjust the reported context; None = its
                expected count.

        Returns:
            True when the request was known (pending or running), False otherwise (idempotent).
        """
        now = self.clock()
        pend = self._pending.pop(request_id, None)
        if pend is not None:
            self._table.remove(pend.rec.slot)
            d = self._decodes.get(pend.decode_id)
            if d is not None and d.incoming.pop(request_id, None) is not None:
                d.incoming_tokens -= pend.rec.input_tokens
            return True
        entry = self._running.pop(request_id, None)
        if entry is None:
            return False
        inst_id, rec = entry
        self._table.remove(rec.slot)
        dec = self._decodes.get(inst_id)
        if dec is not None:
            self._advance_vtok(dec, now)
            dec.running.pop(request_id, None)
            dec.delta_n -= 1
            gen = rec.expected_tokens if num_output_tokens is None else num_output_tokens
            dec.delta_ctx -= rec.input_tokens + gen
            dec.vtok_step = self._decode_now(dec, now)[2]
        if self.admission is AdmissionMode.PREDICTED_QUANTILE and num_output_tokens is not None:
            self.lengths.observe(rec.input_tokens, num_output_tokens,
                                 int(self.lengths.predicted[rec.slot]))
        a = self.config.decode_ewma_alpha
        self.uniform_decode_s += a * ((now - rec.start_s) - self.uniform_decode_s)
        self.num_completed += 1
        return True

    # ---- views -----------------------------------------------------------------------
    def mean_prefill_load(self) -> float:
        """Mean over prefill instances of queue time / TTFT SLO (0 with none)."""
        if not self._prefills:
            return 0.0
        now = self.clock()
        slo = self.config.ttft_slo_s
        return sum(max(0.0, p.busy_until_s - now) for p in self._prefills.values()) / (
            slo * len(self._prefills)
        )

    def mean_decode_load(self) -> float:
        """Mean over decode instances of their current decode load (0 with none)."""
        if not self._decodes:
            return 0.0
        now = self.clock()
        total = 0.0
        for d in self._decodes.values():
            n, ctx, _ = self._decode_now(d, now)
            total += self._decode_load(d, n, ctx, self.config.tbt_slo_s)
        return total / len(self._decodes)

    def describe(self) -> list[InstanceStatus]:
        """Status of every instance: prefill ones first, each in registration order."""
        now = self.clock()
        out: list[InstanceStatus] = []
        for p in self._prefills.values():
            q = max(0.0, p.busy_until_s - now)
            out.append(InstanceStatus(p.spec, q / self.config.ttft_slo_s, queued_prefill_s=q,
                                      last_seen_age_s=now - p.last_seen_s))
        for d in self._decodes.values():
            n, ctx, step = self._decode_now(d, now)
            out.append(InstanceStatus(
                d.spec, self._decode_load(d, n, ctx, self.config.tbt_slo_s), num_running=n,
                num_context_tokens=int(ctx), num_incoming=len(d.incoming), step_s=step,
                last_seen_age_s=now - d.last_seen_s,
            ))
        return out
