"""Kubernetes HPA v2 (autoscaling/v2), faithful to the controller's algorithm and defaults.

Stages, as in ``pkg/controller/podautoscaler/horizontal.go`` and ``replica_calculator.go``:

1. replica calculation: ``ratio = metric / target``; inside the tolerance band
   (``|ratio - 1| <= 0.1``) keep the current count, else ``ceil(ratio * current)``
   (for AverageValue external metrics such as KEDA's: ``ceil(total / target)``);
2. stabilization: the new count is bounded below by the *minimum* recommendation
   within the scale-up window (default 0 s) and above by the *maximum* within the
   scale-down window (default 300 s);
3. rate limits (default behavior): scale-up at most ``max(+100 %, +4 pods)`` per 15 s,
   scale-down at most -100 % per 15 s, counted from the replicas at the start of the
   policy period;
4. clamp to [minReplicas, maxReplicas].

Missing metrics (no ready pods during a restart) mean no scaling, as the controller
does when it cannot compute a metric.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kale_airflow.core.policies.base import Decision, Limits, Observation, Reason, ceil_int


@dataclass(frozen=True)
class HPAConfig:
    """HPA spec fields with the Kubernetes defaults."""

    target_utilization: float = 0.7
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    scale_up_pods: int = 4
    scale_up_percent: float = 100.0
    scale_up_period_s: float = 15.0
    scale_down_percent: float = 100.0
    scale_down_period_s: float = 15.0
    metric_window_s: float = 15.0  # utilization averaged over this window (e.g. a Prometheus rate)

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")


def replicas_for_utilization(current: int, utilization: float, target: float, tolerance: float) -> int:
    """Stage 1 for a Utilization target: ``ceil(current * utilization / target)`` outside tolerance."""
    ratio = utilization / target
    if abs(ratio - 1.0) <= tolerance:
        return current
    return ceil_int(ratio * current)


def replicas_for_average_value(current: int, total: float, target_per_pod: float, tolerance: float) -> int:
    """Stage 1 for an AverageValue (external) target: ``ceil(total / target)`` outside tolerance."""
    ratio = total / (target_per_pod * current)
    if abs(ratio - 1.0) <= tolerance:
        return current
    return ceil_int(total / target_per_pod)


def stabilize(current: int, desired: int, history: list[tuple[float, int]], now: float,
              up_window_s: float, down_window_s: float) -> int:
    """Stage 2: bound by min(recs in up window) from below and max(recs in down window) from above.

    ``history`` holds earlier (time, recommendation) pairs; ``desired`` is this one.
    """
    up, down = desired, desired
    for t, rec in history:
        if t > now - up_window_s:
            up = min(up, rec)
        if t > now - down_window_s:
            down = max(down, rec)
    out = current
    if out < up:
        out = up
    if out > down:
        out = down
    return out


def scale_up_limit(current: int, events: list[tuple[float, int]], now: float, cfg: HPAConfig) -> int:
    """Stage 3 (up): the highest count the default behavior allows now (selectPolicy Max)."""
    added = sum(d for t, d in events if d > 0 and t > now - cfg.scale_up_period_s)
    removed = -sum(d for t, d in events if d < 0 and t > now - cfg.scale_up_period_s)
    start = current - added + removed
    by_pods = start + cfg.scale_up_pods
    by_percent = ceil_int(start * (1 + cfg.scale_up_percent / 100.0))
    return max(current, by_pods, by_percent)


def scale_down_limit(current: int, events: list[tuple[float, int]], now: float, cfg: HPAConfig) -> int:
    """Stage 3 (down): the lowest count the default behavior allows now."""
    added = sum(d for t, d in events if d > 0 and t > now - cfg.scale_down_period_s)
    removed = -sum(d for t, d in events if d < 0 and t > now - cfg.scale_down_period_s)
    start = current - added + removed
    return min(current, int(start * (1 - cfg.scale_down_percent / 100.0)))


class HPAController:
    """The HPA loop around a stage-1 replica calculation supplied by the subclass."""

    name = "hpa"

    def __init__(self, limits: Limits, config: HPAConfig | None = None):
        self.limits = limits
        self.config = config or HPAConfig()
        self.interval_s = self.config.sync_period_s
        self._recs: deque[tuple[float, int]] = deque()
        self._events: deque[tuple[float, int]] = deque()

    def desired(self, obs: Observation) -> int | None:
        """Stage 1; None when the metric is missing."""
        if obs.utilization is None or obs.rescaling:
            return None
        cfg = self.config
        return replicas_for_utilization(obs.workers, obs.utilization, cfg.target_utilization, cfg.tolerance)

    def decide(self, obs: Observation) -> Decision:
        """One HPA sync."""
        cfg, now, current = self.config, obs.now_s, obs.workers
        raw = self.desired(obs)
        if raw is None:
            return Decision(current, Reason.HOLD_MISSING_METRICS, "metric unavailable: HPA does not scale")
        keep = max(cfg.scale_up_window_s, cfg.scale_down_window_s)
        while self._recs and self._recs[0][0] <= now - keep:
            self._recs.popleft()
        stabilized = stabilize(current, raw, list(self._recs), now, cfg.scale_up_window_s, cfg.scale_down_window_s)
        self._recs.append((now, raw))
        while self._events and self._events[0][0] <= now - max(cfg.scale_up_period_s, cfg.scale_down_period_s):
            self._events.popleft()
        events = list(self._events)
        new, reason = stabilized, Reason.HOLD
        if stabilized > current:
            hi = min(self.limits.upper, scale_up_limit(current, events, now, cfg))
            new = min(stabilized, hi)
            reason = Reason.SCALE_UP_METRIC if new == stabilized else Reason.SCALE_LIMITED
        elif stabilized < current:
            lo = max(self.limits.min_workers, scale_down_limit(current, events, now, cfg))
            new = max(stabilized, lo)
            reason = Reason.SCALE_DOWN_METRIC if new == stabilized else Reason.SCALE_LIMITED
        elif raw < current:
            reason = Reason.HOLD_STABILIZING
        new = self.limits.clamp(new)
        if new != current:
            self._events.append((now, new - current))
        return Decision(new, reason, f"desired {raw} (metric), stabilized {stabilized}, applied {new}")


class HPAPolicy(HPAController):
    """HPA v2 on worker utilization (target 0.7), the utilization averaged over
    ``metric_window_s`` (15 s: the last tick only; 60-120 s is typical when GPU metrics
    come through Prometheus). Ticks without a metric (restarts) are left out of the mean."""

    name = "hpa"

    def __init__(self, limits: Limits, config: HPAConfig | None = None):
        super().__init__(limits, config)
        self._util: deque[tuple[float, float]] = deque()

    def desired(self, obs: Observation) -> int | None:
        """Stage 1 on the windowed mean utilization; None when the metric is missing now."""
        if obs.utilization is None or obs.rescaling:
            return None
        cfg, q = self.config, self._util
        q.append((obs.now_s, obs.utilization))
        while q[0][0] <= obs.now_s - cfg.metric_window_s + 1e-9:
            q.popleft()
        mean = sum(u for _, u in q) / len(q)
        return replicas_for_utilization(obs.workers, mean, cfg.target_utilization, cfg.tolerance)
