"""An unauthenticated peer throws random and truncated frames at a real node (seeded, bounded,
loopback only): the gRPC TCP listener and the unix socket (random bytes, truncated HTTP/2
prefaces, real gRPC calls with garbage protobuf) and the TCP data plane (random headers,
wrong magic, huge declared lengths, truncated bodies and payloads).

Afterwards the node is alive and serves a checked put/get round trip, its RSS and open file
descriptors are flat (measured after a warm-up round, a stated slack), and nothing stored
changed: the blocks put before the fuzz read back identical, and the store holds no key the
fuzz did not get an OK for.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from e2e_helpers import ServeProcess, value_for
from helpers import key

from kvstored import Client
from kvstored.addresses import parse_host_port
from kvstored.transport.framing import HEADER, MAGIC, OP_GET, OP_PUT, VERSION

pytestmark = pytest.mark.usefixtures("pinned_reads")  # the pinned path's tests (PinBlocks)

SEED = 20261202
RSS_SLACK_BYTES = 16 << 20
FD_SLACK = 4
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_METHODS = ("Describe", "Put", "Get", "ReservePut", "CommitPut", "PinBlocks", "ReleasePins",
            "LookupPrefix", "Exists", "Remove", "Stats", "ListBlocks", "CloseSession")


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _blast(family: int, address: Any, payload: bytes) -> None:
    """One connection: send ``payload``, half-close, read what comes back briefly, close."""
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(address)
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:
            pass  # reset, refused mid-way or timed out: all fine for garbage


def _raw_grpc_payload(rng: random.Random) -> bytes:
    kind = rng.randrange(3)
    junk = rng.randbytes(rng.randrange(0, 2048))
    if kind == 0:
        return junk
    if kind == 1:
        return _PREFACE[: rng.randrange(1, len(_PREFACE))]
    return _PREFACE + junk  # a valid preface, then garbage frames


def _dataplane_payload(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 512))
    if kind == 1:  # wrong magic
        return HEADER.pack(b"XXXX", VERSION, OP_GET, 0, 1, 8) + rng.randbytes(8)
    if kind == 2:  # huge declared count / body length, nothing behind them
        return HEADER.pack(MAGIC, VERSION, rng.choice((OP_GET, OP_PUT)), 0,
                           rng.choice((2**32 - 1, 1 << 20)), rng.choice((2**32 - 1, 1 << 30)))
    if kind == 3:  # random version / op / flags
        return HEADER.pack(MAGIC, rng.randrange(256), rng.randrange(256), rng.randrange(65536),
                           rng.randrange(64), 16) + rng.randbytes(16)
    if kind == 4:  # a GET whose body is garbage or cut short
        body = rng.randbytes(rng.randrange(0, 256))
        return HEADER.pack(MAGIC, VERSION, OP_GET, 0, rng.randrange(1, 32),
                           len(body) + rng.choice((0, 0, 7))) + body
    # a PUT announcing a large payload that never comes
    ns = b""
    k = rng.randbytes(16)
    body = struct.pack("<H", len(ns)) + ns + struct.pack("<H", len(k)) + k + struct.pack(
        "<QI", rng.choice((1 << 20, 1 << 40)), 0)
    return HEADER.pack(MAGIC, VERSION, OP_PUT, 0, 1, len(body)) + body + rng.randbytes(
        rng.randrange(0, 4096))


def _fuzz(node: ServeProcess, rng: random.Random, scale: int) -> int:
    """One fuzz round; returns how many garbage gRPC calls the node answered OK."""
    host, port = parse_host_port(node.tcp_address)
    dhost, dport = parse_host_port(node.data)
    for _ in range(15 * scale):
        _blast(socket.AF_INET, (host, port), _raw_grpc_payload(rng))
    for _ in range(10 * scale):
        _blast(socket.AF_UNIX, node.socket_path, _raw_grpc_payload(rng))
    for _ in range(60 * scale):
        _blast(socket.AF_INET, (dhost, dport), _dataplane_payload(rng))
    ok = 0
    for address, rounds in ((node.tcp_address, 3 * scale), (node.unix_address, scale)):
        with grpc.insecure_channel(address) as ch:
            for _ in range(rounds):
                for m in _METHODS:
                    call = ch.unary_unary(f"/kvstored.v1.NodeService/{m}")
                    try:
                        call(rng.randbytes(rng.randrange(0, 600)), timeout=2.0)
                        ok += 1
                    except grpc.RpcError as exc:
                        assert exc.code() != grpc.StatusCode.UNAVAILABLE, f"{m}: the node went away"
    return ok


def test_random_and_truncated_frames_change_nothing(workdir: Path, procs: list[Any]) -> None:
    node = ServeProcess(workdir)
    procs.append(node)
    node.start()
    assert node.proc is not None
    pid = node.proc.pid
    keys = [key(i) for i in range(8)]
    with Client(node.unix_address) as c:
        c.put(keys, [value_for(k) for k in keys])
        before = c.stats()
    _fuzz(node, random.Random(SEED - 1), scale=2)  # warm-up: first-use allocations, thread pools
    deadline = time.monotonic() + 20
    fds0 = _fds(pid)
    while time.monotonic() < deadline and _fds(pid) > fds0:
        time.sleep(0.1)
    fds0, rss0 = _fds(pid), _rss(pid)
    accepted = _fuzz(node, random.Random(SEED), scale=25)  # ~3,800 frames and calls
    assert node.proc.poll() is None, "the node died:\n" + node.log()[-3000:]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _fds(pid) > fds0 + FD_SLACK:
        time.sleep(0.1)  # the server closes the fuzz's connections as it sees them end
    fds1, rss1 = _fds(pid), _rss(pid)
    print(f"fds {fds0} -> {fds1}, rss {rss0 >> 20} -> {rss1 >> 20} MiB, "
          f"garbage calls answered OK: {accepted}")
    assert fds1 <= fds0 + FD_SLACK
    assert rss1 <= rss0 + RSS_SLACK_BYTES
    with Client(node.unix_address) as c:
        assert c.get(keys) == [value_for(k) for k in keys]
        after = c.stats()
        fresh = key(99)
        assert c.put([fresh], [value_for(fresh)])[0].stored
        assert c.get([fresh]) == [value_for(fresh)]
    assert after["checksum_failures"] == before["checksum_failures"] == 0
    # a garbage Put the node accepted is the only way a key could have appeared
    assert after["puts"] - before["puts"] <= accepted
