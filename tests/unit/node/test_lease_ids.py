"""Lease ids of the LeaseBook: random 63-bit, never 0, unique, drawn from os.urandom in
batches (one read per 512 ids, not a system call per lease)."""

from __future__ import annotations

import os

import pytest

from kvstored.node import sessions
from kvstored.node.sessions import LeaseBook


def test_lease_ids_are_the_os_random_source_drawn_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    draws: list[int] = []
    real = os.urandom

    def urandom(n: int) -> bytes:
        draws.append(n)
        return real(n)

    monkeypatch.setattr(sessions.os, "urandom", urandom)
    book = LeaseBook(1 << 20, lambda: 0.0)
    sid = book.open_session("t")
    ids = [book.add("pin", sid, [], 0, 5.0) for _ in range(1000)]
    assert len(draws) == 2 and all(n == 8 * sessions._IDS_PER_DRAW for n in draws)
    assert all(i is not None and 0 < i < 1 << 63 for i in ids)
    assert len(set(ids)) == len(ids)


def test_lease_ids_come_from_the_drawn_bytes_and_skip_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    words = [0, 1, 2 << 1, (1 << 64) - 1]  # 0 and 1 both give id 0: skipped
    raw = b"".join(w.to_bytes(8, "little") for w in words)
    monkeypatch.setattr(sessions, "_IDS_PER_DRAW", len(words))
    monkeypatch.setattr(sessions.os, "urandom", lambda n: raw)
    book = LeaseBook(1 << 20, lambda: 0.0)
    sid = book.open_session("t")
    got = [book.add("pin", sid, [], 0, 5.0) for _ in range(2)]
    assert sorted(got) == [2, (1 << 63) - 1]  # the words shifted right by one: 63 bits
