"""Admission: one strategy object per :class:`~kvstored.scheduler.config.AdmissionMode`.

A strategy answers what the mode changes in the life of a request; the core
(kvstored/scheduler/core.py) asks it at each step and branches on nothing else::

    mode                TTFT at   decode instance judged on            TBT at    handoff
                        arrival                                         arrival   may refuse
    none                -         load now                              -         no
    reject-at-decode    yes       load now                              -         yes
    early               yes       load now                              yes       yes
    predicted           yes       load when the prefill ends (uniform   yes       yes
                                  decode time, the paper's)
    predicted-length    yes       same, each request's expected tokens  yes       yes
    predicted-adaptive  yes       same, plus a margin learned at        yes       yes
                                  handoff (per instance, never "mean")
    predicted-quantile  yes       the load's quantile (lengths.py)      yes       yes

("handoff may refuse" also needs ``decode_hard_limit``.) The decode instance is the one with
the lowest decode load as the mode sees it; "load now" does not count requests still in
prefill (early rejection's stale view) but chooses as in-flight load balancing does.

Source: Mooncake arXiv 2407.00079 §7 and FAST'25 §5 (early rejection, prediction-based early
rejection). ``predicted-length``, ``predicted-adaptive`` and ``predicted-quantile`` are ours.
Not thread-safe; the scheduler's thread or event loop only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from sortedcontainers import SortedList

from kvstored.errors import InvalidArgument
from kvstored.scheduler.config import AdmissionMode, SchedulerConfig
from kvstored.scheduler.decode_table import DecodeInstance, DecodePool
from kvstored.scheduler.lengths import OutputLengthModel, pick_decode_quantile

DecodePick = tuple[DecodeInstance, float, float, float]
"""(instance, load judged for admission, its TBT with the request (s), its own load with the
request)."""
LoadSource = Callable[[], float]
"""Reads one of the scheduler's estimates now (the mean prefill load, the uniform decode
time), so a strategy sees the value at the moment it decides."""


class Admission(Protocol):
    """What an admission mode decides (see the module docstring).

    Attributes:
        mode: the mode it implements.
        checks_ttft: refuse at arrival when the predicted TTFT misses the TTFT SLO.
        enforces_decode: the decode side may refuse at handoff (with ``decode_hard_limit``).
    """

    mode: AdmissionMode
    checks_ttft: bool
    enforces_decode: bool

    def pick_decode(self, pool: DecodePool, live: Sequence[DecodeInstance], now: float,
                    t_join: float, input_tokens: int, tbt_slo_s: float) -> DecodePick:
        """The decode instance for a request whose prefill is predicted to end at ``t_join``
        (``live``: the live decode instances, at least one)."""
        ...

    def rejects_tbt(self, decode_load: float, max_load_ratio: float) -> bool:
        """Whether the request is refused at arrival for the decode load it was judged on."""
        ...

    def on_admitted(self, slot: int, input_tokens: int, given_output_tokens: int) -> None:
        """The request was admitted; its incoming decode-table row is ``slot``."""
        ...

    def on_planned_load(self, measured_load: float, predicted_load: float) -> None:
        """At handoff, the planned instance's load with the request, and as predicted."""
        ...

    def on_handoff(self, incoming_slot: int, running_slot: int) -> None:
        """The request moved from its incoming row to its running row (maybe the same)."""
        ...

    def on_finished(self, slot: int, input_tokens: int, num_output_tokens: int | None) -> None:
        """A running request finished (``slot``: its row, already freed)."""
        ...


# ---- choosing a decode instance ----------------------------------------------------------
def decode_states_now(live: Sequence[DecodeInstance], nows: Sequence[tuple[int, float, float]]
                      ) -> list[tuple[DecodeInstance, int, float]]:
    """(instance, requests, context tokens) as measured now: requests still in prefill are
    not counted (early rejection's stale view)."""
    return [(d, n0, c0) for d, (n0, c0, _) in zip(live, nows, strict=True)]


def decode_states_predicted(pool: DecodePool, live: Sequence[DecodeInstance],
                            nows: Sequence[tuple[int, float, float]], now: float, t_join: float,
                            uniform_s: float | None) -> list[tuple[DecodeInstance, int, float]]:
    """(instance, requests, context tokens) predicted for ``t_join``.

    Requests running now leave after ``uniform_s`` (the paper's uniform decode time) or, when
    it is None, after their own expected tokens (ours); requests still in prefill join when it
    is predicted to end.
    """
    k = pool.num_indexes
    inv = np.zeros(k)
    vnow = np.zeros(k)
    for d, (_, _, step) in zip(live, nows, strict=True):
        inv[d.idx] = 1.0 / step
        vnow[d.idx] = pool.vtok_at(d, now)
    n_at, ctx_at = pool.table.at(t_join, now, inv, vnow, uniform_s, k)
    if uniform_s is None:
        # ours, second pass: the tokens until t_join come at the mean of the step time
        # now and the step time predicted for t_join (the batch changes meanwhile)
        d0, db, dc = pool.cost.decode_coefficients
        for d in live:
            i = d.idx
            later = (d0 + db * n_at[i] + dc * ctx_at[i]) / d.spec.relative_speed
            inv[i] = 2.0 / (1.0 / inv[i] + later)
        n_at, ctx_at = pool.table.at(t_join, now, inv, vnow, uniform_s, k)
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
    return states


def least_loaded(pool: DecodePool, states: Sequence[tuple[DecodeInstance, int, float]],
                 input_tokens: int, tbt_slo_s: float, *, predicted: bool,
                 mean_scope: bool) -> DecodePick:
    """The instance whose load with the request added is the lowest.

    Args:
        states: (instance, requests, context tokens) as the mode sees them (at least one).
        predicted: the states are predicted; else requests still in prefill and planned on
            an instance count as if they ran now when choosing (in-flight load balancing).
        mean_scope: judge admission on the mean load over the instances with the request
            added (Mooncake's wording), not the chosen instance's.
    """
    d0, db, dc = pool.cost.decode_coefficients
    best: DecodeInstance | None = None
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
            key = pool.load(d, n1 + len(d.incoming), c1 + d.incoming_tokens, tbt_slo_s)
        if best is None or key < best_key:
            best, best_load, best_alone, best_key, best_tbt = d, load, alone, key, tbt1
    assert best is not None
    admit_load = best_load
    if mean_scope:
        admit_load = (total - best_alone + best_load) / len(states)
    return best, admit_load, best_tbt, best_load


# ---- the strategies ----------------------------------------------------------------------
def _mean_scope(config: SchedulerConfig) -> bool:
    return config.decode_load_scope == "mean"


class MeasuredAdmission:
    """``none``, ``reject-at-decode`` and ``early``: the decode load measured now.

    Args:
        mode: one of the three.
        config: the scheduler's settings.
    """

    def __init__(self, mode: AdmissionMode, config: SchedulerConfig) -> None:
        if mode not in (AdmissionMode.NONE, AdmissionMode.REJECT_AT_DECODE,
                        AdmissionMode.EARLY):
            raise InvalidArgument(f"MeasuredAdmission does not implement {mode!r}")
        self.mode: AdmissionMode = mode
        self.checks_ttft = mode is not AdmissionMode.NONE
        self.enforces_decode = mode is not AdmissionMode.NONE
        self._checks_tbt = mode is AdmissionMode.EARLY
        self._mean_scope = _mean_scope(config)

    def pick_decode(self, pool: DecodePool, live: Sequence[DecodeInstance], now: float,
                    t_join: float, input_tokens: int, tbt_slo_s: float) -> DecodePick:
        """The least loaded instance as measured now (see the module docstring)."""
        nows = [pool.now(d, now) for d in live]
        return least_loaded(pool, decode_states_now(live, nows), input_tokens, tbt_slo_s,
                            predicted=False, mean_scope=self._mean_scope)

    def rejects_tbt(self, decode_load: float, max_load_ratio: float) -> bool:
        """``early`` only: the load now with the request is over the limit."""
        return self._checks_tbt and decode_load > max_load_ratio

    def on_admitted(self, slot: int, input_tokens: int, given_output_tokens: int) -> None:
        """Nothing to keep."""

    def on_planned_load(self, measured_load: float, predicted_load: float) -> None:
        """Nothing to learn."""

    def on_handoff(self, incoming_slot: int, running_slot: int) -> None:
        """Nothing to move."""

    def on_finished(self, slot: int, input_tokens: int, num_output_tokens: int | None) -> None:
        """Nothing to learn."""


class PredictedAdmission:
    """``predicted`` (uniform decode time) and ``predicted-length`` (expected tokens): the
    decode load predicted for the moment the request's prefill ends.

    Args:
        mode: one of the two.
        config: the scheduler's settings.
        uniform_decode_s: returns the current uniform decode-time estimate (``predicted``).
    """

    checks_ttft = True
    enforces_decode = True

    def __init__(self, mode: AdmissionMode, config: SchedulerConfig,
                 uniform_decode_s: LoadSource) -> None:
        if mode not in (AdmissionMode.PREDICTED, AdmissionMode.PREDICTED_LENGTH):
            raise InvalidArgument(f"PredictedAdmission does not implement {mode!r}")
        self.mode: AdmissionMode = mode
        self._uniform = uniform_decode_s if mode is AdmissionMode.PREDICTED else None
        self._mean_scope = _mean_scope(config)

    def pick_decode(self, pool: DecodePool, live: Sequence[DecodeInstance], now: float,
                    t_join: float, input_tokens: int, tbt_slo_s: float) -> DecodePick:
        """The least loaded instance as predicted for ``t_join``."""
        nows = [pool.now(d, now) for d in live]
        uniform = self._uniform() if self._uniform is not None else None
        states = decode_states_predicted(pool, live, nows, now, t_join, uniform)
        return least_loaded(pool, states, input_tokens, tbt_slo_s, predicted=True,
                            mean_scope=self._mean_scope)

    def rejects_tbt(self, decode_load: float, max_load_ratio: float) -> bool:
        """The predicted load with the request is over the limit."""
        return decode_load > max_load_ratio

    def on_admitted(self, slot: int, input_tokens: int, given_output_tokens: int) -> None:
        """Nothing to keep."""

    def on_planned_load(self, measured_load: float, predicted_load: float) -> None:
        """Nothing to learn."""

    def on_handoff(self, incoming_slot: int, running_slot: int) -> None:
        """Nothing to move."""

    def on_finished(self, slot: int, input_tokens: int, num_output_tokens: int | None) -> None:
        """Nothing to learn."""


class AdaptiveAdmission:
    """``predicted-adaptive``: ``predicted-length``'s prediction, judged per instance with a
    margin learned from the prediction errors measured at handoff.

    Args:
        config: the scheduler's settings (``error_window``: errors kept).
        prefill_load: returns the mean prefill load now.
    """

    mode = AdmissionMode.PREDICTED_ADAPTIVE
    checks_ttft = True
    enforces_decode = True
    MIN_ERRORS = 32
    """Errors recorded before the margin is used (0 until then)."""

    def __init__(self, config: SchedulerConfig, prefill_load: LoadSource) -> None:
        self._prefill_load = prefill_load
        # recent (measured - predicted) decode loads at handoff, and the same sorted
        self.errors: deque[float] = deque(maxlen=config.error_window)
        self._errors_sorted: SortedList[float] = SortedList()

    def pick_decode(self, pool: DecodePool, live: Sequence[DecodeInstance], now: float,
                    t_join: float, input_tokens: int, tbt_slo_s: float) -> DecodePick:
        """The least loaded instance as predicted for ``t_join`` (expected tokens)."""
        nows = [pool.now(d, now) for d in live]
        states = decode_states_predicted(pool, live, nows, now, t_join, None)
        return least_loaded(pool, states, input_tokens, tbt_slo_s, predicted=True,
                            mean_scope=False)

    def margin(self) -> float:
        """What to add to the predicted decode load before comparing it with the limit.

        The ``c / (1 + c)`` quantile of recent prediction errors (measured minus predicted
        load at handoff), ``c`` = mean prefill load capped at 1; 0 with fewer than
        :attr:`MIN_ERRORS` errors. Admitting is worth it when P(fit) * 1 >= P(no fit) * c,
        since a request that does not fit wastes a prefill, which costs another request with
        probability about c.
        """
        if len(self._errors_sorted) < self.MIN_ERRORS:
            return 0.0
        c = min(1.0, self._prefill_load())
        q = c / (1.0 + c)
        errs = self._errors_sorted
        return float(errs[int(q * (len(errs) - 1))])

    def record_error(self, err: float) -> None:
        """Keep one prediction error (the oldest leaves past ``error_window``)."""
        if len(self.errors) == self.errors.maxlen:
            self._errors_sorted.remove(self.errors[0])
        self.errors.append(err)
        self._errors_sorted.add(err)

    def rejects_tbt(self, decode_load: float, max_load_ratio: float) -> bool:
        """The predicted load with the request, plus the margin, is over the limit."""
        return decode_load + self.margin() > max_load_ratio

    def on_admitted(self, slot: int, input_tokens: int, given_output_tokens: int) -> None:
        """Nothing to keep."""

    def on_planned_load(self, measured_load: float, predicted_load: float) -> None:
        """Record the prediction error."""
        self.record_error(measured_load - predicted_load)

    def on_handoff(self, incoming_slot: int, running_slot: int) -> None:
        """Nothing to move."""

    def on_finished(self, slot: int, input_tokens: int, num_output_tokens: int | None) -> None:
        """Nothing to learn."""


class QuantileAdmission:
    """``predicted-quantile``: the decode load's distribution at the end of the prefill,
    from per-request output-length distributions (kvstored/scheduler/lengths.py).

    Args:
        config: the scheduler's settings (``default_output_tokens``, ``length_sigma``,
            ``admit_probability``: None = ``c / (1 + c)`` of the mean prefill load ``c``).
        prefill_load: returns the mean prefill load now.
    """

    mode = AdmissionMode.PREDICTED_QUANTILE
    checks_ttft = True
    enforces_decode = True

    def __init__(self, config: SchedulerConfig, prefill_load: LoadSource) -> None:
        self._prefill_load = prefill_load
        self._admit_probability = config.admit_probability
        # output-length distributions, rows keyed by DecodeTable slot
        self.lengths = OutputLengthModel(config.default_output_tokens,
                                         length_sigma=config.length_sigma)

    def pick_decode(self, pool: DecodePool, live: Sequence[DecodeInstance], now: float,
                    t_join: float, input_tokens: int, tbt_slo_s: float) -> DecodePick:
        """The instance with the lowest quantile load (lengths.pick_decode_quantile)."""
        nows = [pool.now(d, now) for d in live]
        q = self._admit_probability
        if q is None:
            c = min(1.0, self._prefill_load())
            q = c / (1.0 + c)
        vnow = [pool.vtok_at(d, now) for d in live]
        return pick_decode_quantile(pool.table, self.lengths, pool.cost.decode_coefficients,
                                    pool.num_indexes, live, nows, vnow, now, t_join,
                                    input_tokens, tbt_slo_s, q)

    def rejects_tbt(self, decode_load: float, max_load_ratio: float) -> bool:
        """The quantile load with the request is over the limit."""
        return decode_load > max_load_ratio

    def on_admitted(self, slot: int, input_tokens: int, given_output_tokens: int) -> None:
        """Give the incoming row the request's length distribution."""
        lm = self.lengths
        lm.set_row(slot, lm.length_quantiles(input_tokens, given_output_tokens),
                   given_output_tokens)

    def on_planned_load(self, measured_load: float, predicted_load: float) -> None:
        """Nothing to learn here (lengths are learned at finish)."""

    def on_handoff(self, incoming_slot: int, running_slot: int) -> None:
        """The distribution moves with the request to its running row."""
        if running_slot != incoming_slot:
            lm = self.lengths
            lm.set_row(running_slot, lm.quantiles[incoming_slot].copy(),
                       int(lm.predicted[incoming_slot]))

    def on_finished(self, slot: int, input_tokens: int, num_output_tokens: int | None) -> None:
        """A known output length feeds the history (with the row's predicted length)."""
        if num_output_tokens is not None:
            self.lengths.observe(input_tokens, num_output_tokens,
                                 int(self.lengths.predicted[slot]))


def make_admission(config: SchedulerConfig, *, prefill_load: LoadSource,
                   uniform_decode_s: LoadSource) -> Admission:
    """The strategy of ``config.admission``.

    Args:
        config: the scheduler's settings.
        prefill_load: returns the mean prefill load now (adaptive, quantile).
        uniform_decode_s: returns the uniform decode-time estimate now (predicted).
    """
    mode = config.admission
    if mode in (AdmissionMode.NONE, AdmissionMode.REJECT_AT_DECODE, AdmissionMode.EARLY):
        return MeasuredAdmission(mode, config)
    if mode in (AdmissionMode.PREDICTED, AdmissionMode.PREDICTED_LENGTH):
        return PredictedAdmission(mode, config, uniform_decode_s)
    if mode is AdmissionMode.PREDICTED_ADAPTIVE:
        return AdaptiveAdmission(config, prefill_load)
    if mode is AdmissionMode.PREDICTED_QUANTILE:
        return QuantileAdmission(config, prefill_load)
    raise InvalidArgument(f"unknown admission mode {mode!r}")
