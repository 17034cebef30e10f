"""Settings of the SLO-aware scheduler (``[scheduler]`` section; see :class:`SchedulerConfig`).

The string enums here are the names users type (``--policy kvcache-centric``) and the names the
replay reports use, so they are :class:`enum.StrEnum`.
"""

from __future__ import annotations

import pathlib
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Policy(StrEnum):
    """How the prefill instance is chosen (Mooncake FAST'25 §5 / arXiv 2407.00079 §6)."""

    RANDOM = "random"
    """Uniformly at random (seeded)."""
    LOAD_BALANCING = "load-balancing"
    """Shortest predicted queue; the cache is ignored when choosing."""
    CACHE_AWARE = "cache-aware"
    """Minimum predicted TTFT counting only the prefix cached on the instance's own node."""
    KVCACHE_CENTRIC = "kvcache-centric"
    """Minimum predicted TTFT counting the best prefix anywhere in the cluster plus its transfer."""


class AdmissionMode(StrEnum):
    """When and on what a request is refused (arXiv 2407.00079 §7)."""

    NONE = "none"
    """Accept everything (no SLO check anywhere); for comparison only."""
    REJECT_AT_DECODE = "reject-at-decode"
    """Baseline: check the TTFT SLO at arrival; the decode instance refuses after prefill."""
    EARLY = "early"
    """Check TTFT and the *current* decode load at arrival."""
    PREDICTED = "predicted"
    """Check TTFT and the decode load predicted for the moment this request's prefill ends,
    assuming every request decodes for one uniform time (the paper's method)."""
    PREDICTED_LENGTH = "predicted-length"
    """Ours (ablation): like PREDICTED, but each request in flight is predicted to leave decode
    after its own expected output length at the instance's step time, instead of after one
    uniform time."""
    PREDICTED_ADAPTIVE = "predicted-adaptive"
    """Ours: PREDICTED_LENGTH's prediction, judged per decode instance with a margin learned
    online: the scheduler records how far the measured load at handoff was from the predicted
    one, and admits when the request fits with probability >= c / (1 + c), where c (the mean
    prefill load, capped at 1) is the chance that a wasted prefill displaces another request.
    Idle prefill -> admit liberally (a waste costs nothing); saturated prefill -> admit when
    more likely than not to fit."""
    PREDICTED_QUANTILE = "predicted-quantile"
    """Ours, for unknown output lengths: every request in flight has an output-length
    *distribution* (completed requests' lengths per input-length bucket, combined with the
    request's predicted length under a stated or learned log-normal error), conditioned on the
    tokens it has already generated; the decode load at the join time is then a distribution,
    and a request is admitted when it fits with probability >= ``admit_probability`` (default
    c / (1 + c) as in PREDICTED_ADAPTIVE). Exact lengths make it PREDICTED_LENGTH; a point-mass
    length at the mean decode time makes it PREDICTED. See kvstored/scheduler/lengths.py."""


class SchedulerConfig(BaseModel):
    """Settings of the SLO-aware scheduler (Mooncake's Conductor).

    Every field has a default, so ``SchedulerConfig()`` is a working embedded scheduler.
    """

    model_config = ConfigDict(extra="forbid", validate_default=True)

    policy: Policy = Policy.KVCACHE_CENTRIC
    """Prefill placement policy. Default kvcache-centric."""
    admission: AdmissionMode = AdmissionMode.PREDICTED_ADAPTIVE
    """Admission mode. Default predicted-adaptive (ours; rejects least on the replayed trace,
    see docs/scheduler.md)."""
    ttft_slo_s: float = Field(default=30.0, gt=0)
    """TTFT objective used when a request does not carry its own, seconds. Default 30."""
    tbt_slo_s: float = Field(default=0.1, gt=0)
    """TBT objective used when a request does not carry its own, seconds. Default 0.1."""
    max_load_ratio: float = Field(default=1.0, gt=0)
    """A decode instance whose load (predicted TBT / TBT SLO, or KV tokens / KV capacity) would
    exceed this is overloaded. Default 1.0."""
    block_tokens: int = Field(default=256, gt=0)
    """Tokens per block, to turn cached blocks into cached tokens. Default 256 (the store's)."""
    profile_path: pathlib.Path | None = None
    """Cost-model profile JSON (``kvstored calibrate`` writes one); None = the shipped A800-like
    profile."""
    kvcache_balancing_threshold: float = Field(default=1.0, ge=1.0)
    """Fetch a remote prefix only when it is at least this many times longer than the local one
    (and the cost model says fetching is faster). Default 1.0: the cost model alone decides."""
    initial_decode_s: float = Field(default=20.0, gt=0)
    """Uniform decode time assumed by the ``predicted`` mode before any request finished,
    seconds. Afterwards an EWMA of observed decode times is used. Default 20."""
    decode_ewma_alpha: float = Field(default=0.02, gt=0, le=1)
    """Weight of each finished request in the EWMA of decode time. Default 0.02."""
    default_output_tokens: int = Field(default=256, gt=0)
    """Expected output length assumed for a request that gives none. Default 256."""
    decode_hard_limit: bool = True
    """Decode instances refuse a request that would overload them when its prefill finishes
    (every admission mode except ``none``). Default true."""
    decode_load_scope: Literal["mean", "instance"] = "instance"
    """What early and predicted admission compare with the limit: the load of the decode
    instance the request would go to (default), or the mean decode load over instances with
    this request on the chosen one (the arXiv report's wording for the predicted mode).
    predicted-adaptive always judges the chosen instance."""
    error_window: int = Field(default=512, ge=16)
    """predicted-adaptive: how many recent prediction errors the margin is learned from."""
    admit_probability: float | None = Field(default=None, gt=0, lt=1)
    """predicted-quantile: admit when the request fits with at least this probability; None =
    c / (1 + c), c = mean prefill load capped at 1 (a wasted prefill displaces another request
    with probability about c). Default None."""
    length_sigma: float | None = Field(default=None, ge=0)
    """predicted-quantile: the stated log-normal error (sigma of log(predicted / actual)) of the
    expected output lengths requests carry; None = learned online from completed requests.
    Default None."""
    repick_decode: bool = False
    """When the decode instance planned at arrival refuses a request after its prefill, try the
    least-loaded other instance before refusing it. Default false (Mooncake's behaviour: the
    pair is chosen at arrival)."""
    instance_ttl_s: float | None = Field(default=30.0, gt=0)
    """An instance that has not registered or reported load for this long is not chosen,
    seconds; None disables the check. Default 30."""
    seed: int = 0
    """Seed of the random policy."""
