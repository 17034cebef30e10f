"""One-sided transfers over RDMA verbs (pyverbs), behind :class:`~.base.OneSidedTransport`.

::

    node (RdmaServer)                              reader (RdmaEndpoint + RdmaTransport)
    Context(device) -> PD -> CQ                    Context(device) -> PD -> CQ
    arena registered as ONE MR                     a bounce buffer registered as one MR
      (LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE)     (LOCAL_WRITE)
    accept(session, reader's RdmaAdvert)  <------  connect(exchange): RC QP in INIT,
      RC QP INIT -> RTR -> RTS                       its RdmaAdvert (GID, LID, QPN, PSN)
      returns its RdmaAdvert (rkey, arena   ------>  QP INIT -> RTR -> RTS
      address and length, GID, LID, QPN, PSN)
                                                   read_regions: one signalled
                                                     IBV_WR_RDMA_READ per region into the
                                                     bounce MR, poll the CQ until the
                                                     deadline, copy out to the sink

The QP exchange is a callable (``exchange(local advert) -> peer advert``) carrying
:meth:`RdmaAdvert.to_json` bytes: it rides whatever request the caller already has open to
the node (a control-channel message, a data-plane op); JSON because the advert is eight
small fields exchanged once per session, not per transfer, and the json module is the
well-kept serialiser already in every process. (Not wired into the node daemon yet: see
docs/rdma.md.)

The two one-sided read protocols (kvstored/transport/base.py) run on top:

- :func:`read_versioned` (no grant): locate -> READ into staging -> check generations; a
  block whose generation changed while the NIC copied is dropped (reported as not found),
  its bytes never reach the caller's sink.
- :func:`read_granted`: pin under the session's lease -> READ -> release; a pin whose
  lease lapsed before the release raises LeaseExpired (the copy is dropped).

:class:`RdmaOrTcp` is the caller's Transport: RDMA when both ends advertise a device
(:func:`negotiate`), TCP when either does not, and TCP for the rest of the request on any
RDMA error, within the same deadline.

Fencing (DESIGN.md section 6, kvstored/node/sessions.py): a NIC may still write into a
granted region after the lease lapsed (the remote CPU stalled, its WRs are queued). So a
WRITE grant whose lease lapses is quarantined, not freed, until the peer's session ends;
:meth:`RdmaServer.end_session` first moves the peer's QP to the error state and destroys
it (the NIC drops every later WR from it), only then hands back the regions to free.

pyverbs is Debian's ``python3-pyverbs`` (rdma-core 44), importable once
``/usr/lib/python3/dist-packages`` is on ``sys.path``: :func:`load_pyverbs` adds it for
the import only. With no device, ``pyverbs.device.get_device_list()`` raises
PyverbsRDMAError: :func:`discover_device` turns that into None.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvstored.errors import (
    DeadlineExceeded,
    InvalidArgument,
    KvstoredError,
    LeaseExpired,
    TransferFailed,
)
from kvstored.transport.base import (
    GetItem,
    GrantingServer,
    PutItem,
    RemoteRegion,
    Sink,
    Transport,
    VersionedBlockSource,
    attach_completed,
)

DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"
_PSN_MASK = 0xFFFFFF  # a PSN is 24 bits
_VERBS_MODULES = ("device", "pd", "mr", "cq", "qp", "wr", "addr", "enums")


@dataclass(frozen=True, slots=True)
class Verbs:
    """The pyverbs modules this transport uses (or a fake with the same names, for tests).

    Attributes:
        device, pd, mr, cq, qp, wr, addr, enums: the modules ``pyverbs.device`` ...
            ``pyverbs.enums`` (``Context``, ``PD``, ``MR``, ``CQ``, ``QP``/``QPInitAttr``/
            ``QPCap``/``QPAttr``, ``SendWR``/``SGE``, ``GID``/``GlobalRoute``/``AHAttr``,
            ``IBV_*``).
        error: ``pyverbs.pyverbs_error.PyverbsError``, the base of every verbs error
            (PyverbsRDMAError and PyverbsUserError derive from it).
        attach_peer: None for pyverbs (the NIC reaches the peer). A verbs layer that
            reaches a peer's memory another way is told of each peer before a QP connects
            to it: ``attach_peer(peer advert, peer's arena file path)`` (tests/fake_verbs.py
            across processes maps that file read-only).
    """

    device: Any
    pd: Any
    mr: Any
    cq: Any
    qp: Any
    wr: Any
    addr: Any
    enums: Any
    error: type[BaseException]
    attach_peer: Callable[[RdmaAdvert, str], None] | None = None


def load_pyverbs(dist_packages: str = DEBIAN_DIST_PACKAGES) -> Verbs | None:
    """Import pyverbs (Debian's python3-pyverbs), or None when it is not installed.

    ``dist_packages`` is put on ``sys.path`` for the import only and taken off again, so
    no other Debian package shadows the venv's. Never raises.
    """
    added = dist_packages not in sys.path
    if added:
        sys.path.append(dist_packages)
    try:
        mods = {name: importlib.import_module(f"pyverbs.{name}") for name in _VERBS_MODULES}
        err = importlib.import_module("pyverbs.pyverbs_error").PyverbsError
    except ImportError:
        return None
    finally:
        if added:
            sys.path.remove(dist_packages)
    m = mods
    return Verbs(device=m["device"], pd=m["pd"], mr=m["mr"], cq=m["cq"], qp=m["qp"], wr=m["wr"],
                 addr=m["addr"], enums=m["enums"], error=err)


def discover_device(verbs: Verbs | None) -> str | None:
    """The name of the first RDMA device, or None (no pyverbs, or no device).

    ``get_device_list()`` raises PyverbsRDMAError when the kernel has no RDMA device
    (it does not return ``[]``); both read as None.
    """
    if verbs is None:
        return None
    try:
        devices = verbs.device.get_device_list()
    except verbs.error:
        return None
    if not devices:
        return None
    name = devices[0].name
    return name.decode() if isinstance(name, bytes) else str(name)


# ---- the advert: what one end tells the other -------------------------------------------------


@dataclass(frozen=True, slots=True)
class RdmaAdvert:
    """One end's RC queue pair and registered memory, exchanged once per session.

    Attributes:
        device: the RDMA device name (e.g. ``mlx5_0``, ``rxe0``).
        gid: the port's GID, eight colon-separated groups of four hex digits.
        lid: the port's LID (0 on RoCE).
        qpn: the queue pair number (24 bits).
        psn: the first packet sequence number this end sends (24 bits).
        rkey: the remote key of the registered region (0 = none advertised).
        addr: the virtual address of the registered region's first byte.
        length_bytes: the registered region's size.
        port_num: the device port (1-based).
        gid_index: the index of ``gid`` in the port's GID table.
    """

    device: str
    gid: str
    lid: int
    qpn: int
    psn: int
    rkey: int
    addr: int
    length_bytes: int
    port_num: int = 1
    gid_index: int = 0

    def to_json(self) -> bytes:
        """The advert as UTF-8 JSON (the handshake's payload)."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RdmaAdvert:
        """Parse and check an advert. Raises InvalidArgument naming the bad field and value."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"rdma advert: not JSON ({exc}); received {data[:64]!r}") from None
        if not isinstance(raw, dict):
            raise InvalidArgument(f"rdma advert: expected an object, received {type(raw).__name__}")
        ints = ("lid", "qpn", "psn", "rkey", "addr", "length_bytes", "port_num", "gid_index")
        for name in ("device", "gid", *ints[:6]):
            if name not in raw:
                raise InvalidArgument(f"rdma advert: missing field {name!r}; received {sorted(raw)}")
        for name in ("device", "gid"):
            if not isinstance(raw[name], str):
                raise InvalidArgument(f"rdma advert: {name} must be a string, received {raw[name]!r}")
        for name in ints:
            v = raw.get(name, 0)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InvalidArgument(f"rdma advert: {name} must be an int >= 0, received {v!r}")
        for name in ("qpn", "psn"):
            if raw[name] > _PSN_MASK:
                raise InvalidArgument(f"rdma advert: {name} must fit 24 bits, received {raw[name]}")
        groups = raw["gid"].split(":")
        if len(groups) != 8 or not all(len(g) == 4 and _is_hex(g) for g in groups):
            raise InvalidArgument(
                f"rdma advert: gid must be 8 groups of 4 hex digits, received {raw['gid']!r}")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in raw.items() if k in known})


def _is_hex(s: str) -> bool:
    try:
        int(s, 16)
    except ValueError:
        return False
    return True


def negotiate(local: RdmaAdvert | None, peer: RdmaAdvert | None) -> str:
    """``"rdma"`` when both ends advertise a device (and the peer a region), else ``"tcp"``."""
    if local is None or peer is None or not local.device or not peer.device:
        return "tcp"
    return "rdma" if peer.rkey and peer.length_bytes else "tcp"


def _buffer_address(buf: Any) -> tuple[Any, int, int]:
    """``(ctypes view keeping the export, address, length)`` of a writable buffer."""
    n = memoryview(buf).nbytes
    if n == 0:
        raise InvalidArgument("rdma: cannot register an empty buffer (received 0 bytes)")
    view = (ctypes.c_char * n).from_buffer(buf)
    return view, ctypes.addressof(view), n


# ---- one end: device context, PD, CQ, one MR, RC QPs ------------------------------------------


class RdmaEndpoint:
    """One device context with a protection domain and one registered memory region; each
    RC QP made here gets its own CQ (a completion is never taken for another QP's).

    Args:
        verbs: the pyverbs modules (:func:`load_pyverbs`) or a fake with the same API.
        device: the device name (:func:`discover_device`).
        buffer: the writable memory to register (an mmap of the arena, or a bytearray
            bounce buffer); kept exported (not resizable, not closable) until :meth:`close`.
        remote_access: register with REMOTE_READ | REMOTE_WRITE (the node's arena) or
            LOCAL_WRITE only (a reader's bounce buffer).
        remote_write: with ``remote_access``, whether peers may also WRITE (default True);
            False registers REMOTE_READ only (a node that grants no RDMA WRITE: a peer's
            NIC then cannot touch its arena at all, whatever it is sent).
        port_num, gid_index: the port and GID table entry to use.
        max_send_wr: outstanding work requests per QP (also bounds one read batch).

    Raises:
        TransferFailed: a verbs call failed (the message names which); nothing stays
            registered or open.

    Thread-safe; every registration made here is undone by :meth:`close` (idempotent):
    QPs and their CQs, then the MR, the PD and the context, in that order. The transports
    over one endpoint share its registered buffer, so they move bytes one at a time
    (:attr:`transfer_lock`).
    """

    def __init__(
        self, verbs: Verbs, device: str, buffer: Any, *, remote_access: bool,
        port_num: int = 1, gid_index: int = 0, max_send_wr: int = 64,
        remote_write: bool = True,
    ) -> None:
        self.verbs = verbs
        self.device = device
        self.port_num = port_num
        self.gid_index = gid_index
        self.max_send_wr = max_send_wr
        self._lock = threading.Lock()
        self.transfer_lock = threading.Lock()
        self._qps: list[Any] = []
        self._cqs: dict[int, Any] = {}  # id(qp) -> its CQ
        self._closed = False
        self._ctx: Any = None
        self._pd: Any = None
        self._mr: Any = None
        self._buffer = buffer  # the memory stays alive while registered
        e = verbs.enums
        self.access = e.IBV_ACCESS_LOCAL_WRITE
        if remote_access:
            self.access |= e.IBV_ACCESS_REMOTE_READ
            if remote_write:
                self.access |= e.IBV_ACCESS_REMOTE_WRITE
        self._cview, self.addr, self.length_bytes = _buffer_address(buffer)
        try:
            self._ctx = verbs.device.Context(name=device)
            self._pd = verbs.pd.PD(self._ctx)
            self._mr = verbs.mr.MR(self._pd, self.length_bytes, self.access, address=self.addr)
            self.gid = str(self._ctx.query_gid(port_num, gid_index).gid)
            self.lid = int(self._ctx.query_port(port_num).lid)
        except verbs.error as exc:
            self.close()
            raise TransferFailed(f"rdma: opening {device!r} failed: {exc}") from exc

    @property
    def num_registered_regions(self) -> int:
        """Memory regions registered and not yet deregistered (1 while open, 0 after close)."""
        return 0 if self._mr is None else 1

    @property
    def num_qps(self) -> int:
        """Queue pairs created here and not yet destroyed."""
        return len(self._qps)

    @property
    def lkey(self) -> int:
        """The local key of the registered region."""
        return int(self._mr.lkey)

    @property
    def rkey(self) -> int:
        """The remote key of the registered region (what a peer's READ/WRITE names)."""
        return int(self._mr.rkey)

    def cq_of(self, qp: Any) -> Any:
        """The completion queue of ``qp`` (None once destroyed)."""
        return self._cqs.get(id(qp))

    def create_qp(self) -> tuple[Any, RdmaAdvert]:
        """A new RC QP in INIT, and the advert that describes it and the region."""
        v, e = self.verbs, self.verbs.enums
        with self._lock:
            if self._closed:
                raise TransferFailed("rdma: endpoint closed")
            cap = v.qp.QPCap(max_send_wr=self.max_send_wr, max_recv_wr=1,
                             max_send_sge=1, max_recv_sge=1)
            attr = v.qp.QPAttr(port_num=self.port_num)
            attr.qp_access_flags = self.access
            cq = None
            try:
                cq = v.cq.CQ(self._ctx, 2 * self.max_send_wr)
                init = v.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1)
                qp = v.qp.QP(self._pd, init, attr)
            except v.error as exc:
                if cq is not None:
                    cq.close()
                raise TransferFailed(f"rdma: creating a QP on {self.device!r} failed: {exc}") from exc
            self._qps.append(qp)
            self._cqs[id(qp)] = cq
        advert = RdmaAdvert(
            device=self.device, gid=self.gid, lid=self.lid, qpn=int(qp.qp_num),
            psn=secrets.randbits(24), rkey=self.rkey, addr=self.addr,
            length_bytes=self.length_bytes, port_num=self.port_num, gid_index=self.gid_index,
        )
        return qp, advert

    def connect_qp(self, qp: Any, local: RdmaAdvert, peer: RdmaAdvert) -> None:
        """Move ``qp`` INIT -> RTR -> RTS towards ``peer``'s QP. Raises TransferFailed."""
        v, e = self.verbs, self.verbs.enums
        attr = v.qp.QPAttr(port_num=self.port_num)
        attr.qp_access_flags = self.access
        attr.dest_qp_num = peer.qpn
        attr.rq_psn = peer.psn
        attr.sq_psn = local.psn
        attr.path_mtu = e.IBV_MTU_1024
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        gr = v.addr.GlobalRoute(dgid=v.addr.GID(peer.gid), sgid_index=self.gid_index)
        attr.ah_attr = v.addr.AHAttr(port_num=self.port_num, is_global=1, gr=gr, dlid=peer.lid)
        try:
            qp.to_rts(attr)
        except v.error as exc:
            raise TransferFailed(f"rdma: connecting QP {local.qpn} to {peer.qpn} failed: {exc}") from exc

    def destroy_qp(self, qp: Any) -> None:
        """Move ``qp`` to the error state (its queued WRs flush) and destroy it (idempotent)."""
        v = self.verbs
        with self._lock:
            if qp not in self._qps:
                return
            self._qps.remove(qp)
            cq = self._cqs.pop(id(qp), None)
        try:
            err = v.qp.QPAttr(qp_state=v.enums.IBV_QPS_ERR)
            qp.modify(err, v.enums.IBV_QP_STATE)
        except v.error:
            pass  # destroying it below fences it all the same
        qp.close()
        if cq is not None:
            cq.close()

    def close(self) -> None:
        """Destroy every QP, deregister the MR, free CQ, PD and context (idempotent)."""
        with self._lock:
            self._closed = True
            qps, self._qps = self._qps, []
            cqs, self._cqs = list(self._cqs.values()), {}
        for obj in (*qps, *cqs):
            try:
                obj.close()
            except self.verbs.error:
                pass
        for name in ("_mr", "_pd", "_ctx"):
            obj = getattr(self, name)
            setattr(self, name, None)
            if obj is not None:
                try:
                    obj.close()
                except self.verbs.error:
                    pass
        self._cview = None  # drop the buffer export
        self._buffer = None


# ---- the reader's transport -------------------------------------------------------------------


class RdmaTransport:
    """An :class:`~.base.OneSidedTransport` over one RC QP to one node's arena.

    Args:
        endpoint: the reader's endpoint; its registered buffer is the bounce buffer every
            READ lands in (and every WRITE is sent from), so one call moves at most its
            ``length_bytes`` per round of work requests.
        qp: a connected QP of ``endpoint`` (:func:`connect`).
        peer: the node's advert (its arena's rkey, address and length).
        poll_sleep_s: pause between empty CQ polls (0 = spin).

    After any failed work request or a deadline with completions pending, the transport
    destroys its QP at once (the NIC drops the READ responses still due, so nothing lands
    in the shared bounce buffer later), marks itself broken, and every later call raises
    TransferFailed (the caller falls back to TCP; :class:`RdmaOrTcp`). Thread-safe: one
    transfer at a time per endpoint (its ``transfer_lock``: the bounce buffer is shared).
    """

    def __init__(self, endpoint: RdmaEndpoint, qp: Any, peer: RdmaAdvert, *,
                 poll_sleep_s: float = 0.0) -> None:
        self.endpoint = endpoint
        self.qp = qp
        self.peer = peer
        self.poll_sleep_s = poll_sleep_s
        self.broken: str = ""
        self._lock = endpoint.transfer_lock
        self.cq = endpoint.cq_of(qp)
        self._bounce = (ctypes.c_char * endpoint.length_bytes).from_address(endpoint.addr)
        self._closed = False

    def _check(self, regions: Sequence[RemoteRegion]) -> None:
        for i, r in enumerate(regions):
            if r.size_bytes < 0 or r.offset < 0 or r.offset + r.size_bytes > self.peer.length_bytes:
                raise InvalidArgument(
                    f"rdma: region {i} (offset {r.offset}, {r.size_bytes} bytes) lies outside "
                    f"the peer's {self.peer.length_bytes}-byte region")
            if r.size_bytes > self.endpoint.length_bytes:
                raise InvalidArgument(
                    f"rdma: region {i} of {r.size_bytes} bytes exceeds the "
                    f"{self.endpoint.length_bytes}-byte bounce buffer")

    def _rounds(self, regions: Sequence[RemoteRegion]) -> list[list[tuple[int, int]]]:
        """Regions grouped so each round fits the bounce buffer and the send queue:
        ``[(index, bounce offset), ...]`` per round."""
        rounds: list[list[tuple[int, int]]] = [[]]
        used = 0
        for i, r in enumerate(regions):
            if rounds[-1] and (used + r.size_bytes > self.endpoint.length_bytes
                               or len(rounds[-1]) >= self.endpoint.max_send_wr):
                rounds.append([])
                used = 0
            rounds[-1].append((i, used))
            used += r.size_bytes
        return rounds

    def _run(self, opcode: int, regions: Sequence[RemoteRegion], batch: list[tuple[int, int]],
             deadline: float) -> None:
        v, e = self.endpoint.verbs, self.endpoint.verbs.enums
        try:
            for i, boff in batch:
                r = regions[i]
                sge = v.wr.SGE(self.endpoint.addr + boff, r.size_bytes, self.endpoint.lkey)
                wr = v.wr.SendWR(wr_id=i, opcode=opcode, num_sge=1, sg=[sge],
                                 send_flags=e.IBV_SEND_SIGNALED)
                wr.set_wr_rdma(self.peer.rkey, self.peer.addr + r.offset)
                self.qp.post_send(wr)
            pending = len(batch)
            while pending:
                n, wcs = self.cq.poll(pending)
                for wc in wcs[:n]:
                    if wc.status != e.IBV_WC_SUCCESS:
                        raise TransferFailed(
                            f"rdma: work request {wc.wr_id} completed with status {wc.status}")
                pending -= n
                if pending and time.monotonic() >= deadline:
                    raise DeadlineExceeded(f"rdma: {pending} work requests pending at the deadline")
                if pending and not n and self.poll_sleep_s:
                    time.sleep(self.poll_sleep_s)
        except v.error as exc:
            self._break(f"verbs error: {exc}")
            raise TransferFailed(f"rdma: {exc}") from exc
        except KvstoredError as exc:
            self._break(str(exc))  # the QP may still complete these WRs: never reuse it
            raise

    def _break(self, why: str) -> None:
        self.broken = why
        self.endpoint.destroy_qp(self.qp)  # fence the NIC before the bounce buffer is reused

    def _start(self, regions: Sequence[RemoteRegion], deadline: float) -> None:
        if self._closed or self.endpoint.num_registered_regions == 0:
            raise TransferFailed("rdma: transport closed")
        if self.broken:
            raise TransferFailed(f"rdma: QP unusable after an earlier failure ({self.broken})")
        if time.monotonic() >= deadline:
            raise DeadlineExceeded("rdma: deadline passed before the transfer")
        self._check(regions)

    def read_regions(self, regions: Sequence[RemoteRegion], sink: Sink, *, deadline: float) -> None:
        """RDMA READ each region into the bounce buffer, then into ``sink(i, size, b"")``.

        Raises:
            InvalidArgument: a region outside the peer's registered region or larger than
                the bounce buffer.
            TransferFailed: a work request failed (the QP is then unusable).
            DeadlineExceeded: completions still pending at ``deadline``.
        """
        with self._lock:
            self._start(regions, deadline)
            for batch in self._rounds(regions):
                self._run(self.endpoint.verbs.enums.IBV_WR_RDMA_READ, regions, batch, deadline)
                for i, boff in batch:
                    size = regions[i].size_bytes
                    view = sink(i, size, b"")
                    if view is not None:
                        view[:size] = memoryview(self._bounce).cast("B")[boff:boff + size]

    def write_regions(
        self, regions: Sequence[RemoteRegion], values: Sequence[memoryview], *, deadline: float
    ) -> None:
        """RDMA WRITE ``values[i]`` (exactly ``regions[i].size_bytes``) into each region.

        Raises as :meth:`read_regions`, and InvalidArgument when a value's size differs
        from its region's.
        """
        if len(values) != len(regions):
            raise InvalidArgument(f"rdma: {len(values)} values for {len(regions)} regions")
        for i, (r, val) in enumerate(zip(regions, values, strict=True)):
            if memoryview(val).nbytes != r.size_bytes:
                raise InvalidArgument(
                    f"rdma: value {i} is {memoryview(val).nbytes} bytes, its region {r.size_bytes}")
        with self._lock:
            self._start(regions, deadline)
            bounce = memoryview(self._bounce).cast("B")
            for batch in self._rounds(regions):
                for i, boff in batch:
                    bounce[boff:boff + regions[i].size_bytes] = memoryview(values[i]).cast("B")
                self._run(self.endpoint.verbs.enums.IBV_WR_RDMA_WRITE, regions, batch, deadline)

    def close(self) -> None:
        """Destroy the QP and its CQ (the endpoint stays; close it separately). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.endpoint.destroy_qp(self.qp)


def connect(endpoint: RdmaEndpoint, exchange: Callable[[bytes], bytes], **kwargs: Any) -> RdmaTransport:
    """Create an RC QP, swap adverts through ``exchange`` and return a connected transport.

    ``exchange(local advert JSON) -> peer advert JSON`` is the handshake round trip (the
    node answers with :meth:`RdmaServer.accept_json`). Raises InvalidArgument (a malformed
    peer advert) or TransferFailed (verbs); the QP is destroyed on failure.
    """
    qp, local = endpoint.create_qp()
    try:
        peer = RdmaAdvert.from_json(exchange(local.to_json()))
        endpoint.connect_qp(qp, local, peer)
    except BaseException:
        endpoint.destroy_qp(qp)
        raise
    return RdmaTransport(endpoint, qp, peer, **kwargs)


# ---- the node's side --------------------------------------------------------------------------


@dataclass(slots=True)
class _WriteGrant:
    session_id: int
    regions: list[RemoteRegion]
    expires_at: float
    quarantined: bool = False


@dataclass(slots=True)
class _Session:
    qp: Any
    advert: RdmaAdvert
    grants: dict[int, _WriteGrant] = field(default_factory=dict)


class RdmaServer:
    """The node's RDMA side: its arena as one MR, one RC QP per peer session, and the
    fencing of RDMA WRITE grants.

    Args:
        endpoint: an :class:`RdmaEndpoint` over the node's arena (``remote_access=True``).
        clock: monotonic seconds (a fake clock in tests).

    A WRITE grant (:meth:`grant_write`) names arena regions a peer's NIC may write into
    until the grant's lease lapses. :meth:`expire` moves lapsed grants to quarantine: their
    regions are NOT handed back, since the peer's NIC may still write; a late commit of one
    raises LeaseExpired. :meth:`end_session` destroys the peer's QP first (no WR of it is
    executed after that) and only then returns every region its grants held, active or
    quarantined, for the node to free. Thread-safe.
    """

    def __init__(self, endpoint: RdmaEndpoint, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[int, _Session] = {}
        self._grant_session: dict[int, int] = {}

    def accept(self, session_id: int, peer: RdmaAdvert) -> RdmaAdvert:
        """Connect a QP to the peer of ``session_id``; the node's advert to send back.

        Raises InvalidArgument (session 0, or one already connected) or TransferFailed.
        """
        if session_id <= 0:
            raise InvalidArgument(f"rdma: a QP needs a session, received session id {session_id}")
        with self._lock:
            if session_id in self._sessions:
                raise InvalidArgument(f"rdma: session {session_id} already has a QP")
        qp, local = self.endpoint.create_qp()
        try:
            self.endpoint.connect_qp(qp, local, peer)
        except BaseException:
            self.endpoint.destroy_qp(qp)
            raise
        with self._lock:
            self._sessions[session_id] = _Session(qp, peer)
        return local

    def accept_json(self, session_id: int, data: bytes) -> bytes:
        """:meth:`accept` on JSON adverts (the handshake's server half)."""
        return self.accept(session_id, RdmaAdvert.from_json(data)).to_json()

    @property
    def num_sessions(self) -> int:
        """Peers with a live QP."""
        return len(self._sessions)

    def grant_write(self, session_id: int, grant_id: int, regions: Sequence[RemoteRegion],
                    *, lease_s: float) -> None:
        """Record that ``session_id``'s NIC may write ``regions`` until ``lease_s`` from now.
        Raises InvalidArgument for a session without a QP or a repeated ``grant_id``."""
        with self._lock:
            sess = self._sessions.get(session_id)
            if sess is None:
                raise InvalidArgument(f"rdma: session {session_id} has no QP")
            if grant_id in self._grant_session:
                raise InvalidArgument(f"rdma: write grant {grant_id} exists already")
            sess.grants[grant_id] = _WriteGrant(session_id, list(regions), self.clock() + lease_s)
            self._grant_session[grant_id] = session_id

    def expire(self) -> list[int]:
        """Quarantine every write grant whose lease lapsed; the ids newly quarantined."""
        now = self.clock()
        out: list[int] = []
        with self._lock:
            for sess in self._sessions.values():
                for gid, g in sess.grants.items():
                    if not g.quarantined and g.expires_at <= now:
                        g.quarantined = True
                        out.append(gid)
        return out

    def commit_write(self, grant_id: int) -> list[RemoteRegion]:
        """The writer's ack: the grant's regions, now the node's to commit.

        Raises LeaseExpired when the grant is quarantined (its lease lapsed first: the
        regions stay held until the session ends) and InvalidArgument for an unknown id.
        """
        self.expire()
        with self._lock:
            sid = self._grant_session.get(grant_id)
            if sid is None:
                raise InvalidArgument(f"rdma: unknown write grant {grant_id}")
            sess = self._sessions[sid]
            g = sess.grants[grant_id]
            if g.quarantined:
                raise LeaseExpired(f"rdma: write grant {grant_id} lapsed; quarantined until "
                                   f"session {sid} ends")
            del sess.grants[grant_id]
            del self._grant_session[grant_id]
            return g.regions

    def quarantined_regions(self) -> list[RemoteRegion]:
        """Every region held by a quarantined write grant (none of it may be reused)."""
        with self._lock:
            return [r for s in self._sessions.values() for g in s.grants.values()
                    if g.quarantined for r in g.regions]

    def end_session(self, session_id: int) -> list[RemoteRegion]:
        """Tear down the peer: destroy its QP, then return every region its grants held
        (active and quarantined) for the node to free. Idempotent (``[]`` the second time)."""
        with self._lock:
            sess = self._sessions.pop(session_id, None)
            if sess is None:
                return []
            for gid in sess.grants:
                self._grant_session.pop(gid, None)
        self.endpoint.destroy_qp(sess.qp)  # fence first: the NIC executes nothing after this
        return [r for g in sess.grants.values() for r in g.regions]

    def close(self) -> list[RemoteRegion]:
        """End every session (see :meth:`end_session`); the regions to free."""
        with self._lock:
            ids = list(self._sessions)
        return [r for sid in ids for r in self.end_session(sid)]


# ---- the read protocols over a one-sided transport --------------------------------------------


def _deliver(staged: dict[int, bytearray], regions: Sequence[RemoteRegion],
             idx: Sequence[int], keep: Sequence[bool], sink: Sink) -> list[bool]:
    found = [False] * (max(idx) + 1 if idx else 0)
    for j, i in enumerate(idx):
        if not keep[j]:
            continue
        size = regions[j].size_bytes
        view = sink(i, size, b"")
        if view is not None:
            view[:size] = staged[j]
        found[i] = True
    return found


def read_versioned(
    source: VersionedBlockSource, transport: Any, keys: Sequence[bytes], namespace_id: bytes,
    sink: Sink, *, deadline: float, after_copy: Callable[[], None] | None = None,
    generations: list[int] | None = None,
) -> list[bool]:
    """A one-sided read with no grant: locate -> READ -> check generations.

    The bytes are staged; a block whose replica changed between the locate and the check
    (evicted, replaced) is dropped and its sink is never called: it reads as not found.
    ``after_copy``: test hook between the READ and the check. ``generations``, when given,
    is filled with per key the generation of the replica delivered (0 = not delivered).
    Returns per key whether its bytes were delivered. Raises what
    ``transport.read_regions`` raises (nothing delivered).
    """
    located = source.locate_blocks(keys, namespace_id)
    if generations is not None:
        generations[:] = [0] * len(keys)
    idx = [i for i, r in enumerate(located) if r is not None]
    regions = [r for r in located if r is not None]
    staged: dict[int, bytearray] = {}

    def stage(j: int, size: int, _meta: bytes) -> memoryview:
        staged[j] = bytearray(size)
        return memoryview(staged[j])

    if regions:
        transport.read_regions(regions, stage, deadline=deadline)
    if after_copy is not None:
        after_copy()
    keep = source.check_generations([keys[i] for i in idx], namespace_id, regions) if regions else []
    found = _deliver(staged, regions, idx, keep, sink)
    if generations is not None:
        for j, i in enumerate(idx):
            if keep[j]:
                generations[i] = regions[j].generation
    return found + [False] * (len(keys) - len(found))


def read_granted(
    server: GrantingServer, transport: Any, keys: Sequence[bytes], namespace_id: bytes,
    sink: Sink, *, session_id: int, deadline: float, lease_ms: int = 0,
    after_copy: Callable[[], None] | None = None,
) -> list[bool]:
    """A granted one-sided read: pin -> READ -> release.

    Raises LeaseExpired (nothing delivered) when the node reports the pin's lease lapsed
    before the release, and what ``transport.read_regions`` raises; the pin is released in
    every case. ``after_copy``: test hook between the READ and the release.
    """
    pin_id, pinned = server.pin_blocks(keys, namespace_id, session_id=session_id, lease_ms=lease_ms)
    idx: list[int] = []
    regions: list[RemoteRegion] = []
    for i, p in enumerate(pinned):
        if p is None or isinstance(p, KvstoredError):
            continue
        idx.append(i)
        regions.append(RemoteRegion(p.offset, p.size_bytes, p.generation))
    staged: dict[int, bytearray] = {}

    def stage(j: int, size: int, _meta: bytes) -> memoryview:
        staged[j] = bytearray(size)
        return memoryview(staged[j])

    try:
        if regions:
            transport.read_regions(regions, stage, deadline=deadline)
        if after_copy is not None:
            after_copy()
    finally:
        _, lapsed = server.release_pins_report([pin_id])
    if pin_id in lapsed:
        raise LeaseExpired(f"rdma: pin {pin_id} lapsed before its release; copy dropped")
    found = _deliver(staged, regions, idx, [True] * len(idx), sink)
    return found + [False] * (len(keys) - len(found))


HeaderCheck = Callable[[int, bytes, bytes], bool]
"""``check(i, header before, header after)`` -> True when block ``i``'s bytes, READ between
the two header READs, are the block the caller expected (a seqlock check on the slot header;
kvstored/node/rdma_slots.py builds one from kvstored/tiers/slots.py's layout)."""


def read_header_checked(
    transport: Any, regions: Sequence[RemoteRegion], headers: Sequence[RemoteRegion],
    check: HeaderCheck, sink: Sink, *, deadline: float,
    after_copy: Callable[[], None] | None = None,
) -> list[bool]:
    """A one-sided read checked by the slot headers, no call to the node at all.

    Source: Pilaf (USENIX ATC 2013) self-verifying reads; FaRM (NSDI 2014) versions checked
    after a one-sided READ. Three rounds, each waiting for all its completions before the
    next is posted (so the payload READ ran strictly between the two header READs): READ
    every ``headers[i]``, READ every ``regions[i]``, READ every ``headers[i]`` again. Block
    ``i`` is delivered to ``sink`` only when ``check(i, before, after)``; else it reads as
    not found (the caller's node path then). ``after_copy``: test hook after the payload
    READs. Raises what ``transport.read_regions`` raises (nothing delivered).
    """
    if len(headers) != len(regions):
        raise InvalidArgument(f"rdma: {len(headers)} slot headers for {len(regions)} regions")

    def reader(rs: Sequence[RemoteRegion]) -> dict[int, bytearray]:
        got: dict[int, bytearray] = {}

        def stage(j: int, size: int, _meta: bytes) -> memoryview:
            got[j] = bytearray(size)
            return memoryview(got[j])
        if rs:
            transport.read_regions(rs, stage, deadline=deadline)
        return got

    before = reader(headers)
    staged = reader(regions)
    if after_copy is not None:
        after_copy()
    after = reader(headers)
    keep = [check(j, bytes(before[j]), bytes(after[j])) for j in range(len(regions))]
    found = _deliver(staged, regions, range(len(regions)), keep, sink)
    return found + [False] * (len(regions) - len(found))


class RdmaOrTcp:
    """The caller's :class:`~.base.Transport` to one node: one-sided RDMA reads when both
    ends advertised a device, TCP otherwise and on any RDMA error, within one deadline.

    Args:
        tcp: the node's two-sided transport (DataPlaneClient).
        rdma: a connected :class:`RdmaTransport`, or None when :func:`negotiate` said TCP.
        source: where versioned reads locate and check blocks (the node's control path).

    A get reads the DRAM blocks the source locates over RDMA (:func:`read_versioned`);
    the keys it did not deliver (not in DRAM, changed while copied) go through TCP in the
    same call. An RDMA failure (verbs error, failed WR, deadline) sends the whole get
    through TCP with the remaining deadline, and later gets straight to TCP (the QP is
    broken). Puts always go through TCP. ``num_fallbacks`` counts the gets that fell back.
    """

    def __init__(self, tcp: Transport, rdma: RdmaTransport | None,
                 source: VersionedBlockSource | None) -> None:
        self.tcp = tcp
        self.rdma = rdma if source is not None else None
        self.source = source
        self.num_fallbacks = 0
        self.num_rdma_blocks = 0
        self.last_error = ""

    @property
    def path(self) -> str:
        """``"rdma"`` while the RDMA path is usable, else ``"tcp"``."""
        return "rdma" if self.rdma is not None and not self.rdma.broken else "tcp"

    def get(self, keys: Sequence[bytes], namespace_id: bytes, sink: Sink, *, deadline: float) -> list[GetItem]:
        """As :meth:`~.base.Transport.get`; RDMA-delivered items carry tier 1, no meta, and
        the generation the source located and checked (so a reading node verifies its copy
        as it does one sent over TCP)."""
        if self.path == "tcp":
            return self.tcp.get(keys, namespace_id, sink, deadline=deadline)
        assert self.rdma is not None and self.source is not None
        sizes: dict[int, int] = {}

        def sized(i: int, size: int, meta: bytes) -> memoryview | None:
            sizes[i] = size
            return sink(i, size, meta)

        try:
            gens: list[int] = []
            found = read_versioned(self.source, self.rdma, keys, namespace_id, sized,
                                   deadline=deadline, generations=gens)
        except (KvstoredError, OSError) as exc:
            self.num_fallbacks += 1
            self.last_error = str(exc)
            return self.tcp.get(keys, namespace_id, sink, deadline=deadline)
        self.num_rdma_blocks += sum(found)
        rest = [i for i, f in enumerate(found) if not f]
        items: list[GetItem | None] = [None] * len(keys)
        for i, f in enumerate(found):
            if f:
                items[i] = GetItem(0, "", True, 1, sizes.get(i, 0), b"", gens[i])
        if rest:
            def rest_sink(j: int, size: int, meta: bytes) -> memoryview | None:
                return sink(rest[j], size, meta)
            try:
                got = self.tcp.get([keys[i] for i in rest], namespace_id, rest_sink, deadline=deadline)
            except KvstoredError as exc:
                attach_completed(exc, items)
                raise
            for j, item in enumerate(got):
                items[rest[j]] = item
        return [it if it is not None else GetItem(0, "", False, 0, 0, b"") for it in items]

    def put(self, items: Sequence[tuple[bytes, memoryview, bytes]], namespace_id: bytes, *,
            deadline: float, replicas: int = 0,
            handoff_age_s: float | None = None, spare_only: bool = False) -> list[PutItem]:
        """Through TCP (:meth:`~.base.Transport.put`)."""
        return self.tcp.put(items, namespace_id, deadline=deadline, replicas=replicas,
                            handoff_age_s=handoff_age_s, spare_only=spare_only)

    def close(self) -> None:
        """Close both paths (idempotent)."""
        if self.rdma is not None:
            self.rdma.close()
        self.tcp.close()
