"""HPA v2 pinned to the Kubernetes controller's documented behaviour and defaults."""

import pytest

from kale_airflow.core.policies import HPAConfig, HPAPolicy, Limits, Observation, Reason
from kale_airflow.core.policies.hpa import (
    replicas_for_average_value,
    replicas_for_utilization,
    scale_down_limit,
    scale_up_limit,
    stabilize,
)

CFG = HPAConfig()


@pytest.mark.parametrize(
    "current, util, expected",
    [
        (10, 0.70, 10),   # on target
        (10, 0.76, 10),   # ratio 1.086: inside tolerance
        (10, 0.63, 10),   # ratio 0.9: inside tolerance
        (10, 0.78, 12),   # ratio 1.114 -> ceil(11.14)
        (10, 0.35, 5),    # half the target -> half the pods
        (3, 1.00, 5),     # ceil(4.29)
        (1, 0.0, 0),      # idle: HPA wants 0, the min clamp applies later
    ],
    ids=["on-target", "tol-up", "tol-down", "out-up", "half", "saturated", "idle"],
)
def test_replica_calculation(current, util, expected):
    assert replicas_for_utilization(current, util, 0.7, 0.1) == expected


@pytest.mark.parametrize(
    "current, total, target, expected",
    [(4, 400, 100, 4), (4, 430, 100, 4), (4, 450, 100, 5), (4, 1000, 100, 10), (4, 10, 100, 1)],
    ids=["exact", "in-tolerance", "up", "big-lag", "small-lag"],
)
def test_average_value_calculation(current, total, target, expected):
    assert replicas_for_average_value(current, total, target, 0.1) == expected


@pytest.mark.parametrize(
    "current, desired, history, expected",
    [
        (10, 5, [(0, 10), (100, 8)], 8),    # held by the max of the window; t=0 is exactly 300 s old: out
        (10, 5, [(-400, 10), (100, 5)], 5),  # older than 300 s: no longer holds
        (10, 15, [(290, 10)], 15),           # scale-up window 0: immediate
        (10, 7, [(250, 9), (280, 7)], 9),    # bounded by the largest recent recommendation
    ],
    ids=["down-held", "down-released", "up-immediate", "down-partial"],
)
def test_stabilization_windows(current, desired, history, expected):
    assert stabilize(current, desired, history, now=300, up_window_s=0, down_window_s=300) == expected


@pytest.mark.parametrize(
    "current, events, expected",
    [
        (2, [], 6),          # max(2 * 2, 2 + 4)
        (10, [], 20),        # max(20, 14)
        (20, [(295, 10)], 20),  # 10 added within the 15 s period: from 10, max(20, 14): no more now
        (20, [(285, 10)], 40),  # an event exactly 15 s old no longer counts
    ],
    ids=["pods-policy", "percent-policy", "recent-event", "old-event"],
)
def test_scale_up_rate_limit(current, events, expected):
    assert scale_up_limit(current, events, now=300, cfg=CFG) == expected


def test_scale_down_rate_limit_allows_all_at_once_by_default():
    assert scale_down_limit(10, [], now=0, cfg=CFG) == 0


def obs(now, workers, util):
    return Observation(now_s=now, workers=workers, utilization=util)


def test_hpa_scales_up_immediately_and_holds_scale_down_for_five_minutes():
    hpa = HPAPolicy(Limits(1, 64))
    d = hpa.decide(obs(0, 2, 1.0))
    assert (d.workers, d.reason) == (3, Reason.SCALE_UP_METRIC)  # ceil(2 / 0.7) = 3
    d = hpa.decide(obs(15, 3, 0.2))  # load vanished: wants 1
    assert (d.workers, d.reason) == (3, Reason.HOLD_STABILIZING)
    for t in range(30, 300, 15):
        assert hpa.decide(obs(t, 3, 0.2)).workers == 3
    d = hpa.decide(obs(300, 3, 0.2))  # the 3-replica recommendation from t=0 is now 300 s old: out
    assert d.workers == 1 and d.reason == Reason.SCALE_DOWN_METRIC


def test_hpa_rate_limit_cuts_a_large_scale_up():
    hpa = HPAPolicy(Limits(1, 64))
    d = hpa.decide(obs(0, 2, 1.0 * 20 * 0.7 / 2))  # wants 20 from 2
    assert d.workers == 6 and d.reason == Reason.SCALE_LIMITED


def test_hpa_clamps_to_max_and_partitions():
    hpa = HPAPolicy(Limits(1, 64, partitions=12))
    assert hpa.decide(obs(0, 10, 1.0)).workers == 12


def test_hpa_does_not_scale_without_metrics():
    hpa = HPAPolicy(Limits(1, 64))
    d = hpa.decide(Observation(now_s=0, workers=5, utilization=None))
    assert (d.workers, d.reason) == (5, Reason.HOLD_MISSING_METRICS)
    d = hpa.decide(Observation(now_s=15, workers=5, utilization=1.0, rescaling=True))
    assert d.reason == Reason.HOLD_MISSING_METRICS


def test_metric_window_averages_utilization_and_15s_keeps_the_last_tick():
    """One spike tick: with the last tick only HPA scales up at once; averaged over 60 s
    (the spike and three quiet ticks) the mean stays within tolerance of the target."""
    utils = [0.7, 0.7, 0.7, 0.9]
    fast, slow = HPAPolicy(Limits(1, 64)), HPAPolicy(Limits(1, 64), HPAConfig(metric_window_s=60.0))
    for k, u in enumerate(utils):
        o = Observation(now_s=15.0 * k, workers=10, utilization=u)
        a, b = fast.decide(o), slow.decide(o)
    assert a.workers == 13  # ceil(10 * 0.9 / 0.7)
    assert b.workers == 10  # mean 0.75: ratio 1.07, inside the tolerance
    # Older ticks leave the window: four more ticks at 0.9 and the mean is 0.9.
    for k in range(4, 8):
        b = slow.decide(Observation(now_s=15.0 * k, workers=10, utilization=0.9))
    assert b.workers == 13
