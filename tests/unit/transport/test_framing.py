"""The data-plane frame codec: limits checked before allocation, whole-exchange deadlines."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from kvstored.errors import BatchTooLarge, BlockTooLarge, InvalidArgument
from kvstored.transport.framing import (
    GET_FLAG_RANGES,
    OP_GET,
    OP_PUT,
    PUT_FLAG_HANDOFF,
    RANGE_TO_END,
    FrameLimits,
    FrameRejected,
    ProtocolError,
    Reader,
    decode_get_body,
    decode_get_ranges_body,
    decode_put_body,
    decode_put_body_flags,
    encode_get_body,
    encode_put_body,
    range_bytes,
    send_all,
)

LIMITS = FrameLimits(
    max_items=8, max_key_bytes=64, max_meta_bytes=4096, max_namespace_bytes=64,
    max_item_bytes=1 << 20, max_request_payload_bytes=4 << 20, max_body_bytes=1 << 20,
)


def test_body_limit_follows_the_op_the_count_and_the_budget() -> None:
    assert LIMITS.max_body_for(OP_GET, 2) == 2 + 64 + 2 * 66
    assert LIMITS.max_body_for(OP_PUT, 2) == 2 + 64 + 2 * (66 + 12 + 4096)
    big = FrameLimits(**{**{f: getattr(LIMITS, f) for f in LIMITS.__slots__}, "max_items": 10**6})
    assert big.max_body_for(OP_PUT, 10**6) == 1 << 20  # capped by the shared budget


@pytest.mark.parametrize(
    ("op", "count", "body_len", "error"),
    [
        (OP_GET, 9, 0, BatchTooLarge),
        (OP_GET, 1, 2 + 64 + 66 + 1, InvalidArgument),
        (OP_PUT, 1, 2 + 64 + 66 + 12 + 4096 + 1, InvalidArgument),
    ],
)
def test_request_headers_over_a_limit_are_rejected(op: int, count: int, body_len: int, error: type) -> None:
    with pytest.raises(FrameRejected) as exc_info:
        LIMITS.check_request_header(op, count, body_len)
    assert type(exc_info.value.error) is error
    LIMITS.check_request_header(op, count - 1 if count > 1 else 1, 0)  # within: no error


def test_a_ranged_get_body_round_trips_and_is_bounded_with_its_ranges() -> None:
    keys = [b"k" * 16, b"j" * 64]
    ranges = [(0, 1 << 20), (1 << 20, RANGE_TO_END)]
    raw = encode_get_body(keys, b"ns", ranges)
    assert decode_get_ranges_body(raw, 2) == (b"ns", keys, ranges)
    assert LIMITS.max_body_for(OP_GET, 2, GET_FLAG_RANGES) == 2 + 64 + 2 * (66 + 16)
    LIMITS.check_request_header(OP_GET, 2, len(raw), GET_FLAG_RANGES)
    with pytest.raises(ProtocolError, match="truncated"):
        decode_get_ranges_body(raw[:-1], 2)
    assert [range_bytes(10, 0, 4), range_bytes(10, 8, 4), range_bytes(10, 12, 4),
            range_bytes(10, 4, RANGE_TO_END)] == [4, 2, 0, 6]


def test_unknown_op_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="unknown data-plane op 7"):
        LIMITS.check_request_header(7, 1, 0)


def test_put_flags_carry_only_the_replication_factor() -> None:
    from kvstored.transport.framing import PUT_FLAG_FACTOR_SHIFT

    LIMITS.check_request_header(OP_PUT, 1, 0, 8 << PUT_FLAG_FACTOR_SHIFT)  # factor 8: known
    for bad in (GET_FLAG_RANGES, 1 << 12):  # a GET flag, a bit above the factor's
        with pytest.raises(ProtocolError, match=r"flags 0x[0-9a-f]+ are not supported for op 2"):
            LIMITS.check_request_header(OP_PUT, 1, 0, bad)


def test_a_probe_get_sends_no_bytes_and_asks_nobody_else() -> None:
    from kvstored.transport.framing import (
        GET_FLAG_FILL_FROM_PEERS,
        GET_FLAG_GENERATION,
        GET_FLAG_PROBE,
    )

    LIMITS.check_request_header(OP_GET, 1, 0, GET_FLAG_PROBE | GET_FLAG_GENERATION)
    for bad in (GET_FLAG_FILL_FROM_PEERS, GET_FLAG_RANGES):
        with pytest.raises(ProtocolError, match="GET_FLAG_PROBE"):
            LIMITS.check_request_header(OP_GET, 1, 0, GET_FLAG_PROBE | bad)


def test_put_sizes_are_bounded_as_a_sum_skipped_items_included() -> None:
    LIMITS.check_put_sizes([1 << 20] * 4)
    with pytest.raises(FrameRejected) as exc_info:
        LIMITS.check_put_sizes([1 << 20] * 4 + [1])
    assert isinstance(exc_info.value.error, BlockTooLarge)
    with pytest.raises(FrameRejected):
        LIMITS.check_put_sizes([1 << 62])


def test_bodies_round_trip() -> None:
    keys = [b"k" * 16, b"j" * 64]
    assert decode_get_body(encode_get_body(keys, b"ns"), 2) == (b"ns", keys)
    items = [(b"k" * 16, 5, b"meta"), (b"j" * 20, 0, b"")]
    assert decode_put_body(encode_put_body(items, b""), 2) == (b"", items)
    with pytest.raises(ProtocolError, match="truncated"):
        decode_get_body(encode_get_body(keys, b"ns")[:-1], 2)


def test_a_hand_off_put_body_carries_its_age_after_the_namespace() -> None:
    items = [(b"k" * 16, 5, b"meta")]
    raw = encode_put_body(items, b"ns", handoff_age_ms=12345)
    assert len(raw) == len(encode_put_body(items, b"ns")) + 8
    assert decode_put_body_flags(raw, 1, PUT_FLAG_HANDOFF) == (b"ns", 12345, items)
    assert decode_put_body_flags(encode_put_body(items, b"ns"), 1, 0) == (b"ns", None, items)
    LIMITS.check_request_header(OP_PUT, 1, len(raw), PUT_FLAG_HANDOFF)  # a known flag
    assert LIMITS.max_body_for(OP_PUT, 2, PUT_FLAG_HANDOFF) == LIMITS.max_body_for(OP_PUT, 2) + 8
    with pytest.raises(ProtocolError, match="flags 0x4 are not supported"):
        LIMITS.check_request_header(OP_PUT, 1, len(raw), 4)
    with pytest.raises(ProtocolError, match="truncated"):  # the age promised, not sent
        decode_put_body_flags(encode_put_body([], b"ns"), 0, PUT_FLAG_HANDOFF)


def test_reader_deadline_bounds_the_whole_read_not_each_recv() -> None:
    a, b = socket.socketpair()
    stop = threading.Event()

    def trickle() -> None:  # a byte every 20 ms: each recv returns well within any timeout
        while not stop.wait(0.02):
            try:
                b.send(b"x")
            except OSError:
                return

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        reader = Reader(a, deadline=time.monotonic() + 0.3)
        with pytest.raises(TimeoutError):
            reader.read_into(memoryview(bytearray(1 << 20)))
        assert 0 < reader.num_received < 1 << 20
    finally:
        stop.set()
        t.join(5)
        a.close()
        b.close()


def test_reader_fill_waits_for_one_byte_and_keeps_it() -> None:
    a, b = socket.socketpair()
    with a, b:
        reader = Reader(a)
        b.sendall(b"abc")
        reader.fill()
        assert reader.buffered >= 1
        assert reader.read_exact(3) == b"abc"


def _in_thread(fn: object, guard_s: float = 10.0) -> list[object]:
    """Run ``fn`` on a thread; its result or exception (a hang guard, not a timing check)."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())  # type: ignore[operator]
        except Exception as exc:  # noqa: BLE001  (the caller asserts on it)
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(guard_s)
    assert not t.is_alive(), "the socket call outlived its deadline (no kernel timeout armed?)"
    return out


def test_a_silent_peer_ends_a_whole_payload_read_at_the_deadline() -> None:
    # Under a deadline the socket blocks in the kernel (one MSG_WAITALL recv per payload);
    # SO_RCVTIMEO, armed to what is left before each call, is what ends it.
    a, b = socket.socketpair()
    with a, b:
        reader = Reader(a, deadline=time.monotonic() + 0.2)
        b.sendall(b"x" * 1000)  # part of the payload, then nothing
        out = _in_thread(lambda: reader.read_into(memoryview(bytearray(1 << 20))))
        assert isinstance(out[0], TimeoutError)
        assert reader.num_received == 1000
        reader.deadline = time.monotonic() + 0.2
        assert isinstance(_in_thread(lambda: reader.read_exact(16))[0], TimeoutError)


def test_a_payload_arriving_in_pieces_is_received_whole() -> None:
    a, b = socket.socketpair()
    payload = bytes(range(256)) * 4096  # 1 MiB
    with a, b:
        reader = Reader(a, deadline=time.monotonic() + 20)

        def send() -> None:
            for i in range(0, len(payload), 100_000):
                b.sendall(payload[i : i + 100_000])

        t = threading.Thread(target=send, daemon=True)
        t.start()
        dst = bytearray(len(payload))
        reader.read_into(memoryview(dst))
        t.join(10)
        assert dst == payload and reader.buffered == 0


def test_send_all_to_a_peer_that_stops_reading_ends_at_the_deadline() -> None:
    a, b = socket.socketpair()
    with a, b:
        big = memoryview(bytearray(64 << 20))  # far more than the socket buffers hold
        out = _in_thread(lambda: send_all(a, [big], time.monotonic() + 0.3))
        assert isinstance(out[0], TimeoutError)


def test_a_spare_put_is_a_known_flag_never_with_a_hand_off() -> None:
    from kvstored.transport.framing import PUT_FLAG_FACTOR_SHIFT, PUT_FLAG_SPARE

    LIMITS.check_request_header(OP_PUT, 1, 0, PUT_FLAG_SPARE | 3 << PUT_FLAG_FACTOR_SHIFT)
    with pytest.raises(ProtocolError, match="PUT_FLAG_HANDOFF .1. and PUT_FLAG_SPARE .2."):
        LIMITS.check_request_header(OP_PUT, 1, 8, PUT_FLAG_SPARE | PUT_FLAG_HANDOFF)
