"""Output-length distributions and the probabilistic decode load of ``predicted-quantile``.

No engine knows a request's output length at arrival. This module predicts it as a
*distribution* from what is knowable then, and turns the distributions of the requests in
flight into the distribution of a decode instance's load at a future time (the moment a new
request's prefill ends), so admission can ask "with what probability will it fit?".

**Length distribution of one request** (at arrival):

- *Prior*: the output lengths of completed requests, a histogram over ``log(tokens)``
  (:data:`GRID_POINTS` points from 1 to :data:`MAX_TOKENS` tokens) per input-length bucket
  (powers of two of ``input_tokens / 1024``), shrunk towards the all-bucket histogram with
  ``bucket_shrinkage`` pseudo-counts, smoothed with a Gaussian kernel of ``kernel_sigma`` in
  log space, and, until enough requests completed, mixed with a broad log-normal around the
  configured default output length (``prior_count`` pseudo-counts).
- *Likelihood* of a predicted length ``e`` (when the caller gives one): ``log e ~ N(log L,
  sigma^2)``, the log-normal error model of an output-length predictor (and of the replay's
  ``--length-noise``). ``sigma`` is either stated by the caller (``length_sigma``) or learned
  online as the RMS of ``log(e / L)`` over completed requests.
- *Posterior* = prior x likelihood on the grid, summarised by :data:`NUM_QUANTILES` quantiles
  (mid-point probabilities). With ``sigma == 0`` every quantile is ``e`` (exact knowledge);
  without a predicted length it is the prior.

**Decode load at time t** of an instance: each request ``i`` planned or running there is still
decoding at ``t`` with probability ``p_i = P(L_i > g_i(t) | L_i > g_i(now))``, the survival of
its posterior *conditioned on what it has already generated* (a request found running is a
long one: the inspection paradox that a uniform decode time misses). Its KV context then is
``a_i = input_i + g_i(t)``. With independent Bernoulli ``B_i ~ p_i``, ``n = sum B_i`` and
``ctx = sum B_i a_i``; every capacity term of the load (TBT / TBT SLO, ctx / KV capacity,
batch / max batch) is linear in ``(n, ctx)``, so its mean and variance are exact sums, and the
admission quantile of each is approximated by a normal (central limit over the batch):
``load_q = max_k (mu_k + z_q * sd_k)`` with ``z_q = Phi^-1(q)`` (the batch term, a count, with
a continuity correction of half a request). A request is admitted when
``load_q <= max_load_ratio``, i.e. when it fits with probability about ``>= q``.

Limits: with exact lengths (``sigma == 0``) every ``p_i`` is 0 or 1 and the mode is
``predicted-length``; with a point-mass prior at the mean decode time and no predicted length
it is the paper's uniform-time ``predicted`` mode.

Sources: Mooncake, arXiv 2407.00079 §7 (overload-oriented scheduling, prediction-based early
rejection: judge the decode load predicted for the moment the request's prefill ends; the
report predicts at system level with one uniform decode time t_d because request-level output
lengths are hard to predict). That output lengths are predictable only roughly, not exactly:
S^3 (Jin et al., NeurIPS'23, arXiv 2306.06000: a length-bucket predictor plus misprediction
handling) and "Efficient LLM Scheduling by Learning to Rank" (Fu et al., arXiv 2408.15792:
ranks are predictable, exact lengths are not). The rest is textbook: Bayes' rule on a grid with
a log-normal error model, the conditional survival of a length distribution given the tokens
already generated, and the normal approximation of a sum of independent Bernoulli-weighted
terms (Lyapunov CLT) for the load quantile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvstored.scheduler.decode_table import DecodeInstance, DecodeTable

MAX_TOKENS = 1 << 17
"""Largest output length the grid represents (longer ones are clipped)."""
GRID_POINTS = 512
"""Points of the log-length grid (spacing ~2.3% in length)."""
NUM_QUANTILES = 32
"""Quantiles kept per request."""
NUM_BUCKETS = 8
"""Input-length buckets: < 2k, 2-4k, ..., >= 128k tokens."""

_LOG_GRID = np.linspace(0.0, math.log(MAX_TOKENS), GRID_POINTS)
_DLOG = float(_LOG_GRID[1] - _LOG_GRID[0])
_PROBS = (np.arange(NUM_QUANTILES) + 0.5) / NUM_QUANTILES


def input_bucket(input_tokens: int) -> int:
    """Bucket of a prompt length: 0 for < 2048 tokens, then one per doubling, capped."""
    return max(0, min(NUM_BUCKETS - 1, int(math.log2(max(1, input_tokens) / 1024.0))))


def admit_z(q: float) -> float:
    """``Phi^-1(q)``: the standard-normal quantile used for an admission probability ``q``."""
    return NormalDist().inv_cdf(min(0.999, max(0.001, q)))


class OutputLengthModel:
    """Learns output lengths and gives each request's length distribution as quantiles.

    Args:
        default_output_tokens: centre of the prior before any request completed.
        length_sigma: the stated log-normal error of predicted lengths; None = learned online
            from completed requests (RMS of log(predicted / actual)).
        prior_count: pseudo-counts of the default prior (it fades as requests complete).
        bucket_shrinkage: pseudo-counts of the all-bucket histogram in each bucket's prior.
        kernel_sigma: smoothing of the histograms, in log(tokens).
        refresh_every: recompute a bucket's smoothed prior after this many new observations.

    Per-slot state (rows of the scheduler's decode table) lives in :attr:`quantiles` and
    :attr:`predicted`, grown on demand.
    """

    def __init__(
        self,
        default_output_tokens: int,
        *,
        length_sigma: float | None = None,
        prior_count: float = 8.0,
        bucket_shrinkage: float = 32.0,
        kernel_sigma: float = 0.15,
        refresh_every: int = 32,
    ) -> None:
        self.length_sigma = length_sigma
        self._counts = np.zeros((NUM_BUCKETS, GRID_POINTS))
        self._total = np.zeros(GRID_POINTS)
        prior = np.exp(-0.5 * ((_LOG_GRID - math.log(default_output_tokens)) / 1.5) ** 2)
        self._default = prior_count * prior / prior.sum()
        self._shrink = bucket_shrinkage
        half = int(4 * kernel_sigma / _DLOG) + 1
        k = np.exp(-0.5 * (np.arange(-half, half + 1) * _DLOG / kernel_sigma) ** 2)
        self._kernel = k / k.sum()
        self._refresh_every = refresh_every
        self._since: list[int] = [refresh_every] * NUM_BUCKETS
        self._prior: list[np.ndarray] = [self._default.copy() for _ in range(NUM_BUCKETS)]
        self._err_sq = 0.0
        self._err_n = 0
        self.num_observed = 0
        self.quantiles = np.ones((256, NUM_QUANTILES))
        self.predicted = np.zeros(256)  # the predicted length a row was admitted with (0: none)

    # ---- learning ------------------------------------------------------------------
    def observe(self, input_tokens: int, output_tokens: int, predicted_tokens: int = 0) -> None:
        """A request completed after ``output_tokens``; ``predicted_tokens`` (0 = none) is the
        length it was predicted to have, to learn the predictor's error."""
        out = max(1, output_tokens)
        j = min(GRID_POINTS - 1, int(round(math.log(min(out, MAX_TOKENS)) / _DLOG)))
        b = input_bucket(input_tokens)
        self._counts[b, j] += 1.0
        self._total[j] += 1.0
        self._since[b] += 1
        self.num_observed += 1
        if predicted_tokens > 0:
            self._err_sq += math.log(predicted_tokens / out) ** 2
            self._err_n += 1

    @property
    def sigma(self) -> float:
        """The predictor's log-normal error in use: stated, or learned (1.0 until 16 samples)."""
        if self.length_sigma is not None:
            return self.length_sigma
        if self._err_n < 16:
            return 1.0
        return math.sqrt(self._err_sq / self._err_n)

    def prior(self, input_tokens: int) -> np.ndarray:
        """Unnormalised prior weights over the log grid for a prompt of this length."""
        b = input_bucket(input_tokens)
        if self._since[b] >= self._refresh_every:
            n_tot = self._total.sum()
            raw = self._counts[b].copy()
            if n_tot > 0:
                raw += self._shrink * self._total / n_tot
            sm = np.convolve(raw, self._kernel, mode="same")
            self._prior[b] = sm + self._default
            self._since[b] = 0
        return self._prior[b]

    def length_quantiles(self, input_tokens: int, predicted_tokens: int = 0) -> np.ndarray:
        """The :data:`NUM_QUANTILES` quantiles (tokens, ascending) of the output length of a
        request with this prompt and predicted length (0 = none)."""
        sigma = self.sigma
        if predicted_tokens > 0 and sigma <= 1e-3:
            return np.full(NUM_QUANTILES, float(predicted_tokens))
        w = self.prior(input_tokens)
        if predicted_tokens > 0:
            s = max(sigma, _DLOG)
            w = w * np.exp(-0.5 * ((math.log(predicted_tokens) - _LOG_GRID) / s) ** 2)
        cdf = np.cumsum(w)
        if not cdf[-1] > 0:  # the prediction is far outside the prior: trust it
            return np.full(NUM_QUANTILES, float(max(1, predicted_tokens)))
        cdf /= cdf[-1]
        return np.maximum(1.0, np.exp(np.interp(_PROBS, cdf, _LOG_GRID)))

    # ---- per-row state -------------------------------------------------------------
    def set_row(self, slot: int, quantiles: np.ndarray, predicted_tokens: int) -> None:
        """Store a row's quantiles (grows the arrays as the decode table grows)."""
        if slot >= len(self.predicted):
            cap = max(2 * len(self.predicted), slot + 1)
            q = np.ones((cap, NUM_QUANTILES))
            q[: len(self.predicted)] = self.quantiles
            p = np.zeros(cap)
            p[: len(self.predicted)] = self.predicted
            self.quantiles, self.predicted = q, p
        self.quantiles[slot] = quantiles
        self.predicted[slot] = predicted_tokens


def survival(quantiles: np.ndarray, gen_now: np.ndarray, gen_t: np.ndarray) -> np.ndarray:
    """P(still decoding after ``gen_t`` tokens | still decoding after ``gen_now``), per row.

    Args:
        quantiles: (rows, NUM_QUANTILES) length quantiles, tokens.
        gen_now / gen_t: (rows,) tokens generated now and at the future time (gen_t >= gen_now).

    A request that already outlived every quantile keeps a heavy tail: ``(1 + gen_now) /
    (1 + gen_t)`` (the conditional survival of a Pareto tail of index 1).
    """
    alive_now = (quantiles > gen_now[:, None]).sum(axis=1)
    alive_t = (quantiles > gen_t[:, None]).sum(axis=1)
    tail = (1.0 + gen_now) / (1.0 + gen_t)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(alive_now > 0, alive_t / np.maximum(alive_now, 1), tail)
    return p


def quantile_loads(
    p: np.ndarray, ctx_tokens: np.ndarray, inst: np.ndarray, num_inst: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Moments of (n, ctx) per instance from per-row presence probabilities.

    Args:
        p: (rows,) probability each row is decoding at t.
        ctx_tokens: (rows,) its context tokens then.
        inst: (rows,) instance index of each row.
        num_inst: number of instance columns.

    Returns:
        (E[n], E[ctx], S0, S1, S2) per instance, where ``S_k = sum p(1-p) a^k``; the variance
        of ``alpha*n + beta*ctx`` is ``alpha^2 S0 + 2 alpha beta S1 + beta^2 S2``.
    """
    v = p * (1.0 - p)
    mean_n = np.bincount(inst, weights=p, minlength=num_inst)
    mean_ctx = np.bincount(inst, weights=p * ctx_tokens, minlength=num_inst)
    s0 = np.bincount(inst, weights=v, minlength=num_inst)
    s1 = np.bincount(inst, weights=v * ctx_tokens, minlength=num_inst)
    s2 = np.bincount(inst, weights=v * ctx_tokens * ctx_tokens, minlength=num_inst)
    return mean_n, mean_ctx, s0, s1, s2


def linear_quantile(const: float, alpha: float, beta: float, mean_n: float, mean_ctx: float,
                    s0: float, s1: float, s2: float, z: float) -> float:
    """``mu + z * sd`` of ``const + alpha * n + beta * ctx`` (see :func:`quantile_loads`)."""
    mu = const + alpha * mean_n + beta * mean_ctx
    var = alpha * alpha * s0 + 2.0 * alpha * beta * s1 + beta * beta * s2
    return mu + z * math.sqrt(max(0.0, var))


def pick_decode_quantile(
    table: DecodeTable, lengths: OutputLengthModel,
    decode_coefficients: tuple[float, float, float], num_indexes: int,
    live: Sequence[DecodeInstance], nows: Sequence[tuple[int, float, float]],
    vnow: Sequence[float], now: float, t_join: float, input_tokens: int, tbt_slo_s: float,
    admit_probability: float,
) -> tuple[DecodeInstance, float, float, float]:
    """``predicted-quantile``'s choice of decode instance (kvstored/scheduler/admission.py).

    For every live decode instance: the distribution of its load at ``t_join`` with the new
    request added (module doc), summarised as the ``admit_probability`` quantile. The instance
    with the lowest quantile load is chosen. The token rate between now and ``t_join`` is the
    mean of the step time now and the step time at the expected batch then (as
    ``predicted-length``).

    Args:
        table: the decode table (read only); ``lengths`` its rows' length distributions
            (a row is added when the table holds more than it has).
        decode_coefficients: the cost model's ``(d0, db, dc)`` of the decode step time.
        num_indexes: decode instance indexes handed out (the table's instance columns).
        live: live decode instances; ``nows`` their (num_running, context_tokens, step_s) now;
            ``vnow`` their token clocks now.
        now / t_join: the current time and the predicted end of the request's prefill, s.
        input_tokens: the new request's prompt length.
        tbt_slo_s: its TBT SLO.
        admit_probability: the probability of fitting that admission requires.

    Returns:
        (instance, its quantile load, its expected TBT with the request (s), its expected load).
    """
    tab = table
    lm = lengths
    h = tab.hi
    if lm.quantiles.shape[0] < h:  # rows added before this mode was in use
        lm.set_row(h - 1, np.ones(NUM_QUANTILES), 0)
    k = num_indexes
    inv = np.zeros(k)
    vclock = np.zeros(k)
    for d, (_, _, step), v in zip(live, nows, vnow, strict=True):
        inv[d.idx] = 1.0 / step
        vclock[d.idx] = v
    inst = tab.inst[:h]
    run = tab.run[:h]
    el = t_join - tab.start[:h]
    present = tab.act[:h] & (el >= 0)
    gen_now = np.where(run, vclock[inst] - tab.vjoin[:h], 0.0)
    quant = lm.quantiles[:h]
    inp = tab.inp[:h]
    d0, db, dc = decode_coefficients

    def moments(rate: np.ndarray) -> tuple[np.ndarray, ...]:
        r = rate[inst]
        gen_t = np.where(run, gen_now + (t_join - now) * r, np.maximum(el, 0.0) * r)
        p = np.where(present, survival(quant, gen_now, gen_t), 0.0)
        return quantile_loads(p, inp + gen_t, inst, k)

    mean_n, mean_ctx, *_ = moments(inv)
    for d in live:
        i = d.idx
        later = (d0 + db * mean_n[i] + dc * mean_ctx[i]) / d.spec.relative_speed
        inv[i] = 2.0 / (1.0 / inv[i] + later)
    mean_n, mean_ctx, s0, s1, s2 = moments(inv)
    z = admit_z(admit_probability)
    best: DecodeInstance | None = None
    best_q = best_mean = best_tbt = 0.0
    for d, (n_rep, ctx_rep, _) in zip(live, nows, strict=True):
        i = d.idx
        en, ec = float(mean_n[i]), float(mean_ctx[i])
        extra = n_rep - len(d.running)
        if d.reported is not None and extra > 0:
            # requests the engine runs that this scheduler did not place: assume they stay
            en += extra
            ec += ctx_rep * extra / n_rep
        sp = d.spec.relative_speed * tbt_slo_s
        terms = [((d0 + db + dc * input_tokens) / sp, db / sp, dc / sp)]
        if d.kv_capacity_tokens:
            terms.append((input_tokens / d.kv_capacity_tokens, 0.0, 1.0 / d.kv_capacity_tokens))
        if d.max_batch:
            # n is a count: n + 1 <= max_batch <=> n < max_batch - 0.5 (continuity correction)
            terms.append((0.5 / d.max_batch, 1.0 / d.max_batch, 0.0))
        mom = (en, ec, float(s0[i]), float(s1[i]), float(s2[i]))
        q_load = max(linear_quantile(c, a, b, *mom, z) for c, a, b in terms)
        mean_load = max(linear_quantile(c, a, b, *mom, 0.0) for c, a, b in terms)
        if best is None or q_load < best_q:
            best, best_q, best_mean = d, q_load, mean_load
            best_tbt = (d0 + db * (en + 1) + dc * (ec + input_tokens)) / d.spec.relative_speed
    assert best is not None
    return best, best_q, best_tbt, best_mean
