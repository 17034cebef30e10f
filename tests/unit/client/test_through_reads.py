"""The shared-memory get's misses a full node marked ``through`` (issue 17 section 3): the
client reads exactly those keys with the inline Get, batched by the node's inline budget
by their sizes, asking again for what the node answered BatchTooLarge.

Driven without I/O: the op's Get steps are answered by a fake node that honours its inline
budget like the real one (the first value always fits; past the budget BatchTooLarge).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from kvstored.client._ops import _inline_batch, _read_grpc, _ReadSink
from kvstored.client._steps import Call
from kvstored.errors import ErrorCode
from kvstored.v1 import common_pb2 as cpb
from kvstored.v1 import node_pb2 as pb

BLOCK = 1000


def _value(k: bytes) -> bytes:
    return k[:1] * BLOCK


def _drive(only: dict[int, int], keys: list[bytes], budget: int,
           buffers: list[bytearray] | None = None) -> tuple[_ReadSink, list[list[bytes]]]:
    """Run ``_read_grpc(only=...)`` against a fake node; returns the sink and each Get's keys."""
    sink = _ReadSink(keys, buffers)
    st: Any = SimpleNamespace(namespace_id=b"")
    info: Any = SimpleNamespace(max_batch_keys=64, max_inline_bytes=budget)
    asked: list[list[bytes]] = []
    gen = _read_grpc(st, info, sink, time.monotonic() + 10, only)
    reply = None
    try:
        while True:
            step = gen.send(reply)
            assert isinstance(step, Call) and step.method == "Get"
            req = step.request
            assert isinstance(req, pb.GetRequest)
            asked.append(list(req.keys))
            resp, used = pb.GetResponse(), 0
            for k in req.keys:
                if used and used + BLOCK > budget:
                    resp.results.add(status=cpb.ItemStatus(code=ErrorCode.BATCH_TOO_LARGE))
                    continue
                used += BLOCK
                resp.results.add(found=True, value=_value(k))
            reply = resp
    except StopIteration:
        pass
    return sink, asked


KEYS = [bytes([65 + i]) * 16 for i in range(6)]


def test_the_marked_keys_are_read_in_batches_that_fit_the_inline_budget() -> None:
    sink, asked = _drive({1: BLOCK, 3: BLOCK, 4: BLOCK}, KEYS, 2 * BLOCK)
    assert asked == [[KEYS[1], KEYS[3]], [KEYS[4]]]  # no key asked twice: no wasted peer fetch
    assert [sink.value(i) for i in range(6)] == [
        None, _value(KEYS[1]), None, _value(KEYS[3]), _value(KEYS[4]), None]


def test_unknown_sizes_are_asked_together_and_the_node_budget_splits_them() -> None:
    sink, asked = _drive({1: 0, 3: 0, 4: 0}, KEYS, 2 * BLOCK)
    assert asked == [[KEYS[1], KEYS[3], KEYS[4]], [KEYS[4]]]
    assert [sink.value(i) for i in (1, 3, 4)] == [_value(KEYS[i]) for i in (1, 3, 4)]


def test_get_into_buffers_receive_the_marked_blocks() -> None:
    bufs = [bytearray(BLOCK) for _ in KEYS]
    sink, _ = _drive({0: BLOCK, 5: BLOCK}, KEYS, BLOCK, bufs)
    assert sink.sizes == [BLOCK, None, None, None, None, BLOCK]
    assert (bytes(bufs[0]), bytes(bufs[5])) == (_value(KEYS[0]), _value(KEYS[5]))


@pytest.mark.parametrize(("sizes", "budget", "want"), [
    ([5, 5, 5], 10, 2),   # as many as fit
    ([20, 5], 10, 1),     # the first always goes, even past the budget
    ([0, 0, 0], 1, 3),    # unknown sizes: every key (the node's budget splits them)
    ([1] * 100, 1000, 64),  # never more than max_batch_keys
])
def test_inline_batch(sizes: list[int], budget: int, want: int) -> None:
    pending = list(range(len(sizes)))
    assert _inline_batch(pending, dict(enumerate(sizes)), budget, 64) == want
