"""Autopilot-style moving-window recommender and static provisioning.

Autopilot (Rzadca et al., EuroSys '20) recommends from a moving window of usage
samples with exponentially decaying weights, takes a high percentile, and adds a
safety margin. Applied horizontally here: every ``interval_s`` (300 s) the demand
sample is the busy workers ``utilization * workers``; the recommendation is
``ceil(p95_weighted(demand) * (1 + margin) / target_utilization)`` over the last
``window_s`` (1 h) with weights halving every ``half_life_s`` (30 min). Like the
original it only sees usage, never the backlog, so a saturated job grows by
``(1 + margin) / target`` per interval.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from kale_airflow.core.policies.base import Decision, Limits, Observation, Reason, ceil_int


@dataclass(frozen=True)
class AutopilotConfig:
    """Moving-window recommender settings."""

    interval_s: float = 300.0
    window_s: float = 3600.0
    half_life_s: float = 1800.0
    percentile: float = 0.95
    margin: float = 0.10
    target_utilization: float = 0.8


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Smallest value whose cumulative weight reaches ``q`` of the total."""
    order = np.argsort(values)
    cw = np.cumsum(weights[order])
    idx = int(np.searchsorted(cw, q * cw[-1], side="left"))
    return float(values[order][min(idx, len(values) - 1)])


class AutopilotPolicy:
    """Horizontal Autopilot-style recommender."""

    name = "autopilot"

    def __init__(self, limits: Limits, config: AutopilotConfig | None = None):
        self.limits = limits
        self.config = config or AutopilotConfig()
        self.interval_s = self.config.interval_s
        self._samples: deque[tuple[float, float]] = deque()

    def decide(self, obs: Observation) -> Decision:
        """Add this interval's usage sample and recommend."""
        cfg, current = self.config, obs.workers
        if obs.utilization is None or obs.rescaling:
            return Decision(current, Reason.HOLD_MISSING_METRICS, "no usage sample while workers restart")
        self._samples.append((obs.now_s, obs.utilization * current))
        while self._samples[0][0] <= obs.now_s - cfg.window_s:
            self._samples.popleft()
        t = np.fromiter((s[0] for s in self._samples), float)
        v = np.fromiter((s[1] for s in self._samples), float)
        w = 0.5 ** ((obs.now_s - t) / cfg.half_life_s)
        demand = weighted_percentile(v, w, cfg.percentile)
        rec = self.limits.clamp(ceil_int(demand * (1 + cfg.margin) / cfg.target_utilization))
        reason = Reason.HOLD if rec == current else (Reason.SCALE_UP_METRIC if rec > current else Reason.SCALE_DOWN_METRIC)
        return Decision(rec, reason, f"p{cfg.percentile * 100:.0f} busy workers {demand:.1f} -> {rec}")


class StaticPolicy:
    """A fixed worker count (the simulator sizes it for the trace's peak: no scaling)."""

    name = "static"
    interval_s = float("inf")

    def __init__(self, workers: int):
        self.workers = workers

    def decide(self, obs: Observation) -> Decision:
        """Always the same count."""
        return Decision(self.workers, Reason.STATIC, f"static at {self.workers} workers")
