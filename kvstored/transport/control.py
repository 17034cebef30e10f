"""Framing of the lean control channel (node: kvstored/node/control.py, client:
kvstored/client/_control.py).

A frame is a 4-byte big-endian length followed by that many bytes of one protobuf message:
a ``ControlRequest`` from the client, a ``ControlResponse`` from the node (node.proto). No
other encoding is involved; the messages carry the NodeService requests and responses.
"""

from __future__ import annotations

import socket

from google.protobuf.message import Message

LENGTH_BYTES = 4
MAX_FRAME_BYTES = 64 << 20
"""Largest frame accepted either way (batches of keys and offsets; values only in the Put of
a small batch, client/_put.py)."""
SOCKET_SUFFIX = ".ctl"
"""The channel's socket is the node's first unix listen path plus this suffix."""

OPS: dict[str, str] = {  # ControlRequest/ControlResponse oneof field -> NodeService method
    "pin_blocks": "PinBlocks",
    "release_pins": "ReleasePins",
    "reserve_put": "ReservePut",
    "commit_put": "CommitPut",
    "lookup_prefix": "LookupPrefix",
    "exists": "Exists",
    "commit_slots": "CommitSlots",  # reserve-ahead puts (node/slots.py)
    "put": "Put",  # small batches only: their values travel inline (client/_put.py)
}
FIELD_OF: dict[str, str] = {method: field for field, method in OPS.items()}
"""NodeService method name -> oneof field (the methods the channel serves)."""


class FrameTooLarge(ValueError):
    """A frame's length prefix is over :data:`MAX_FRAME_BYTES` (a corrupt or foreign stream)."""


def frame(message: Message) -> bytes:
    """``message`` serialized behind its 4-byte big-endian length."""
    data = message.SerializeToString()
    return len(data).to_bytes(LENGTH_BYTES, "big") + data


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from a blocking socket.

    Raises:
        OSError: the connection failed or closed (ConnectionResetError), or timed out.
    """
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionResetError(f"the peer closed the control connection after {got} of {n} bytes")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes:
    """Read one frame's payload from a blocking socket.

    Raises:
        OSError: the connection failed or closed (ConnectionResetError), or timed out.
        FrameTooLarge: the length prefix is over the limit.
    """
    head = sock.recv(LENGTH_BYTES + 65536)  # usually the whole (small) frame at once
    if not head:
        raise ConnectionResetError("the peer closed the control connection")
    if len(head) < LENGTH_BYTES:
        head += recv_exactly(sock, LENGTH_BYTES - len(head))
    size = int.from_bytes(head[:LENGTH_BYTES], "big")
    if size > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"control frame of {size} bytes; the limit is {MAX_FRAME_BYTES}")
    body = head[LENGTH_BYTES:]
    if len(body) > size:
        raise ConnectionResetError("the control connection sent more than one frame per request")
    if len(body) < size:
        body += recv_exactly(sock, size - len(body))
    return body
