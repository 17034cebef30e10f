"""Test-only fault hooks a daemon arms from ``KVSTORED_TEST_HOOKS`` (a no-op unless set).

Multi-process tests need to hold a daemon at a chosen point (e.g. a data-plane GET whose
pins are taken but whose bytes are not sent yet) while they change the daemon from outside.
The environment variable names the points and a FIFO per point::

    KVSTORED_TEST_HOOKS="dataplane_get_before_send:/tmp/x/hold.fifo[,POINT:PATH ...]"

The first time a point is reached, the hook creates ``PATH + ".held"`` (an empty file: "I am
holding"), then opens the FIFO ``PATH`` for reading, which blocks until the test opens it
for writing, and reads until the test closes it. The point is then disarmed: later hits
pass straight through. The FIFO must exist before the point is reached (``os.mkfifo``).

Points: ``dataplane_get_before_send`` (the data-plane server's ``get_before_send`` event:
the chunk's blocks are pinned, nothing of it is sent yet); ``loop_stall`` (the node daemon's
SIGUSR2 handler, run on the event loop: the whole loop is blocked while held, which the
watchdog test uses to show that a wedged loop stops its ``WATCHDOG=1`` pings);
``remote_fill_before_copy`` (a read across the pool, kvstored/node/remote.py, after its
master lookup named the holders and before the first data-plane GET from one: a test stops
or kills the named holder there, then releases the read to see it fall back to another);
``remote_copy_before_copy`` (a master COPY command's transfer, the same point of
``RemoteReads.copy_from``: the ``.held`` file holds the source's node id, so a test stops or
kills that very source, then releases the copy to see it go to another replica);
``remote_fill_gate`` (the same place as ``remote_fill_before_copy``, but a gate, not a
one-shot hold: *every* copy that reaches it waits, the parallel peer batches of one read
and any other read or COPY command alike, until the test opens the FIFO for writing and
closes it; from then on it is open for good. The first arrival creates ``PATH + ".held"``;
the release logs how many copies were held. A read whose holders are spread over several
peers copies from them in parallel, so only a gate holds all of it: the whole-system test
kills a holder and the leading master while every copy of engine B's load is held).

``master_link_before_reregister`` (the node's MasterLink before a registration other than
its first, e.g. with the new leader after a failover; held on a worker thread, so the
node goes on serving: the fail17b test holds a live holder away from the new leader while
that leader says ``complete=true``).

Unset (every production run): :func:`dataplane_hook_from_env` returns None and the data
plane makes no hook calls at all.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from kvstored.errors import ConfigInvalid

log = structlog.get_logger(__name__)

ENV_VAR = "KVSTORED_TEST_HOOKS"
POINTS = ("dataplane_get_before_send", "loop_stall", "remote_fill_before_copy",
          "remote_copy_before_copy", "remote_fill_gate", "master_link_before_reregister")
_DATAPLANE_PREFIX = "dataplane_"


def parse_test_hooks(value: str) -> dict[str, str]:
    """``"POINT:PATH,POINT:PATH"`` -> ``{point: fifo path}``.

    Raises:
        ConfigInvalid: an entry without ``:``, an unknown point or an empty path (names
            the entry and the known points).
    """
    out: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in value.split(","))):
        point, sep, path = entry.partition(":")
        if not sep or point not in POINTS or not path:
            raise ConfigInvalid(
                f"env var {ENV_VAR}: entry {entry!r} is not POINT:FIFO_PATH with POINT one of "
                f"{', '.join(POINTS)}"
            )
        out[point] = path
    return out


class _Hold:
    """Blocks the first caller on a FIFO until the test writes to it and closes it."""

    def __init__(self, point: str, path: str) -> None:
        self.point = point
        self.path = path
        self._armed = True
        self._lock = threading.Lock()

    def __call__(self, note: str = "") -> None:
        """Hold (the first call only); ``note`` is written into the ``.held`` file."""
        with self._lock:
            if not self._armed:
                return
            self._armed = False
        log.warning("test_hook_holding", point=self.point, fifo=self.path)
        with open(self.path + ".held.tmp", "w") as f:
            f.write(note)
        os.replace(self.path + ".held.tmp", self.path + ".held")  # whole, once it exists
        with open(self.path, "rb") as fifo:  # blocks until the test opens the FIFO to write
            fifo.read()  # until the test closes it
        log.warning("test_hook_released", point=self.point)


class _Gate:
    """Holds every caller until the test writes the FIFO and closes it; then open for good.

    The first caller creates ``path + ".held"`` and waits on the FIFO (as :class:`_Hold`);
    the others wait on an event the first sets once released (also if its wait failed, so
    a broken FIFO never strands them). ``num_held`` counts the callers that waited.
    """

    def __init__(self, point: str, path: str) -> None:
        self.point = point
        self.path = path
        self.num_held = 0
        self._waiter = False
        self._open = threading.Event()
        self._lock = threading.Lock()

    def __call__(self) -> None:
        if self._open.is_set():
            return
        with self._lock:
            if self._open.is_set():
                return
            self.num_held += 1
            first, self._waiter = not self._waiter, True
        if not first:
            self._open.wait()
            return
        log.warning("test_hook_holding", point=self.point, fifo=self.path, gate=True)
        try:
            with open(self.path + ".held", "w"):
                pass
            with open(self.path, "rb") as fifo:  # blocks until the test opens it to write
                fifo.read()  # until the test closes it
        finally:
            with self._lock:
                self._open.set()
                n = self.num_held
            log.warning("test_hook_released", point=self.point, num_held=n)


def dataplane_hook_from_env(
    environ: Mapping[str, str] | None = None,
) -> Callable[..., None] | None:
    """The data-plane server's ``hook`` armed by ``KVSTORED_TEST_HOOKS``; None when unset.

    Args:
        environ: environment to read (default ``os.environ``).

    Raises:
        ConfigInvalid: the variable is set but malformed (see :func:`parse_test_hooks`).
    """
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    holds = {
        point[len(_DATAPLANE_PREFIX):]: _Hold(point, path)
        for point, path in parse_test_hooks(value).items()
        if point.startswith(_DATAPLANE_PREFIX)
    }
    if not holds:
        return None

    def hook(event: str, **fields: Any) -> None:
        hold = holds.get(event)
        if hold is not None:
            hold()

    return hook


def loop_stall_hook_from_env(environ: Mapping[str, str] | None = None) -> Callable[[], None] | None:
    """The ``loop_stall`` hold armed by ``KVSTORED_TEST_HOOKS``; None when unset.

    The daemon runs it (once) as its SIGUSR2 handler on the event loop, so while it holds,
    nothing else on the loop runs.

    Raises:
        ConfigInvalid: the variable is set but malformed (see :func:`parse_test_hooks`).
    """
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    path = parse_test_hooks(value).get("loop_stall")
    return None if path is None else _Hold("loop_stall", path)


def remote_fill_hook_from_env(
    environ: Mapping[str, str] | None = None,
) -> Callable[[], None] | None:
    """The ``remote_fill_before_copy`` hold or the ``remote_fill_gate`` armed by
    ``KVSTORED_TEST_HOOKS``; None when neither is set.

    The node's remote reads call it before each peer batch's data-plane GET, after the
    lookup that named the holders (``RemoteReads.before_copy``; the master's COPY commands
    take the same path, so a test arms it only where none is due): the hold stops the
    first call only, the gate every call until released.

    Raises:
        ConfigInvalid: the variable is set but malformed (see :func:`parse_test_hooks`), or
            names both points (one call site: arm one of them).
    """
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    hooks = parse_test_hooks(value)
    hold, gate = hooks.get("remote_fill_before_copy"), hooks.get("remote_fill_gate")
    if hold is not None and gate is not None:
        raise ConfigInvalid(
            f"env var {ENV_VAR}: remote_fill_before_copy and remote_fill_gate share one call "
            f"site; arm one of them (got {value!r})"
        )
    if gate is not None:
        return _Gate("remote_fill_gate", gate)
    return None if hold is None else _Hold("remote_fill_before_copy", hold)


def remote_copy_hook_from_env(
    environ: Mapping[str, str] | None = None,
) -> Callable[[str], None] | None:
    """The ``remote_copy_before_copy`` hold armed by ``KVSTORED_TEST_HOOKS``; None when unset.

    The node's COPY commands call it (the first time: it holds) with the source's node id
    before the data-plane GET from it (``RemoteReads.before_repair_copy``); the id is
    written into the ``.held`` file.

    Raises:
        ConfigInvalid: the variable is set but malformed (see :func:`parse_test_hooks`).
    """
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    path = parse_test_hooks(value).get("remote_copy_before_copy")
    return None if path is None else _Hold("remote_copy_before_copy", path)


def reregister_hook_from_env(
    environ: Mapping[str, str] | None = None,
) -> Callable[[], None] | None:
    """The ``master_link_before_reregister`` hold armed by ``KVSTORED_TEST_HOOKS``; None
    when unset. The node's MasterLink calls it (on a worker thread; the first time: it
    holds) before it registers again (``MasterLink.before_reregister``).

    Raises:
        ConfigInvalid: the variable is set but malformed (see :func:`parse_test_hooks`).
    """
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    path = parse_test_hooks(value).get("master_link_before_reregister")
    return None if path is None else _Hold("master_link_before_reregister", path)
