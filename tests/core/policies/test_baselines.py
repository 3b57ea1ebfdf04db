"""KEDA Kafka scaler, Autopilot-style recommender and static provisioning."""

import numpy as np
import pytest

from kale_airflow.core.policies import (
    AutopilotConfig,
    AutopilotPolicy,
    KEDAConfig,
    KEDAPolicy,
    Limits,
    Observation,
    Reason,
    StaticPolicy,
)
from kale_airflow.core.policies.simple import weighted_percentile


@pytest.mark.parametrize(
    "lag, current, partitions, expected",
    [(0, 4, 64, 1), (420_000, 4, 64, 4), (1_000_000, 4, 64, 10), (10_000_000, 4, 16, 16)],
    ids=["no-lag-min", "within-tolerance", "lag-over-threshold", "capped-at-partitions"],
)
def test_keda_desired_replicas(lag, current, partitions, expected):
    keda = KEDAPolicy(Limits(1, 64, partitions), KEDAConfig(lag_threshold=100_000.0))
    d = keda.desired(Observation(now_s=0, workers=current, backlog=lag))
    assert d == expected


def test_keda_refreshes_lag_only_every_polling_interval():
    keda = KEDAPolicy(Limits(1, 64), KEDAConfig(lag_threshold=100.0, polling_interval_s=30))
    assert keda.desired(Observation(now_s=0, workers=1, backlog=1000)) == 10
    assert keda.desired(Observation(now_s=15, workers=1, backlog=5000)) == 10  # cached
    assert keda.desired(Observation(now_s=30, workers=1, backlog=5000)) == 50


def test_keda_keeps_scaling_while_workers_restart():
    keda = KEDAPolicy(Limits(1, 64), KEDAConfig(lag_threshold=100.0))
    d = keda.decide(Observation(now_s=0, workers=2, backlog=1000, rescaling=True))
    assert d.workers == 6 and d.reason == Reason.SCALE_LIMITED  # lag comes from the broker


def test_weighted_percentile():
    v = np.array([1.0, 2.0, 3.0, 4.0])
    assert weighted_percentile(v, np.ones(4), 0.5) == 2.0
    assert weighted_percentile(v, np.array([0.0, 0.0, 0.0, 1.0]), 0.1) == 4.0


def test_autopilot_grows_by_margin_over_target_when_saturated_and_decays_down():
    ap = AutopilotPolicy(Limits(1, 64), AutopilotConfig())
    d = ap.decide(Observation(now_s=0, workers=10, utilization=1.0))
    assert d.workers == 14  # ceil(10 * 1.1 / 0.8)
    for k in range(1, 13):
        d = ap.decide(Observation(now_s=300 * k, workers=d.workers, utilization=0.1))
    assert d.workers < 5  # after the 1 h window the busy peak is forgotten


def test_static_never_moves():
    s = StaticPolicy(7)
    assert {s.decide(Observation(now_s=t, workers=3)).workers for t in range(5)} == {7}
