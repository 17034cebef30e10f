"""The node's RDMA side (issue 18 section 2; docs/rdma.md): its device, its arena file as ONE
memory region, and the queue pairs of the peers that read it.

::

    NodeDaemon.start -> open_node_rdma([rdma], store)  -> NodeRdma, or None (TCP only)
        verbs: pyverbs (Debian's python3-pyverbs), or KVSTORED_TEST_VERBS=module:factory (tests)
        device: [rdma] device, else the first listed (none listed: get_device_list() raises)
        RdmaEndpoint(store.arena_mapping(), REMOTE_READ, no REMOTE_WRITE) -> RdmaServer
    MasterLink registers transports ["tcp", "rdma"]          (["tcp"] without a NodeRdma)
    ConnectRdma(reader's advert, node_id, epoch)  -> accept(): one RC QP, a session id
        a newer epoch of the same reader node ends its older sessions first (its QPs are gone)
    DisconnectRdma(session id) | close()           -> end_session: QP destroyed first

Safety by construction: the arena is registered REMOTE_READ only, so a peer's NIC can never
write into it, whatever a peer sends; no RDMA WRITE grant is issued by the daemon (puts go
over TCP). :class:`~kvstored.transport.rdma.RdmaServer`'s WRITE-grant quarantine still
applies to whatever grants a caller records (:attr:`NodeRdma.server`): a session's
regions come back only from :meth:`NodeRdma.disconnect` / a newer epoch / :meth:`close`,
after its QP is destroyed. Readers check every block by its slot header
(kvstored/node/rdma_slots.py), so the node's CPU is not asked per read.

An rkey lets its holder READ the whole arena, every tenant's blocks: ConnectRdma is a node's
call only (role ``node`` under TLS, node/service.py ``METHOD_ROLES``), and the master's
ListNodes carries only the word ``rdma``, never an rkey.

Thread-safe.
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from kvstored.errors import ConfigInvalid, InvalidArgument, NoCapacity, TransferFailed
from kvstored.transport.rdma import RdmaAdvert, RdmaEndpoint, RdmaServer, Verbs, load_pyverbs

if TYPE_CHECKING:
    from kvstored.config import RdmaConfig
    from kvstored.tiers.tiered import TieredStore

log = structlog.get_logger(__name__)

TEST_VERBS_ENV = "KVSTORED_TEST_VERBS"
"""Test-only: ``module:factory`` of a verbs layer to use instead of pyverbs (the e2e tests
set ``tests.fake_verbs:process_verbs``); the factory takes no argument and returns a
:class:`~kvstored.transport.rdma.Verbs`."""


def load_verbs(environ: Mapping[str, str] | None = None) -> Verbs | None:
    """pyverbs, or the verbs layer ``KVSTORED_TEST_VERBS`` names; None when pyverbs is absent.

    Raises:
        ConfigInvalid: ``KVSTORED_TEST_VERBS`` is set but names no importable factory.
    """
    spec = (os.environ if environ is None else environ).get(TEST_VERBS_ENV, "")
    if not spec:
        return load_pyverbs()
    module, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name or "process_verbs")
    except (ImportError, AttributeError) as exc:
        raise ConfigInvalid(f"{TEST_VERBS_ENV}={spec!r}: cannot load it ({exc}); "
                            "expected module:factory") from None
    verbs = factory()
    if not isinstance(verbs, Verbs):
        raise ConfigInvalid(f"{TEST_VERBS_ENV}={spec!r} returned {type(verbs).__name__}, not Verbs")
    return verbs


def list_devices(verbs: Verbs) -> list[str]:
    """The RDMA device names; [] when there is none (``get_device_list()`` then raises)."""
    try:
        devices = verbs.device.get_device_list()
    except verbs.error:
        return []
    out = []
    for d in devices or []:
        name = d.name
        out.append(name.decode() if isinstance(name, bytes) else str(name))
    return out


def _listed(sysfs: str) -> bool:
    try:
        return bool(os.listdir(sysfs))
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class _Reader:
    node_id: str
    epoch: int


class NodeRdma:
    """The node's RDMA device, its arena registered as one MR, and its peers' sessions.

    Args:
        verbs: the verbs layer (:func:`load_verbs`).
        device: the device the arena is registered on.
        endpoint: an :class:`RdmaEndpoint` over the whole arena file (REMOTE_READ).
        arena_size_bytes: block bytes of the arena (the slot layout follows them).
        arena_path: the arena file ("" = anonymous: a same-host fake cannot map it).
        epoch: this node's epoch (ConnectRdma answers it).
        max_sessions: most peer QPs at once.

    Build it with :func:`open_node_rdma`; :meth:`close` before the store closes (the MR
    exports the arena mapping).
    """

    def __init__(self, verbs: Verbs, device: str, endpoint: RdmaEndpoint, *,
                 arena_size_bytes: int, arena_path: str, epoch: int, max_sessions: int = 64) -> None:
        self.verbs = verbs
        self.device = device
        self.endpoint = endpoint
        self.server = RdmaServer(endpoint)
        self.arena_size_bytes = arena_size_bytes
        self.arena_path = arena_path
        self.epoch = epoch
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._readers: dict[int, _Reader] = {}
        self._closed = False

    @property
    def num_sessions(self) -> int:
        """Peer QPs connected to this node's arena."""
        return self.server.num_sessions

    def accept(self, advert_json: bytes, *, node_id: str, epoch: int) -> tuple[int, bytes]:
        """Connect a QP to the reader ``node_id`` (epoch ``epoch``); ``(session id, this
        node's advert JSON)``.

        Sessions of the same reader node with an older epoch are ended first (that process
        is gone: its QPs with it).

        Raises:
            InvalidArgument: a malformed advert (names the field), or no ``node_id``.
            NoCapacity: ``max_sessions`` QPs are connected already.
            TransferFailed: a verbs call failed (nothing stays connected).
        """
        if not node_id:
            raise InvalidArgument("ConnectRdma: node_id is empty; the reading node must name itself")
        peer = RdmaAdvert.from_json(advert_json)
        with self._lock:
            if self._closed:
                raise TransferFailed("rdma: the node is stopping")
            stale = [sid for sid, r in self._readers.items()
                     if r.node_id == node_id and r.epoch < epoch]
        for sid in stale:
            self.disconnect(sid)
        with self._lock:
            if len(self._readers) >= self.max_sessions:
                raise NoCapacity(f"rdma: {len(self._readers)} peer queue pairs connected, "
                                 f"the most [rdma] max_sessions allows; read over TCP")
            sid = next(self._ids)
            self._readers[sid] = _Reader(node_id, epoch)
        try:
            local = self.server.accept(sid, peer)
        except BaseException:
            with self._lock:
                self._readers.pop(sid, None)
            raise
        log.info("rdma_peer_connected", peer=node_id, peer_epoch=epoch, session_id=sid,
                 qpn=local.qpn)
        return sid, local.to_json()

    def disconnect(self, session_id: int) -> int:
        """End a peer's session: destroy its QP, then free what its grants held (idempotent).
        Returns the number of regions handed back."""
        with self._lock:
            reader = self._readers.pop(session_id, None)
        regions = self.server.end_session(session_id)
        if reader is not None:
            log.info("rdma_peer_disconnected", peer=reader.node_id, session_id=session_id,
                     num_regions=len(regions))
        return len(regions)

    def close(self) -> None:
        """End every session, then deregister the MR and close the device (idempotent)."""
        with self._lock:
            self._closed = True
            self._readers.clear()
        self.server.close()
        self.endpoint.close()

    def reader_endpoint(self, bounce_bytes: int) -> RdmaEndpoint:
        """A new endpoint on this node's device with a ``bounce_bytes`` buffer that this
        node's READs of one peer land in (LOCAL_WRITE only). Raises TransferFailed."""
        return RdmaEndpoint(self.verbs, self.device, bytearray(bounce_bytes), remote_access=False)


SYSFS_RDMA = "/sys/class/infiniband"
"""Where the kernel lists RDMA devices (libibverbs enumerates them from sysfs)."""


def _unavailable(cfg: RdmaConfig, reason: str) -> None:
    if cfg.enabled == "on":
        raise ConfigInvalid(f"[rdma] enabled = \"on\" but {reason}; set rdma.enabled = "
                            "\"auto\" (TCP when there is no device) or \"off\"")
    log.info("rdma_unavailable", reason=reason)


def find_rdma_device(cfg: RdmaConfig, *, environ: Mapping[str, str] | None = None,
                     sysfs: str = SYSFS_RDMA) -> tuple[Verbs, str] | None:
    """The verbs layer and the device ``[rdma]`` asks for, or None (TCP only). Called
    before the store is opened, so ``enabled = "on"`` fails before any memory is mapped.

    ``enabled = "off"``: None. ``"auto"``: None, logged once, when the kernel lists no RDMA
    device (``sysfs`` absent or empty: pyverbs is then not even imported, so a node without
    one starts as fast as before), pyverbs is missing, no device is listed, or ``[rdma]
    device`` is not among them. ``"on"``: each of those raises ConfigInvalid naming what was
    missing and what was found.
    """
    if cfg.enabled == "off":
        return None
    env = os.environ if environ is None else environ
    if cfg.enabled == "auto" and not env.get(TEST_VERBS_ENV) and not _listed(sysfs):
        log.info("rdma_unavailable", reason=f"no RDMA device in {sysfs}")
        return None
    verbs = load_verbs(environ)
    if verbs is None:
        _unavailable(cfg, "pyverbs cannot be imported (Debian's python3-pyverbs: "
                          "scripts/setup-system.sh)")
        return None
    devices = list_devices(verbs)
    if not devices:
        _unavailable(cfg, "no RDMA device is listed (pyverbs get_device_list() found none)")
        return None
    device = cfg.device or devices[0]
    if device not in devices:
        _unavailable(cfg, f"rdma.device {device!r} is not among the devices listed {devices}")
        return None
    return verbs, device


def open_node_rdma(cfg: RdmaConfig, store: TieredStore, *, epoch: int,
                   environ: Mapping[str, str] | None = None, sysfs: str = SYSFS_RDMA,
                   found: tuple[Verbs, str] | None = None) -> NodeRdma | None:
    """The node's RDMA side per ``[rdma]``, or None (TCP only): :func:`find_rdma_device`
    (unless ``found`` gives its answer), then the whole arena file registered as one MR
    (REMOTE_READ only).

    Raises:
        ConfigInvalid: ``enabled = "on"`` and no device (see :func:`find_rdma_device`), or
            the registration failed (e.g. LimitMEMLOCK); with ``"auto"`` both log and
            return None.
    """
    if found is None:
        found = find_rdma_device(cfg, environ=environ, sysfs=sysfs)
    if found is None:
        return None
    verbs, device = found
    try:
        endpoint = RdmaEndpoint(verbs, device, store.arena_mapping(), remote_access=True,
                                remote_write=False)
    except TransferFailed as exc:
        _unavailable(cfg, f"registering the {store.arena_size_bytes}-byte arena on {device!r} "
                          f"failed ({exc}; check LimitMEMLOCK)")
        return None
    log.info("rdma_enabled", device=device, region_bytes=endpoint.length_bytes,
             gid=endpoint.gid)
    return NodeRdma(verbs, device, endpoint, arena_size_bytes=store.arena_size_bytes,
                    arena_path=store.arena_path or "", epoch=epoch,
                    max_sessions=cfg.max_sessions)
