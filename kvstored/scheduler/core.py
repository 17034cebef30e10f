"""The scheduler core: a facade over instance choice and admission. Pure Python: no gRPC, no
I/O, no threads.

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

The parts, composed here::

    prefill.py       prefill instances; the choice of one (Algorithm 1: min predicted TTFT)
    decode_table.py  decode instances, their requests as numpy rows, load estimates
    admission.py     one strategy per admission mode: how the decode instance is judged,
                     what is refused when, what the mode learns at handoff and finish
    types.py         instances, requests, decisions, statuses, the PrefixIndex port

Decode load of an instance = max(TBT(b, c) / TBT SLO, c / KV capacity, b / max batch), for the
``b`` requests and ``c`` context tokens it runs (see :class:`CostModel`).

Source: Mooncake arXiv 2407.00079 §6-7 and FAST'25 §5 (Algorithm 1, early rejection,
prediction-based early rejection). The ``predicted-length``, ``predicted-adaptive`` and
``predicted-quantile`` modes are ours (the last one: kvstored/scheduler/lengths.py).

Concurrency: not thread-safe; call from one thread or one event loop.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass

from kvstored.errors import InvalidArgument, NotFound
from kvstored.scheduler.admission import make_admission
from kvstored.scheduler.config import SchedulerConfig
from kvstored.scheduler.costmodel import CostModel
from kvstored.scheduler.decode_table import DecodeEntry, DecodeInstance, DecodePool
from kvstored.scheduler.prefill import PrefillInstance, choose_prefill
from kvstored.scheduler.types import (
    Clock,
    Decision,
    HandoffDecision,
    InstanceSpec,
    InstanceStatus,
    NoPrefixIndex,
    PrefixIndex,
    RejectReason,
    Role,
    ScheduleRequest,
)


@dataclass(slots=True)
class _Pending:
    request: ScheduleRequest
    prefill_id: str
    decode_id: str
    arrival_s: float
    predicted_ttft_s: float
    expected_tokens: int
    tbt_slo_s: float
    rec: DecodeEntry
    predicted_load: float  # the planned instance's predicted load at handoff, with this request


class Scheduler:
    """SLO-aware placement and admission of requests onto prefill and decode instances.

    Args:
        config: policy, admission mode, SLO defaults and tunables.
        cost_model: predicted durations.
        clock: seconds, monotonic; the simulator passes its own.
        prefix_index: where prompts' prefixes are cached (default: nowhere).

    Attributes:
        strategy: the admission mode's strategy (kvstored/scheduler/admission.py).

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
        self._prefills: dict[str, PrefillInstance] = {}
        self._decode = DecodePool(cost_model)
        self._decodes = self._decode.instances  # (the same dict: the pool owns it)
        self._pending: dict[str, _Pending] = {}
        self._running: dict[str, tuple[str, DecodeEntry]] = {}
        self.uniform_decode_s = config.initial_decode_s
        self.strategy = make_admission(config, prefill_load=self.mean_prefill_load,
                                       uniform_decode_s=lambda: self.uniform_decode_s)
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
                self._prefills[spec.instance_id] = PrefillInstance(spec, busy_until_s=now,
                                                                 last_seen_s=now)
            else:
                old.spec, old.last_seen_s = spec, now
        else:
            self._decode.register(spec, now)

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
        self._decode.advance_vtok(d, now)
        d.reported = (num_running, context_tokens, step_s)
        d.delta_n = 0
        d.delta_ctx = 0.0
        d.last_seen_s = now
        d.vtok_step = self._decode.now(d, now)[2]

    def touch_instance(self, instance_id: str) -> None:
        """Mark an instance as alive (a load report without values).

        Raises:
            NotFound: no such instance.
        """
        inst = self._prefills.get(instance_id) or self._decodes.get(instance_id)
        if inst is None:
            raise NotFound(f"no instance {instance_id!r} is registered")
        inst.last_seen_s = self.clock()

    # ---- liveness ----------------------------------------------------------------------
    def _is_live(self, last_seen_s: float, now: float) -> bool:
        ttl = self.config.instance_ttl_s
        return ttl is None or now - last_seen_s <= ttl

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

        prefills = [p for p in self._prefills.values() if self._is_live(p.last_seen_s, now)]
        if not prefills or not any(self._is_live(d.last_seen_s, now) for d in
                                   self._decodes.values()):
            self.num_rejected[RejectReason.NO_INSTANCE] += 1
            return Decision(request.request_id, False, RejectReason.NO_INSTANCE, None, None,
                            num_blocks=len(keys))

        pc = choose_prefill(
            prefills, keys, n_tok, now=now, policy=self.policy, cost=self.cost,
            prefix_index=prefix_index or self.prefix_index,
            balancing_threshold=cfg.kvcache_balancing_threshold, rng=self._rng,
        )
        chosen = pc.instance
        t_x, t_p, q, ttft = pc.transfer_s, pc.prefill_s, pc.queue_s, pc.ttft_s
        local_used, fetched = pc.local_blocks, pc.fetched_blocks
        finish = now + ttft

        strategy = self.strategy
        live = [d for d in self._decodes.values() if self._is_live(d.last_seen_s, now)]
        dec, dload, dtbt, inst_load = strategy.pick_decode(self._decode, live, now, finish,
                                                           n_tok, tbt_slo)
        reused = local_used + fetched
        decision_kw = dict(
            num_blocks=len(keys), reused_blocks=reused, local_blocks=local_used,
            fetched_blocks=fetched, fetched_ssd_blocks=pc.fetched_ssd_blocks,
            prefix_node_id=pc.prefix_node_id if fetched else None,
            predicted_queue_s=q, predicted_transfer_s=t_x, predicted_prefill_s=t_p,
            predicted_ttft_s=ttft, predicted_tbt_s=dtbt, predicted_decode_load=dload,
            prefill_finish_s=finish,
        )
        reason: RejectReason | None = None
        if strategy.checks_ttft and ttft > ttft_slo:
            reason = RejectReason.TTFT_SLO
        elif strategy.rejects_tbt(dload, cfg.max_load_ratio):
            reason = RejectReason.TBT_SLO
        if reason is not None:
            self.num_rejected[reason] += 1
            return Decision(request.request_id, False, reason, chosen.spec.instance_id,
                            dec.spec.instance_id, **decision_kw)  # type: ignore[arg-type]  # decision_kw holds the optional Decision fields with their own types

        chosen.busy_until_s = max(now, chosen.busy_until_s) + t_x + t_p
        chosen.num_scheduled += 1
        rec = DecodeEntry(n_tok, expected, finish,
                          self._decode.table.add(dec.idx, finish, n_tok, expected))
        strategy.on_admitted(rec.slot, n_tok, request.expected_output_tokens)
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
                        **decision_kw)  # type: ignore[arg-type]  # decision_kw holds the optional Decision fields with their own types


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
        pool = self._decode
        n_tok = pend.request.input_tokens
        planned = self._decodes.get(pend.decode_id)
        self._decode.table.remove(pend.rec.slot)
        if planned is not None and planned.incoming.pop(request_id, None) is not None:
            planned.incoming_tokens -= n_tok
        strategy = self.strategy
        enforce = strategy.enforces_decode and self.config.decode_hard_limit
        limit = self.config.max_load_ratio
        chosen: DecodeInstance | None = None
        chosen_load = 0.0
        # The planned instance takes it if it is still live and it fits (Mooncake: the decode
        # instance chosen at arrival refuses when overloaded). Only a planned instance that
        # went away, or ``repick_decode`` in the config, sends it to the least loaded one.
        if planned is not None and self._is_live(planned.last_seen_s, now):
            n, ctx, _ = pool.now(planned, now)
            chosen_load = pool.load(planned, n + 1, ctx + n_tok, pend.tbt_slo_s)
            strategy.on_planned_load(chosen_load, pend.predicted_load)
            if not enforce or chosen_load <= limit:
                chosen = planned
        if chosen is None and (planned is None or self.config.repick_decode
                               or not self._is_live(planned.last_seen_s, now)):
            best: DecodeInstance | None = None
            best_load = 0.0
            for d in self._decodes.values():
                if not self._is_live(d.last_seen_s, now):
                    continue
                n, ctx, _ = pool.now(d, now)
                load = pool.load(d, n + 1, ctx + n_tok, pend.tbt_slo_s)
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
        pool.advance_vtok(chosen, now)
        rec = DecodeEntry(n_tok, pend.expected_tokens, now,
                          pool.table.add(chosen.idx, now, n_tok, pend.expected_tokens,
                                         chosen.vtok))
        strategy.on_handoff(pend.rec.slot, rec.slot)
        chosen.running[request_id] = rec
        chosen.delta_n += 1
        chosen.delta_ctx += n_tok
        chosen.vtok_step = pool.now(chosen, now)[2]
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
            self._decode.table.remove(pend.rec.slot)
            d = self._decodes.get(pend.decode_id)
            if d is not None and d.incoming.pop(request_id, None) is not None:
                d.incoming_tokens -= pend.rec.input_tokens
            return True
        entry = self._running.pop(request_id, None)
        if entry is None:
            return False
        inst_id, rec = entry
        pool = self._decode
        pool.table.remove(rec.slot)
        dec = self._decodes.get(inst_id)
        if dec is not None:
            pool.advance_vtok(dec, now)
            dec.running.pop(request_id, None)
            dec.delta_n -= 1
            gen = rec.expected_tokens if num_output_tokens is None else num_output_tokens
            dec.delta_ctx -= rec.input_tokens + gen
            dec.vtok_step = pool.now(dec, now)[2]
        self.strategy.on_finished(rec.slot, rec.input_tokens, num_output_tokens)
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
            n, ctx, _ = self._decode.now(d, now)
            total += self._decode.load(d, n, ctx, self.config.tbt_slo_s)
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
            n, ctx, step = self._decode.now(d, now)
            out.append(InstanceStatus(
                d.spec, self._decode.load(d, n, ctx, self.config.tbt_slo_s), num_running=n,
                num_context_tokens=int(ctx), num_incoming=len(d.incoming), step_s=step,
                last_seen_age_s=now - d.last_seen_s,
            ))
        return out
