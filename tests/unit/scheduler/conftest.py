"""Fixtures of the scheduler unit tests (helpers live in sched_helpers.py)."""

from __future__ import annotations

import pytest
from sched_helpers import make_profile

from kvstored.clock import FakeClock
from kvstored.scheduler.costmodel import CostModel


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(0.0)


@pytest.fixture
def cost() -> CostModel:
    return CostModel(make_profile(), block_tokens=16)
