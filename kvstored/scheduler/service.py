"""The gRPC SchedulerService: a thin adapter over :class:`~kvstored.scheduler.core.Scheduler`.

Hosted by the master (inside ``kvstored serve`` while the master is embedded there) through
:func:`add_scheduler_service`. Every method decodes the request, calls the pure core on the
event loop (no locks: one loop), and encodes the answer; a :class:`KvstoredError` becomes a gRPC
status with the error code in the ``kvstored-error-code`` trailing metadata.

Where prefixes are cached comes from two sources, merged per node:

- what instances report (``ReportLoad.added_block_keys`` / ``removed_block_keys``: KV events
  of the blocks cached on their node), and
- optionally a ``block_locator`` (the store's index): ``locator(keys)`` returns one entry per
  *leading* present key (stopping at the first miss); an entry is a :class:`Tier` (the block
  is on the store that hosts this scheduler, which every instance treats as local: the
  single-host embedded daemon), a ``(node_id, Tier)`` pair, or a sequence of such pairs (one
  per replica). It may be a plain function or return an awaitable.

On the master (``kvstored master``, kvstored/master/scheduling.py) the locator reads the
master's block index, so ``prefix_node_id`` is the node that really holds the prefix, and a
``copier`` carries a planned fetch out: when a decision names ``replicate_keys`` for a
prefill instance on another node than the prefix's, the servicer starts one owned task that
asks the prefill instance's node to pull those blocks in (``NodeService.Prefetch``: the
cluster get path) before the engine's prefill. ``ScheduleRequest.copy_wait_ms`` waits for
it; ``AwaitCopy`` tells later. The copy is an optimisation, never a correctness condition:
a block it did not bring is a miss for the engine's own load (which then fetches or
recomputes it). Under leader election (``gate``) only the leading master answers; a
follower answers every call NotLeader naming the leader, as the MasterService does.

Roles (docs/security.md; the caller's principal is its TLS certificate's, TRUSTED_LOCAL on a
plaintext port, which holds every role): :data:`METHOD_ROLES` says who may call each method,
checked before the method runs. Instances (their node or their engine) register, unregister,
report load and drive requests (``Schedule``, ``Report*Finished``); every authenticated
caller may read the state (``DescribeScheduler``); the scheduler has no config-change RPC
(its config is the file), so nothing is admin-only yet. A refusal is ``PermissionDenied``
(gRPC PERMISSION_DENIED) naming the method, the roles it needs and the caller.

Metrics (``registry`` argument, default a private registry exposed as
``servicer.metrics.registry``): ``kvstored_scheduler_admissions_total``,
``kvstored_scheduler_rejections_total{reason}``, ``kvstored_scheduler_wasted_prefills_total``,
``kvstored_scheduler_predicted_ttft_seconds``, ``kvstored_scheduler_observed_ttft_seconds``,
``kvstored_scheduler_ttft_error_seconds`` (observed - predicted),
``kvstored_scheduler_instance_load_ratio{instance,role}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvstored.auth import Role as AuthRole
from kvstored.auth import require_role
from kvstored.errors import InvalidArgument, KvstoredError, NotFound, NotLeader
from kvstored.rpc_status import grpc_status, grpc_trailing_metadata
from kvstored.scheduler.config import SchedulerConfig
from kvstored.scheduler.core import Scheduler
from kvstored.scheduler.costmodel import CostModel, CostProfile
from kvstored.scheduler.types import (
    Clock,
    Decision,
    InstanceSpec,
    RejectReason,
    Role,
    ScheduleRequest,
)
from kvstored.security.identity import principal_of_call
from kvstored.transport.master_targets import LEADER_METADATA_KEY, TERM_METADATA_KEY
from kvstored.types import Tier
from kvstored.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

log = structlog.get_logger(__name__)

BlockLocator = Callable[..., Any]
"""``locator(keys[, namespace_id]) -> list[Tier | (node_id, Tier) | Sequence[(node_id, Tier)]]``
(or an awaitable of it), one entry per leading present key; called with the request's
namespace id as a second argument when the request names one."""


@dataclass(frozen=True, slots=True)
class CopyOutcome:
    """What one planned copy did.

    Attributes:
        num_fetched: blocks the prefill node copied in.
        num_missing: planned blocks not on that node afterwards.
        duration_s: wall time of the copy, seconds.
        num_bytes: bytes the copied blocks hold (their size in the index).
        message: why blocks are missing ("" when none is).
    """

    num_fetched: int
    num_missing: int
    duration_s: float
    num_bytes: int = 0
    message: str = ""


class BlockCopier(Protocol):
    """Carries a planned fetch out (kvstored/master/scheduling.py: ``NodePrefetcher``)."""

    async def prefetch(self, node_id: str, namespace_id: bytes, keys: Sequence[bytes],
                       timeout_s: float) -> CopyOutcome:
        """Have ``node_id`` copy in the blocks of ``keys`` it lacks, within ``timeout_s``
        seconds; never raises for a node's or the network's failure."""


class LeaderGate(Protocol):
    """The election as the servicer sees it (``kvstored.master.election.Elector`` fits)."""

    leader_address: str
    leader_term: int

    def is_leading(self) -> bool:
        """Whether this master may answer as leader now."""


@dataclass(slots=True)
class _CopyJob:
    node_id: str
    num_keys: int
    task: asyncio.Task[CopyOutcome]
    outcome: CopyOutcome | None = None


MAX_TRACKED_COPIES = 4096
"""Copies whose state AwaitCopy can still tell (the oldest finished ones are forgotten)."""

SHARED_NODE = ""
"""Node id under which blocks located without a node (bare :class:`Tier`) are filed: the store
hosting the scheduler, local to every instance."""

_ROLE_TO_PB = {Role.PREFILL: scheduler_pb2.INSTANCE_ROLE_PREFILL,
               Role.DECODE: scheduler_pb2.INSTANCE_ROLE_DECODE}
_ROLE_FROM_PB = {v: k for k, v in _ROLE_TO_PB.items()}
_REASON_TO_PB = {
    None: scheduler_pb2.REJECT_REASON_UNSPECIFIED,
    RejectReason.TTFT_SLO: scheduler_pb2.REJECT_REASON_TTFT_SLO,
    RejectReason.TBT_SLO: scheduler_pb2.REJECT_REASON_TBT_SLO,
    RejectReason.DECODE_OVERLOADED: scheduler_pb2.REJECT_REASON_DECODE_OVERLOADED,
    RejectReason.NO_INSTANCE: scheduler_pb2.REJECT_REASON_NO_INSTANCE,
}
_COPY_PENDING = scheduler_pb2.COPY_STATE_PENDING
_TIER_FROM_PB = {common_pb2.TIER_UNSPECIFIED: Tier.DRAM, common_pb2.DRAM: Tier.DRAM,
                 common_pb2.SSD: Tier.SSD}
_MAX_KEYS = 1 << 16

_INSTANCE_ROLES: tuple[AuthRole, ...] = ("node", "engine")
METHOD_ROLES: dict[str, tuple[AuthRole, ...]] = {
    "RegisterInstance": _INSTANCE_ROLES,
    "UnregisterInstance": _INSTANCE_ROLES,
    "ReportLoad": _INSTANCE_ROLES,
    "Schedule": _INSTANCE_ROLES,
    "ReportPrefillFinished": _INSTANCE_ROLES,
    "ReportRequestFinished": _INSTANCE_ROLES,
    "AwaitCopy": _INSTANCE_ROLES,
    "DescribeScheduler": (),  # a read: every authenticated caller, with a role or none
}
"""Who may call each SchedulerService method (:func:`kvstored.auth.require_role`); ``()`` =
any caller the TLS layer authenticated (its certificate still has to parse)."""

R = TypeVar("R")
_Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]


def _checked(fn: _Handler[R]) -> _Handler[R]:
    """Refuse a caller without one of :data:`METHOD_ROLES` ``[fn.__name__]`` before ``fn``
    runs: PERMISSION_DENIED (or UNAUTHENTICATED for a malformed certificate) with the error
    code in the trailing metadata."""
    roles = METHOD_ROLES[fn.__name__]
    action = f"SchedulerService.{fn.__name__}"

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            principal = principal_of_call(context)
            if roles:
                require_role(principal, *roles, action=action)
        except KvstoredError as exc:
            log.debug("scheduler_call_refused", method=fn.__name__, error=str(exc))
            await self._abort(context, exc)
            raise  # context.abort raises; a stand-in context that does not is refused here
        gate = self.gate
        if gate is not None and not gate.is_leading():
            leader = gate.leader_address
            refusal = NotLeader(
                f"this master does not lead (newest term {gate.leader_term}); "
                + (f"the leader is {leader}" if leader else "no leader is known right now"))
            context.set_trailing_metadata(grpc_trailing_metadata(refusal) + (
                (LEADER_METADATA_KEY, leader), (TERM_METADATA_KEY, str(gate.leader_term))))
            await context.abort(grpc_status(refusal), str(refusal))
            raise refusal  # a stand-in context whose abort returns
        return await fn(self, request, context)

    wrapper.roles = roles  # type: ignore[attr-defined]  # read by the role-table test
    return wrapper


class SchedulerMetrics:
    """The scheduler's Prometheus metrics, registered in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.admissions = Counter("kvstored_scheduler_admissions_total",
                                  "Requests admitted at arrival.", registry=r)
        self.rejections = Counter("kvstored_scheduler_rejections_total",
                                  "Requests rejected, by reason.", ["reason"], registry=r)
        self.wasted = Counter("kvstored_scheduler_wasted_prefills_total",
                              "Prefills done for requests the decode side then refused.",
                              registry=r)
        buckets = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)
        self.predicted_ttft = Histogram("kvstored_scheduler_predicted_ttft_seconds",
                                        "Predicted TTFT of admitted requests.", buckets=buckets,
                                        registry=r)
        self.observed_ttft = Histogram("kvstored_scheduler_observed_ttft_seconds",
                                       "TTFT reported when prefill finished.", buckets=buckets,
                                       registry=r)
        self.ttft_error = Histogram(
            "kvstored_scheduler_ttft_error_seconds", "Observed minus predicted TTFT.",
            buckets=(-10, -5, -2, -1, -0.5, -0.1, 0, 0.1, 0.5, 1, 2, 5, 10), registry=r,
        )
        self.copies = Counter("kvstored_scheduler_copies_total",
                              "Planned copies to prefill nodes, by outcome (done, failed).",
                              ["outcome"], registry=r)
        self.copied_blocks = Counter("kvstored_scheduler_copied_blocks_total",
                                     "Blocks planned copies moved to prefill nodes.", registry=r)
        self.copied_bytes = Counter("kvstored_scheduler_copied_bytes_total",
                                    "Bytes planned copies moved to prefill nodes.", registry=r)
        self.copy_seconds = Histogram("kvstored_scheduler_copy_seconds",
                                      "Wall time of one planned copy.",
                                      buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2,
                                               5, 10, 30), registry=r)
        self.load = Gauge("kvstored_scheduler_instance_load_ratio",
                          "Prefill: queue / TTFT SLO; decode: decode load (1 = at the limit).",
                          ["instance", "role"], registry=r)


class ReportedBlockIndex:
    """Blocks cached per node, from instance reports and an optional block locator.

    Implements :class:`~kvstored.scheduler.core.PrefixIndex` once :meth:`snapshot` added the
    locator's answer for one request.
    """

    def __init__(self, locator: BlockLocator | None = None) -> None:
        self.locator = locator
        self._nodes: dict[str, dict[bytes, Tier]] = {}

    def apply_report(self, node_id: str, added: Sequence[bytes], removed: Sequence[bytes],
                     *, clear: bool = False, tier: Tier = Tier.DRAM) -> None:
        """Apply one node's KV events (``clear`` first, then removals, then additions)."""
        blocks = self._nodes.setdefault(node_id, {})
        if clear:
            blocks.clear()
        for k in removed:
            blocks.pop(k, None)
        for k in added:
            blocks[k] = tier

    def num_blocks(self, node_id: str) -> int:
        """Blocks reported for a node."""
        return len(self._nodes.get(node_id, ()))

    async def locate(self, keys: Sequence[bytes],
                     namespace_id: bytes = b"") -> list[list[tuple[str, Tier]]]:
        """Ask the locator (if any); normalise to one list of (node, tier) per leading key.

        ``namespace_id`` (when not empty) is passed as the locator's second argument.

        A locator that fails is logged and treated as knowing nothing (the request is then
        placed on reported caches only; a miss costs recomputation, never correctness).
        """
        if self.locator is None or not keys:
            return []
        try:
            got = (self.locator(list(keys), namespace_id) if namespace_id
                   else self.locator(list(keys)))
            if inspect.isawaitable(got):
                got = await got
        except Exception as exc:  # degrade: a broken locator must not fail scheduling
            log.warning("block_locator_failed", error=str(exc), num_keys=len(keys))
            return []
        out: list[list[tuple[str, Tier]]] = []
        for entry in list(got)[: len(keys)]:
            if isinstance(entry, Tier | int) and not isinstance(entry, bool):
                out.append([(SHARED_NODE, Tier(int(entry)))])
            elif isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str):
                out.append([(entry[0], Tier(int(entry[1])))])
            elif entry is None:
                break
            else:
                out.append([(str(n), Tier(int(t))) for n, t in entry])
        return out

    def snapshot(self, located: list[list[tuple[str, Tier]]]) -> _SnapshotIndex:
        """A PrefixIndex over the reported caches plus one located answer."""
        return _SnapshotIndex(self._nodes, located)


class _SnapshotIndex:
    def __init__(self, nodes: Mapping[str, Mapping[bytes, Tier]],
                 located: list[list[tuple[str, Tier]]]) -> None:
        self._nodes = nodes
        self._located = located

    def _located_prefix(self, node_id: str) -> tuple[int, int]:
        nb = ns = 0
        for replicas in self._located:
            best: Tier | None = None
            for n, t in replicas:
                if n in (node_id, SHARED_NODE):
                    best = t if best is None or t < best else best
            if best is None:
                break
            nb += 1
            ns += best is Tier.SSD
        return nb, ns

    def match_prefix(
        self, keys: Sequence[Hashable], node_ids: Sequence[str]
    ) -> Mapping[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for node in node_ids:
            blocks = self._nodes.get(node, {})
            nb = ns = 0
            for k in keys:
                t = blocks.get(k)  # type: ignore[call-overload]  # the keys are block hashes (bytes); match_prefix types them Hashable
                if t is None:
                    break
                nb += 1
                ns += t is Tier.SSD
            lb, ls = self._located_prefix(node)
            if lb > nb:
                nb, ns = lb, ls
            if nb:
                out[node] = (nb, ns)
        # nodes holding a prefix that run no prefill instance are fetch sources too
        extra: set[str] = set()
        for replicas in self._located:
            extra.update(n for n, _ in replicas if n != SHARED_NODE)
        extra.update(self._nodes)
        for node in sorted(extra - set(node_ids)):
            blocks = self._nodes.get(node, {})
            nb = ns = 0
            for k in keys:
                t = blocks.get(k)  # type: ignore[call-overload]  # the keys are block hashes (bytes); the signature types them Hashable
                if t is None:
                    break
                nb += 1
                ns += t is Tier.SSD
            lb, ls = self._located_prefix(node)
            if lb > nb:
                nb, ns = lb, ls
            if nb:
                out[node] = (nb, ns)
        return out


def group_blocks(keys: Sequence[bytes], located: list[list[tuple[str, Tier]]],
                 per_block: int) -> tuple[list[bytes], list[list[tuple[str, Tier]]]]:
    """Per-layer keys -> one representative key (the block's first) per block.

    Args:
        keys: block-major, ``per_block`` keys per block.
        located: one ``[(node, tier)]`` per leading located key (as :meth:`ReportedBlockIndex.locate`).
        per_block: keys of one block.

    Returns:
        ``(representatives, located per leading block)``: a block is on a node when every
        one of its keys is (its tier there is the slowest of them); stops at the first
        block no node holds whole.
    """
    reps = [keys[i] for i in range(0, len(keys), per_block)]
    out: list[list[tuple[str, Tier]]] = []
    for b in range(len(located) // per_block):
        group = located[b * per_block:(b + 1) * per_block]
        tiers: dict[str, Tier] = {}
        for n, t in group[0]:
            tiers[n] = max(t, tiers.get(n, t))
        for entry in group[1:]:
            here: dict[str, Tier] = {}
            for n, t in entry:
                if n in tiers:
                    here[n] = max(t, tiers[n], here.get(n, t))
            tiers = here
        if not tiers:
            break
        out.append(sorted(tiers.items()))
    return reps, out


def _ms(seconds: float) -> int:
    return max(0, min(int(round(seconds * 1000)), 2**32 - 1))


def _us(seconds: float) -> int:
    return max(0, min(int(round(seconds * 1e6)), 2**32 - 1))


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    """gRPC adapter over one :class:`Scheduler`.

    Args:
        config: scheduler settings.
        block_locator: optional store index (see module doc).
        clock: seconds, monotonic (default ``time.monotonic``).
        registry: Prometheus registry for the metrics (default: a private one).
        copier: carries planned fetches out (None: decisions only name them).
        copy_timeout_s: deadline of one planned copy, seconds.
        gate: the election (None: this process always answers).

    Raises:
        ConfigInvalid: the configured cost profile cannot be read.
    """

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        block_locator: BlockLocator | None = None,
        clock: Clock = time.monotonic,
        registry: CollectorRegistry | None = None,
        copier: BlockCopier | None = None,
        copy_timeout_s: float = 10.0,
        gate: LeaderGate | None = None,
    ) -> None:
        self.config = config or SchedulerConfig()
        profile = (CostProfile.load(self.config.profile_path) if self.config.profile_path
                   else CostProfile.default())
        self.index = ReportedBlockIndex(block_locator)
        self.core = Scheduler(self.config, CostModel(profile, self.config.block_tokens), clock,
                              self.index.snapshot([]))
        self.metrics = SchedulerMetrics(registry)
        self._roles: dict[str, Role] = {}
        self._nodes: dict[str, str] = {}
        self.copier = copier
        self.copy_timeout_s = float(copy_timeout_s)
        self.gate = gate
        self._copies: OrderedDict[str, _CopyJob] = OrderedDict()
        self.copy_hook: Callable[[str], Awaitable[None]] | None = None
        """Test hook: awaited with the request id inside each copy task, before the copy
        starts (holds a copy at a known step; never set in production)."""

    # ---- planned copies --------------------------------------------------------------
    def _start_copy(self, d: Decision, namespace_id: bytes) -> _CopyJob | None:
        """Start the copy a decision plans (an owned task), or None when there is none."""
        if self.copier is None or not d.admitted or not d.replicate_keys:
            return None
        node = self._nodes.get(d.prefill_instance_id or "")
        keys = [k for k in d.replicate_keys if isinstance(k, bytes)]
        if not node or not keys or node == d.prefix_node_id:
            return None
        old = self._copies.pop(d.request_id, None)
        if old is not None:
            old.task.cancel()
        copier, timeout_s, rid = self.copier, self.copy_timeout_s, d.request_id

        async def run() -> CopyOutcome:
            if self.copy_hook is not None:
                await self.copy_hook(rid)
            return await copier.prefetch(node, namespace_id, keys, timeout_s)

        job = _CopyJob(node, len(keys), asyncio.create_task(run(), name=f"scheduler-copy-{rid}"))

        def done(task: asyncio.Task[CopyOutcome]) -> None:
            if task.cancelled():
                job.outcome = CopyOutcome(0, job.num_keys, 0.0, 0, "the copy was cancelled")
                return
            exc = task.exception()
            job.outcome = task.result() if exc is None else CopyOutcome(
                0, job.num_keys, 0.0, 0, f"the copy failed: {type(exc).__name__}: {exc}")
            o = job.outcome
            self.metrics.copies.labels("done" if not o.num_missing else "failed").inc()
            self.metrics.copied_blocks.inc(o.num_fetched)
            self.metrics.copied_bytes.inc(o.num_bytes)
            self.metrics.copy_seconds.observe(o.duration_s)
            log.info("scheduler_copy_finished", request_id=rid, node_id=node,
                     num_fetched=o.num_fetched, num_missing=o.num_missing,
                     duration_ms=round(o.duration_s * 1000, 1), error=o.message)

        job.task.add_done_callback(done)
        self._copies[d.request_id] = job
        while len(self._copies) > MAX_TRACKED_COPIES:
            oldest = next((k for k, j in self._copies.items() if j.task.done()), None)
            if oldest is None:
                break
            del self._copies[oldest]
        return job

    async def _wait_copy(self, job: _CopyJob, timeout_s: float) -> None:
        if timeout_s > 0 and not job.task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(job.task), timeout_s)
        if job.task.done() and job.outcome is None:
            await asyncio.sleep(0)  # the done callback runs on the next loop pass

    @staticmethod
    def _copy_fields(job: _CopyJob | None) -> dict[str, Any]:
        if job is None:
            return {}
        o = job.outcome
        if o is None:
            return {"copy_state": _COPY_PENDING}
        return {"copy_state": (scheduler_pb2.COPY_STATE_DONE if not o.num_missing
                               else scheduler_pb2.COPY_STATE_FAILED),
                "copied_blocks": o.num_fetched, "missing_blocks": o.num_missing,
                "copy_ms": _ms(o.duration_s), "copied_bytes": o.num_bytes,
                "copy_message": o.message}

    async def close(self) -> None:
        """Cancel the copies still running and wait for them (the owner's stop)."""
        tasks = [j.task for j in self._copies.values() if not j.task.done()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # ---- helpers ---------------------------------------------------------------------
    async def _abort(self, context: grpc.aio.ServicerContext, exc: KvstoredError) -> None:
        context.set_trailing_metadata(grpc_trailing_metadata(exc))
        await context.abort(grpc_status(exc), str(exc))

    def _refresh_load_gauges(self) -> None:
        for st in self.core.describe():
            self.metrics.load.labels(st.spec.instance_id, str(st.spec.role)).set(st.load)

    # ---- RPCs ------------------------------------------------------------------------
    @_checked
    async def RegisterInstance(  # noqa: N802 (gRPC method names)
        self, request: scheduler_pb2.RegisterInstanceRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.RegisterInstanceResponse:
        info = request.instance
        try:
            role = _ROLE_FROM_PB.get(info.role)
            if role is None:
                raise InvalidArgument(
                    f"instance.role must be INSTANCE_ROLE_PREFILL or INSTANCE_ROLE_DECODE, got "
                    f"{info.role}"
                )
            spec = InstanceSpec(info.instance_id, info.node_id, role,
                                relative_speed=info.relative_speed or 1.0,
                                max_running_requests=info.max_running_requests,
                                kv_capacity_tokens=info.kv_capacity_tokens)
            self.core.register_instance(spec)
        except KvstoredError as exc:
            await self._abort(context, exc)
        self._roles[info.instance_id] = role  # type: ignore[assignment]  # role is not None here: a bad role raised above (and _abort raises)
        self._nodes[info.instance_id] = info.node_id
        log.info("scheduler_instance_registered", instance_id=info.instance_id,
                 node_id=info.node_id, role=str(role))
        self._refresh_load_gauges()
        return scheduler_pb2.RegisterInstanceResponse()

    @_checked
    async def UnregisterInstance(  # noqa: N802
        self, request: scheduler_pb2.UnregisterInstanceRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.UnregisterInstanceResponse:
        try:
            self.core.unregister_instance(request.instance_id)
        except KvstoredError as exc:
            await self._abort(context, exc)
        role = self._roles.pop(request.instance_id, None)
        self._nodes.pop(request.instance_id, None)
        if role is not None:
            with contextlib.suppress(KeyError):
                self.metrics.load.remove(request.instance_id, str(role))
        log.info("scheduler_instance_unregistered", instance_id=request.instance_id)
        return scheduler_pb2.UnregisterInstanceResponse()

    @_checked
    async def ReportLoad(  # noqa: N802
        self, request: scheduler_pb2.ReportLoadRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ReportLoadResponse:
        iid = request.instance_id
        try:
            role = self._roles.get(iid)
            if role is None:
                raise NotFound(f"no instance {iid!r} is registered; call RegisterInstance first")
            if len(request.added_block_keys) + len(request.removed_block_keys) > _MAX_KEYS:
                raise InvalidArgument(
                    f"at most {_MAX_KEYS} block keys per report, got "
                    f"{len(request.added_block_keys) + len(request.removed_block_keys)}"
                )
            reported = False
            if role is Role.PREFILL and request.HasField("queued_prefill_ms"):
                self.core.report_prefill_load(iid, request.queued_prefill_ms / 1000.0)
                reported = True
            if role is Role.DECODE and (request.HasField("num_running_requests")
                                        or request.HasField("num_context_tokens")
                                        or request.HasField("step_time_us")):
                self.core.report_decode_load(iid, request.num_running_requests,
                                             float(request.num_context_tokens),
                                             request.step_time_us / 1e6)
                reported = True
            if not reported:
                self.core.touch_instance(iid)
            if request.added_block_keys or request.removed_block_keys or request.clear_blocks:
                node = self._nodes[iid]
                self.index.apply_report(node, list(request.added_block_keys),
                                        list(request.removed_block_keys),
                                        clear=request.clear_blocks,
                                        tier=_TIER_FROM_PB.get(request.added_tier, Tier.DRAM))
        except KvstoredError as exc:
            await self._abort(context, exc)
        self._refresh_load_gauges()
        return scheduler_pb2.ReportLoadResponse()

    @_checked
    async def Schedule(  # noqa: N802
        self, request: scheduler_pb2.ScheduleRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ScheduleResponse:
        try:
            if len(request.block_keys) > _MAX_KEYS:
                raise InvalidArgument(
                    f"at most {_MAX_KEYS} block keys per request, got {len(request.block_keys)}"
                )
            keys = list(request.block_keys)
            namespace_id = bytes(request.namespace_id)
            per_block = request.keys_per_block or 1
            if len(keys) % per_block:
                raise InvalidArgument(
                    f"{len(keys)} block keys are not a whole number of blocks of "
                    f"keys_per_block={per_block} keys each")
            all_keys = keys
            located = await self.index.locate(keys, namespace_id)
            if per_block > 1:
                keys, located = group_blocks(keys, located, per_block)
            req = ScheduleRequest(
                request.request_id, keys, request.input_tokens, request.expected_output_tokens,
                ttft_slo_s=request.ttft_slo_ms / 1000.0 if request.ttft_slo_ms else None,
                tbt_slo_s=request.tbt_slo_ms / 1000.0 if request.tbt_slo_ms else None,
            )
            d = self.core.schedule(req, self.index.snapshot(located))
        except KvstoredError as exc:
            await self._abort(context, exc)
        if d.admitted:
            self.metrics.admissions.inc()
            self.metrics.predicted_ttft.observe(d.predicted_ttft_s)
        else:
            assert d.reason is not None
            self.metrics.rejections.labels(str(d.reason)).inc()
            log.debug("scheduler_request_rejected", request_id=d.request_id,
                      reason=str(d.reason), predicted_ttft_s=d.predicted_ttft_s,
                      predicted_decode_load=d.predicted_decode_load)
        if per_block > 1 and d.replicate_keys:
            first = {k: i for i, k in enumerate(keys)}
            d = dataclasses.replace(d, replicate_keys=tuple(
                k for r in d.replicate_keys
                for k in all_keys[first[r] * per_block:(first[r] + 1) * per_block]))  # type: ignore[index]  # the representatives are the request's keys
        job = self._start_copy(d, namespace_id)
        if job is not None and request.copy_wait_ms:
            await self._wait_copy(job, request.copy_wait_ms / 1000.0)
        self._refresh_load_gauges()
        out = _decision_to_pb(d)
        for name, value in self._copy_fields(job).items():
            setattr(out, name, value)
        return out

    @_checked
    async def AwaitCopy(  # noqa: N802
        self, request: scheduler_pb2.AwaitCopyRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.AwaitCopyResponse:
        job = self._copies.get(request.request_id)
        if job is None:
            return scheduler_pb2.AwaitCopyResponse()
        await self._wait_copy(job, request.timeout_ms / 1000.0)
        return scheduler_pb2.AwaitCopyResponse(node_id=job.node_id, **self._copy_fields(job))

    @_checked
    async def ReportPrefillFinished(  # noqa: N802
        self, request: scheduler_pb2.ReportPrefillFinishedRequest,
        context: grpc.aio.ServicerContext,
    ) -> scheduler_pb2.ReportPrefillFinishedResponse:
        try:
            h = self.core.start_decode(request.request_id)
        except KvstoredError as exc:
            await self._abort(context, exc)
        if request.observed_ttft_ms:
            obs = request.observed_ttft_ms / 1000.0
            self.metrics.observed_ttft.observe(obs)
            self.metrics.ttft_error.observe(obs - h.predicted_ttft_s)
        if not h.admitted:
            self.metrics.rejections.labels(str(h.reason)).inc()
            self.metrics.wasted.inc()
        self._refresh_load_gauges()
        return scheduler_pb2.ReportPrefillFinishedResponse(
            admitted=h.admitted, decode_instance_id=h.decode_instance_id or "",
            reason=_REASON_TO_PB[h.reason], decode_load=h.decode_load,
        )

    @_checked
    async def ReportRequestFinished(  # noqa: N802
        self, request: scheduler_pb2.ReportRequestFinishedRequest,
        context: grpc.aio.ServicerContext,
    ) -> scheduler_pb2.ReportRequestFinishedResponse:
        known = self.core.finish_request(request.request_id,
                                         request.num_output_tokens or None)
        job = self._copies.pop(request.request_id, None)
        if job is not None and not job.task.done():
            job.task.cancel()  # the request is over: its copy would only cost bandwidth
        self._refresh_load_gauges()
        return scheduler_pb2.ReportRequestFinishedResponse(known=known)

    @_checked
    async def DescribeScheduler(  # noqa: N802
        self, request: scheduler_pb2.DescribeSchedulerRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.DescribeSchedulerResponse:
        core = self.core
        out = scheduler_pb2.DescribeSchedulerResponse(
            policy=str(core.policy), admission=str(core.admission),
            num_admitted=core.num_admitted, num_completed=core.num_completed,
            profile=core.cost.profile.name, uniform_decode_s=core.uniform_decode_s,
        )
        for reason, count in core.num_rejected.items():
            out.num_rejected[str(reason)] = count
        for st in core.describe():
            s = st.spec
            out.instances.append(scheduler_pb2.InstanceStatus(
                instance=scheduler_pb2.InstanceInfo(
                    instance_id=s.instance_id, node_id=s.node_id, role=_ROLE_TO_PB[s.role],
                    relative_speed=s.relative_speed, max_running_requests=s.max_running_requests,
                    kv_capacity_tokens=s.kv_capacity_tokens,
                ),
                load=st.load, queued_prefill_ms=_ms(st.queued_prefill_s),
                num_running_requests=st.num_running, num_context_tokens=st.num_context_tokens,
                num_incoming_requests=st.num_incoming, step_time_us=_us(st.step_s),
                last_seen_age_ms=_ms(st.last_seen_age_s),
            ))
        self._refresh_load_gauges()
        return out


def _decision_to_pb(d: Decision) -> scheduler_pb2.ScheduleResponse:
    msg = ""
    if d.reason is RejectReason.TTFT_SLO:
        msg = f"predicted TTFT {d.predicted_ttft_s:.3f} s misses the TTFT SLO"
    elif d.reason is RejectReason.TBT_SLO:
        msg = f"predicted decode load {d.predicted_decode_load:.3f} exceeds the limit"
    elif d.reason is RejectReason.NO_INSTANCE:
        msg = "no live prefill or decode instance is registered"
    return scheduler_pb2.ScheduleResponse(
        admitted=d.admitted, reason=_REASON_TO_PB[d.reason], message=msg,
        prefill_instance_id=d.prefill_instance_id or "",
        decode_instance_id=d.decode_instance_id or "",
        num_blocks=d.num_blocks, reused_blocks=d.reused_blocks, local_blocks=d.local_blocks,
        fetched_blocks=d.fetched_blocks, fetched_ssd_blocks=d.fetched_ssd_blocks,
        prefix_node_id=d.prefix_node_id or "",
        replicate_block_keys=[k for k in d.replicate_keys if isinstance(k, bytes)],
        predicted_queue_ms=_ms(d.predicted_queue_s),
        predicted_transfer_ms=_ms(d.predicted_transfer_s),
        predicted_prefill_ms=_ms(d.predicted_prefill_s),
        predicted_ttft_ms=_ms(d.predicted_ttft_s), predicted_tbt_us=_us(d.predicted_tbt_s),
        predicted_decode_load=d.predicted_decode_load,
    )


def add_scheduler_service(
    server: grpc.aio.Server,
    config: SchedulerConfig | None = None,
    *,
    block_locator: BlockLocator | None = None,
    registry: CollectorRegistry | None = None,
    clock: Clock = time.monotonic,
    copier: BlockCopier | None = None,
    copy_timeout_s: float = 10.0,
    gate: LeaderGate | None = None,
) -> SchedulerServicer:
    """Create a :class:`SchedulerServicer` and add it to ``server`` (before it starts).

    Args:
        server: the grpc.aio server of the hosting process.
        config: scheduler settings (default ``SchedulerConfig()``).
        block_locator: the store's block index, see the module doc; None = only the caches
            instances report count.
        registry: Prometheus registry for the scheduler metrics (pass the process's).
        clock: seconds, monotonic.
        copier / copy_timeout_s / gate: as :class:`SchedulerServicer`'s.

    Returns:
        The servicer (its ``core`` is the plain-Python scheduler).

    Raises:
        ConfigInvalid: the configured cost profile cannot be read.
    """
    servicer = SchedulerServicer(config, block_locator=block_locator, clock=clock,
                                 registry=registry, copier=copier,
                                 copy_timeout_s=copy_timeout_s, gate=gate)
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    log.info("scheduler_service_created", policy=str(servicer.core.policy),
             admission=str(servicer.core.admission), profile=servicer.core.cost.profile.name)
    return servicer
