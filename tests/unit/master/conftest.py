"""Fixtures of the master unit tests (helpers live in master_helpers.py)."""

from __future__ import annotations

import pytest
from master_helpers import Cluster


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()
