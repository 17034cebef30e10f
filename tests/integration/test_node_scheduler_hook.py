"""The daemon hosts the scheduler service when ``kvstored.scheduler.service`` is importable."""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import pytest
from it_helpers import random_keys

from kvstored import Client, Tier


def test_scheduler_service_is_added_with_a_block_locator(start_node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    fake = types.ModuleType("kvstored.scheduler.service")

    class SchedulerConfig:  # used only when kvstored.scheduler.config is absent
        pass

    def add_scheduler_service(server: Any, config: Any, *, block_locator: Any, registry: Any = None) -> None:
        calls.append({"server": server, "config": config, "block_locator": block_locator,
                      "registry": registry})

    fake.SchedulerConfig = SchedulerConfig  # type: ignore[attr-defined]
    fake.add_scheduler_service = add_scheduler_service  # type: ignore[attr-defined]
    if importlib.util.find_spec("kvstored.scheduler") is None:
        monkeypatch.setitem(sys.modules, "kvstored.scheduler", types.ModuleType("kvstored.scheduler"))
    monkeypatch.setitem(sys.modules, "kvstored.scheduler.service", fake)

    node = start_node(enable_scheduler=True)
    assert len(calls) == 1 and calls[0]["server"] is not None
    assert calls[0]["registry"] is node.daemon.metrics.registry
    keys = random_keys(3)
    with Client(node.unix_address) as c:
        c.put(keys[:2], [b"a", b"b"])
    assert calls[0]["block_locator"](keys) == [Tier.DRAM, Tier.DRAM]


def test_no_scheduler_module_is_fine(start_node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kvstored.scheduler.service", None)  # import raises ImportError
    node = start_node(enable_scheduler=True)
    with Client(node.unix_address) as c:
        assert c.stats()["node_id"] == node.cfg.node_id
