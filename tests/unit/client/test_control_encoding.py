"""The control channel's request encoding (kvstored/client/_control.py ``encode_request``):
the op appended as its serialized field, never copied into the envelope, must parse to the
very message ``CopyFrom`` would have built, for every op the channel carries."""

from __future__ import annotations

import pytest

from kvstored.client._control import encode_request
from kvstored.transport.control import OPS
from kvstored.v1 import node_pb2 as pb


def _op(field: str) -> object:
    req = pb.ControlRequest()
    msg = getattr(req, field)
    if field == "commit_slots":
        msg.namespace_id, msg.session_id, msg.request_id = b"ns" * 100, 7, 2**63 + 5
        for j in range(40):  # long enough for a multi-byte length
            w = msg.writes.add()
            w.slot_id, w.key, w.size_bytes = j, b"k" * 32, 256 << 10
        msg.want.add(size_bytes=4096, num_slots=3)
        msg.grant_after_answer = True
    elif field == "pin_blocks":
        msg.keys.extend([b"x" * 16] * 3)
        msg.session_id = 9
    elif field == "put":
        msg.items.add(key=b"k" * 16, value=b"v" * 300)
    return msg


@pytest.mark.parametrize("field", sorted(OPS))
def test_an_encoded_request_parses_as_the_copied_one(field: str) -> None:
    op = _op(field)
    envelope = pb.ControlRequest(session_id=7, release_pin_ids=[1, 2, 300])
    envelope.one_sided.hit_blocks = 5
    copied = pb.ControlRequest()
    copied.CopyFrom(envelope)
    getattr(copied, field).CopyFrom(op)  # type: ignore[arg-type]  # the op's own message type
    got = pb.ControlRequest.FromString(encode_request(envelope, field, op))  # type: ignore[arg-type]  # as above
    assert got == copied
    assert got.WhichOneof("op") == field


def test_an_empty_op_is_still_the_op() -> None:
    # an op with no field set serializes to nothing; the tag and a zero length still name it
    got = pb.ControlRequest.FromString(encode_request(pb.ControlRequest(), "exists", pb.ExistsRequest()))
    assert got.WhichOneof("op") == "exists"
