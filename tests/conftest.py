"""Suite-wide fixtures.

CLI commands run in-process by tests (click's CliRunner) call ``kvstored.log.configure``,
which sets a level filter and ``cache_logger_on_first_use``: every module logger used after
that stays bound to it, and later tests' ``structlog.testing.capture_logs`` see nothing. Real
processes (daemons started by the tests) configure their own logging as in production.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _keep_the_test_process_logging_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvstored.log.configure", lambda **kwargs: None)
