"""Framing of the control channel (kvstored/transport/control.py): length prefix + protobuf."""

from __future__ import annotations

import socket

import pytest

from kvstored.transport import control
from kvstored.v1 import node_pb2 as pb


def test_a_frame_round_trips_whole_and_split_into_single_bytes() -> None:
    req = pb.ControlRequest(session_id=7, release_pin_ids=[1, 2, 3],
                            lookup_prefix=pb.LookupPrefixRequest(keys=[b"a" * 16, b"b" * 16]))
    data = control.frame(req)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    a, b = socket.socketpair()
    with a, b:
        a.sendall(data)
        assert pb.ControlRequest.FromString(control.recv_frame(b)) == req
        for i in range(len(data)):  # a peer that writes one byte at a time
            a.send(data[i:i + 1])
        assert pb.ControlRequest.FromString(control.recv_frame(b)) == req


def test_an_empty_message_is_a_zero_length_frame() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(control.frame(pb.ControlResponse()))
        assert control.recv_frame(b) == b""


def test_a_length_over_the_limit_is_refused() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall((control.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(control.FrameTooLarge, match=str(control.MAX_FRAME_BYTES)):
            control.recv_frame(b)


def test_a_peer_closing_mid_frame_is_a_connection_error() -> None:
    a, b = socket.socketpair()
    with b:
        a.sendall((100).to_bytes(4, "big") + b"x" * 10)
        a.close()
        with pytest.raises(ConnectionResetError, match="10 of 90|after"):
            control.recv_frame(b)


def test_every_method_has_a_oneof_field_in_both_messages() -> None:
    req_fields = {f.name for f in pb.ControlRequest.DESCRIPTOR.oneofs_by_name["op"].fields}
    resp_fields = {f.name for f in pb.ControlResponse.DESCRIPTOR.oneofs_by_name["op"].fields}
    assert set(control.OPS) == req_fields == resp_fields
    assert set(control.FIELD_OF) == set(control.OPS.values())
