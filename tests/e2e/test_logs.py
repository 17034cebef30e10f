"""A real daemon's log (``--log-format json``): every line is one JSON object, every request
line names its request id, node id and peer, and no payload byte is ever logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import ServeProcess

from kvstored import Client

pytestmark = pytest.mark.usefixtures("pinned_reads")  # its get's PinBlocks line is checked

MARKER = b"PAYLOAD-MARKER-7f3a"


def test_request_lines_carry_ids_and_never_the_payload(workdir: Path) -> None:
    node = ServeProcess(workdir, node_id="logs", extra=["--log-format", "json", "--log-level", "debug"])
    node.start()
    try:
        value = MARKER * 64
        keys = [bytes([i]) * 16 for i in range(3)]
        for address in (node.unix_address, node.tcp_address):  # shm or inline, and TCP
            with Client(address) as c:
                c.put(keys, [value] * 3)
                assert c.get(keys) == [value] * 3
                assert c.get([b"\xee" * 16]) == [None]  # a miss is logged like any request
        assert node.terminate() == 0, node.log()[-3000:]
    finally:
        node.kill()
    text = node.log()
    for needle in (MARKER.decode(), MARKER.hex(), repr(MARKER)[2:-1]):
        assert needle not in text, f"payload bytes ({needle!r}) in the log"
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # all JSON
    assert all(e["node_id"] == "logs" for e in lines)
    served = [e for e in lines if e["event"] in ("rpc_served", "data_plane_request_served")]
    methods = {e["method"] for e in served}
    assert {"Put", "PinBlocks", "dataplane"} <= methods, methods  # gRPC, shm control channel, TCP
    assert served and all(e["request_id"] and e["peer"] for e in served)
    assert len({e["request_id"] for e in served}) == len(served)  # one id per request
