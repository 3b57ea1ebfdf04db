"""What every policy sees and returns.

A policy is an object with ``decide(observation) -> Decision``. It keeps its own
stabilization state (history of recommendations, last rescale) but performs no I/O and
reads no clock: time comes in as ``Observation.now_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


class Reason(str, Enum):
    """Machine-readable reason attached to every decision."""

    HOLD = "hold"                                # current level fits; nothing to do
    HOLD_TOLERANCE = "hold_within_tolerance"     # change too small to be worth it
    HOLD_STABILIZING = "hold_stabilizing"        # a change is wanted but has not held long enough
    HOLD_NOT_WORTH_DOWNTIME = "hold_not_worth_downtime"
    HOLD_RESCALING = "hold_rescaling"            # a rescale is still in progress
    HOLD_MISSING_METRICS = "hold_missing_metrics"  # never scale down on missing data
    HOLD_PENDING = "hold_pending"                # workers wait for capacity: asking for more cannot help
    SCALE_UP_FORECAST = "scale_up_forecast"
    SCALE_UP_SLO_RISK = "scale_up_slo_risk"
    SCALE_UP_BACKLOG = "scale_up_backlog"        # a backlog drains sooner at more workers, and that pays
    SCALE_DOWN_FORECAST = "scale_down_forecast"
    SCALE_UP_METRIC = "scale_up_metric"          # reactive baselines (HPA, KEDA, Autopilot)
    SCALE_DOWN_METRIC = "scale_down_metric"
    SCALE_LIMITED = "scale_limited"              # HPA rate limit cut the change
    CLAMPED = "clamped"                          # min/max/partition bound applied
    STATIC = "static"
    HOLD_BUDGET = "hold_budget"                  # the fleet's GPU budget is held by other jobs
    OVERRIDE = "override"                        # a calendar window or a manual pin sets the bounds


@dataclass(frozen=True, slots=True)
class Observation:
    """Metrics at decision time ``now_s`` (seconds). ``None`` means the metric is missing.

    - ``arrival_rate``: samples/s that arrived over the last interval;
    - ``backlog``: unprocessed samples (total consumer lag);
    - ``freshness_lag_s``: age of the oldest unprocessed sample;
    - ``utilization``: fraction of the last interval the workers were busy (0..1);
    - ``throughput``: samples/s the workers achieved while training (their capacity);
    - ``rescaling``: a rescale (checkpoint/restart) is in progress;
    - ``ready_workers``: workers actually running (the rest are Pending for lack of
      capacity); None when the backend cannot tell.
    """

    now_s: float
    workers: int
    arrival_rate: float | None = None
    backlog: float | None = None
    freshness_lag_s: float | None = None
    utilization: float | None = None
    throughput: float | None = None
    rescaling: bool = False
    ready_workers: int | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer: the worker count it wants, why, and a sentence for humans."""

    workers: int
    reason: Reason
    message: str = ""
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-friendly form for logs, XCom and the UI."""
        return {"workers": self.workers, "reason": self.reason.value, "message": self.message, **self.details}


@dataclass(frozen=True)
class Limits:
    """Worker bounds shared by all policies; the partition count caps useful workers."""

    min_workers: int = 1
    max_workers: int = 64
    partitions: int | None = None

    def __post_init__(self) -> None:
        if self.min_workers < 1:
            raise ValueError(f"min_workers must be >= 1, got {self.min_workers}")
        if self.max_workers < self.min_workers:
            raise ValueError(
                f"max_workers ({self.max_workers}) is below min_workers ({self.min_workers}); raise max_workers"
            )
        if self.partitions is not None and self.partitions < self.min_workers:
            raise ValueError(
                f"partitions ({self.partitions}) is below min_workers ({self.min_workers}); "
                "a worker without a partition idles: lower min_workers or add partitions"
            )

    @property
    def upper(self) -> int:
        """Largest useful worker count: max_workers, capped by the partition count."""
        return self.max_workers if self.partitions is None else min(self.max_workers, self.partitions)

    def clamp(self, n: float) -> int:
        """Bound n to [min_workers, upper]."""
        lo, hi = self.min_workers, self.upper
        return lo if n < lo else (hi if n > hi else int(n))


class Policy(Protocol):
    """A scaling policy."""

    name: str
    interval_s: float

    def decide(self, obs: Observation) -> Decision: ...


def ceil_int(x: float) -> int:
    """Ceiling that tolerates float noise (2.0000000001 -> 2)."""
    return int(math.ceil(x - 1e-9))


def duration(seconds: float) -> str:  # pragma: no mutate block
    """'45 s', '15 min' or '2 h' for decision messages."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:g} h"
