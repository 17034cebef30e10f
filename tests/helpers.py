"""Small helpers every test directory shares: block keys, an O_DIRECT probe, a torn send.

Importable from every test directory: pytest puts tests/ on ``sys.path`` (the suite's root
conftest lives there). Polling and thread helpers are in tests/thread_helpers.py; the clock
tests advance by hand is :class:`kvstored.clock.FakeClock`.
"""

from __future__ import annotations

import os
import pathlib
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import pytest


def key(i: int) -> bytes:
    """Block ``i``'s 16-byte key (``i`` big-endian): distinct for distinct ``i`` in 0..2**128-1.

    Raises:
        OverflowError: ``i`` is negative or does not fit in 16 bytes.
    """
    return i.to_bytes(16, "big")


def odirect_supported(d: pathlib.Path) -> bool:
    """Whether the filesystem of directory ``d`` accepts ``O_DIRECT`` at open (tmpfs before
    Linux 6.6 and FUSE refuse it). Creates the empty file ``d/probe``."""
    try:
        os.close(os.open(d / "probe", os.O_CREAT | os.O_WRONLY | os.O_DIRECT))
    except OSError:
        return False
    return True


def tear_payload_at(monkeypatch: pytest.MonkeyPatch, server_module: ModuleType, start: int
                    ) -> Callable[[int], None]:
    """Make the data-plane server in ``server_module`` (kvstored.transport.tcp_server) cut its
    connection half-way through the payload of the chunk that starts at item ``start``: the
    item's header and meta and half its payload go out, then ``send_all`` raises
    ConnectionResetError. Returns the ``get_before_send`` hook (``hook(start)``) that tells the
    torn send which chunk is going out; install it on the server's test hook."""
    real = server_module.send_all
    current = threading.local()

    def tearing_send_all(sock: Any, bufs: Sequence[Any], deadline: float | None) -> None:
        if getattr(current, "start", None) != start:
            return real(sock, bufs, deadline)
        *head, payload = bufs
        real(sock, [*head, memoryview(payload)[: len(payload) // 2]], deadline)
        raise ConnectionResetError("test: connection cut in the middle of a payload")

    monkeypatch.setattr(server_module, "send_all", tearing_send_all)
    return lambda s: setattr(current, "start", s)


class ServicerContextStub:
    """The part of a ``grpc.aio.ServicerContext`` the master's handlers use, for calling a
    servicer method in process: the peer their log lines name, trailing metadata (ignored),
    and ``abort``, raised as ``RuntimeError("CODE: details")``."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def set_trailing_metadata(self, md: object) -> None:
        pass

    async def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")
