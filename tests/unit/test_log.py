"""kvstored.log: structlog over stdlib logging, one stream for our events and every library's."""

from __future__ import annotations

import io
import json
import logging
import warnings
from collections.abc import Iterator

import pytest
import structlog

from kvstored import log as kvlog

configure = kvlog.configure  # the real one: tests/conftest.py stubs kvstored.log.configure per test


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logging.captureWarnings(False)
    kvlog._process_fields.clear()
    structlog.reset_defaults()


def test_our_events_and_library_records_share_one_json_stream(restore_logging: None) -> None:
    out = io.StringIO()
    configure(json=True, level="info", stream=out)
    kvlog.bind_process(node_id="n7")
    fields = {"request_id": "r1", "peer": "ipv4:1.2.3.4:5", "method": "Control"}
    token = kvlog.bind_request(fields)
    fields["method"] = "PinBlocks"  # known once parsed: later lines say so
    with structlog.contextvars.bound_contextvars(session_id=3):  # structlog's own binding too
        structlog.get_logger("kvstored.node.service").info("rpc_served", duration_ms=1.5)
    kvlog.unbind_request(token)
    logging.getLogger("grpc._cython.cygrpc").warning("channel %s closed", "x")  # a library's line
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("old api", DeprecationWarning, stacklevel=1)
    structlog.get_logger("kvstored.x").debug("below_the_level")
    logging.getLogger("rocksdict").debug("below the level too")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["logger"], e["level"]) for e in lines] == [
        ("kvstored.node.service", "info"), ("grpc._cython.cygrpc", "warning"), ("py.warnings", "warning")]
    ours, grpc_line, warned = lines
    assert ours["event"] == "rpc_served" and ours["request_id"] == "r1" and ours["peer"] == "ipv4:1.2.3.4:5"
    assert ours["method"] == "PinBlocks" and ours["session_id"] == 3
    assert "request_id" not in grpc_line  # the request's scope ended before it
    assert grpc_line["event"] == "channel x closed"
    assert all(e["node_id"] == "n7" and e["timestamp"].endswith("Z") for e in lines)
    assert "old api" in warned["event"]


def test_console_format_and_bad_level(restore_logging: None) -> None:
    out = io.StringIO()
    configure(json=False, level="debug", stream=out)
    logging.getLogger("asyncio").debug("loop slow")
    assert "loop slow" in out.getvalue() and not out.getvalue().startswith("{")
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        configure(level="loud")
