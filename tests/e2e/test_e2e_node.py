"""Real ``kvstored serve`` processes: drain on SIGTERM, restart from SSD, SIGKILL mid-storm,
systemd notification, kvstorectl against the daemon."""

from __future__ import annotations

import json
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from e2e_helpers import ServeProcess, value_for

from kvstored import Client, Draining, Namespace, Tier, block_hashes
from kvstored.addresses import parse_host_port
from kvstored.v1 import node_pb2, node_pb2_grpc

pytestmark = pytest.mark.usefixtures("pinned_reads")  # the pinned path's tests (PinBlocks)

HERE = Path(__file__).resolve().parent


@pytest.fixture
def serve(workdir: Path) -> Iterator[type[ServeProcess]]:
    started: list[ServeProcess] = []

    class Tracked(ServeProcess):
        def start(self) -> ServeProcess:
            started.append(self)
            return super().start()

    def make(**kwargs: object) -> ServeProcess:
        return Tracked(workdir, **kwargs)  # type: ignore[arg-type]

    yield make  # type: ignore[misc]
    for p in started:
        p.kill()


_DP_HEADER = struct.Struct("<4sBBHII")  # the data-plane frame header (kvstored/transport/tcp.py)


def _dp_put_frame(key: bytes, size: int) -> bytes:
    body = struct.pack("<H", 0) + struct.pack("<H", len(key)) + key + struct.pack("<QI", size, 0)
    return _DP_HEADER.pack(b"KVDP", 1, 2, 0, 1, len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "the data plane closed the connection"
        out += chunk
    return out


def _wait_for_log(node: ServeProcess, event: str, timeout_s: float = 30.0, **fields: str) -> None:
    """Wait until the daemon logged ``event`` with these ``key=value`` fields (a hang guard)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for line in node.log().splitlines():
            words = line.split()
            if event in words and fields.items() <= dict(
                w.split("=", 1) for w in words if "=" in w
            ).items():
                return
        assert time.monotonic() < deadline, f"the daemon never logged {event} {fields}"
        time.sleep(0.02)


def test_sigterm_finishes_in_flight_work_refuses_new_work_and_flushes_the_index(
    serve: object, workdir: Path
) -> None:
    """SIGTERM while a read holds its pins, a shared-memory write holds its reservation and a
    TCP write is half sent: each of them finishes, new puts and reads are refused, the daemon
    exits 0 and a restart finds every spilled block on SSD."""
    node = serve(env={"KVSTORED_NODE__DRAIN_GRACE_S": "60"}).start()  # type: ignore[operator]
    arena = node.arena
    keys = [os.urandom(16) for _ in range(12)]
    shm_key, tcp_key = os.urandom(16), os.urandom(16)
    with Client(node.unix_address) as c:
        assert c.describe().transport == "shm"
        assert all(r.stored for r in c.put(keys, [value_for(k) for k in keys]))
    # the three requests in flight, each held at a point the test chooses (it is the client)
    channel = grpc.insecure_channel(node.unix_address)
    stub = node_pb2_grpc.NodeServiceStub(channel)
    session = stub.OpenSession(node_pb2.OpenSessionRequest())  # shm grants need a session
    sid = next(session).session_id
    pins = stub.PinBlocks(node_pb2.PinBlocksRequest(keys=keys[:3], session_id=sid), timeout=10)
    assert pins.pin_id and all(b.found for b in pins.blocks)
    res = stub.ReservePut(node_pb2.ReservePutRequest(
        items=[node_pb2.ReserveItem(key=shm_key, size_bytes=len(value_for(shm_key)))],
        session_id=sid), timeout=10)
    assert res.reservation_id and not res.reservations[0].exists
    dp = socket.create_connection(parse_host_port(node.data), timeout=30)
    tcp_value = value_for(tcp_key)
    with Client(node.unix_address) as c:
        used = c.stats()["tiers"][0]["used_bytes"]
        dp.sendall(_dp_put_frame(tcp_key, len(tcp_value)) + tcp_value[: len(tcp_value) // 2])
        deadline = time.monotonic() + 30
        while c.stats()["tiers"][0]["used_bytes"] == used:  # the server reserved it: in flight
            assert time.monotonic() < deadline, "the data plane did not take the PUT"

    node.signal(signal.SIGTERM)
    with Client(node.unix_address, timeout_s=0.3) as c:
        deadline = time.monotonic() + 30
        while not c.describe().draining:  # the observable start of the drain
            assert time.monotonic() < deadline, "the node did not start draining"
        with pytest.raises(Draining):
            c.put([os.urandom(16)], [b"new"])
        with pytest.raises(Draining):
            c.get(keys[3:4])
        assert c.lookup_prefix(keys) == 12  # metadata is still answered
    with Client(node.tcp_address, transport="tcp", timeout_s=0.3) as c:
        with pytest.raises(Draining):
            c.put([os.urandom(16)], [b"new"])
        with pytest.raises(Draining):
            c.get(keys[3:4])
    assert node.proc is not None and node.proc.poll() is None, "exited with requests in flight"

    # the writes finish first: the shm one fills its reservation and commits, the TCP one
    # sends the rest of its payload
    with open(arena, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        off = res.reservations[0].offset
        m[off : off + len(value_for(shm_key))] = value_for(shm_key)
    committed = stub.CommitPut(node_pb2.CommitPutRequest(reservation_id=res.reservation_id), timeout=10)
    assert [r.stored for r in committed.results] == [True]
    dp.sendall(tcp_value[len(tcp_value) // 2 :])
    magic, _, op, status, count, body_len = _DP_HEADER.unpack(_recv_exact(dp, _DP_HEADER.size))
    assert (magic, op, status, count) == (b"KVDP", 2, 0, 1)
    code, stored, _ = struct.unpack("<HBH", _recv_exact(dp, body_len)[:5])
    assert (code, stored) == (0, 1)
    dp.close()
    # then the read: the node says its drain now waits on this read's pins alone
    _wait_for_log(node, "drain_waiting", num_pins="1", num_reservations="0", num_puts="0",
                  num_dataplane_requests="0")
    assert node.proc.poll() is None, "exited while a read held its pins"
    with open(arena, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        for k, b in zip(keys[:3], pins.blocks, strict=True):
            assert m[b.offset : b.offset + b.size_bytes] == value_for(k)
    assert stub.ReleasePins(node_pb2.ReleasePinsRequest(pin_ids=[pins.pin_id]), timeout=10).num_released == 1
    session.cancel()
    channel.close()

    assert node.wait() == 0, node.log()
    log = node.log()
    assert "drain_grace_expired" not in log, "the drain waited for its grace instead of the work"
    assert "node_stopped" in log
    assert not os.path.exists(node.socket_path), "unix socket left behind"
    assert not os.path.exists(arena), "arena file left behind"

    every = [*keys, shm_key, tcp_key]
    again = serve().start()  # type: ignore[operator]
    with Client(again.unix_address) as c:
        assert c.lookup_prefix_tiers(every) == [Tier.SSD] * len(every)
        assert c.get(every) == [value_for(k) for k in every]
        assert c.lookup_prefix_tiers(every[:1]) == [Tier.DRAM]  # promoted by the read
    with Client(again.tcp_address, transport="tcp") as c:
        assert c.get(every) == [value_for(k) for k in every]
    assert again.terminate() == 0


def test_sigint_also_drains(serve: object) -> None:
    node = serve(ssd_size="0").start()  # type: ignore[operator]
    node.signal(signal.SIGINT)
    assert node.wait() == 0
    assert not os.path.exists(node.socket_path)


@pytest.mark.slow
def test_sigkill_during_a_put_storm_never_serves_torn_blocks(serve: object, workdir: Path) -> None:
    node = serve(dram_size="8MiB", ssd_size="64MiB").start()  # type: ignore[operator]
    writers = [
        subprocess.Popen(
            [sys.executable, str(HERE / "e2e_writer.py"), addr, transport, str(seed)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=HERE,
        )
        for seed, (addr, transport) in enumerate(
            [(node.unix_address, "shm"), (node.tcp_address, "tcp"), (node.unix_address, "shm")]
        )
    ]
    try:
        with Client(node.unix_address, timeout_s=10) as c:
            deadline = time.monotonic() + 120
            while True:  # until blocks were demoted to SSD while writes keep going
                ssd = c.stats()["tiers"][1]
                if ssd["num_blocks"] >= 60:
                    break
                assert time.monotonic() < deadline, "the put storm did not reach the SSD tier"
                assert all(w.poll() is None for w in writers), "a writer stopped early"
                time.sleep(0.05)
        node.kill()
    finally:
        for w in writers:
            w.kill()
            w.wait(timeout=30)

    again = serve(dram_size="8MiB", ssd_size="64MiB").start()  # type: ignore[operator]
    with Client(again.unix_address, timeout_s=30) as c:
        stats = c.stats()
        listed, truncated = c.list_blocks(limit=100_000)
        assert not truncated
        assert len(listed) == stats["tiers"][1]["num_blocks"] > 0
        assert all(b.tiers == (Tier.SSD,) for b in listed)
        keys = [b.key for b in listed]
        for b in listed:
            assert b.size_bytes == len(value_for(b.key)), "the index holds a torn size"
        served = c.get(keys)
        for k, v in zip(keys, served, strict=True):
            assert v is None or v == value_for(k), f"block {k.hex()} served torn or wrong bytes"
        misses = sum(v is None for v in served)
        after = c.stats()
        assert misses == after["checksum_failures"], "a listed block vanished without a counted failure"
    with Client(again.tcp_address, transport="tcp", timeout_s=30) as c:
        for k, v in zip(keys, c.get(keys), strict=True):
            assert v is None or v == value_for(k)
    assert again.terminate() == 0


def test_sd_notify_ready_and_stopping(serve: object, workdir: Path) -> None:
    path = str(workdir / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(path)
        notify.settimeout(60)
        node = serve(ssd_size="0", env={"NOTIFY_SOCKET": path}).start()  # type: ignore[operator]
        ready = notify.recv(4096).decode()
        assert ready.startswith("READY=1") and node.unix_address in ready
        node.signal(signal.SIGTERM)
        assert notify.recv(4096).decode() == "STOPPING=1"
        assert node.wait() == 0


def _ctl(*args: str, address: str | None) -> subprocess.CompletedProcess[str]:
    """Run kvstorectl in-process (click's runner) against the real daemon."""
    from click.testing import CliRunner

    from kvstored.cli.kvstorectl import main

    argv = (["--address", address] if address is not None else []) + list(args)
    result = CliRunner().invoke(main, argv, catch_exceptions=False)
    return subprocess.CompletedProcess(argv, result.exit_code, result.stdout, result.stderr)


def _ctl_process(*args: str) -> subprocess.CompletedProcess[str]:
    """Run kvstorectl as its own process (the real entry point and exit codes)."""
    return subprocess.run(
        [sys.executable, "-m", "kvstored.cli.kvstorectl", *args], capture_output=True, text=True,
        timeout=120,
    )


def test_kvstorectl_against_a_real_daemon(serve: object, workdir: Path) -> None:
    node = serve().start()  # type: ignore[operator]
    ns = Namespace(model_id="e2e/model", block_size=4)
    tokens = list(range(22))  # 5 full blocks
    keys = block_hashes(ns, tokens)
    with Client(node.unix_address, namespace=ns) as c:
        c.put(keys[:3], [b"kv" * 100] * 3)
    addr = node.unix_address

    r = _ctl_process("--address", addr, "--output", "json", "status")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["node_id"] == "e2e" and status["draining"] is False
    assert addr in status["addresses"]["grpc"] and status["addresses"]["data"] == node.data
    assert [t["tier"] for t in status["tiers"]] == ["DRAM", "SSD"]
    assert status["tiers"][0]["capacity_bytes"] == 16 << 20 and status["tiers"][0]["num_blocks"] == 3

    r = _ctl("--output", "json", "blocks", "--namespace-id", ns.id_hex, address=addr)
    assert r.returncode == 0, r.stderr
    listing = json.loads(r.stdout)
    assert listing["count"] == 3 and not listing["truncated"]
    assert {b["key"] for b in listing["blocks"]} == {k.hex() for k in keys[:3]}
    ns_file = workdir / "ns.toml"
    ns_file.write_text('model_id = "e2e/model"\nblock_size = 4\n')
    r = _ctl("--output", "json", "blocks", "--namespace-file", str(ns_file), address=addr)
    assert json.loads(r.stdout)["count"] == 3
    r = _ctl("--output", "json", "blocks", "--namespace-id", "00" * 16, address=addr)
    assert json.loads(r.stdout)["count"] == 0

    tok_file = workdir / "tokens.txt"
    tok_file.write_text(" ".join(map(str, tokens)))
    r = _ctl("--output", "json", "where", "--tokens", str(tok_file), "--namespace-file", str(ns_file), address=addr)
    assert r.returncode == 0, r.stderr
    where = json.loads(r.stdout)
    assert where["num_blocks"] == 5 and where["num_leading_hits"] == 3
    assert [b["tier"] for b in where["blocks"]] == ["DRAM", "DRAM", "DRAM", None, None]
    assert [b["key"] for b in where["blocks"]] == [k.hex() for k in keys]
    json_tokens = workdir / "tokens.json"
    json_tokens.write_text(json.dumps(tokens))
    r = _ctl("--output", "json", "where", "--tokens", str(json_tokens), "--model", "e2e/model",
             "--block-size", "4", address=addr)
    assert json.loads(r.stdout)["num_leading_hits"] == 3
    two = f"{keys[0].hex()},{keys[4].hex()}"
    r = _ctl("--output", "json", "where", "--keys", two, "--namespace-id", ns.id_hex, address=addr)
    assert [b["tier"] for b in json.loads(r.stdout)["blocks"]] == ["DRAM", None]
    r = _ctl("--output", "json", "where", "--keys", two, address=addr)  # blocks are namespace-scoped
    assert [b["tier"] for b in json.loads(r.stdout)["blocks"]] == [None, None]

    r = _ctl("status", address=addr)  # the human table
    assert r.returncode == 0 and "DRAM" in r.stdout and "e2e" in r.stdout
    r = _ctl("--output", "json", "stats", address=addr)
    assert r.returncode == 0 and json.loads(r.stdout)["puts"] == 3
    r = _ctl("stats", "--output", "json", address=addr)  # global flags also after the command
    assert r.returncode == 0 and json.loads(r.stdout)["puts"] == 3

    # exit codes: bad arguments 2, unreachable 3
    r = _ctl("--output", "json", "where", "--keys", "not-hex", address=addr)
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["code"] == "INVALID_ARGUMENT"
    assert _ctl("where", address=addr).returncode == 2
    assert _ctl("--output", "yaml", "status", address=addr).returncode == 2
    r = _ctl_process("--address", f"unix:{workdir}/nobody.sock", "--timeout-s", "1", "--output", "json", "status")
    assert r.returncode == 3 and json.loads(r.stdout)["error"]["code"] == "UNAVAILABLE"
    assert node.terminate() == 0


def test_serve_rejects_bad_configuration(workdir: Path) -> None:
    base = [sys.executable, "-m", "kvstored.cli.main", "serve", "--listen", f"unix:{workdir}/x.sock",
            "--metrics-address", "", "--data-address", "127.0.0.1:0"]
    r = subprocess.run([*base, "--dram-size", "lots"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "dram_size_bytes" in r.stderr and "lots" in r.stderr
    cfg = workdir / "bad.toml"
    cfg.write_text("[node]\ndram_size_byte = 1\n")
    r = subprocess.run([*base, "--config", str(cfg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "dram_size_byte" in r.stderr
    r = subprocess.run([*base, "--listen", "not an address", "--ssd-size", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not an address" in r.stderr


def test_second_daemon_on_the_same_socket_is_refused(serve: object, workdir: Path) -> None:
    first = serve(ssd_size="0").start()  # type: ignore[operator]
    r = subprocess.run(
        [sys.executable, "-m", "kvstored.cli.main", "serve", "--listen", first.unix_address,
         "--data-address", "127.0.0.1:0", "--metrics-address", "", "--ssd-size", "0",
         "--dram-size", "8MiB"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 2 and "already listening" in r.stderr
    with Client(first.unix_address) as c:  # the first one is unharmed
        assert c.stats()["node_id"] == "e2e"
    assert first.terminate() == 0


def test_serving_never_imports_torch(serve: object) -> None:
    node = serve(ssd_size="0").start()  # type: ignore[operator]
    assert node.proc is not None
    maps = Path(f"/proc/{node.proc.pid}/maps").read_text()
    assert "libtorch" not in maps and "torch/lib" not in maps
    r = subprocess.run(
        [sys.executable, "-c", "import sys, kvstored, kvstored.cli.main, kvstored.cli.kvstorectl; "
         "sys.exit('torch' in sys.modules)"], timeout=120,
    )
    assert r.returncode == 0, "importing kvstored imported torch"
    assert node.terminate() == 0
