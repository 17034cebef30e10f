"""The suite's loadgroup order (tests/conftest.py hands it to xdist): longest kind first."""

from __future__ import annotations

from typing import Any

VLLM_GROUP = "vllm"
"""The loadgroup of every test marked ``vllm`` (tests/conftest.py)."""


def group_rank(group: str) -> int:
    """Where a loadgroup goes in the queue: 0 (first) for the vLLM group, then the e2e
    files (real processes: the long ones), the integration files, everything else."""
    if group == VLLM_GROUP:
        return 0
    for rank, prefix in enumerate(("tests/e2e/", "tests/integration/"), start=1):
        if group.startswith(prefix):
            return rank
    return 3


def make_scheduler(config: Any, log: Any) -> Any:
    """``--dist loadgroup``: xdist's LoadGroupScheduling, its queue ordered by
    :func:`group_rank` (stable: xdist's order, most tests first, within a rank)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadGroupScheduling

    class LongestKindFirst(LoadGroupScheduling):
        _ordered = False

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:  # the first call: the queue is complete, nothing taken yet
                self._ordered = True
                queue = self.workqueue
                self.workqueue = OrderedDict(
                    (scope, queue[scope]) for scope in sorted(queue, key=group_rank)
                )
            super()._assign_work_unit(node)

    return LongestKindFirst(config, log)
