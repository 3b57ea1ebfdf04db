"""KEDA Apache Kafka scaler, driving an HPA (KEDA reports a metric; HPA decides).

The scaler reports total consumer lag as an AverageValue external metric with target
``lagThreshold`` per replica, so HPA's stage 1 is ``ceil(total_lag / lagThreshold)``;
with ``allowIdleConsumers: false`` (the default) the result is capped at the partition
count. The metric is refreshed every ``pollingInterval`` (30 s) and read by HPA every
sync (15 s). KEDA's documented default lagThreshold is 10 messages; a sample stream has
no natural message size, so we set lagThreshold in samples to what one worker drains in
``lag_threshold_s`` seconds, from the same profiling observations Kale gets.
"""

from __future__ import annotations

from dataclasses import dataclass

from kale_airflow.core.policies.base import Limits, Observation
from kale_airflow.core.policies.hpa import HPAConfig, HPAController, replicas_for_average_value


@dataclass(frozen=True)
class KEDAConfig:
    """ScaledObject / Kafka trigger fields."""

    lag_threshold: float = 60_000.0
    polling_interval_s: float = 30.0

    def __post_init__(self) -> None:
        if self.lag_threshold <= 0:
            raise ValueError(f"lag_threshold must be > 0, got {self.lag_threshold}")


class KEDAPolicy(HPAController):
    """Lag-based scaling through the HPA loop."""

    name = "keda"

    def __init__(self, limits: Limits, config: KEDAConfig | None = None, hpa: HPAConfig | None = None):
        super().__init__(limits, hpa)
        self.keda = config or KEDAConfig()
        self._lag: float | None = None
        self._polled_at = float("-inf")

    def desired(self, obs: Observation) -> int | None:
        """``ceil(lag / lagThreshold)`` capped at partitions; lag comes from the broker,
        so it stays available while workers restart."""
        if obs.now_s - self._polled_at >= self.keda.polling_interval_s - 1e-9:
            self._lag, self._polled_at = obs.backlog, obs.now_s
        if self._lag is None:
            return None
        n = replicas_for_average_value(max(obs.workers, 1), self._lag, self.keda.lag_threshold, self.config.tolerance)
        if self.limits.partitions is not None:
            n = min(n, self.limits.partitions)
        return max(n, self.limits.min_workers)
