"""How a large data-plane GET is split over streams (kvstored/transport/tcp_streams.py)."""

from __future__ import annotations

import itertools
import socket

import pytest

from kvstored.transport.framing import RANGE_TO_END
from kvstored.transport.tcp_streams import StreamSet, plan_ranges, plan_streams

MIB = 1 << 20


def test_a_batch_too_small_for_two_streams_stays_one() -> None:
    assert plan_streams([4 * MIB] * 3, 2, 8 * MIB) == [(0, 3)]  # 12 MiB < 2 x 8 MiB
    assert plan_streams([64 * MIB], 4, 8 * MIB) == [(0, 1)]  # one block is never split
    assert plan_streams([], 4, 8 * MIB) == [(0, 0)]
    assert plan_streams([0] * 16, 4, 1) == [(0, 16)]  # no size known: no split


def test_equal_blocks_are_split_into_equal_contiguous_runs() -> None:
    assert plan_streams([4 * MIB] * 16, 2, 8 * MIB) == [(0, 8), (8, 16)]
    assert plan_streams([MIB] * 16, 4, 4 * MIB) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert plan_streams([MIB] * 16, 4, 8 * MIB) == [(0, 8), (8, 16)]  # 16 MiB: 2 runs of 8


def test_runs_balance_bytes_not_keys() -> None:
    sizes = [16 * MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB, MIB]
    assert plan_streams(sizes, 2, MIB) == [(0, 1), (1, 17)]


@pytest.mark.parametrize("n", [2, 3, 7, 16, 33])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_runs_cover_every_key_once_in_order(n: int, k: int) -> None:
    runs = plan_streams([MIB + i for i in range(n)], k, 1)
    assert runs[0][0] == 0 and runs[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))
    assert all(lo < hi for lo, hi in runs)
    assert len(runs) == min(k, n)


def test_abort_shuts_down_the_siblings_not_the_origin() -> None:
    a, a_peer = socket.socketpair()
    b, b_peer = socket.socketpair()
    with a, a_peer, b, b_peer:
        streams = StreamSet()
        assert streams.enter(a) and streams.enter(b)
        streams.abort(origin=a)
        assert streams.failed
        assert b.recv(1) == b""  # shut down: a blocked recv_into on it returns at once
        a_peer.sendall(b"x")
        assert a.recv(1) == b"x"  # the origin is left to its own stream
        assert not streams.enter(socket.socket())  # a failed set starts no new stream


def test_a_lone_block_is_split_into_aligned_ranges_the_last_to_the_end() -> None:
    end = RANGE_TO_END
    assert plan_ranges(16 * MIB, 2, 8 * MIB, end) == [(0, 8 * MIB), (8 * MIB, end)]
    assert plan_ranges(15 * MIB, 2, 8 * MIB, end) == [(0, end)]  # < 2 x 8 MiB: whole
    assert plan_ranges(12 * MIB + 1, 2, 4 * MIB, end) == [(0, 6 * MIB + (64 << 10)), (6 * MIB + (64 << 10), end)]
    parts = plan_ranges(64 * MIB, 4, 8 * MIB, end)
    assert parts == [(0, 16 * MIB), (16 * MIB, 16 * MIB), (32 * MIB, 16 * MIB), (48 * MIB, end)]
