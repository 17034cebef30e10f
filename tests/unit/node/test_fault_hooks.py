"""The test-only fault hooks armed from KVSTORED_TEST_HOOKS (kvstored/node/fault_hooks.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvstored.errors import ConfigInvalid
from kvstored.node.fault_hooks import (
    dataplane_hook_from_env,
    parse_test_hooks,
    remote_fill_hook_from_env,
)


def test_unset_or_empty_arms_nothing() -> None:
    assert dataplane_hook_from_env({}) is None
    assert dataplane_hook_from_env({"KVSTORED_TEST_HOOKS": ""}) is None


@pytest.mark.parametrize("value", ["dataplane_get_before_send", "nope:/tmp/x",
                                   "dataplane_get_before_send:"])
def test_a_malformed_entry_is_refused_naming_it_and_the_known_points(value: str) -> None:
    with pytest.raises(ConfigInvalid, match="KVSTORED_TEST_HOOKS.*dataplane_get_before_send"):
        parse_test_hooks(value)


def test_the_point_holds_its_first_caller_until_the_fifo_is_written_then_passes(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    hook = dataplane_hook_from_env({"KVSTORED_TEST_HOOKS": f"dataplane_get_before_send:{fifo}"})
    assert hook is not None
    hook("chunk_sent", start=0, num_items=1)  # another event: passes at once
    done = threading.Event()
    t = threading.Thread(target=lambda: (hook("get_before_send", start=0, num_items=1),
                                         done.set()))
    t.start()
    held = Path(f"{fifo}.held")
    deadline = time.monotonic() + 10
    while not held.exists():
        assert time.monotonic() < deadline, "the hook never said it holds"
        time.sleep(0.01)
    assert not done.is_set()  # held
    with open(fifo, "wb") as f:
        f.write(b"go")
    t.join(10)
    assert done.is_set()
    hook("get_before_send", start=0, num_items=1)  # disarmed: passes at once


def test_the_remote_fill_point_is_armed_alone_and_holds_like_the_others(tmp_path: Path) -> None:
    fifo = tmp_path / "fill.fifo"
    os.mkfifo(fifo)
    env = {"KVSTORED_TEST_HOOKS": f"remote_fill_before_copy:{fifo}"}
    assert remote_fill_hook_from_env({}) is None
    assert dataplane_hook_from_env(env) is None  # a node-side point, not a data-plane one
    hook = remote_fill_hook_from_env(env)
    assert hook is not None
    t = threading.Thread(target=hook)
    t.start()
    held = Path(f"{fifo}.held")
    deadline = time.monotonic() + 10
    while not held.exists():
        assert time.monotonic() < deadline, "the hook never said it holds"
        time.sleep(0.01)
    assert t.is_alive()  # held
    open(fifo, "wb").close()
    t.join(10)
    assert not t.is_alive()
    hook()  # disarmed: passes at once


def _wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_the_remote_fill_gate_holds_every_caller_until_released_then_stays_open(
    tmp_path: Path,
) -> None:
    # a read copies from several peers in parallel: a one-shot hold stops one batch only
    fifo = tmp_path / "gate.fifo"
    os.mkfifo(fifo)
    gate = remote_fill_hook_from_env({"KVSTORED_TEST_HOOKS": f"remote_fill_gate:{fifo}"})
    assert gate is not None
    threads = [threading.Thread(target=gate) for _ in range(3)]
    threads[0].start()
    _wait_for(Path(f"{fifo}.held").exists, "the gate never said it holds")
    for t in threads[1:]:
        t.start()
    _wait_for(lambda: getattr(gate, "num_held", 0) == 3, "the later callers did not arrive")
    assert all(t.is_alive() for t in threads)  # all three held, not just the first
    open(fifo, "wb").close()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    gate()  # open for good: a later caller passes at once (no writer would release it)


def test_the_gate_releases_its_waiters_even_if_the_fifo_wait_fails(tmp_path: Path) -> None:
    gate = remote_fill_hook_from_env(
        {"KVSTORED_TEST_HOOKS": f"remote_fill_gate:{tmp_path / 'missing.fifo'}"})
    assert gate is not None
    with pytest.raises(FileNotFoundError):
        gate()
    gate()  # open: nobody is stranded behind a broken FIFO


def test_the_hold_and_the_gate_are_not_armed_together() -> None:
    with pytest.raises(ConfigInvalid, match="remote_fill_before_copy and remote_fill_gate"):
        remote_fill_hook_from_env({"KVSTORED_TEST_HOOKS":
                                   "remote_fill_before_copy:/tmp/a,remote_fill_gate:/tmp/b"})
