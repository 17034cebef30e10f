"""SLO-aware scheduler (Mooncake's "Conductor"): cost model, placement, admission, replay.

- :mod:`kvstored.scheduler.costmodel`: prefill / transfer / decode-step predictions.
- :mod:`kvstored.scheduler.core`: the pure scheduler, a facade over :mod:`~kvstored.scheduler.prefill`
  (prefill choice), :mod:`~kvstored.scheduler.decode_table` (decode side) and
  :mod:`~kvstored.scheduler.admission` (one strategy per admission mode); value types in
  :mod:`~kvstored.scheduler.types`.
- :mod:`kvstored.scheduler.sim`: discrete-event replay of Mooncake traces through the core.
- :mod:`kvstored.scheduler.service`: the gRPC SchedulerService (hosted by ``kvstored serve``).
- :mod:`kvstored.scheduler.cli` / :mod:`kvstored.scheduler.ctl`: ``kvstored replay|calibrate``,
  ``kvstorectl scheduler``.

See docs/scheduler.md.
"""

from kvstored.scheduler.config import AdmissionMode, Policy, SchedulerConfig
from kvstored.scheduler.core import Scheduler
from kvstored.scheduler.costmodel import CostModel, CostProfile
from kvstored.scheduler.types import (
    Decision,
    HandoffDecision,
    InstanceSpec,
    InstanceStatus,
    PrefixIndex,
    RejectReason,
    Role,
    ScheduleRequest,
)

__all__ = [
    "AdmissionMode",
    "CostModel",
    "CostProfile",
    "Decision",
    "HandoffDecision",
    "InstanceSpec",
    "InstanceStatus",
    "Policy",
    "PrefixIndex",
    "RejectReason",
    "Role",
    "ScheduleRequest",
    "Scheduler",
    "SchedulerConfig",
]
