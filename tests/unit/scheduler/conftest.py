"""Fixtures of the scheduler unit tests (helpers live in sched_helpers.py)."""

from __future__ import annotations

import pytest
from sched_helpers import ManualClock, make_profile

from kvstored.scheduler.costmodel import CostModel


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def cost() -> CostModel:
    return CostModel(make_profile(), block_tokens=16)
