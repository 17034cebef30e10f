"""Helpers of the integration tests: an in-process daemon thread, polling, derived values."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from thread_helpers import wait_until  # noqa: F401  (re-exported: the tests import it from here)

from kvstored.config import NodeConfig
from kvstored.node.daemon import NodeDaemon


class DaemonThread:
    """A NodeDaemon serving from a background thread's event loop."""

    def __init__(self, cfg: NodeConfig, *, enable_scheduler: bool = False) -> None:
        self.cfg = cfg
        self.enable_scheduler = enable_scheduler
        self._started = threading.Event()
        self._exc: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"daemon-{cfg.node_id}", daemon=True)
        self.daemon: NodeDaemon
        self._loop: asyncio.AbstractEventLoop
        self._stop_event: asyncio.Event

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self.daemon = NodeDaemon(self.cfg, enable_scheduler=self.enable_scheduler)
        try:
            await self.daemon.start()
        except BaseException as exc:
            self._exc = exc
            self._started.set()
            return
        self._started.set()
        await self._stop_event.wait()
        await self.daemon.stop()

    def start(self) -> DaemonThread:
        self._thread.start()
        assert self._started.wait(60), "daemon did not start within 60 s"
        if self._exc is not None:
            raise self._exc
        return self

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the daemon's loop thread and return its result."""
        done = threading.Event()
        box: list[Any] = []

        def wrapper() -> None:
            try:
                box.append(fn())
            finally:
                done.set()

        self._loop.call_soon_threadsafe(wrapper)
        assert done.wait(10)
        return box[0]

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop_event.set)
            self._thread.join(timeout=60)

    @property
    def unix_address(self) -> str:
        return next(a for a in self.daemon.grpc_addresses if a.startswith("unix:"))

    @property
    def tcp_address(self) -> str:
        return next(a for a in self.daemon.grpc_addresses if not a.startswith("unix:"))

    def address_for(self, transport: str) -> str:
        """shm needs the unix socket; tcp/grpc use the TCP address (like a remote client)."""
        return self.unix_address if transport in ("shm", "auto") else self.tcp_address


def value_for(key: bytes, size: int) -> bytes:
    """A value derived from its key, so any read can be checked without bookkeeping."""
    seed = int.from_bytes(key[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def random_keys(n: int) -> list[bytes]:
    return [os.urandom(16) for _ in range(n)]


NodeFactory = Callable[..., "DaemonThread"]
"""What the ``start_node`` fixture yields: start a node with NodeConfig overrides."""
