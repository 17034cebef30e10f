"""The client's test hook seam (kvstored.client._hooks): off by default, installable in-process
or through KVSTORED_TEST_HOOK for child processes."""

from __future__ import annotations

import os
import subprocess
import sys

from kvstored.client import _hooks


def test_fire_without_a_hook_does_nothing_and_install_returns_the_previous_hook() -> None:
    seen: list[tuple[str, dict[str, object]]] = []
    assert _hooks._hook is None
    _hooks.fire("rpc", method="X")  # no hook: nothing happens
    previous = _hooks.install(lambda event, **fields: seen.append((event, fields)))
    try:
        assert previous is None
        _hooks.fire("shm_copy_in_mid", offset=4, size_bytes=8)
        assert seen == [("shm_copy_in_mid", {"offset": 4, "size_bytes": 8})]
    finally:
        assert _hooks.install(None) is not None
    _hooks.fire("rpc", method="Y")
    assert len(seen) == 1


def test_env_var_installs_a_hook_in_a_child_process() -> None:
    code = "from kvstored.client import _hooks; print(_hooks._hook is not None, _hooks._hook.__name__)"
    env = {**os.environ, "KVSTORED_TEST_HOOK": "json:dumps"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "dumps"]
    env.pop("KVSTORED_TEST_HOOK")
    out = subprocess.run([sys.executable, "-c", "from kvstored.client import _hooks; print(_hooks._hook)"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"
