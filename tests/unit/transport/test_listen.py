"""Listen addresses are checked before gRPC binds them (gRPC logs a raw line on failure)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kvstored.errors import ConfigInvalid
from kvstored.transport.listen import add_grpc_port, check_listen_address


class _Server:
    """Records what gRPC was asked to bind; ``fail`` makes it refuse like gRPC does."""

    def __init__(self, fail: bool = False) -> None:
        self.asked: list[str] = []
        self.fail = fail

    def add_insecure_port(self, address: str) -> int:
        self.asked.append(address)
        if self.fail:
            raise RuntimeError(f"Failed to bind to address {address}; set GRPC_VERBOSITY=debug")
        return 4242


def test_a_port_in_use_is_refused_before_grpc_is_asked() -> None:
    server = _Server()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        addr = f"127.0.0.1:{held.getsockname()[1]}"
        assert check_listen_address(addr) == "Address already in use"
        with pytest.raises(ConfigInvalid) as err:
            add_grpc_port(server, addr, "node.listen")
    assert str(err.value) == f"cannot listen on {addr}: Address already in use; change node.listen"
    assert server.asked == []


def test_a_free_port_port_zero_and_a_unix_socket_go_to_grpc(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = f"127.0.0.1:{s.getsockname()[1]}"
    server = _Server()
    for addr in (free, "127.0.0.1:0", "[::1]:0", f"unix:{tmp_path}/n.sock"):
        assert check_listen_address(addr) is None, addr
        assert add_grpc_port(server, addr, "node.listen") == 4242
    assert server.asked == [free, "127.0.0.1:0", "[::1]:0", f"unix:{tmp_path}/n.sock"]


def test_a_unix_socket_in_a_missing_directory_is_refused(tmp_path: Path) -> None:
    addr = f"unix:{tmp_path}/nope/n.sock"
    with pytest.raises(ConfigInvalid, match=f"directory {tmp_path}/nope does not exist; "
                                            "change master.listen"):
        add_grpc_port(_Server(), addr, "master.listen")


def test_grpc_refusing_after_the_check_is_still_one_clean_error() -> None:
    with pytest.raises(ConfigInvalid) as err:
        add_grpc_port(_Server(fail=True), "127.0.0.1:0", "node.listen")
    assert "GRPC_VERBOSITY" not in str(err.value)
    assert str(err.value) == ("cannot listen on 127.0.0.1:0: gRPC could not bind it (in use or "
                              "not permitted); change node.listen")


def test_a_port_above_65535_is_refused_not_bound_modulo_65536() -> None:
    # gRPC binds 127.0.0.1:99999 as port 34463 and says nothing; the check refuses it first
    server = _Server()
    assert check_listen_address("127.0.0.1:99999") == "port 99999 is out of range 0..65535"
    with pytest.raises(ConfigInvalid) as err:
        add_grpc_port(server, "127.0.0.1:99999", "master.listen")
    assert str(err.value) == ("cannot listen on 127.0.0.1:99999: port 99999 is out of range 0..65535; "
                              "change master.listen")
    assert server.asked == []
