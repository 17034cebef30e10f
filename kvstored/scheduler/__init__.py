"""SLO-aware scheduler (Mooncake's "Conductor"): cost model, placement, admission, replay.

- :mod:`kvstored.scheduler.core`: the pure scheduler, a facade over :mod:`~kvstored.scheduler.prefill`
  (prefill choice), :mod:`~kvstored.scheduler.decode_table` (decode side) and
  :mod:`~kvstored.scheduler.admission` (one strategy per admission mode); value types in
  :mod:`~kvstored.scheduler.types`.
- :mod:`~kvstored.scheduler.admission`: admission strategies, one per mode (make_admission).
- :mod:`~kvstored.scheduler.cache`: block-cache models of the replay (lru, store, lfu).
- :mod:`~kvstored.scheduler.calibrate`: fit a CostProfile on a real model (``kvstored calibrate``).
- :mod:`~kvstored.scheduler.calibrate_vllm`: the same on a vLLM engine (``--engine vllm``).
- :mod:`~kvstored.scheduler.cli`: ``kvstored replay|calibrate`` (click commands).
- :mod:`~kvstored.scheduler.config`: settings (``[scheduler]``; SchedulerConfig, modes, policies).
- :mod:`~kvstored.scheduler.costmodel`: prefill / transfer / decode-step predictions.
- :mod:`~kvstored.scheduler.ctl`: the state ``kvstorectl scheduler`` (kvstored/cli/scheduler.py)
  shows.
- :mod:`~kvstored.scheduler.decode_table`: decode instances, their requests and load estimates.
- :mod:`~kvstored.scheduler.lengths`: output-length distributions (``predicted-quantile``).
- :mod:`~kvstored.scheduler.prefill`: prefill instances and the choice of one for a request.
- :mod:`~kvstored.scheduler.report`: tables, JSON and plots of replay results.
- :mod:`~kvstored.scheduler.robustness`: sweeps of admission modes against noise, seeds, load.
- :mod:`~kvstored.scheduler.service`: the gRPC SchedulerService (hosted by ``kvstored serve``).
- :mod:`~kvstored.scheduler.sim`: discrete-event replay of Mooncake traces through the core.
- :mod:`~kvstored.scheduler.trace`: reading Mooncake request traces (JSON lines).
- :mod:`~kvstored.scheduler.types`: value types (instances, requests, decisions, PrefixIndex).

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
