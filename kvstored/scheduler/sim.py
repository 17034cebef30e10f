"""Discrete-event replay of a request trace through the scheduler core.

The simulator owns the "hardware": prefill instances (each a FIFO that runs one prefill at a
time, on its own node with a block cache of ``cache_blocks`` under the store's eviction policy)
and decode instances (continuous batching: every step emits one token for each running request
and lasts ``tbt_s(batch, context)`` of the cost model). The *decisions* are all made by
:class:`~kvstored.scheduler.core.Scheduler`, the same code the gRPC service runs; the simulator
reports load back to it as engines would.

Decode is simulated per instance in "virtual tokens": between two membership changes the batch
is fixed, so every member advances by ``elapsed / step_s`` tokens; a request finishes when the
instance's virtual token counter passes ``join + output_tokens``. This makes a replay cost
O(events), not O(tokens). Per-request TBT is the mean of the slowest 10% of its token gaps
(FAST'25's definition), computed from the step-time history of its instance.

Arrival times are divided by ``speed`` (2.0 = the trace played twice as fast). Everything is
deterministic for a fixed seed.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from kvstored.errors import InvalidArgument
from kvstored.scheduler.cache import BlockCache, EvictionPolicy
from kvstored.scheduler.config import AdmissionMode, Policy, SchedulerConfig
from kvstored.scheduler.core import Scheduler
from kvstored.scheduler.costmodel import CostModel, CostProfile
from kvstored.scheduler.trace import TRACE_BLOCK_TOKENS, TraceRecord
from kvstored.scheduler.types import InstanceSpec, RejectReason, Role, ScheduleRequest

ProgressFn = Callable[[int], None]
"""Called with the number of requests that arrived since the previous call."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The simulated cluster and workload settings of one replay.

    Attributes:
        num_prefill: prefill instances, each on its own node with its own block cache.
        num_decode: decode instances.
        cache_blocks: cache capacity of each prefill node, blocks; None = unlimited.
        cache_policy: eviction policy of those caches.
        decode_relative_speed: speed of a decode instance relative to the profile (0.5 = a
            decode instance with half the GPUs of the profile's).
        decode_kv_capacity_tokens: KV capacity of a decode instance; 0 = the profile's.
        speed: arrival-time compression (2.0 replays the trace twice as fast).
        block_tokens: tokens per trace block (512 in the Mooncake traces).
        ttft_slo_s / tbt_slo_s: objectives of every request.
        length_noise: sigma of a log-normal error on the expected output length given to the
            scheduler (0 = it is told each request's true output length).
        sample_interval_s: period of the load timeline samples, simulated seconds.
        seed: seeds the random policy and the length noise.
        profile: the cost profile (None = the shipped default).
        copy_bytes_per_s: the rate a planned fetch's copy from another node really runs
            at, bytes/s (e.g. ``bench/bench_remote_get.py``'s measured GB/s): the prefill
            then waits ``fetched bytes / rate`` for it, plus the engine's load of those
            blocks from its own node's DRAM, instead of the cost model's remote transfer
            time (the scheduler still predicts with its model); 0 = the model's.
    """

    num_prefill: int = 8
    num_decode: int = 8
    cache_blocks: int | None = 10_000
    cache_policy: EvictionPolicy = EvictionPolicy.STORE
    decode_relative_speed: float = 1.0
    decode_kv_capacity_tokens: int = 0
    speed: float = 1.0
    block_tokens: int = TRACE_BLOCK_TOKENS
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.1
    length_noise: float = 0.0
    sample_interval_s: float = 10.0
    seed: int = 0
    profile: CostProfile | None = None
    copy_bytes_per_s: float = 0.0

    def validate(self) -> None:
        """Raises InvalidArgument naming the bad setting."""
        if self.num_prefill < 1 or self.num_decode < 1:
            raise InvalidArgument(
                f"need at least one prefill and one decode instance, got {self.num_prefill} "
                f"prefill and {self.num_decode} decode"
            )
        if self.cache_blocks is not None and self.cache_blocks < 1:
            raise InvalidArgument(
                f"cache_blocks must be >= 1 or unlimited, got {self.cache_blocks}"
            )
        if self.decode_kv_capacity_tokens < 0:
            raise InvalidArgument(
                f"decode_kv_capacity_tokens must be >= 0, got {self.decode_kv_capacity_tokens}"
            )
        for name in ("speed", "ttft_slo_s", "tbt_slo_s", "sample_interval_s",
                     "decode_relative_speed"):
            if not getattr(self, name) > 0:
                raise InvalidArgument(f"{name} must be > 0, got {getattr(self, name)}")
        if self.length_noise < 0:
            raise InvalidArgument(f"length_noise must be >= 0, got {self.length_noise}")
        if self.copy_bytes_per_s < 0:
            raise InvalidArgument(
                f"copy_bytes_per_s must be >= 0 (0 = the cost model's), got "
                f"{self.copy_bytes_per_s}")

    def describe(self) -> dict[str, object]:
        """JSON-able summary (the profile by name)."""
        d = {k: v for k, v in asdict(self).items() if k != "profile"}
        d["cache_policy"] = str(self.cache_policy)
        d["profile"] = (self.profile or CostProfile.default()).name
        return d


@dataclass(slots=True)
class ReplayResult:
    """Outcome of one (policy, admission mode) replay. Times are simulated seconds.

    Attributes:
        policy / admission: what ran.
        num_requests: requests in the trace.
        completed: requests that finished decoding.
        rejected: refused at arrival or after prefill.
        rejected_by_reason: the same split by :class:`RejectReason`.
        wasted_prefills: prefilled, then refused by decode.
        avg_ttft_s / p90_ttft_s: TTFT of completed requests.
        avg_tbt_s: mean per-request TBT (slowest 10% of its gaps) of completed requests.
        tbt_slo_attainment: fraction of completed requests whose TBT met the TBT SLO.
        completed_within_slo: completed requests that met both SLOs (goodput).
        hit_ratio: reused blocks / blocks over every prefilled request.
        fetched_blocks: blocks fetched from another node (kvcache-centric).
        admitted: requests admitted at arrival.
        copies: admitted requests whose plan copies blocks from another node.
        copied_bytes: bytes those copies move (fetched blocks x block bytes of the profile).
        copy_s: total time the copies took (the model's or ``copy_bytes_per_s``'s), seconds.
        mean_prefill_load / mean_decode_load: time averages of the timeline.
        decode_load_std / prefill_load_std: their standard deviations (oscillation).
        load_correlation: Pearson correlation of prefill and decode load (anti-phase < 0).
        makespan_s: simulated time until the last request finished.
        length_noise / seed / speed: the cluster's settings this run used (robustness sweeps).
        wall_s: real seconds the replay took (not deterministic; excluded from comparisons).
        timeline: ``[t_s, mean prefill load, mean decode load]`` every sample interval.
    """

    policy: str
    admission: str
    num_requests: int
    completed: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    wasted_prefills: int = 0
    avg_ttft_s: float = 0.0
    p90_ttft_s: float = 0.0
    avg_tbt_s: float = 0.0
    tbt_slo_attainment: float = 0.0
    completed_within_slo: int = 0
    hit_ratio: float = 0.0
    fetched_blocks: int = 0
    admitted: int = 0
    copies: int = 0
    copied_bytes: int = 0
    copy_s: float = 0.0
    mean_prefill_load: float = 0.0
    mean_decode_load: float = 0.0
    prefill_load_std: float = 0.0
    decode_load_std: float = 0.0
    load_correlation: float = 0.0
    makespan_s: float = 0.0
    length_noise: float = 0.0
    seed: int = 0
    speed: float = 1.0
    wall_s: float = 0.0
    timeline: list[list[float]] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """Everything but the timeline, JSON-able."""
        d = asdict(self)
        d.pop("timeline")
        return d


class _NodeCacheIndex:
    """PrefixIndex over the simulated per-node caches (all blocks in DRAM)."""

    __slots__ = ("caches",)

    def __init__(self, caches: Mapping[str, BlockCache]) -> None:
        self.caches = caches

    def match_prefix(
        self, keys: Sequence[Hashable], node_ids: Sequence[str]
    ) -> Mapping[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        caches = self.caches
        for node in node_ids:
            c = caches.get(node)
            if c is None:
                continue
            nb = c.prefix_blocks(keys)
            if nb:
                out[node] = (nb, 0)
        return out


class _DecodeSim:
    """One decode instance in virtual tokens (see module doc)."""

    __slots__ = (
        "iid", "cost", "v", "t", "step", "n", "s_in", "s_vjoin", "heap", "members", "seg_v",
        "seg_step", "nseg", "version", "seq", "speed",
    )

    def __init__(self, iid: str, cost: CostModel, speed: float = 1.0) -> None:
        self.iid = iid
        self.cost = cost
        self.speed = speed
        self.v = 0.0
        self.t = 0.0
        self.step = cost.tbt_s(0, 0) / speed
        self.n = 0
        self.s_in = 0
        self.s_vjoin = 0.0
        self.heap: list[tuple[float, int, str]] = []
        self.members: dict[str, tuple[float, int, int, float]] = {}
        # step-time history: segment i starts at virtual token seg_v[i] and lasts seg_step[i]
        self.seg_v = np.zeros(1024)
        self.seg_step = np.zeros(1024)
        self.seg_step[0] = self.step
        self.nseg = 1
        self.version = 0
        self.seq = 0

    def advance(self, now: float) -> None:
        if self.n:
            self.v += (now - self.t) / self.step
        self.t = now

    def ctx(self) -> float:
        return self.s_in + self.n * self.v - self.s_vjoin

    def join(self, rid: str, input_tokens: int, tokens: int, now: float) -> None:
        v = self.v
        self.members[rid] = (v, input_tokens, tokens, now)
        self.seq += 1
        heapq.heappush(self.heap, (v + tokens, self.seq, rid))
        self.n += 1
        self.s_in += input_tokens
        self.s_vjoin += v

    def leave(self, rid: str) -> tuple[float, int, int, float]:
        vj, inp, tokens, tj = self.members.pop(rid)
        self.n -= 1
        self.s_in -= inp
        self.s_vjoin -= vj
        if self.n == 0:  # reset to keep floating error from accumulating
            self.s_in = 0
            self.s_vjoin = 0.0
        return vj, inp, tokens, tj

    def restep(self) -> None:
        step = self.cost.tbt_s(self.n, self.ctx()) / self.speed
        if step != self.step:
            self.step = step
            k = self.nseg
            if self.seg_v[k - 1] == self.v:
                self.seg_step[k - 1] = step
                return
            if k == len(self.seg_v):
                self.seg_v = np.concatenate([self.seg_v, np.zeros(k)])
                self.seg_step = np.concatenate([self.seg_step, np.zeros(k)])
            self.seg_v[k] = self.v
            self.seg_step[k] = step
            self.nseg = k + 1

    def next_finish_s(self) -> float | None:
        if not self.heap:
            return None
        return self.t + max(0.0, self.heap[0][0] - self.v) * self.step

    def slow_tbt_s(self, vj: float, vf: float) -> float:
        """Mean of the slowest 10% of the gaps between virtual tokens vj and vf."""
        sv = self.seg_v[: self.nseg]
        i0 = max(0, int(np.searchsorted(sv, vj, "right")) - 1)
        i1 = int(np.searchsorted(sv, vf, "left"))
        if i1 <= i0:
            return self.step
        lo = np.maximum(sv[i0:i1], vj)
        hi = np.empty(i1 - i0)
        hi[:-1] = sv[i0 + 1 : i1]
        hi[-1] = vf
        tok = np.maximum(np.minimum(hi, vf) - lo, 0.0)
        steps = self.seg_step[i0:i1]
        order = np.argsort(-steps, kind="stable")
        tok_o = tok[order]
        st_o = steps[order]
        cum = np.cumsum(tok_o)
        if cum[-1] <= 0:
            return self.step
        want = min(max(1.0, 0.1 * (vf - vj)), float(cum[-1]))
        k = int(np.searchsorted(cum, want - 1e-9))
        k = min(k, len(cum) - 1)
        prev = float(cum[k - 1]) if k > 0 else 0.0
        tot = float(np.dot(st_o[:k], tok_o[:k])) + float(st_o[k]) * (want - prev)
        return tot / want


_PREFILL_DONE = 0
_DECODE = 1
_SAMPLE = 2


def replay(
    records: Sequence[TraceRecord],
    policy: Policy,
    admission: AdmissionMode,
    cluster: ClusterConfig,
    *,
    progress: ProgressFn | None = None,
) -> ReplayResult:
    """Replay a trace through one (policy, admission mode) and measure the outcome.

    Args:
        records: the trace, sorted by timestamp.
        policy: prefill placement policy.
        admission: admission mode.
        cluster: the simulated cluster.
        progress: optional callback fed with arrivals (for a progress bar).

    Raises:
        InvalidArgument: a bad cluster setting, or records out of order.
    """
    cluster.validate()
    wall0 = time.perf_counter()
    profile = cluster.profile or CostProfile.default()
    cost = CostModel(profile, cluster.block_tokens)
    now_box = [0.0]
    caches = {
        f"node-p{i}": BlockCache(cluster.cache_blocks, cluster.cache_policy)
        for i in range(cluster.num_prefill)
    }
    cfg = SchedulerConfig(
        policy=policy, admission=admission, ttft_slo_s=cluster.ttft_slo_s,
        tbt_slo_s=cluster.tbt_slo_s, block_tokens=cluster.block_tokens, seed=cluster.seed,
        instance_ttl_s=None,
    )
    sched = Scheduler(cfg, cost, lambda: now_box[0], _NodeCacheIndex(caches))
    prefill_ids = [f"prefill-{i}" for i in range(cluster.num_prefill)]
    for i, pid in enumerate(prefill_ids):
        sched.register_instance(InstanceSpec(pid, f"node-p{i}", Role.PREFILL))
    decodes: dict[str, _DecodeSim] = {}
    for i in range(cluster.num_decode):
        did = f"decode-{i}"
        sched.register_instance(InstanceSpec(
            did, f"node-d{i}", Role.DECODE, relative_speed=cluster.decode_relative_speed,
            kv_capacity_tokens=cluster.decode_kv_capacity_tokens,
        ))
        decodes[did] = _DecodeSim(did, cost, cluster.decode_relative_speed)
        sched.report_decode_load(did, 0, 0.0, decodes[did].step)
    node_of = {pid: f"node-p{i}" for i, pid in enumerate(prefill_ids)}
    busy = dict.fromkeys(prefill_ids, 0.0)

    noise_rng = random.Random(cluster.seed + 1)
    sigma = cluster.length_noise
    speed = cluster.speed
    ttft_slo, tbt_slo = cluster.ttft_slo_s, cluster.tbt_slo_s

    events: list[tuple[float, int, int, str, int]] = []
    seq = 0
    res = ReplayResult(str(policy), str(admission), len(records), length_noise=sigma,
                       seed=cluster.seed, speed=speed)
    ttfts: list[float] = []
    tbts: list[float] = []
    ttft_of: dict[str, float] = {}
    prefill_of: dict[str, tuple[str, tuple[int, ...]]] = {}
    input_of: dict[str, int] = {}
    decode_tokens_of: dict[str, int] = {}
    blocks_total = 0
    blocks_reused = 0
    fetched = 0
    within = 0
    timeline: list[list[float]] = []
    last_arrival_s = records[-1].timestamp_ms / 1000.0 / speed if records else 0.0
    interval = cluster.sample_interval_s
    heapq.heappush(events, (0.0, -1, _SAMPLE, "", 0))

    def push_decode(d: _DecodeSim) -> None:
        nonlocal seq
        d.version += 1
        t = d.next_finish_s()
        if t is not None:
            seq += 1
            heapq.heappush(events, (t, seq, _DECODE, d.iid, d.version))

    def report(d: _DecodeSim) -> None:
        sched.report_decode_load(d.iid, d.n, d.ctx(), d.step)

    idx = 0
    n_rec = len(records)
    pending_progress = 0
    last_ts = -1
    while idx < n_rec or len(events) > 1 or (events and events[0][2] != _SAMPLE):
        next_arrival = records[idx].timestamp_ms / 1000.0 / speed if idx < n_rec else math.inf
        if events and events[0][0] < next_arrival:
            t, _, kind, rid, ver = heapq.heappop(events)
            now_box[0] = t
            if kind == _SAMPLE:
                timeline.append([t, sched.mean_prefill_load(), sched.mean_decode_load()])
                if idx < n_rec or len(events) > 0:
                    heapq.heappush(events, (t + interval, -1, _SAMPLE, "", 0))
                continue
            if kind == _PREFILL_DONE:
                pid, keys = prefill_of.pop(rid)
                caches[node_of[pid]].access(keys)
                hand = sched.start_decode(rid)
                if not hand.admitted:
                    res.wasted_prefills += 1
                    ttft_of.pop(rid, None)
                    decode_tokens_of.pop(rid, None)
                    input_of.pop(rid, None)
                    continue
                d = decodes[hand.decode_instance_id]  # type: ignore[index]  # an admitted handoff names its decode instance
                d.advance(t)
                d.join(rid, input_of.pop(rid), decode_tokens_of.pop(rid), t)
                d.restep()
                report(d)
                push_decode(d)
                continue
            # decode event
            d = decodes[rid]
            if ver != d.version:
                continue
            d.advance(t)
            heap = d.heap
            lim = d.v + 1e-6
            while heap and heap[0][0] <= lim:
                vf, _, fid = heapq.heappop(heap)
                vj, _inp, tokens, tj = d.leave(fid)
                tbt = d.slow_tbt_s(vj, vf)
                tbts.append(tbt)
                ttft = ttft_of.pop(fid)
                ttfts.append(ttft)
                if ttft <= ttft_slo and tbt <= tbt_slo:
                    within += 1
                sched.finish_request(fid, tokens)
            d.restep()
            report(d)
            push_decode(d)
            continue
        # arrival
        rec = records[idx]
        idx += 1
        if rec.timestamp_ms < last_ts:
            raise InvalidArgument(f"trace records out of order at record {idx}")
        last_ts = rec.timestamp_ms
        now = next_arrival
        now_box[0] = now
        pending_progress += 1
        if progress is not None and pending_progress >= 256:
            progress(pending_progress)
            pending_progress = 0
        rid = str(idx)
        out_tokens = max(1, rec.output_tokens)
        expected = out_tokens
        if sigma > 0:
            expected = max(1, round(out_tokens * math.exp(noise_rng.gauss(0.0, sigma))))
        dec = sched.schedule(ScheduleRequest(rid, rec.hash_ids, rec.input_tokens, expected))
        if not dec.admitted:
            continue
        assert dec.prefill_instance_id is not None
        pid = dec.prefill_instance_id
        node = node_of[pid]
        if dec.local_blocks:
            caches[node].touch(rec.hash_ids[: dec.local_blocks])
        res.admitted += 1
        transfer_s = dec.predicted_transfer_s
        if dec.fetched_blocks and dec.prefix_node_id is not None:
            caches[dec.prefix_node_id].touch(rec.hash_ids[: dec.reused_blocks])
            fetched += dec.fetched_blocks
            nbytes = dec.fetched_blocks * cost.block_bytes
            fs = dec.fetched_ssd_blocks
            model_s = (cost.transfer_s(dec.fetched_blocks - fs, remote=True)
                       + cost.transfer_s(fs, remote=True, ssd=True))
            # executed: the node-to-node copy, then the engine's load from its own DRAM
            copy_s = (nbytes / cluster.copy_bytes_per_s
                      + cost.transfer_s(dec.fetched_blocks, remote=False)
                      if cluster.copy_bytes_per_s else model_s)
            transfer_s += copy_s - model_s
            res.copies += 1
            res.copied_bytes += nbytes
            res.copy_s += copy_s
        blocks_total += len(rec.hash_ids)
        blocks_reused += dec.reused_blocks
        start = max(now, busy[pid])
        finish = start + transfer_s + dec.predicted_prefill_s
        busy[pid] = finish
        ttft_of[rid] = finish - now
        decode_tokens_of[rid] = out_tokens
        input_of[rid] = rec.input_tokens
        prefill_of[rid] = (pid, rec.hash_ids)
        seq += 1
        heapq.heappush(events, (finish, seq, _PREFILL_DONE, rid, 0))
    if progress is not None and pending_progress:
        progress(pending_progress)

    res.completed = len(ttfts)
    res.rejected_by_reason = {
        str(r): c for r, c in sched.num_rejected.items() if c and r is not RejectReason.NO_INSTANCE
    } | ({"no_instance": sched.num_rejected[RejectReason.NO_INSTANCE]}
         if sched.num_rejected[RejectReason.NO_INSTANCE] else {})
    res.rejected = sum(sched.num_rejected.values())
    if ttfts:
        res.avg_ttft_s = sum(ttfts) / len(ttfts)
        res.p90_ttft_s = _percentile(ttfts, 0.9)
        res.avg_tbt_s = sum(tbts) / len(tbts)
        res.tbt_slo_attainment = sum(1 for x in tbts if x <= tbt_slo) / len(tbts)
    res.completed_within_slo = within
    res.hit_ratio = blocks_reused / blocks_total if blocks_total else 0.0
    res.fetched_blocks = fetched
    res.makespan_s = now_box[0]
    active = [row for row in timeline if row[0] <= last_arrival_s]
    res.timeline = [[round(a, 3), round(b, 5), round(c, 5)] for a, b, c in timeline]
    if active:
        pl = [r[1] for r in active]
        dl = [r[2] for r in active]
        res.mean_prefill_load = sum(pl) / len(pl)
        res.mean_decode_load = sum(dl) / len(dl)
        res.prefill_load_std = _std(pl)
        res.decode_load_std = _std(dl)
        res.load_correlation = _corr(pl, dl)
    res.wall_s = time.perf_counter() - wall0
    return res


def _percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _std(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _corr(xs: Sequence[float], ys: Sequence[float]) -> float:
    sx, sy = _std(xs), _std(ys)
    if sx == 0 or sy == 0:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / (len(xs) * sx * sy)
