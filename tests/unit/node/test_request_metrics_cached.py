"""Request paths look up no labelled metric child after their first use (issue 9).

``.labels(...)`` costs microseconds a call. The gRPC handlers (node/service.py), the TCP data
plane's per-request counter (transport/tcp_server.py) and the remote-read outcomes
(node/remote.py) count through :class:`~kvstored.node.metrics.NodeMetrics` helpers that cache the
children; these tests patch ``MetricWrapperBase.labels`` to record any call after a warm-up.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import key
from prometheus_client.metrics import MetricWrapperBase
from remote_helpers import FakeMaster, make_reads
from thread_helpers import HOOK_WAIT_S, HookEvents

from kvstored.config import NodeConfig
from kvstored.errors import InvalidArgument
from kvstored.node import service
from kvstored.node.core import NodeCore
from kvstored.node.metrics import NodeMetrics
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.framing import OP_GET
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import PinnedBlock, Tier
from kvstored.v1 import node_pb2 as pb

BLOCK = 4 << 10


class LabelsCalls:
    """Records ``.labels`` calls once :meth:`start` is called (``calls``: (metric, labels))."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, object]] = []
        self._monkeypatch = monkeypatch

    def start(self) -> None:
        real = MetricWrapperBase.labels
        calls = self.calls

        def counting(self: MetricWrapperBase, *args: object, **kwargs: object) -> object:
            calls.append((self._name, kwargs or args))
            return real(self, *args, **kwargs)

        self._monkeypatch.setattr(MetricWrapperBase, "labels", counting)


@pytest.fixture
def labels_calls(monkeypatch: pytest.MonkeyPatch) -> LabelsCalls:
    return LabelsCalls(monkeypatch)


class _Aborted(Exception):
    """What the fake gRPC context raises on abort."""


class _Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def abort(self, *args: Any, **kwargs: Any) -> None:
        raise _Aborted


def test_grpc_handlers_reuse_their_children(labels_calls: LabelsCalls) -> None:
    metrics = NodeMetrics()
    servicer = SimpleNamespace(core=SimpleNamespace(metrics=metrics), check_roles=False)

    async def ok(request: Any, context: Any) -> pb.StatsResponse:
        return pb.StatsResponse()

    async def bad(request: Any, context: Any) -> pb.StatsResponse:
        raise InvalidArgument("bad request")

    good = service._wrap("Stats", pb.StatsRequest, ok, servicer)  # type: ignore[arg-type]
    failing = service._wrap("Stats", pb.StatsRequest, bad, servicer)  # type: ignore[arg-type]
    raw = pb.StatsRequest().SerializeToString()

    async def round_trip() -> None:
        await good(raw, _Context())  # type: ignore[arg-type]
        with pytest.raises(_Aborted):
            await failing(raw, _Context())  # type: ignore[arg-type]

    asyncio.run(round_trip())  # first use creates the children
    labels_calls.start()
    for _ in range(3):
        asyncio.run(round_trip())
    assert labels_calls.calls == []
    r = metrics.registry
    assert r.get_sample_value("kvstored_rpc_requests_total", {"method": "Stats", "code": "OK"}) == 4
    assert r.get_sample_value(
        "kvstored_rpc_requests_total", {"method": "Stats", "code": "INVALID_ARGUMENT"}) == 4
    assert r.get_sample_value("kvstored_rpc_duration_seconds_count", {"method": "Stats"}) == 8


def _core(node_id: str) -> NodeCore:
    cfg = NodeConfig(node_id=node_id, dram_size_bytes=1 << 20, ssd_size_bytes=0,
                     max_block_bytes=BLOCK, max_batch_keys=64)
    store = TieredStore(dram_size_bytes=1 << 20, arena_dir=None, max_block_bytes=BLOCK)
    return NodeCore(store, cfg, epoch=7, metrics=NodeMetrics())


def test_data_plane_and_remote_reads_reuse_their_children(labels_calls: LabelsCalls) -> None:
    src, dst = _core("src"), _core("dst")
    # The source counts a GET after its last byte went out, so possibly after the reader
    # returned: the test waits for the server's request_done (reported after the count).
    served = HookEvents()
    server = DataPlaneServer(src, "127.0.0.1:0", hook=served.hook)
    address = server.start()
    master = FakeMaster()
    # a deadline far above any load (this test is about metric children, not deadlines: a
    # fill that ran out of time under load counted a new outcome child)
    reads = make_reads(dst, master, fetch_timeout_s=60.0)
    ids = iter(range(1, 1000))

    def round_trip() -> None:
        batch = [next(ids) for _ in range(2)]
        for i in batch:
            src.put_inline([(key(i), bytes([i % 251]) * BLOCK, b"")], b"")
            pinned = src.store.pin_many([key(i)])[0]
            assert isinstance(pinned, PinnedBlock)
            src.store.unpin(pinned)  # (the master names the generation the source holds)
            master.replicas[key(i)] = ClusterReplica(
                "src", 7, Tier.DRAM, BLOCK, pinned.generation, address)
        got = reads.fill([key(i) for i in batch], b"")
        assert got.num_fetched == 2

    try:
        round_trip()
        served.wait_for(1, "request_done", op=OP_GET)  # the first GET counted by the source
        labels_calls.start()
        for _ in range(3):
            round_trip()
        served.wait_for(4, "request_done", op=OP_GET)
    finally:
        reads.close()
        server.stop(0.0)
        src.store.close()
        dst.store.close()
    assert labels_calls.calls == []
    assert dst.metrics is not None and src.metrics is not None
    assert dst.metrics.registry.get_sample_value(
        "kvstored_remote_blocks_total", {"outcome": "fetched"}) == 8
    assert src.metrics.registry.get_sample_value(
        "kvstored_dataplane_requests_total", {"op": "get", "code": "OK"}) == 4


def test_a_get_is_counted_after_its_last_byte_so_a_reader_may_return_first() -> None:
    """The race the data-plane metric tests wait out: held between its last send and its
    count, the source has sent every byte (the reader returns) and counted nothing yet; its
    ``request_done`` comes after the count, so a test waits for that event."""
    release = threading.Event()
    served = HookEvents()

    def hold_after_send(event: str, **fields: Any) -> None:
        served.hook(event, **fields)
        if event == "chunk_sent":
            assert release.wait(HOOK_WAIT_S), "the test never released the source"

    src, dst = _core("src"), _core("dst")
    server = DataPlaneServer(src, "127.0.0.1:0", hook=hold_after_send)
    address = server.start()
    master = FakeMaster()
    reads = make_reads(dst, master, fetch_timeout_s=60.0)
    assert src.metrics is not None

    def counted() -> float | None:
        assert src.metrics is not None
        return src.metrics.registry.get_sample_value(
            "kvstored_dataplane_requests_total", {"op": "get", "code": "OK"})

    try:
        src.put_inline([(key(1), b"\x01" * BLOCK, b"")], b"")
        pinned = src.store.pin_many([key(1)])[0]
        assert isinstance(pinned, PinnedBlock)
        src.store.unpin(pinned)
        master.replicas[key(1)] = ClusterReplica("src", 7, Tier.DRAM, BLOCK, pinned.generation,
                                                 address)
        assert reads.fill([key(1)], b"").num_fetched == 1  # the reader has every byte
        served.wait_for(1, "chunk_sent")  # the source is held there from now on
        assert served.count("request_done") == 0
        assert counted() is None  # a scrape now sees no GET: the race
        release.set()
        served.wait_for(1, "request_done", op=OP_GET)
        assert counted() == 1
    finally:
        release.set()
        reads.close()
        server.stop(0.0)
        src.store.close()
        dst.store.close()
