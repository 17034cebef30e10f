"""Fixtures of the end-to-end tests (real processes); ``workdir`` is the suite's (tests/conftest.py).

``procs``: the processes a test started (append to it); each is killed, last started first,
when the test ends, whatever its outcome.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def procs() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for p in reversed(started):
        p.kill()
