"""The prefill side of the scheduler: prefill instances and the choice of one for a request.

Per prefill instance ``i`` (Algorithm 1 of FAST'25, "Conductor")::

    TTFT_i = queue_i + min over reuse options k of (transfer_i(k) + prefill(n, cached(k)))

where the options are: recompute everything (k = 0), reuse the prefix on ``i``'s own node, and
(kvcache-centric only) fetch the longest prefix held by any node, when it is at least
``kvcache_balancing_threshold`` times the local one. The policy picks ``i``: random, shortest
queue (load-balancing), or minimum TTFT (cache-aware: own node only; kvcache-centric: all
options); ties go to the first registered.

Source: Mooncake arXiv 2407.00079 §6 and FAST'25 §5 (Algorithm 1).
Not thread-safe; the scheduler's thread or event loop only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvstored.scheduler.config import Policy
from kvstored.scheduler.costmodel import CostModel
from kvstored.scheduler.types import InstanceSpec, PrefixIndex


@dataclass(slots=True)
class PrefillInstance:
    """A registered prefill instance and its predicted queue."""

    spec: InstanceSpec
    busy_until_s: float = 0.0
    last_seen_s: float = 0.0
    num_scheduled: int = 0


@dataclass(frozen=True, slots=True)
class PrefillChoice:
    """The prefill instance chosen for a request and the parts of its predicted TTFT.

    Attributes:
        instance: the chosen instance.
        prefix_node_id: the node with the longest cached prefix (kvcache-centric), or None.
        queue_s / transfer_s / prefill_s: parts of the TTFT, seconds.
        local_blocks: leading blocks reused from the instance's own node.
        fetched_blocks: further blocks fetched from ``prefix_node_id``.
        fetched_ssd_blocks: of those, how many come from its SSD.
    """

    instance: PrefillInstance
    prefix_node_id: str | None
    queue_s: float
    transfer_s: float
    prefill_s: float
    local_blocks: int
    fetched_blocks: int
    fetched_ssd_blocks: int

    @property
    def ttft_s(self) -> float:
        """Predicted TTFT: queue + transfer + prefill, seconds."""
        return self.queue_s + self.transfer_s + self.prefill_s


def choose_prefill(
    prefills: Sequence[PrefillInstance], keys: Sequence[Hashable], input_tokens: int, *,
    now: float, policy: Policy, cost: CostModel, prefix_index: PrefixIndex,
    balancing_threshold: float, rng: random.Random,
) -> PrefillChoice:
    """Choose the prefill instance for a request (see the module docstring).

    Args:
        prefills: the live prefill instances, in registration order (at least one).
        keys: the request's block keys.
        input_tokens: its prompt length.
        now: the scheduler's clock, seconds.
        policy: how to choose.
        cost: predicted durations.
        prefix_index: where prefixes are cached (asked once, for the instances' nodes).
        balancing_threshold: kvcache-centric fetches a remote prefix only when it is at least
            this many times the local one.
        rng: the random policy's generator (one draw per call with that policy).

    Returns:
        The choice; nothing is changed (the caller books the queue on admission).
    """
    n_tok = input_tokens
    # every policy reuses what the chosen instance's node holds (engines do); only
    # kvcache-centric also looks at other nodes' prefixes
    match = (
        prefix_index.match_prefix(keys, sorted({p.spec.node_id for p in prefills}))
        if keys else {}
    )
    holder: str | None = None
    g_blocks = 0
    g_ssd = 0
    if policy is Policy.KVCACHE_CENTRIC:
        for node, (nb, ns) in match.items():
            if nb > g_blocks or (nb == g_blocks and holder is not None and node < holder):
                holder, g_blocks, g_ssd = node, nb, ns

    cached = cost.cached_tokens
    tr = cost.transfer_s
    thr = balancing_threshold

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
        chosen = prefills[rng.randrange(len(prefills))]
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
    return PrefillChoice(chosen, holder, q, t_x, t_p, local_used, fetched, fetched_ssd)
