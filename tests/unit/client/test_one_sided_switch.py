"""``KVSTORED_ONE_SIDED`` as the hit path reads it (kvstored/client/_shm.py
``one_sided_enabled``: one lookup in CPython's environ store, not ``os.environ.get``)."""

from __future__ import annotations

import os

import pytest

from kvstored.client import _shm


@pytest.mark.parametrize("value", [None, "0", "1", "", " 0", "off"])
def test_the_switch_reads_what_os_environ_holds_now(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("KVSTORED_ONE_SIDED", raising=False)
    else:
        monkeypatch.setenv("KVSTORED_ONE_SIDED", value)
    assert _shm.one_sided_enabled() is (os.environ.get("KVSTORED_ONE_SIDED", "") != "0")
    assert _shm.one_sided_enabled() is (value != "0")


def test_a_plain_assignment_and_del_are_seen_at_once() -> None:
    old = os.environ.pop("KVSTORED_ONE_SIDED", None)
    try:
        os.environ["KVSTORED_ONE_SIDED"] = "0"
        assert not _shm.one_sided_enabled()
        del os.environ["KVSTORED_ONE_SIDED"]
        assert _shm.one_sided_enabled()
    finally:
        if old is not None:
            os.environ["KVSTORED_ONE_SIDED"] = old
