"""Engine-agnostic core of the vLLM connector: config, block keys, the worker's block I/O.

Nothing here imports vllm or torch; :mod:`kvstored.integrations.vllm` adapts vLLM's objects to
it. A paged KV cache is seen as one uint8 array per layer shaped ``(num_blocks, block_bytes)``
whose rows are contiguous: loads copy from the node straight into those rows (``get_into``),
saves hand those rows to ``put`` (the shared-memory arena copy reads them in place), so no
intermediate tensor of the prompt ever exists.

Keys: one kvstored block per (engine block, layer)::

    key = u16be(layer index) + engine block hash (left-padded with zeros to 14 bytes)

inside a :class:`~kvstored.keys.Namespace` built from the engine config (model, revision, KV
dtype, layout, block size, TP size/rank, tenant salt). A prefix of ``n`` engine blocks is the
block-major list ``[b0/L0 .. b0/L(k-1), b1/L0 ..]``, so ``lookup_prefix`` of that list divided
by the number of layers is the number of leading engine blocks present on every layer.

Save safety (why a block's bytes can never be stored under the wrong hash): a save reads the
engine's KV rows after the forward that wrote them returned, on one background thread. The
rows stay owned by the request until :meth:`BlockIO.poll_finished` reports it (the engine
delays freeing a finished request's blocks until then), and a preempted request's rows are
only reused after :meth:`BlockIO.wait_for_saves` returned for it. Lock order: ``_lock`` only;
no client call runs under it.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvstored.client import Client
from kvstored.errors import InvalidArgument, KvstoredError
from kvstored.keys import Namespace

log = structlog.get_logger(__name__)

MAX_LAYERS = 1 << 16
_HASH_PAD_BYTES = 14  # 2-byte layer prefix + 14 = the node's default min_key_bytes (16)
_MAX_CLIENTS = 64


class ConnectorConfig(BaseModel):
    """``kv_connector_extra_config`` of the kvstored connector (unknown keys are errors).

    Attributes:
        address: the kvstored node (``unix:PATH`` or ``HOST:PORT``); default
            ``$KVSTORED_ADDRESS`` or the local daemon's unix socket.
        namespace: overrides of the Namespace fields derived from the engine config
            (``model_id``, ``revision``, ``kv_dtype``, ``kv_layout``, ``block_size``,
            ``tp_size``, ``tp_rank``); ``tenant_salt`` always comes from the request's
            ``cache_salt``.
        timeout_ms: deadline of one load or save batch, milliseconds (default 2000).
        lookup_timeout_ms: deadline of the scheduler's prefix lookup, milliseconds (default 50);
            a lookup that misses it counts as a miss.
        retry_after_ms: after a failed lookup the scheduler skips lookups (misses) for this
            long, so a dead daemon costs at most one deadline per interval (default 1000).
        transport: the client's data path: ``auto``, ``shm``, ``tcp`` or ``grpc``.
        replicas: replicas each saved block wants (1..8, on distinct nodes; the node writes
            the extra ones before the save ends; docs/cluster.md "Replicas"); None = the
            node's default for the namespace.
        reserve_ahead_bytes: shared-memory saves: arena slots the client holds granted in
            advance, so a save costs one round trip per chunk (``Client(reserve_ahead_bytes)``);
            None = the client's default (64 MiB), 0 = off (ReservePut, copy, CommitPut).
        stats_dir: when set, each connector instance writes its counters to
            ``STATS_DIR/<role>-<pid>.json`` after every step that changed them.
        scheduler_address: the master hosting the SchedulerService (``HOST:PORT``): the
            engine registers its instances there at start, with its node's id, and
            unregisters at shutdown (docs/scheduler.md "On a cluster"); None (the default) =
            no registration.
        scheduler_instance_id: the engine's instance id (default ``<hostname>:<pid>``); its
            decode instance is ``<id>/decode``.
        scheduler_roles: the instances to register: ``prefill`` and/or ``decode`` (default
            both: a vLLM engine does both).
        scheduler_node_id: the node id to register under (default: the node's own, from
            its Describe).
    """

    model_config = ConfigDict(extra="forbid")

    address: str | None = None
    namespace: dict[str, str | int] = Field(default_factory=dict)
    timeout_ms: int = Field(default=2000, gt=0)
    lookup_timeout_ms: int = Field(default=50, gt=0)
    retry_after_ms: int = Field(default=1000, ge=0)
    transport: str = "auto"
    replicas: int | None = Field(default=None, ge=1, le=8)
    reserve_ahead_bytes: int | None = Field(default=None, ge=0)
    stats_dir: str | None = None
    scheduler_address: str | None = None
    scheduler_instance_id: str | None = Field(default=None, min_length=1, max_length=128)
    scheduler_roles: list[str] = Field(default_factory=lambda: ["prefill", "decode"])
    scheduler_node_id: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("scheduler_roles")
    @classmethod
    def _roles(cls, v: list[str]) -> list[str]:
        if not v or any(r not in ("prefill", "decode") for r in v):
            raise ValueError(f"must be some of ['prefill', 'decode'], got {v}")
        return v

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> ConnectorConfig:
        """Validate ``kv_connector_extra_config``.

        Raises:
            InvalidArgument: an unknown key or a bad value (the message names it).
        """
        try:
            return cls.model_validate(dict(extra or {}))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e.get('input')!r})"
                for e in exc.errors()
            )
            raise InvalidArgument(
                f"bad kv_connector_extra_config for KvstoredConnector: {problems}"
            ) from None


def block_keys(block_hashes: Sequence[bytes], num_layers: int) -> list[bytes]:
    """The kvstored keys of engine blocks, block-major (all layers of block 0, then block 1...).

    Args:
        block_hashes: engine block hashes (bytes, 1..62 long each; vLLM's are 32).
        num_layers: KV layers per block (1..65536).

    Returns:
        ``len(block_hashes) * num_layers`` keys, 16..64 bytes each.

    Raises:
        InvalidArgument: a hash that is not bytes or is too long, or a bad layer count.
    """
    if not 1 <= num_layers <= MAX_LAYERS:
        raise InvalidArgument(f"num_layers must be in [1, {MAX_LAYERS}]; got {num_layers}")
    prefixes = [i.to_bytes(2, "big") for i in range(num_layers)]
    keys: list[bytes] = []
    for index, h in enumerate(block_hashes):
        if not isinstance(h, (bytes, bytearray)) or not 1 <= len(h) <= 62:
            raise InvalidArgument(
                f"block hash {index} must be 1..62 bytes; got {type(h).__name__} "
                f"of length {len(h) if hasattr(h, '__len__') else '?'}"
            )
        padded = bytes(h).rjust(_HASH_PAD_BYTES, b"\0")
        keys.extend(p + padded for p in prefixes)
    return keys


@dataclass
class ConnectorStats:
    """Counters of one connector instance (JSON-ready via :meth:`to_dict`)."""

    lookups: int = 0
    lookup_errors: int = 0
    lookup_s_total: float = 0.0
    lookup_s_max: float = 0.0
    steps_with_lookups: int = 0
    step_lookup_s_max: float = 0.0
    hit_tokens: int = 0
    blocks_loaded: int = 0
    bytes_loaded: int = 0
    load_errors: int = 0
    blocks_saved: int = 0
    blocks_already_stored: int = 0
    bytes_saved: int = 0
    save_errors: int = 0
    saves: int = 0
    """Save batches run (one put of all the layers of a request's new blocks)."""
    keys_saved: int = 0
    """kvstored blocks (one per engine block and layer) the saves stored."""
    save_s_total: float = 0.0
    """Wall time of those puts, seconds (on the save thread; the forward does not wait)."""
    save_s_max: float = 0.0
    blocks_short_of_replicas: int = 0
    """Saved blocks with fewer replicas than asked (``PutResult.short``): stored, never
    silently under-replicated."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the counters (plus ``extra``)."""
        return asdict(self)


class StatsWriter:
    """Writes a stats dict to ``DIR/<name>.json`` atomically, only when it changed."""

    def __init__(self, stats_dir: str | None, name: str) -> None:
        self._path = Path(stats_dir) / f"{name}.json" if stats_dir else None
        self._last = ""

    def write(self, data: dict[str, Any]) -> None:
        """Write ``data`` if a directory is configured and it differs from the last write."""
        if self._path is None:
            return
        text = json.dumps(data, sort_keys=True, default=str)
        if text == self._last:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, self._path)
        self._last = text


class ClientPool:
    """One :class:`Client` per tenant salt (each scoped to its namespace), LRU-bounded.

    Args:
        make_namespace: tenant salt -> Namespace.
        config: the connector config (address, transport).
    """

    def __init__(self, make_namespace: Callable[[str], Namespace], config: ConnectorConfig) -> None:
        self._make_namespace = make_namespace
        self._config = config
        self._clients: OrderedDict[str, Client] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, salt: str) -> Client:
        """The client of tenant ``salt`` (created on first use; thread-safe).

        A new client connects at once (:meth:`Client.connect` under ``timeout_ms``: the
        node described, the transport set up, the session opened; a failure is only
        logged), so the first tight-deadline lookup does not pay for any of it. A client
        that could not connect, or whose call failed, stays usable: its next call connects
        again once the node answers.
        """
        with self._lock:
            client = self._clients.get(salt)
            if client is not None:
                self._clients.move_to_end(salt)
                return client
            client = Client(
                self._config.address, namespace=self._make_namespace(salt),
                timeout_s=self._config.timeout_ms / 1000, transport=self._config.transport,
                replicas=self._config.replicas,
                reserve_ahead_bytes=self._config.reserve_ahead_bytes,
            )
            self._clients[salt] = client
            evicted = self._clients.popitem(last=False)[1] if len(self._clients) > _MAX_CLIENTS else None
        if evicted is not None:
            evicted.close()
        try:
            client.connect(timeout_s=self._config.timeout_ms / 1000)
        except KvstoredError as exc:
            log.warning("vllm_connector_node_unreachable", address=client.address,
                        error=type(exc).__name__)
        return client

    def close(self) -> None:
        """Close every client."""
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for c in clients:
            c.close()


BlockItems = Sequence[tuple[bytes, int]]
"""(engine block hash, engine block id) pairs of one request, in prefix order."""


class BlockIO:
    """The worker side: loads into and saves out of the engine's paged KV arrays.

    Args:
        layers: one uint8 array per KV layer shaped ``(num_blocks, block_bytes)``, each row
            C-contiguous (a view of the engine's KV tensor, not a copy).
        clients: the per-tenant client pool.
        timeout_s: deadline of one load or save batch.
        stats: counters to update.
        before_save: test hook, called on the save thread before a save reads the rows.

    Raises:
        InvalidArgument: no layers, or a layer of another shape or with non-contiguous rows.
    """

    def __init__(
        self,
        layers: Sequence[np.ndarray],
        clients: ClientPool,
        *,
        timeout_s: float,
        stats: ConnectorStats,
        before_save: Callable[[str], None] | None = None,
    ) -> None:
        if not layers:
            raise InvalidArgument("BlockIO needs at least one KV layer; got none")
        shape = layers[0].shape
        for i, arr in enumerate(layers):
            if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape != shape:
                raise InvalidArgument(
                    f"KV layer {i} must be a uint8 (num_blocks, block_bytes) array like layer 0 "
                    f"{shape}; got {arr.dtype} {arr.shape}"
                )
            if arr.strides[1] != 1:
                raise InvalidArgument(f"KV layer {i} rows are not contiguous (strides {arr.strides})")
        self.layers = list(layers)
        self.num_blocks, self.block_bytes = int(shape[0]), int(shape[1])
        self._clients = clients
        self._timeout_s = timeout_s
        self.stats = stats
        self._before_save = before_save
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvstored-save")
        self._lock = threading.Lock()
        self._pending: dict[str, list[Future[None]]] = {}  # req id -> save jobs not yet done
        self._saving: set[str] = set()  # req ids that ever had a save (engine delays their free)
        self._finishing: set[str] = set()  # finished by the engine, saves maybe still running

    @property
    def num_layers(self) -> int:
        """KV layers per engine block."""
        return len(self.layers)

    def _rows(self, items: BlockItems) -> tuple[list[bytes], list[np.ndarray]]:
        keys = block_keys([h for h, _ in items], self.num_layers)
        rows: list[np.ndarray] = []
        for _, block_id in items:
            if not 0 <= block_id < self.num_blocks:
                raise InvalidArgument(
                    f"block id must be in [0, {self.num_blocks}); got {block_id}"
                )
            rows.extend(layer[block_id] for layer in self.layers)
        return keys, rows

    def load(self, salt: str, items: BlockItems) -> set[int]:
        """Copy blocks from the node into the KV rows, synchronously (within the deadline).

        Args:
            salt: tenant salt (selects the namespace).
            items: the blocks to load.

        Returns:
            Engine block ids that were not loaded completely (missing on some layer, wrong size,
            or the whole batch failed); the engine must recompute them. Never raises for a
            node failure.
        """
        if not items:
            return set()
        keys, rows = self._rows(items)
        try:
            results = self._clients.get(salt).get_into(keys, rows, timeout_s=self._timeout_s)
        except KvstoredError as exc:
            log.warning("vllm_load_failed", num_blocks=len(items), error=type(exc).__name__)
            self.stats.load_errors += len(items)
            return {block_id for _, block_id in items}
        failed: set[int] = set()
        k = self.num_layers
        for i, (_, block_id) in enumerate(items):
            got = results[i * k:(i + 1) * k]
            if any(n is None or n != self.block_bytes for n in got):
                failed.add(block_id)
        self.stats.load_errors += len(failed)
        self.stats.blocks_loaded += len(items) - len(failed)
        self.stats.bytes_loaded += (len(items) - len(failed)) * k * self.block_bytes
        return failed

    def submit_save(self, req_id: str, salt: str, items: BlockItems) -> None:
        """Queue a save of ``items`` (already computed) for request ``req_id``; returns at once.

        The request is then reported by :meth:`poll_finished` only after this save is done.
        """
        with self._lock:
            self._saving.add(req_id)
            if not items:
                return
            future = self._executor.submit(self._save, req_id, salt, list(items))
            self._pending.setdefault(req_id, []).append(future)
        # Outside the lock: on a future that is already done the callback runs right here.
        future.add_done_callback(functools.partial(self._done, req_id))

    def _done(self, req_id: str, future: Future[None]) -> None:
        with self._lock:
            jobs = self._pending.get(req_id)
            if jobs is not None:
                jobs.remove(future)
                if not jobs:
                    del self._pending[req_id]

    def _save(self, req_id: str, salt: str, items: list[tuple[bytes, int]]) -> None:
        if self._before_save is not None:
            self._before_save(req_id)
        keys, rows = self._rows(items)
        client = self._clients.get(salt)
        t0 = time.perf_counter()
        try:
            results = client.put(keys, rows, timeout_s=self._timeout_s)
        except KvstoredError as exc:
            log.warning("vllm_save_failed", num_blocks=len(items), error=type(exc).__name__)
            self.stats.save_errors += len(items)
            return
        finally:
            dt = time.perf_counter() - t0
            self.stats.saves += 1
            self.stats.save_s_total += dt
            self.stats.save_s_max = max(self.stats.save_s_max, dt)
        k = self.num_layers
        self.stats.keys_saved += sum(1 for r in results if r.stored)
        for i in range(len(items)):
            rs = results[i * k:(i + 1) * k]
            if any(r.error is not None for r in rs):
                self.stats.save_errors += 1
                continue
            if any(r.short for r in rs):
                self.stats.blocks_short_of_replicas += 1
            if any(r.stored for r in rs):
                self.stats.blocks_saved += 1
                self.stats.bytes_saved += sum(self.block_bytes for r in rs if r.stored)
            else:
                self.stats.blocks_already_stored += 1

    def wait_for_saves(self, req_ids: Iterable[str], timeout_s: float | None = None) -> None:
        """Block until every queued save of ``req_ids`` is done (before their rows are reused).

        A save never outlives its deadline, so this returns within about ``timeout_s`` times
        the number of queued jobs; ``timeout_s`` caps the total wait (None: no cap).
        """
        with self._lock:
            futures = [f for r in req_ids for f in self._pending.get(r, ())]
        end = None if timeout_s is None else time.monotonic() + timeout_s
        for f in futures:
            remaining = None if end is None else max(0.0, end - time.monotonic())
            try:
                f.result(timeout=remaining)
            except Exception:  # a failed save is a future miss; _save counted it
                pass

    def mark_finished(self, req_ids: Iterable[str]) -> None:
        """The engine finished these requests; report them once their saves are done."""
        with self._lock:
            self._finishing.update(r for r in req_ids if r in self._saving)

    def poll_finished(self) -> set[str]:
        """Finished requests whose saves are all done (each reported exactly once)."""
        with self._lock:
            done = {r for r in self._finishing if r not in self._pending}
            self._finishing -= done
            self._saving -= done
            return done

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait (up to ``timeout_s``) for queued saves, then stop the save thread."""
        with self._lock:
            reqs = list(self._pending)
        self.wait_for_saves(reqs, timeout_s=timeout_s)
        self._executor.shutdown(wait=False, cancel_futures=True)
