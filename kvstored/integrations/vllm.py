"""``KvstoredConnector``: vLLM's v1 KV connector over a kvstored node (pinned: vllm 0.32.0).

The only kvstored module that imports vllm (its connector API is experimental). Turn it on
with ``KVTransferConfig(kv_connector="KvstoredConnector",
kv_connector_module_path="kvstored.integrations.vllm", kv_role="kv_both",
kv_load_failure_policy="recompute", kv_connector_extra_config={...})``; the extra keys are
:class:`~kvstored.integrations.blockio.ConnectorConfig`.

Flow of one request (scheduler role in the engine core, worker role in each worker)::

    scheduler  get_num_new_matched_tokens  lookup_prefix(keys of the blocks past the local hit)
                                           -> leading blocks present, block-aligned, leaving
                                           >= 1 token to compute (a failure = 0, never waits
                                           past lookup_timeout_ms)
               update_state_after_alloc    remembers (hash, block id) of the blocks to load
               build_connector_meta        loads + the blocks this step completes (saves)
    worker     handle_preemptions          waits for saves of preempted requests
               start_load_kv               get_into straight into the paged KV rows (sync,
                                           before the forward); failed blocks ->
                                           get_block_ids_with_load_errors -> vLLM recomputes
               wait_for_save               queues the saves (background thread)
               get_finished                a finished request whose saves are done; only then
                                           does vLLM free its blocks (request_finished=True)

Scheduler registration (``scheduler_address`` in the extra config; off by default): the
scheduler role registers the engine's prefill and decode instances with the SchedulerService
on the master, under its node's id (Describe), so the scheduler places requests on it and
knows its cache is that node's; shutdown unregisters them. A failed registration is logged
and the engine serves anyway.

Keys and namespace: :mod:`kvstored.integrations.blockio`. vLLM's block hashes already chain
the tokens, the cache_salt and LoRA/multimodal extras; the namespace adds model, revision,
KV dtype, layout, block size, TP size and rank, and the cache_salt as tenant salt.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.logger import init_logger

from kvstored.errors import InvalidArgument, KvstoredError
from kvstored.integrations.blockio import (
    BlockIO,
    ClientPool,
    ConnectorConfig,
    ConnectorStats,
    StatsWriter,
    block_keys,
)
from kvstored.keys import Namespace

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger(__name__)

_KV_DTYPES = {
    "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
}
_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")


@dataclass
class KvstoredConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells the workers for one step (plain data; pickled to workers).

    Attributes:
        loads: (request id, tenant salt, [(block hash, block id)]) to load before the forward.
        saves: (request id, tenant salt, [(block hash, block id)]) completed by this step.
        preempted: request ids preempted by this step (their saves must finish first).
    """

    loads: list[tuple[str, str, list[tuple[bytes, int]]]] = field(default_factory=list)
    saves: list[tuple[str, str, list[tuple[bytes, int]]]] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)


_INTERVAL_COUNTERS = ("blocks_loaded", "bytes_loaded", "load_errors", "blocks_saved",
                      "bytes_saved", "save_errors")


@dataclass
class KvstoredConnectorStats(KVConnectorStats):
    """Worker counters of one logging interval, summed over workers; vLLM's stat logger
    prints :meth:`reduce` ("KV Transfer metrics") next to its own.
    """

    def reset(self) -> None:
        """Start a new interval."""
        self.data: dict[str, int | float] = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Add another worker's (or interval's) counters."""
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        """The interval's counters (MiB for byte counts)."""
        out: dict[str, int | float] = {}
        for key, value in sorted(self.data.items()):
            if key.startswith("bytes_"):
                out[key.replace("bytes_", "MiB_")] = round(value / 2**20, 1)
            else:
                out[key] = value
        return out

    def is_empty(self) -> bool:
        """No block moved and nothing failed in this interval."""
        return not any(self.data.values())


@dataclass
class _RequestState:
    request: Any
    salt: str
    lookup: tuple[int, int, int, float] | None = None  # first block, end block, hits, time
    pending_load: list[tuple[bytes, int]] | None = None
    next_save_block: int | None = None
    has_saves: bool = False


def _kv_layers(kv_cache_config: KVCacheConfig) -> tuple[list[str], Any]:
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise InvalidArgument(
            f"KvstoredConnector supports models with one KV cache group (full attention); got "
            f"{len(groups)} groups"
        )
    spec = groups[0].kv_cache_spec
    for attr in ("num_kv_heads", "head_size", "dtype"):
        if not hasattr(spec, attr):
            raise InvalidArgument(
                f"KvstoredConnector needs an attention KV cache spec; got {type(spec).__name__}"
            )
    return list(groups[0].layer_names), spec


def namespace_fields(
    vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, tp_rank: int
) -> dict[str, str | int]:
    """The Namespace fields (all but ``tenant_salt``) of an engine, before overrides.

    ``kv_layout`` names the platform, vLLM's block-hash algorithm, the layer count and the
    per-layer block shape, so blocks of engines whose bytes differ never share a key.
    """
    from vllm.platforms import current_platform

    layer_names, spec = _kv_layers(kv_cache_config)
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    cache_dtype = str(cache.cache_dtype)
    if cache_dtype == "auto":
        kv_dtype = str(spec.dtype).removeprefix("torch.")
    else:
        kv_dtype = _KV_DTYPES.get(cache_dtype, cache_dtype)
    hash_algo = str(getattr(cache, "prefix_caching_hash_algo", "sha256"))
    layout = (
        f"vllm-{current_platform.device_type}-paged:{hash_algo}:L{len(layer_names)}:"
        f"H{spec.num_kv_heads}:D{spec.head_size}:pp{parallel.pipeline_parallel_size}"
    )
    return {
        "model_id": _UNPRINTABLE.sub("_", str(model.model))[-256:],
        "revision": _UNPRINTABLE.sub("_", str(model.revision or "main"))[:256],
        "kv_dtype": kv_dtype,
        "kv_layout": layout,
        "block_size": int(cache.block_size),
        "tp_size": int(parallel.tensor_parallel_size),
        "tp_rank": int(tp_rank),
    }


class KvstoredConnector(KVConnectorBase_V1):
    """vLLM KV connector storing full KV blocks in kvstored (scheduler and worker roles).

    Args:
        vllm_config: the engine config; ``kv_transfer_config.kv_connector_extra_config``
            holds the :class:`~kvstored.integrations.blockio.ConnectorConfig` keys.
        role: SCHEDULER or WORKER.
        kv_cache_config: the engine's KV cache layout (one full-attention group).

    Raises:
        InvalidArgument: bad extra config, or a KV cache layout this connector cannot store
            (several KV cache groups, non-attention layers).
    """

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = self._kv_transfer_config
        self._config = ConnectorConfig.from_extra(ktc.kv_connector_extra_config)
        if getattr(ktc, "kv_load_failure_policy", "recompute") != "recompute":
            # A miss must never fail a request: the engine recomputes what could not load.
            logger.warning("KvstoredConnector: setting kv_load_failure_policy=recompute")
            ktc.kv_load_failure_policy = "recompute"
        self._layer_names, _ = _kv_layers(kv_cache_config)
        self._num_layers = len(self._layer_names)
        self._block_size = int(vllm_config.cache_config.block_size)
        hash_bs = getattr(kv_cache_config, "hash_block_size", None) or self._block_size
        if self._block_size % hash_bs:
            raise InvalidArgument(
                f"vLLM block size {self._block_size} is not a multiple of its hash block size "
                f"{hash_bs}"
            )
        self._hashes_per_block = self._block_size // hash_bs
        tp_rank = 0
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            tp_rank = get_tensor_model_parallel_rank()
        fields = namespace_fields(vllm_config, kv_cache_config, tp_rank)
        unknown = set(self._config.namespace) - set(fields)
        if unknown:
            raise InvalidArgument(
                f"kv_connector_extra_config.namespace: unknown field(s) {sorted(unknown)}; "
                f"known: {sorted(fields)} (tenant_salt comes from each request's cache_salt)"
            )
        fields.update(self._config.namespace)
        Namespace(**fields)  # type: ignore[arg-type]  # validate now, not on the first request
        self.namespace_fields = fields
        self._clients = ClientPool(
            lambda salt: Namespace(**fields, tenant_salt=salt),  # type: ignore[arg-type]  # the Namespace validates its fields at run time
            self._config,
        )
        self._clients.get("")  # connect now, not inside the first scheduling step
        self.stats = ConnectorStats(extra={"namespace": fields})
        name = "scheduler" if role == KVConnectorRole.SCHEDULER else f"worker{tp_rank}"
        self._stats_writer = StatsWriter(self._config.stats_dir, f"{name}-{os.getpid()}")
        # scheduler side
        self.scheduler_instances: dict[str, str] = {}  # role -> instance id registered
        if role == KVConnectorRole.SCHEDULER and self._config.scheduler_address:
            self._register_with_scheduler()
        self._requests: dict[str, _RequestState] = {}
        self._lookups_off_until = 0.0
        self._step_lookup_s = 0.0
        # worker side
        self._io: BlockIO | None = None
        self._load_errors: set[int] = set()
        self._stats_reported: dict[str, int] = {}
        logger.info(
            "KvstoredConnector %s: address %s, namespace %s", name,
            self._config.address or "(default)", fields,
        )

    # ---- helpers -----------------------------------------------------------------------------
    def _register_with_scheduler(self) -> None:
        """Register this engine's instances (``scheduler_*`` of the extra config); a failure
        is logged, never raised: the engine serves without the scheduler."""
        import socket

        from kvstored.scheduler.ctl import register_engine

        cfg = self._config
        assert cfg.scheduler_address is not None
        timeout_s = cfg.timeout_ms / 1000
        try:
            node_id = cfg.scheduler_node_id or self._clients.get("").describe(
                timeout_s=timeout_s).node_id
            self.scheduler_instances = register_engine(
                cfg.scheduler_address, cfg.scheduler_instance_id
                or f"{socket.gethostname()}:{os.getpid()}", node_id, cfg.scheduler_roles,
                timeout_s=timeout_s)
        except KvstoredError as exc:
            logger.warning("KvstoredConnector: registering with the scheduler at %s failed: %s",
                           cfg.scheduler_address, exc)
            return
        logger.info("KvstoredConnector: registered %s (node %s) with the scheduler at %s",
                    self.scheduler_instances, node_id, cfg.scheduler_address)

    def _block_hashes(self, request: Request, num_blocks: int) -> list[bytes]:
        hashes = request.block_hashes
        k = self._hashes_per_block
        return [bytes(hashes[(j + 1) * k - 1]) for j in range(num_blocks)]

    def _num_hashed_blocks(self, request: Request) -> int:
        return len(request.block_hashes) // self._hashes_per_block

    def _write_stats(self) -> None:
        try:
            self._stats_writer.write(self.stats.to_dict())
        except OSError as exc:
            logger.warning("KvstoredConnector: cannot write stats: %s", exc)

    # ---- scheduler side ----------------------------------------------------------------------
    def on_new_request(self, request: Request) -> None:
        """Track the request (its block hashes grow as tokens are appended)."""
        self._requests[request.request_id] = _RequestState(request, request.cache_salt or "")

    def _state(self, request: Request) -> _RequestState:
        st = self._requests.get(request.request_id)
        if st is None:
            st = _RequestState(request, request.cache_salt or "")
            self._requests[request.request_id] = st
        return st

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Tokens past ``num_computed_tokens`` whose KV the node holds (block-aligned).

        Leaves at least one token to compute. Costs one ``lookup_prefix`` RPC under
        ``lookup_timeout_ms`` (cached for the request until its blocks are allocated); any
        failure is a miss and pauses lookups for ``retry_after_ms``.
        """
        st = self._state(request)
        bs = self._block_size
        first = num_computed_tokens // bs
        end = min(self._num_hashed_blocks(request), (request.num_tokens - 1) // bs)
        if end <= first:
            return 0, False
        now = time.monotonic()
        if st.lookup is not None and st.lookup[:2] == (first, end) and now - st.lookup[3] < 1.0:
            return st.lookup[2] * bs, False
        if now < self._lookups_off_until:
            return 0, False
        keys = block_keys(self._block_hashes(request, end)[first:], self._num_layers)
        t0 = time.perf_counter()
        try:
            present = self._clients.get(st.salt).lookup_prefix(
                keys, timeout_s=self._config.lookup_timeout_ms / 1000
            )
        except KvstoredError as exc:
            self.stats.lookup_errors += 1
            self._lookups_off_until = now + self._config.retry_after_ms / 1000
            logger.warning("KvstoredConnector: lookup failed (%s); misses for %d ms",
                           type(exc).__name__, self._config.retry_after_ms)
            present = 0
        dt = time.perf_counter() - t0
        self.stats.lookups += 1
        self.stats.lookup_s_total += dt
        self.stats.lookup_s_max = max(self.stats.lookup_s_max, dt)
        self._step_lookup_s += dt
        hits = present // self._num_layers
        st.lookup = (first, end, hits, now)
        return hits * bs, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Remember which allocated blocks the worker must fill from the node."""
        st = self._state(request)
        if num_external_tokens <= 0 or st.lookup is None:
            st.lookup = None
            return
        first = st.lookup[0]
        num = num_external_tokens // self._block_size
        block_ids = blocks.get_block_ids()[0]
        hashes = self._block_hashes(request, first + num)
        st.pending_load = [(hashes[j], int(block_ids[j])) for j in range(first, first + num)]
        st.lookup = None
        self.stats.hit_tokens += num_external_tokens

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """This step's loads, saves of newly completed blocks, and preempted requests."""
        meta = KvstoredConnectorMetadata()
        bs = self._block_size
        for rid in scheduler_output.preempted_req_ids or ():
            meta.preempted.add(rid)
            st = self._requests.get(rid)
            if st is not None:
                st.next_save_block, st.pending_load, st.lookup = None, None, None
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            computed[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
        for rid, before in computed.items():
            st = self._requests.get(rid)
            if st is None:
                continue
            if st.next_save_block is None:  # first step since (re)scheduling
                st.next_save_block = before // bs
            if st.pending_load:
                meta.loads.append((rid, st.salt, st.pending_load))
                st.pending_load = None
            after = before + scheduler_output.num_scheduled_tokens.get(rid, 0)
            full = min(after // bs, self._num_hashed_blocks(st.request))
            if full > st.next_save_block and self._kv_cache_manager is not None:
                block_ids = self._kv_cache_manager.get_block_ids(rid)[0]
                hashes = self._block_hashes(st.request, full)
                items = [(hashes[j], int(block_ids[j])) for j in range(st.next_save_block, full)]
                meta.saves.append((rid, st.salt, items))
                st.has_saves = True
                st.next_save_block = full
        if self._step_lookup_s > 0:
            self.stats.steps_with_lookups += 1
            self.stats.step_lookup_s_max = max(self.stats.step_lookup_s_max, self._step_lookup_s)
            self._step_lookup_s = 0.0
        self._write_stats()
        return meta

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Delay freeing the blocks of a request with saves until the worker reports them."""
        st = self._requests.pop(request.request_id, None)
        return (st is not None and st.has_saves), None

    # ---- worker side -------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Map each layer's paged KV tensor as (num_blocks, block_bytes) uint8 rows (no copy).

        Raises:
            InvalidArgument: a layer is missing, or its blocks are not contiguous rows.
        """
        layers = []
        for name in self._layer_names:
            t = kv_caches.get(name)
            if t is None:
                raise InvalidArgument(f"KvstoredConnector: no KV cache tensor for layer {name!r}")
            if t.device.type != "cpu" or not t.is_contiguous():
                raise InvalidArgument(
                    f"KvstoredConnector needs contiguous host KV tensors; layer {name!r} is "
                    f"{t.device} contiguous={t.is_contiguous()} shape {tuple(t.shape)}"
                )
            layers.append(t.view(torch.uint8).reshape(t.shape[0], -1).numpy())
        self._io = BlockIO(
            layers, self._clients, timeout_s=self._config.timeout_ms / 1000, stats=self.stats
        )
        logger.info("KvstoredConnector: %d layers x %d blocks of %d bytes", len(layers),
                    self._io.num_blocks, self._io.block_bytes)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Finish the saves of preempted requests before their blocks are overwritten."""
        if self._io is not None and isinstance(kv_connector_metadata, KvstoredConnectorMetadata):
            self._io.wait_for_saves(kv_connector_metadata.preempted)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Copy this step's hits into the paged KV rows (synchronous, before the forward)."""
        meta = self._get_connector_metadata()
        if self._io is None or not isinstance(meta, KvstoredConnectorMetadata):
            return
        for _rid, salt, items in meta.loads:
            self._load_errors |= self._io.load(salt, items)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Loads are whole-prompt and finish in :meth:`start_load_kv`."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Saves run after the forward (:meth:`wait_for_save`), all layers of a block at once."""

    def wait_for_save(self) -> None:
        """Queue this step's saves on the save thread; returns without waiting for them."""
        meta = self._get_connector_metadata()
        if self._io is None or not isinstance(meta, KvstoredConnectorMetadata):
            return
        for rid, salt, items in meta.saves:
            self._io.submit_save(rid, salt, items)
        self._write_stats()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Finished requests whose saves are done (vLLM may free their blocks now)."""
        if self._io is None:
            return None, None
        self._io.mark_finished(finished_req_ids)
        done = self._io.poll_finished()
        if done:
            self._write_stats()
        return (done or None), None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> KVConnectorStats | None:
        """vLLM rebuilds the worker's interval stats in the logging process with this."""
        return KvstoredConnectorStats(data=dict(data or {}))

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """Counters since the previous call (None when nothing happened)."""
        now = {k: getattr(self.stats, k) for k in _INTERVAL_COUNTERS}
        delta = {k: now[k] - self._stats_reported.get(k, 0) for k in now}
        self._stats_reported = now
        return KvstoredConnectorStats(data=delta) if any(delta.values()) else None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Block ids whose load failed in this step (vLLM recomputes them)."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        """Wait briefly for queued saves, write the stats, close the clients."""
        if self._io is not None:
            self._io.close()
        if self.scheduler_instances and self._config.scheduler_address:
            from kvstored.scheduler.ctl import unregister_engine

            unregister_engine(self._config.scheduler_address,
                              list(self.scheduler_instances.values()),
                              timeout_s=self._config.timeout_ms / 1000)
            self.scheduler_instances = {}
        self._write_stats()
        self._clients.close()


# ---- engine processes for the demo, tests and bench ------------------------------------------
CONNECTORS = {
    "kvstored": ("KvstoredConnector", "kvstored.integrations.vllm"),
    "example": ("ExampleConnector", None),
    "offload": ("SimpleCPUOffloadConnector", None),
    "offloading": ("OffloadingConnector", None),
}
"""``--connector`` names of :func:`run_engine` -> (vLLM connector class, module path)."""


def _reset_prefix_cache(llm: Any, tokens_prompt: Any, sampling_params: Any,
                        timeout_s: float = 120.0) -> bool:
    """Reset vLLM's own prefix cache, waiting until it can be reset.

    vLLM refuses the reset while blocks are still held, e.g. by this connector for a save in
    flight (``request_finished`` keeps them until ``get_finished`` reports the save done), and
    finished saves are only reported when the engine steps: so step it with a prompt shorter
    than one block (nothing to save) until the reset succeeds.

    Returns:
        True if the cache was reset within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache():
        if time.monotonic() > deadline:
            return False
        llm.generate([tokens_prompt(prompt_token_ids=[1, 2, 3, 4])],
                     sampling_params(temperature=0.0, max_tokens=1), use_tqdm=False)
    return True


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one vLLM engine over a scripted list of greedy requests; return what happened.

    Args:
        spec: ``model`` (checkpoint dir), ``dtype`` (default float32), ``block_size``
            (default 128), ``max_model_len`` (default 8192), ``connector`` (a
            :data:`CONNECTORS` name or None), ``extra_config`` (its
            ``kv_connector_extra_config``), ``prompts`` (token-id lists), ``steps``: a list
            of ``{"prompt": index, "max_tokens": n, "cache_salt": str|None,
            "reset_prefix_cache": bool}`` run in order.

    Returns:
        ``{"steps": [{"prompt_tokens", "num_cached_tokens", "wall_s", "token_ids", "text"}],
        "startup_s"}``; ``wall_s`` of a ``max_tokens=1`` step is its TTFT.
    """
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    kwargs: dict[str, Any] = {}
    name = spec.get("connector")
    if name:
        cls, module = CONNECTORS[name]
        ktc: dict[str, Any] = {
            "kv_connector": cls, "kv_role": "kv_both",
            "kv_connector_extra_config": spec.get("extra_config") or {},
        }
        if module:
            ktc["kv_connector_module_path"] = module
        if name == "kvstored":
            ktc["kv_load_failure_policy"] = "recompute"
        kwargs["kv_transfer_config"] = KVTransferConfig(**ktc)
    llm = LLM(
        model=spec["model"], dtype=spec.get("dtype", "float32"),
        block_size=spec.get("block_size", 128), max_model_len=spec.get("max_model_len", 8192),
        enforce_eager=True, seed=0, enable_prefix_caching=True,
        max_num_batched_tokens=spec.get("max_num_batched_tokens", 8192),
        kv_cache_memory_bytes=int(spec.get("kv_cache_memory_bytes", 1 << 30)),
        **kwargs,
    )
    startup_s = time.perf_counter() - t0
    steps = []
    for step in spec["steps"]:
        if step.get("signal_file"):  # tell the driver this point was reached
            Path(step["signal_file"]).write_text("reached\n")
        if step.get("wait_for_file"):  # the driver acted (e.g. killed the daemon); go on
            deadline = time.monotonic() + float(step.get("wait_timeout_s", 300))
            while not Path(step["wait_for_file"]).exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{step['wait_for_file']} did not appear")
                time.sleep(0.05)
        if "prompt" not in step:
            continue
        reset_ok = None
        if step.get("reset_prefix_cache"):
            reset_ok = _reset_prefix_cache(llm, TokensPrompt, SamplingParams)
        ids = spec["prompts"][step["prompt"]]
        prompt: Any = TokensPrompt(prompt_token_ids=ids)
        if step.get("cache_salt"):
            prompt["cache_salt"] = step["cache_salt"]
        params = SamplingParams(temperature=0.0, max_tokens=step.get("max_tokens", 1),
                                ignore_eos=bool(step.get("ignore_eos", False)))
        t1 = time.perf_counter()
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        wall_s = time.perf_counter() - t1
        steps.append({
            "prompt_tokens": len(ids), "num_cached_tokens": int(out.num_cached_tokens or 0),
            "wall_s": wall_s, "token_ids": list(out.outputs[0].token_ids),
            "text": out.outputs[0].text, "prefix_cache_reset": reset_ok,
        })
    del llm
    return {"steps": steps, "startup_s": startup_s}


def main() -> None:
    """``python -m kvstored.integrations.vllm``: :func:`run_engine` on the JSON spec on stdin;
    prints the JSON result as the last stdout line."""
    import json
    import sys

    result = run_engine(json.load(sys.stdin))
    sys.stdout.write("\nKVSTORED_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
