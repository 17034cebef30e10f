"""The suite's loadgroup order (tests/conftest.py): the vLLM group is handed out first.

Runs xdist's real LoadGroupScheduling, as tests/conftest.py's ``pytest_xdist_make_scheduler``
returns it, over a made-up collection on two fake workers: the first unit each worker gets
is what a CI run (``-n 2 --dist loadgroup``) starts with.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist_order import group_rank
from xdist_order import make_scheduler as pytest_xdist_make_scheduler

pytest.importorskip("xdist", reason="pytest-xdist (the test extra) is not installed")


class _Config:
    def __init__(self) -> None:
        self.option = type("Option", (), {"loadscopereorder": True})()

    def getvalue(self, name: str) -> Any:
        return {"dist": "loadgroup", "tx": ["2*popen"]}[name]


class _Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


class _Log:
    def __getattr__(self, name: str) -> Any:
        return self

    def __call__(self, *args: Any) -> None:
        pass


def _collection() -> list[str]:
    ids = [f"tests/unit/test_big.py::test_{i}@tests/unit/test_big.py" for i in range(40)]
    ids += [f"tests/integration/test_mid.py::test_{i}@tests/integration/test_mid.py" for i in range(20)]
    ids += [f"tests/e2e/test_e2e_x.py::test_{i}@tests/e2e/test_e2e_x.py" for i in range(12)]
    ids += [f"tests/e2e/test_vllm_connector.py::test_{i}@vllm" for i in range(3)]
    ids += ["tests/e2e/test_system_vllm_cluster.py::test_it@vllm"]
    return ids


def test_the_vllm_group_goes_first_then_e2e_integration_unit() -> None:
    sched = pytest_xdist_make_scheduler(_Config(), _Log())
    assert sched is not None
    workers = [_Worker("gw0"), _Worker("gw1")]
    ids = _collection()
    for w in workers:
        sched.add_node(w)
        sched.add_node_collection(w, ids)
    sched.schedule()
    first = {w.name: {ids[i].rsplit("@", 1)[1] for i in w.sent[0]} for w in workers}
    assert first == {"gw0": {"vllm"}, "gw1": {"tests/e2e/test_e2e_x.py"}}
    # the rest waits in rank order (xdist's own order, most tests first, would start with
    # the unit file and leave the vLLM group, fewest tests, for last)
    assert list(sched.workqueue) == ["tests/integration/test_mid.py", "tests/unit/test_big.py"]


def test_group_rank() -> None:
    assert [group_rank(g) for g in ("vllm", "tests/e2e/test_a.py", "tests/integration/test_b.py",
                                    "tests/unit/node/test_c.py", "tests/test_layers.py")] == [0, 1, 2, 3, 3]


def test_other_dist_modes_keep_xdists_scheduler() -> None:
    config = _Config()
    config.getvalue = lambda name: "load"  # type: ignore[method-assign]
    assert pytest_xdist_make_scheduler(config, _Log()) is None
