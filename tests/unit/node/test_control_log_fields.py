"""The control channel's request log fields (kvstored/log.py bind_request) on a request that
suspends: its eager step runs in a protocol callback, the rest on a task; both must log the
same request id, and nothing logged outside it may carry it. The test holds the request at
an injected servicer step (an Event) while it logs a line from outside."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from kvstored import log as kvlog
from kvstored.node.control import ControlServer
from kvstored.transport.control import LENGTH_BYTES, frame
from kvstored.v1 import node_pb2 as pb

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


def test_a_suspended_control_request_logs_its_fields_on_both_sides_and_leaks_none(
        log_stream: io.StringIO, workdir: Path) -> None:
    log = structlog.get_logger("kvstored.test")

    async def main() -> pb.ControlResponse:
        gate = asyncio.Event()

        class Core:
            rpcs_in_flight = 0
            metrics = None

        class Servicer:
            core = Core()

            async def Exists(self, req: Any, ctx: Any) -> pb.ExistsResponse:
                log.info("exists_started")  # the eager step, in the protocol's callback
                await gate.wait()  # held here: the rest runs on a task
                log.info("exists_finished")
                return pb.ExistsResponse()

        path = str(workdir / "n.sock.ctl")
        server = ControlServer(Servicer(), path)  # type: ignore[arg-type]
        await server.start()
        try:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(frame(pb.ControlRequest(exists=pb.ExistsRequest())))
            await writer.drain()
            while "exists_started" not in log_stream.getvalue():
                await asyncio.sleep(0.001)
            log.info("between_requests")  # the loop's own context, outside the request
            gate.set()
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(LENGTH_BYTES), 30), "big")
            answer = pb.ControlResponse.FromString(await reader.readexactly(size))
            writer.close()
            return answer
        finally:
            await server.close()

    answer = asyncio.run(main())
    assert answer.error_code == 0, answer.error_message
    lines = {e["event"]: e for e in map(json.loads, log_stream.getvalue().splitlines())}
    started, finished = lines["exists_started"], lines["exists_finished"]
    assert started["request_id"] == finished["request_id"] and len(started["request_id"]) == 12
    assert started["method"] == finished["method"] == "Exists"
    assert started["peer"].endswith("(control)")
    assert "request_id" not in lines["between_requests"]
    served = lines["rpc_served"]  # the channel's per-request line, same id
    assert served["request_id"] == started["request_id"] and served["code"] == "OK"
