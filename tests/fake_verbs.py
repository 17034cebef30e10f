"""A fake verbs layer with pyverbs' API (rdma-core 44), for tests of kvstored/transport/rdma.py.

Follows the names and signatures of the installed python3-pyverbs: ``device.Context(name=)``,
``device.get_device_list()`` (raises PyverbsRDMAError with no device), ``pd.PD(ctx)``,
``mr.MR(pd, length, access, address=)`` (``lkey``, ``rkey``, ``close``), ``cq.CQ(ctx, cqe)``
(``poll(n) -> (npolled, wcs)``), ``qp.QP(pd, QPInitAttr, QPAttr)`` (``qp_num``, ``to_rts``,
``modify``, ``post_send``, ``close``), ``qp.QPCap``/``QPInitAttr``/``QPAttr``,
``wr.SendWR(wr_id=, opcode=, num_sge=, sg=, send_flags=)`` + ``set_wr_rdma(rkey, addr)``,
``wr.SGE(addr, length, lkey)``, ``addr.GID``/``GlobalRoute``/``AHAttr(gr=)`` and the
``IBV_*`` values of ``pyverbs.enums``.

A :class:`Fabric` joins the fakes: every MR registered on it is addressable by its rkey, and
an RDMA READ/WRITE posted on a connected QP is an immediate ``ctypes.memmove`` between the
two registered buffers (same process; each end may map the same arena file), checked like a
NIC checks it: the rkey must name a live MR of the peer with the access flag, the range must
lie inside it, and the QP must be in RTS. Hooks: ``before_wr(qp, wr)`` runs before each
work request executes (a test holds or changes the source there) and ``fail_wr(wr)`` -> a
WC status makes that WR complete in error (the QP then moves to ERR, like hardware).

Across processes (a node daemon loads this module through ``KVSTORED_TEST_VERBS=
tests.fake_verbs:process_verbs``): :func:`process_verbs` gives each process its own fabric
with keys and QP numbers drawn from a per-process range, and ``Verbs.attach_peer`` maps a
peer's arena FILE (the path its ConnectRdma answer names) read-only with ``mmap(PROT_READ)``
and registers the peer's MR (REMOTE_READ only) and QP in this process, so a READ posted here
copies the peer's bytes as they are in the shared file at that moment. Environment of
:func:`process_verbs`: ``KVSTORED_TEST_FAKE_DEVICES`` (comma-separated device names; ""
= none: ``get_device_list()`` raises; default ``fake0``) and ``KVSTORED_TEST_FAKE_FAIL_WR=N``
(the N-th work request this process posts, 1-based, completes with RETRY_EXC_ERR).
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvstored.transport.rdma import Verbs


class PyverbsError(Exception):
    pass


class PyverbsRDMAError(PyverbsError):
    pass


enums = SimpleNamespace(
    IBV_ACCESS_LOCAL_WRITE=1, IBV_ACCESS_REMOTE_WRITE=2, IBV_ACCESS_REMOTE_READ=4,
    IBV_QPT_RC=2, IBV_QPS_RESET=0, IBV_QPS_INIT=1, IBV_QPS_RTR=2, IBV_QPS_RTS=3, IBV_QPS_ERR=6,
    IBV_QP_STATE=1, IBV_MTU_1024=3, IBV_WR_RDMA_WRITE=0, IBV_WR_RDMA_READ=4,
    IBV_SEND_SIGNALED=2, IBV_WC_SUCCESS=0, IBV_WC_REM_ACCESS_ERR=10, IBV_WC_WR_FLUSH_ERR=5,
    IBV_WC_RETRY_EXC_ERR=12,
)
E = enums


@dataclass
class Fabric:
    """The fake wire: devices present, live MRs by rkey, QPs by number, and the hooks."""

    devices: list[str] = field(default_factory=lambda: ["fake0"])
    mrs: dict[int, FakeMR] = field(default_factory=dict)
    qps: dict[int, FakeQP] = field(default_factory=dict)
    before_wr: Callable[[FakeQP, FakeSendWR], None] | None = None
    fail_wr: Callable[[FakeSendWR], int] | None = None
    num_open: dict[str, int] = field(default_factory=lambda: {"ctx": 0, "pd": 0, "cq": 0, "mr": 0, "qp": 0})
    key_base: int = 0x100
    _keys: itertools.count[int] = field(init=False)
    _maps: dict[int, tuple[int, int]] = field(default_factory=dict)  # rkey -> (address, length)

    def __post_init__(self) -> None:
        self._keys = itertools.count(self.key_base)

    def attach_file(self, advert: Any, path: str) -> None:
        """``Verbs.attach_peer``: map the peer's arena file read-only and make its QP
        ``advert.qpn`` and MR ``advert.rkey`` (at its virtual ``advert.addr``) reachable
        from this process (REMOTE_READ only: a WRITE to it completes REM_ACCESS_ERR)."""
        own = self.mrs.get(advert.rkey)
        if own is not None and advert.rkey not in self._maps and own.buf == advert.addr:
            return  # the peer registered on this very fabric (one process): reachable already
        if not path:
            raise PyverbsRDMAError("fake verbs: the peer has no arena file to map")
        if (own is not None and advert.rkey not in self._maps) or (
                advert.qpn in self.qps and self.qps[advert.qpn].dest is not None):
            raise PyverbsRDMAError(f"fake verbs: rkey {advert.rkey:#x} / QP {advert.qpn:#x} of "
                                   "the peer collide with this process's")
        old = self._maps.pop(advert.rkey, None)
        if old is not None:
            _LIBC.munmap(old[0], old[1])
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            addr = _LIBC.mmap(None, advert.length_bytes, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise PyverbsRDMAError(f"fake verbs: cannot map {path} (errno {ctypes.get_errno()})")
        self._maps[advert.rkey] = (addr, advert.length_bytes)
        pd = SimpleNamespace(closed=False)
        mr = FakeMR.__new__(FakeMR)
        mr.fab, mr.pd, mr.length, mr.buf = self, pd, advert.length_bytes, advert.addr
        mr.access = E.IBV_ACCESS_REMOTE_READ
        mr.lkey = mr.rkey = advert.rkey
        mr.local_base = addr
        self.mrs[advert.rkey] = mr
        qp = FakeQP.__new__(FakeQP)
        qp.fab, qp.pd, qp.qp_num, qp.qp_state, qp.dest = self, pd, advert.qpn, E.IBV_QPS_RTS, None
        self.qps[advert.qpn] = qp

    def import_peer(self, qpn: int, rkey: int, addr: int, length: int, buf: Any) -> None:
        """Make another process's QP ``qpn`` and MR ``rkey`` (at its virtual ``addr``)
        reachable from this process's fakes: ``buf`` is this process's mapping of the same
        memory (the arena file both processes map), so a READ/WRITE copies through it."""
        view = (ctypes.c_char * length).from_buffer(buf)
        pd = SimpleNamespace(closed=False)
        mr = FakeMR.__new__(FakeMR)
        mr.fab, mr.pd, mr.length, mr.access, mr.buf = self, pd, length, 7, addr
        mr.lkey = mr.rkey = rkey
        mr.local_base = ctypes.addressof(view)
        mr._keep = view
        self.mrs[rkey] = mr
        qp = FakeQP.__new__(FakeQP)
        qp.fab, qp.pd, qp.qp_num, qp.qp_state, qp.dest = self, pd, qpn, E.IBV_QPS_RTS, None
        self.qps[qpn] = qp

    def verbs(self) -> Verbs:
        """A :class:`Verbs` whose modules are this fabric's fakes."""
        fab = self

        class Context:
            def __init__(self, *, name: str) -> None:
                if name not in fab.devices:
                    raise PyverbsRDMAError(f"Failed to open device {name}")
                self.name = name.encode()
                self.closed = False
                fab.num_open["ctx"] += 1

            def query_gid(self, port_num: int, index: int) -> SimpleNamespace:
                n = fab.devices.index(self.name.decode()) + 1
                return SimpleNamespace(gid=f"fe80:0000:0000:0000:0000:0000:0000:{n:04x}")

            def query_port(self, port_num: int) -> SimpleNamespace:
                return SimpleNamespace(lid=0)

            def close(self) -> None:
                if not self.closed:
                    self.closed = True
                    fab.num_open["ctx"] -= 1

        def get_device_list() -> list[SimpleNamespace]:
            if not fab.devices:
                raise PyverbsRDMAError("Failed to get devices list")
            return [SimpleNamespace(name=d.encode()) for d in fab.devices]

        class PD:
            def __init__(self, ctx: Any) -> None:
                self.ctx = ctx
                self.closed = False
                fab.num_open["pd"] += 1

            def close(self) -> None:
                if not self.closed:
                    self.closed = True
                    fab.num_open["pd"] -= 1

        def MR(pd: Any, length: int, access: int, address: int = 0) -> FakeMR:  # noqa: N802
            return FakeMR(fab, pd, length, access, address)

        def CQ(ctx: Any, cqe: int) -> FakeCQ:  # noqa: N802
            return FakeCQ(fab, cqe)

        def QP(pd: Any, init_attr: Any, qp_attr: Any = None) -> FakeQP:  # noqa: N802
            return FakeQP(fab, pd, init_attr)

        def QPCap(**kw: Any) -> SimpleNamespace:  # noqa: N802
            return SimpleNamespace(**kw)

        def QPInitAttr(**kw: Any) -> SimpleNamespace:  # noqa: N802
            return SimpleNamespace(**kw)

        def QPAttr(qp_state: int = E.IBV_QPS_INIT, cur_qp_state: int = E.IBV_QPS_RESET,
                   port_num: int = 1) -> SimpleNamespace:  # noqa: N802
            return SimpleNamespace(qp_state=qp_state, port_num=port_num)

        def GID(val: str) -> SimpleNamespace:  # noqa: N802
            return SimpleNamespace(gid=val)

        return Verbs(
            device=SimpleNamespace(Context=Context, get_device_list=get_device_list),
            pd=SimpleNamespace(PD=PD), mr=SimpleNamespace(MR=MR), cq=SimpleNamespace(CQ=CQ),
            qp=SimpleNamespace(QP=QP, QPCap=QPCap, QPInitAttr=QPInitAttr, QPAttr=QPAttr),
            wr=SimpleNamespace(SendWR=FakeSendWR, SGE=FakeSGE),
            addr=SimpleNamespace(GID=GID, GlobalRoute=lambda **kw: SimpleNamespace(**kw),
                                 AHAttr=lambda **kw: SimpleNamespace(**kw)),
            enums=enums, error=PyverbsError, attach_peer=fab.attach_file,
        )


class FakeMR:
    def __init__(self, fab: Fabric, pd: Any, length: int, access: int, address: int) -> None:
        if pd.closed:
            raise PyverbsRDMAError("Failed to register a MR: PD closed")
        self.fab, self.pd, self.length, self.access, self.buf = fab, pd, length, access, address
        self.lkey = self.rkey = next(fab._keys)
        self.local_base = address  # where this process reaches the region (import_peer differs)
        fab.mrs[self.rkey] = self
        fab.num_open["mr"] += 1

    def close(self) -> None:
        if self.fab.mrs.pop(self.rkey, None) is not None:
            self.fab.num_open["mr"] -= 1


@dataclass
class FakeWC:
    wr_id: int
    status: int
    opcode: int = 0
    byte_len: int = 0


class FakeCQ:
    def __init__(self, fab: Fabric, cqe: int) -> None:
        self.fab, self.cqe = fab, cqe
        self.entries: list[FakeWC] = []
        self.closed = False
        fab.num_open["cq"] += 1

    def poll(self, num_entries: int = 1) -> tuple[int, list[FakeWC]]:
        out, self.entries = self.entries[:num_entries], self.entries[num_entries:]
        return len(out), out

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.fab.num_open["cq"] -= 1


@dataclass
class FakeSGE:
    addr: int
    length: int
    lkey: int


class FakeSendWR:
    def __init__(self, wr_id: int = 0, opcode: int = 0, num_sge: int = 0, imm_data: int = 0,
                 sg: list[FakeSGE] | None = None, send_flags: int = 0) -> None:
        self.wr_id, self.opcode, self.num_sge, self.sg, self.send_flags = wr_id, opcode, num_sge, sg or [], send_flags
        self.rkey = self.remote_addr = 0

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        self.rkey, self.remote_addr = rkey, addr


class FakeQP:
    def __init__(self, fab: Fabric, pd: Any, init_attr: Any) -> None:
        if init_attr.qp_type != E.IBV_QPT_RC:
            raise PyverbsRDMAError("fake verbs: only RC QPs")
        self.fab, self.pd, self.cq = fab, pd, init_attr.scq
        self.qp_num = next(fab._keys) & 0xFFFFFF
        self.qp_state = E.IBV_QPS_INIT
        self.dest: int | None = None
        self.posted: list[FakeSendWR] = []
        fab.qps[self.qp_num] = self
        fab.num_open["qp"] += 1

    def to_rts(self, attr: Any) -> None:
        if self.qp_state not in (E.IBV_QPS_INIT, E.IBV_QPS_RTR):
            raise PyverbsRDMAError(f"Failed to modify QP state to RTS (state {self.qp_state})")
        for name in ("dest_qp_num", "rq_psn", "sq_psn", "path_mtu", "ah_attr"):
            getattr(attr, name)  # the real to_rts needs them all
        self.dest = attr.dest_qp_num
        self.qp_state = E.IBV_QPS_RTS

    def modify(self, attr: Any, mask: int) -> None:
        if mask & E.IBV_QP_STATE:
            self.qp_state = attr.qp_state

    def _peer_mr(self, wr: FakeSendWR, size: int, access: int) -> FakeMR | None:
        peer = self.fab.qps.get(self.dest or -1)
        mr = self.fab.mrs.get(wr.rkey)
        if peer is None or peer.qp_state != E.IBV_QPS_RTS or mr is None or mr.pd is not peer.pd:
            return None
        if not mr.access & access or wr.remote_addr < mr.buf or wr.remote_addr + size > mr.buf + mr.length:
            return None
        return mr

    def post_send(self, wr: FakeSendWR, bad_wr: Any = None) -> None:
        if self.qp_state != E.IBV_QPS_RTS:
            raise PyverbsRDMAError(f"Failed to post send (QP state {self.qp_state})")
        self.posted.append(wr)
        if self.fab.before_wr is not None:
            self.fab.before_wr(self, wr)
        status = self.fab.fail_wr(wr) if self.fab.fail_wr is not None else E.IBV_WC_SUCCESS
        if status == E.IBV_WC_SUCCESS:
            sge = wr.sg[0]
            want = E.IBV_ACCESS_REMOTE_READ if wr.opcode == E.IBV_WR_RDMA_READ else E.IBV_ACCESS_REMOTE_WRITE
            mr = self._peer_mr(wr, sge.length, want)
            if self.fab.mrs.get(sge.lkey) is None or mr is None:
                status = E.IBV_WC_REM_ACCESS_ERR
            elif wr.opcode == E.IBV_WR_RDMA_READ:
                ctypes.memmove(sge.addr, mr.local_base + wr.remote_addr - mr.buf, sge.length)
            else:
                ctypes.memmove(mr.local_base + wr.remote_addr - mr.buf, sge.addr, sge.length)
        if status != E.IBV_WC_SUCCESS:
            self.qp_state = E.IBV_QPS_ERR
        self.cq.entries.append(FakeWC(wr.wr_id, status, wr.opcode, sge_len(wr)))

    def close(self) -> None:
        if self.fab.qps.pop(self.qp_num, None) is not None:
            self.qp_state = E.IBV_QPS_ERR
            self.fab.num_open["qp"] -= 1


def sge_len(wr: FakeSendWR) -> int:
    return sum(s.length for s in wr.sg)


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def process_verbs() -> Verbs:
    """The fake verbs of one process (a node daemon's ``KVSTORED_TEST_VERBS`` factory): its
    own fabric, keys from a per-process range, the environment read as the module says."""
    devices = os.environ.get("KVSTORED_TEST_FAKE_DEVICES", "fake0")
    fab = Fabric(devices=[d for d in devices.split(",") if d],
                 key_base=0x100 + (os.getpid() % 0xFFF) * 0x1000)
    fail_at = int(os.environ.get("KVSTORED_TEST_FAKE_FAIL_WR", "0") or 0)
    if fail_at:
        posted = itertools.count(1)

        def fail(wr: FakeSendWR) -> int:
            return E.IBV_WC_RETRY_EXC_ERR if next(posted) == fail_at else E.IBV_WC_SUCCESS
        fab.fail_wr = fail
    return fab.verbs()
