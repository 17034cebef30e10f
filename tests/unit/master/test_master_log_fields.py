"""A master call's log lines name the request (id, peer, method) and the node it speaks for."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import structlog

from kvstored import log as kvlog
from kvstored.config import MasterConfig
from kvstored.master.daemon import MasterDaemon
from kvstored.v1 import master_pb2 as pb
from kvstored.v1 import master_pb2_grpc as pb_grpc

configure = kvlog.configure  # the real one: tests/conftest.py stubs kvstored.log.configure per test


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out = io.StringIO()
    configure(json=True, level="debug", stream=out)
    yield out
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logging.captureWarnings(False)
    structlog.reset_defaults()


def test_request_lines_carry_request_id_peer_and_the_calling_node(log_stream: io.StringIO, tmp_path: Path) -> None:
    daemon = MasterDaemon(MasterConfig(listen=["127.0.0.1:0"], data_dir=tmp_path))

    async def main() -> None:
        await daemon.start()
        try:
            async with grpc.aio.insecure_channel(daemon.grpc_addresses[0]) as channel:
                stub = pb_grpc.MasterServiceStub(channel)
                await stub.ListNodes(pb.ListNodesRequest())
                await stub.Heartbeat(pb.HeartbeatRequest(node_id="gpu9", epoch=1))  # unknown: re-register
        finally:
            await daemon.stop()

    asyncio.run(main())
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    listed = next(e for e in lines if e.get("method") == "ListNodes" and e["event"] == "rpc_served")
    beat = next(e for e in lines if e.get("method") == "Heartbeat" and e["event"] == "rpc_served")
    for e in (listed, beat):
        assert len(e["request_id"]) == 12 and e["peer"].startswith("ipv4:127.0.0.1:")
    assert listed["request_id"] != beat["request_id"]
    assert beat["node_id"] == "gpu9" and "node_id" not in listed  # kvstorectl speaks for no node
