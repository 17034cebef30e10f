"""``kvstorectl nodes`` against an in-process MasterService: JSON, table, exit codes."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from kvstored.cli.ctl_common import EXIT_BAD_ARGS, EXIT_UNREACHABLE
from kvstored.cli.kvstorectl import main
from kvstored.clock import FakeClock
from kvstored.master.membership import Membership
from kvstored.master.service import MasterServicer, add_master_service
from kvstored.master.state import MasterState
from kvstored.master.types import BlockRef, NodeSpec, TierUsage
from kvstored.types import Tier


@pytest.fixture
def master() -> Iterator[tuple[str, Membership]]:
    state = MasterState(epoch=99, clock=FakeClock(), node_lease_s=10.0, initial_blocks=16,
                        first_generation=5, rng=random.Random(0))
    members = state.membership
    members.register(NodeSpec("gpu1", 1796000000000000000, "10.0.0.5:7070", "10.0.0.5:7071",
                              (TierUsage(Tier.DRAM, 8 << 30, 2 << 30, 7),
                               TierUsage(Tier.SSD, 200 << 30, 0, 0))))
    members.sync_inventory("gpu1", 1796000000000000000, sync_id=1, last_chunk=True,
                           blocks=[BlockRef(b"n" * 16, bytes([i]) * 16, Tier.DRAM, 1)
                                   for i in range(7)])
    members.heartbeat("gpu1", 1796000000000000000, load=3.0, coldest_age_ms=42_500)
    members.register(NodeSpec("gpu2", 42, "10.0.0.6:7070", "10.0.0.6:7071", ()))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []
    stop = asyncio.Event()

    async def serve() -> None:
        server = grpc.aio.server()
        add_master_service(server, MasterServicer(state))
        port.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        ready.set()
        await stop.wait()
        await server.stop(grace=0)

    t = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    t.start()
    assert ready.wait(30)
    yield f"127.0.0.1:{port[0]}", members
    loop.call_soon_threadsafe(stop.set)
    t.join(30)


def test_nodes_json_is_the_membership(master: tuple[str, Membership]) -> None:
    addr, _ = master
    out = CliRunner().invoke(main, ["--address", addr, "nodes", "--output", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["master_epoch"] == 99 and data["num_replicas"] == 7
    assert [n["node_id"] for n in data["nodes"]] == ["gpu1", "gpu2"]
    g1, g2 = data["nodes"]
    assert (g1["epoch"], g1["health"], g1["load"], g1["num_replicas"]) == (
        1796000000000000000, "healthy", 3.0, 7)
    assert g1["tiers"] == [
        {"tier": "DRAM", "used_bytes": 2 << 30, "capacity_bytes": 8 << 30, "num_blocks": 7,
         "spare_bytes": 0},
        {"tier": "SSD", "used_bytes": 0, "capacity_bytes": 200 << 30, "num_blocks": 0,
         "spare_bytes": 0},
    ]
    assert (g2["health"], g2["tiers"], g2["grpc_address"]) == ("syncing", [], "10.0.0.6:7070")
    assert (g1["coldest_age_s"], g2["coldest_age_s"]) == (42.5, 0.0)  # pool LRU (FakeClock)


def test_nodes_table_shows_every_column_untruncated(master: tuple[str, Membership]) -> None:
    addr, _ = master
    out = CliRunner().invoke(main, ["nodes", "--address", addr])
    assert out.exit_code == 0, out.output
    for text in ("gpu1", "10.0.0.5:7070", "1796000000000000000", "healthy", "syncing",
                 "2.0 GiB / 8.0 GiB", "0 B / 200.0 GiB", "master epoch 99", "7 replicas",
                 "coldest", "42.5 s"):
        assert text in out.output, text


def test_a_node_on_probation_shows_as_probation(master: tuple[str, Membership]) -> None:
    addr, members = master
    for _ in range(3):  # unhealthy_after_failures (3) failed transfers: unhealthy
        members.report_transfer("gpu1", 1796000000000000000, ok=False)
    health = {n["node_id"]: n["health"] for n in json.loads(CliRunner().invoke(
        main, ["--address", addr, "nodes", "--output", "json"]).output)["nodes"]}
    assert health == {"gpu1": "unhealthy", "gpu2": "syncing"}
    clock = members.clock
    assert isinstance(clock, FakeClock)
    for _ in range(2):  # one node lease (the retry time) unhealthy, heartbeating
        clock.advance(5.0)
        members.heartbeat("gpu1", 1796000000000000000)
        members.heartbeat("gpu2", 42)
    out = CliRunner().invoke(main, ["--address", addr, "nodes", "--output", "json"])
    assert out.exit_code == 0, out.output
    g1, g2 = json.loads(out.output)["nodes"]
    assert (g1["node_id"], g1["health"], g2["health"]) == ("gpu1", "probation", "syncing")
    table = CliRunner().invoke(main, ["nodes", "--address", addr])
    assert table.exit_code == 0 and "probation" in table.output, table.output
    members.report_transfer("gpu1", 1796000000000000000, ok=True)  # the trial heals it
    out = CliRunner().invoke(main, ["--address", addr, "nodes", "--output", "json"])
    assert json.loads(out.output)["nodes"][0]["health"] == "healthy"


def test_a_lapsed_node_and_a_node_that_left_are_shown_as_departed_until_they_return(
    master: tuple[str, Membership],
) -> None:
    # regression (second tester, session 2): a node whose lease lapsed vanished from the view
    addr, members = master
    clock = members.clock
    assert isinstance(clock, FakeClock)
    clock.advance(6.0)
    members.heartbeat("gpu2", 42)
    clock.advance(5.0)  # gpu1 silent for 11 s > its 10 s lease; gpu2 renewed 5 s ago
    assert members.unregister("gpu2", 42)
    clock.advance(2.5)
    out = CliRunner().invoke(main, ["--address", addr, "nodes", "--output", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["nodes"] == [] and data["num_replicas"] == 0
    assert [(d["node_id"], d["reason"], d["num_replicas"], d["departed_s_ago"])
            for d in data["departed"]] == [("gpu2", "left", 0, 2.5), ("gpu1", "expired", 7, 2.5)]
    assert data["departed"][1]["grpc_address"] == "10.0.0.5:7070"
    table = CliRunner().invoke(main, ["nodes", "--address", addr])
    assert table.exit_code == 0, table.output
    for text in ("0 live, 2 departed", "expired", "left", "had 7", "gone 2.5 s ago"):
        assert text in table.output, text
    # a node that registers again is live, not departed
    members.register(NodeSpec("gpu1", 1796000000000000001, "10.0.0.5:7070", "10.0.0.5:7071", ()))
    data = json.loads(CliRunner().invoke(main, ["--address", addr, "nodes", "--output",
                                               "json"]).output)
    assert [n["node_id"] for n in data["nodes"]] == ["gpu1"]
    assert [d["node_id"] for d in data["departed"]] == ["gpu2"]


def test_departed_nodes_are_bounded_in_number_and_age() -> None:
    from kvstored.master.departed import DepartedNodes

    d = DepartedNodes(max_nodes=2, keep_s=10.0)
    for i, name in enumerate(["a", "b", "c"]):
        d.add(name, None, "expired", float(i), i)
    assert [n for n, _ in d.recent(2.0)] == ["c", "b"]  # a, the oldest, was dropped
    d.add("b", None, "left", 5.0, 9)  # b again: one record, now the newest
    assert [(n, r.reason) for n, r in d.recent(5.0)] == [("b", "left"), ("c", "expired")]
    assert [n for n, _ in d.recent(14.0)] == ["b"]  # c left at 2.0: older than 10 s
    d.forget("b")
    assert d.recent(14.0) == []


def test_nodes_exit_codes_for_an_unreachable_master_and_a_node_socket() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    out = CliRunner().invoke(main, ["--timeout-s", "1", "--address", f"127.0.0.1:{free}",
                                    "nodes"])
    assert out.exit_code == EXIT_UNREACHABLE
    out = CliRunner().invoke(main, ["--address", "unix:/tmp/x.sock", "nodes"])
    assert out.exit_code == EXIT_BAD_ARGS and "MASTER_HOST:PORT" in out.output


def test_a_node_command_sent_to_the_master_says_which_kind_of_server_it_reached(
    master: tuple[str, Membership],
) -> None:
    # regression: "INTERNAL: UNIMPLEMENTED: Method not found!" (exit 4), after retries
    # then (issue 17): gRPC's raw "UNIMPLEMENTED: Method not found!" text, exit 2
    addr, _ = master
    for command in ("status", "stats"):
        out = CliRunner().invoke(main, ["--timeout-s", "20", "--address", addr, command])
        assert out.exit_code == EXIT_BAD_ARGS, out.output
        text = out.stderr.replace("\n", " ")
        assert text.startswith(f"kvstorectl: INVALID_ARGUMENT: {addr} is a master, not a node: "
                               f"`kvstorectl {command}` asks a node"), text
        assert "`kvstorectl nodes`" in text and "UNIMPLEMENTED" not in text, text


@pytest.mark.parametrize("command", ["where", "evict"])
def test_cluster_commands_check_key_length_and_hex_like_the_client(
    master: tuple[str, Membership], command: str,
) -> None:
    addr, _ = master
    good = "11" * 16
    out = CliRunner().invoke(main, ["--timeout-s", "20", "--address", addr, command, good,
                                    "0001"])
    assert out.exit_code == EXIT_BAD_ARGS, out.output
    # a master's address: the message names the master and the key rule, never "the node"
    assert ("key #1 is 2 bytes; a master takes block keys of 16..64 bytes (32..128 hex "
            "digits)") in out.output.replace("\n", " "), out.output
    assert "node" not in out.output, out.output
    out = CliRunner().invoke(main, ["--timeout-s", "20", "--address", addr, command, "1" * 33])
    assert out.exit_code == EXIT_BAD_ARGS
    assert "has an odd number of hex digits (33)" in out.output, out.output


def test_an_unreachable_master_error_names_its_code_once() -> None:
    # regression: "kvstorectl: UNAVAILABLE: UNAVAILABLE: failed to connect..."
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    for out_mode in ("table", "json"):
        out = CliRunner().invoke(main, ["--timeout-s", "1", "--address", f"127.0.0.1:{free}",
                                        "--output", out_mode, "nodes"])
        assert out.exit_code == EXIT_UNREACHABLE
        err = out.stderr
        assert err.startswith("kvstorectl: UNAVAILABLE: ") and err.count("UNAVAILABLE") == 1, err
        if out_mode == "json":
            msg = json.loads(out.stdout)["error"]
            assert msg["code"] == "UNAVAILABLE" and "UNAVAILABLE" not in msg["message"]


def test_emit_error_keeps_a_distinct_code_in_the_message(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from kvstored.cli import output

    output.emit_error("table", "DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED: Deadline Exceeded")
    output.emit_error("table", "INTERNAL", "PERMISSION_DENIED: no")
    assert capsys.readouterr().err.splitlines() == [
        "kvstorectl: DEADLINE_EXCEEDED: Deadline Exceeded", "kvstorectl: INTERNAL: PERMISSION_DENIED: no"]


def test_the_readme_namespace_file_loads_as_the_engines_namespace(tmp_path: Any) -> None:
    import re
    from pathlib import Path

    from kvstored.cli.kvstorectl import _load_namespace_file
    from kvstored.keys import Namespace

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    m = re.search(r"<!-- readme-test: skip [^>]*test_kvstorectl_nodes\.py -->\n```toml\n(.*?)```",
                  readme, re.S)
    assert m, "README lost its namespace-file example"
    want = Namespace(model_id="HuggingFaceTB/SmolLM2-135M-Instruct", kv_dtype="bfloat16",
                     block_size=256)
    flat = tmp_path / "ns.toml"
    flat.write_text(m.group(1))
    assert _load_namespace_file(str(flat)).id == want.id
    table = tmp_path / "ns2.toml"
    table.write_text("[namespace]\n" + m.group(1))
    assert _load_namespace_file(str(table)).id == want.id
