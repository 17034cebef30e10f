"""kvstorectl: key order of ``where``, namespace-id prefixes, human uptime, fast failure."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from it_helpers import NodeFactory, random_keys, value_for

from kvstored import Client, Namespace
from kvstored.cli import output
from kvstored.cli.ctl_common import EXIT_BAD_ARGS, EXIT_OK, EXIT_UNREACHABLE
from kvstored.cli.kvstorectl import main


def _ctl(address: str, *args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["--address", address, "--timeout-s", "30", *args])
    return r.exit_code, r.stdout, r.stderr


def test_where_keeps_the_users_order_of_keys_and_counts_leading_hits(start_node: NodeFactory) -> None:
    node = start_node()
    a, b, c = random_keys(3)
    with Client(node.unix_address) as kv:
        kv.put([a, b], [value_for(a, 4096), value_for(b, 4096)])
    # present, present, missing: 2 leading hits, whichever way the keys are spelled
    for args in (
        ["where", a.hex(), "--keys", b.hex(), c.hex()],      # was read as a, c, b
        ["where", "--keys", a.hex(), b.hex(), c.hex()],      # was read as b, c, a
        ["where", "--keys", f"{a.hex()},{b.hex()}", c.hex()],
        ["where", "--keys", a.hex(), "--output", "json", "--keys", b.hex(), c.hex()],
        ["where", f"--keys={a.hex()}", b.hex(), "--keys", c.hex()],
    ):
        code, out, err = _ctl(node.unix_address, "--output", "json", *args)
        assert code == EXIT_OK, err
        data = json.loads(out)
        assert [blk["key"] for blk in data["blocks"]] == [a.hex(), b.hex(), c.hex()], args
        assert data["num_leading_hits"] == 2, args
    code, out, _ = _ctl(node.unix_address, "--output", "json", "where", "--keys", c.hex(), a.hex(), b.hex())
    assert json.loads(out)["num_leading_hits"] == 0


def _put_in(address: str, ns: Namespace) -> bytes:
    key = random_keys(1)[0]
    with Client(address, namespace=ns) as kv:
        assert kv.put([key], [value_for(key, 4096)])[0].stored
    return key


def _namespace_with_id_prefix(prefix: str, avoid: str = "") -> Namespace:
    for i in range(100000):
        ns = Namespace(model_id=f"m{i}", kv_dtype="bfloat16", block_size=16)
        if ns.id_hex.startswith(prefix) and ns.id_hex != avoid:
            return ns
    raise AssertionError("no namespace found")


def test_blocks_accepts_a_unique_namespace_id_prefix(start_node: NodeFactory) -> None:
    node = start_node()
    first = _namespace_with_id_prefix("")
    twin = _namespace_with_id_prefix(first.id_hex[:1], avoid=first.id_hex)  # shares one digit
    key_first, key_twin = _put_in(node.unix_address, first), _put_in(node.unix_address, twin)
    # the table shows 16 digits; those (and any unique prefix) select the namespace
    code, out, err = _ctl(node.unix_address, "blocks")
    assert code == EXIT_OK and first.id_hex[:16] in out, err
    for prefix in (first.id_hex[:16], first.id_hex[:5], first.id_hex, first.id_hex[:16].upper()):
        code, out, err = _ctl(node.unix_address, "--output", "json", "blocks", "--namespace-id", prefix)
        assert code == EXIT_OK, err
        assert [blk["key"] for blk in json.loads(out)["blocks"]] == [key_first.hex()], prefix
    code, out, err = _ctl(node.unix_address, "--output", "json", "blocks", "--namespace-id", twin.id_hex[:12])
    assert code == EXIT_OK and [blk["key"] for blk in json.loads(out)["blocks"]] == [key_twin.hex()]
    code, _, err = _ctl(node.unix_address, "blocks", "--namespace-id", first.id_hex[:1])
    assert code == EXIT_BAD_ARGS and "ambiguous" in err and first.id_hex in err and twin.id_hex in err
    unused = next(d for d in "0123456789abcdef" if d not in (first.id_hex[0], twin.id_hex[0]))
    code, _, err = _ctl(node.unix_address, "blocks", "--namespace-id", unused)
    assert code == EXIT_BAD_ARGS and "no stored block has a namespace id starting with" in err
    code, _, err = _ctl(node.unix_address, "blocks", "--namespace-id", "xyz")
    assert code == EXIT_BAD_ARGS and "not hex" in err
    code, _, err = _ctl(node.unix_address, "blocks", "--namespace-id", "")  # was: every block
    assert code == EXIT_BAD_ARGS and "not hex" in err
    code, _, err = _ctl(node.unix_address, "blocks", "--namespace-id", first.id_hex + "00")
    assert code == EXIT_BAD_ARGS and "has 34 hex digits" in err


def test_where_takes_the_namespace_id_prefix_that_blocks_prints(start_node: NodeFactory) -> None:
    # regression: `where --namespace-id <the 16 digits blocks prints>` said "missing", rc 0
    node = start_node()
    ns = _namespace_with_id_prefix("")
    key_ns = _put_in(node.unix_address, ns)
    for prefix in (ns.id_hex[:16], ns.id_hex[:6], ns.id_hex):
        code, out, err = _ctl(node.unix_address, "--output", "json", "where", "--namespace-id", prefix,
                              key_ns.hex())
        assert code == EXIT_OK, err
        data = json.loads(out)
        assert data["num_leading_hits"] == 1 and data["namespace_id"] == ns.id_hex, (prefix, data)
    code, _, err = _ctl(node.unix_address, "where", "--namespace-id", ns.id_hex + "00", key_ns.hex())
    assert code == EXIT_BAD_ARGS and "has 34 hex digits" in err


def test_stats_prints_uptime_for_people_and_seconds_in_json(start_node: NodeFactory) -> None:
    node = start_node()
    code, out, _ = _ctl(node.unix_address, "--output", "json", "stats")
    assert code == EXIT_OK and isinstance(json.loads(out)["uptime_s"], float)
    code, out, _ = _ctl(node.unix_address, "stats")
    assert code == EXIT_OK
    assert re.search(r"uptime\W+\d+\.\ds\b", out), out  # e.g. "1.3s", not "1.2947713"
    assert "uptime_s" not in out
    assert [output.format_duration(s) for s in (0.04, 59.99, 123, 3723, 3 * 86400 + 4 * 3600 + 300)] == [
        "0.0s", "59.9s", "2m 03s", "1h 02m 03s", "3d 04h 05m"]


def test_missing_or_dead_socket_fails_at_once_with_exit_3(tmp_path: Path) -> None:
    missing = tmp_path / "nobody.sock"
    start = time.monotonic()
    code, out, err = _ctl(f"unix:{missing}", "--output", "json", "status")
    assert time.monotonic() - start < 5  # the deadline is 30 s
    assert code == EXIT_UNREACHABLE and str(missing) in err and "does not exist" in err
    assert json.loads(out)["error"]["code"] == "UNAVAILABLE"
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # a socket file with nobody listening: a daemon that was SIGKILLed
    code, _, err = _ctl(f"unix:{stale}", "stats")
    assert code == EXIT_UNREACHABLE and str(stale) in err and "nothing listens" in err
    plain = tmp_path / "file"
    plain.write_text("")
    code, _, err = _ctl(f"unix:{plain}", "blocks")
    assert code == EXIT_UNREACHABLE and "not a unix socket" in err
    assert time.monotonic() - start < 10


def test_where_refuses_keys_the_client_would_refuse_with_its_message(
    start_node: NodeFactory,
) -> None:
    # regression: `where 0001` (2 bytes) was shown `missing`, where the client raises
    node = start_node()
    (a,) = random_keys(1)
    for bad, what in (("0001", "key #1 is 2 bytes; the node accepts keys of 16..64 bytes"),
                      ("ab" * 65, "key #1 is 65 bytes; the node accepts keys of 16..64 bytes")):
        code, _, err = _ctl(node.unix_address, "where", a.hex(), bad)
        assert code == EXIT_BAD_ARGS and what in err, err
    with Client(node.unix_address) as kv, pytest.raises(Exception, match="2 bytes; the node"):
        kv.get([a, bytes.fromhex("0001")])  # the same words
    code, _, err = _ctl(node.unix_address, "where", "a" * 33)
    assert code == EXIT_BAD_ARGS and "has an odd number of hex digits (33)" in err, err
    assert "is not hex" not in err
    code, _, err = _ctl(node.unix_address, "where", "zz" * 16)
    assert code == EXIT_BAD_ARGS and "is not hex" in err, err
