"""kvstored.addresses: the one parser of unix:PATH and HOST:PORT addresses."""

from __future__ import annotations

import os

import pytest

from kvstored.addresses import (
    default_address,
    default_socket_path,
    format_host_port,
    is_unix_address,
    parse_address,
    parse_host_port,
    unix_socket_path,
)
from kvstored.errors import InvalidArgument


@pytest.mark.parametrize(("address", "expected"), [
    ("127.0.0.1:7070", ("127.0.0.1", 7070)),
    ("[::1]:0", ("::1", 0)),
    ("host.example:65535", ("host.example", 65535)),
])
def test_parse_host_port_splits_and_unbrackets(address: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(address) == expected


@pytest.mark.parametrize("address", ["", "7070", ":7070", "host:", "host:x", "host:65536", "host:-1"])
def test_parse_host_port_names_what_it_got(address: str) -> None:
    with pytest.raises(InvalidArgument, match="expected HOST:PORT") as info:
        parse_host_port(address)
    assert repr(address) in str(info.value)


def test_an_out_of_range_port_is_named_as_such() -> None:
    with pytest.raises(InvalidArgument, match=r"port 99999 out of range"):
        parse_host_port("127.0.0.1:99999")


def test_format_host_port_brackets_ipv6_and_round_trips() -> None:
    assert format_host_port("::1", 5) == "[::1]:5"
    assert format_host_port("10.0.0.1", 5) == "10.0.0.1:5"
    assert parse_host_port(format_host_port("fe80::1", 9)) == ("fe80::1", 9)


def test_unix_addresses_resolve_to_absolute_paths() -> None:
    assert is_unix_address("unix:/run/x.sock") and not is_unix_address("127.0.0.1:1")
    assert unix_socket_path("unix:/run/x.sock") == "/run/x.sock"
    assert unix_socket_path("unix:///run/x.sock") == "/run/x.sock"
    assert unix_socket_path("unix:rel.sock") == os.path.join(os.getcwd(), "rel.sock")
    for bad in ("unix:", "unix://", "127.0.0.1:1"):
        with pytest.raises(InvalidArgument):
            unix_socket_path(bad)


def test_parse_address_gives_the_grpc_target() -> None:
    assert parse_address("unix:///run/x.sock") == ("unix:/run/x.sock", True)
    assert parse_address("10.0.0.1:7070") == ("10.0.0.1:7070", False)
    for bad in ("", "nonsense", "unix:"):
        with pytest.raises(InvalidArgument):
            parse_address(bad)
    with pytest.raises(InvalidArgument, match="got 7"):
        parse_address(7)  # type: ignore[arg-type]


def test_default_address_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORED_ADDRESS", "10.0.0.1:7070")
    assert default_address() == "10.0.0.1:7070"
    monkeypatch.delenv("KVSTORED_ADDRESS")
    assert default_address() == f"unix:{default_socket_path()}"


@pytest.mark.parametrize(("address", "detail"), [
    ("nonsense", "(expected HOST:PORT for a TCP address, got 'nonsense')"),
    ("h:99999", "(port 99999 out of range)"),
    ("127.0.0.1:1,127.0.0.1:2", "a list of masters or an etcd:// address names the masters"),
    ("etcd://127.0.0.1:2379/kv", "a list of masters or an etcd:// address names the masters"),
])
def test_a_bad_node_address_names_both_forms_and_what_was_received(address: str, detail: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_address(address)
    assert "'unix:PATH'" in str(err.value) and "'HOST:PORT'" in str(err.value)
    assert repr(address) in str(err.value) and detail in str(err.value)


def test_kvstorectl_gives_no_tls_hint_for_a_silent_process_or_an_empty_election() -> None:
    from kvstored.cli.ctl_common import CtlContext, _tls_hint

    obj = CtlContext.__new__(CtlContext)
    obj.tls, obj.address = None, "127.0.0.1:7080"
    assert "--tls-cert" in _tls_hint(obj, "UNAVAILABLE: master at 127.0.0.1:7080 is unreachable")
    assert _tls_hint(obj, "master at 127.0.0.1:7080 did not answer ListNodes within 500 ms") == ""
    assert _tls_hint(obj, "no master leads under '/kvt' in etcd") == ""
