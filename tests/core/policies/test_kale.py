"""The Kale policy: each stage on its own (tables), then scenarios through ``decide``."""

import pytest
from hypothesis import given, strategies as st

from kale_airflow.core.forecast import SeasonalNaiveForecaster
from kale_airflow.core.policies import KaleConfig, KalePolicy, Limits, Observation, Reason
from kale_airflow.core.policies.kale import (
    KnownCapacity, OnlineForecastSource, WindowMax, drain_rate, held_for, required_rate, scale_down_worth_it,
    slo_at_risk,
)
from kale_airflow.core.throughput import ClusterModel
from tests.conftest import daily_series

CFG = KaleConfig()
CLUSTER = ClusterModel(noise_sd=0.0)


class ScriptedForecast:
    """A forecast source whose upper bound follows a script: a test input, not our logic."""

    def __init__(self, upper_by_time):
        self.upper_by_time = upper_by_time  # callable now -> float | None
        self.recent = 0.0

    def observe(self, now_s, rate):
        if rate is not None:
            self.recent = rate

    def upper(self, now_s, horizon_s):
        v = self.upper_by_time(now_s)
        return (None, "forecaster failed: boom") if v is None else (v, "forecast")

    def recent_max(self, now_s, window_s):
        return self.recent


def kale(script, limits=Limits(1, 64), **cfg):
    return KalePolicy(limits, ScriptedForecast(script), KnownCapacity(CLUSTER.capacity_table(limits.upper)),
                      KaleConfig(**cfg))


def obs(now, workers, rate=1000.0, backlog=0.0, fresh=0.0, **kw):
    return Observation(now_s=now, workers=workers, arrival_rate=rate, backlog=backlog, freshness_lag_s=fresh, **kw)


# ------------------------------------------------------------------ stage tables
@pytest.mark.parametrize(
    "upper, recent, expected",
    [(1000, 500, 1030), (1000, 2000, 2060), (0, 0, 0)],
    ids=["forecast-dominates", "recent-floor", "zero"],
)
def test_required_rate(upper, recent, expected):
    assert required_rate(upper, recent, CFG) == pytest.approx(expected)


@pytest.mark.parametrize(
    "backlog, fresh, expected",
    [(60_000, 0, 60_000 / 210), (60_000, 200, 60_000 / 60), (0, 250, 0)],
    ids=["early", "late-uses-min-drain", "no-backlog"],
)
def test_drain_rate_clears_backlog_before_the_slo(backlog, fresh, expected):
    assert drain_rate(backlog, fresh, CFG) == pytest.approx(expected)


@pytest.mark.parametrize("fresh, risk", [(None, False), (100, False), (150, False), (151, True)])
def test_slo_risk_threshold(fresh, risk):
    assert slo_at_risk(fresh, CFG) is risk


@pytest.mark.parametrize("since, now, window, ok", [(None, 100, 60, False), (40, 100, 60, True), (41, 100, 60, False)])
def test_held_for(since, now, window, ok):
    assert held_for(since, now, window) is ok


@pytest.mark.parametrize(
    "current, target, worth",
    [(40, 30, True), (40, 39, False), (10, 9, True), (10, 5, True)],
    ids=["big-drop", "one-of-forty", "one-of-ten", "half"],
)
def test_scale_down_must_beat_downtime_cost(current, target, worth):
    assert scale_down_worth_it(current, target, CFG)[0] is worth


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 100)), min_size=1, max_size=60))
def test_window_max_matches_brute_force(steps):
    wm, seen, t = WindowMax(30.0), [], 0.0
    for dt, v in steps:
        t += dt * 5.0
        seen.append((t, v))
        assert wm.push(t, v) == max(x for s, x in seen if s > t - 30.0 - 1e-9)


# ------------------------------------------------------------------ scenarios
def test_traffic_jump_scales_up_after_the_up_window_ahead_of_traffic():
    jump_at = 3600
    p = kale(lambda t: 5_000.0 if t < jump_at else 20_000.0)
    current = p.limits.clamp(CLUSTER.workers_for(5_000 * 1.03, 64))
    assert p.decide(obs(0, current, rate=5000)).workers == current
    d = p.decide(obs(jump_at, current, rate=5000))
    assert d.reason == Reason.HOLD_STABILIZING
    d = p.decide(obs(jump_at + 60, current, rate=5000))
    assert d.reason == Reason.SCALE_UP_FORECAST
    assert CLUSTER.capacity(d.workers) >= 20_000 * 1.03 > CLUSTER.capacity(d.workers - 1)
    assert "needs" in d.message and d.details["need"] == d.workers


def test_slo_risk_scales_up_at_once_and_sizes_for_the_backlog():
    p = kale(lambda t: 10_000.0)
    n = CLUSTER.workers_for(10_300, 64)
    d = p.decide(obs(0, n, rate=10_000, backlog=600_000, fresh=200))
    assert d.reason == Reason.SCALE_UP_SLO_RISK
    assert CLUSTER.capacity(d.workers) >= 10_300 + 600_000 / 60 > CLUSTER.capacity(d.workers - 1)


def test_traffic_drop_scales_down_only_after_stabilization():
    p = kale(lambda t: 20_000.0 if t < 600 else 5_000.0)
    n = CLUSTER.workers_for(20_600, 64)
    reasons = [p.decide(obs(t, n, rate=20_000 if t < 600 else 5_000)) for t in range(0, 2000, 15)]
    down = [d for d in reasons if d.reason == Reason.SCALE_DOWN_FORECAST]
    assert down, "never scaled down"
    first = reasons.index(down[0]) * 15
    assert first >= 600 + 900 - 15  # the high level must leave the 15-minute window first
    assert all(d.workers == n for d in reasons[: reasons.index(down[0])])
    assert down[0].workers == CLUSTER.workers_for(5_000 * 1.03, 64)


def test_small_drop_within_tolerance_holds():
    p = kale(lambda t: 19_000.0)
    n = CLUSTER.workers_for(20_600, 64)
    ds = [p.decide(obs(t, n, rate=19_000)) for t in range(0, 2000, 15)]
    assert {d.workers for d in ds} == {n}
    assert ds[-1].reason == Reason.HOLD_TOLERANCE


def test_scale_down_not_worth_the_downtime_holds():
    p = kale(lambda t: 13_000.0, lookahead_s=600)
    n = CLUSTER.workers_for(16_000, 64)
    ds = [p.decide(obs(t, n, rate=13_000)) for t in range(0, 2000, 15)]
    assert ds[-1].reason == Reason.HOLD_NOT_WORTH_DOWNTIME and ds[-1].workers == n


def test_missing_metrics_never_scale_down():
    p = kale(lambda t: 1_000.0)
    ds = [p.decide(Observation(now_s=t, workers=30, arrival_rate=None, backlog=None)) for t in range(0, 3000, 15)]
    assert {d.workers for d in ds} == {30}
    assert ds[-1].reason == Reason.HOLD_MISSING_METRICS


def test_missing_metrics_still_allow_a_forecast_scale_up():
    p = kale(lambda t: 30_000.0)
    ds = [p.decide(Observation(now_s=t, workers=5)) for t in range(0, 120, 15)]
    assert ds[-1].workers > 5


def test_failed_forecast_falls_back_to_recent_peak_with_margin():
    p = kale(lambda t: None)
    d = p.decide(obs(0, 5, rate=10_000))
    assert d.details["source"].startswith("fallback")
    assert d.details["forecast_upper"] == pytest.approx(12_000)


def test_rescaling_holds():
    p = kale(lambda t: 50_000.0)
    d = p.decide(obs(0, 5, rescaling=True))
    assert (d.workers, d.reason) == (5, Reason.HOLD_RESCALING)


def test_clamped_to_the_partition_count():
    p = kale(lambda t: 1e9, limits=Limits(1, 64, partitions=24))
    d = p.decide(obs(0, 4, rate=1e9, backlog=1e9, fresh=299))
    assert d.workers == 24


# ------------------------------------------------------------ online forecasts
def test_online_source_sees_only_completed_bins_and_forecasts_ahead():
    s = daily_series(days=15) * 100
    src = OnlineForecastSource(SeasonalNaiveForecaster(), bin_s=300, quantile=0.9)
    assert src.upper(0, 3600)[0] is None
    src.preload(s.iloc[:-288])
    start = s.index[-288].value / 1e9
    for k in range(40):  # 10 minutes of 15 s ticks into the held-out day
        now = start + 15 * (k + 1)
        src.observe(now, float(s.iloc[-288 + (15 * k) // 300]))
    assert len(src.bins) == len(s) - 288 + 1  # one new bin completed; the second is in progress
    upper, source = src.upper(start + 600, 3600)
    truth = s.iloc[-288 + 2:-288 + 15].max()  # bins touching (start + 10 min, start + 70 min]
    assert source == "forecast" and upper == pytest.approx(truth, rel=1e-6)


def test_online_source_reports_a_failing_forecaster():
    class Broken(SeasonalNaiveForecaster):
        def fit_values(self, *a, **k):
            raise ValueError("model file corrupt")

    src = OnlineForecastSource(Broken(), bin_s=300)
    src.preload(daily_series(days=2))
    upper, why = src.upper(daily_series(days=2).index[-1].value / 1e9, 3600)
    assert upper is None and "model file corrupt" in why


def test_online_source_refuses_a_quantile_the_forecaster_lacks():
    with pytest.raises(ValueError, match="no 0.95 quantile"):
        OnlineForecastSource(SeasonalNaiveForecaster(), quantile=0.95)


def test_config_validation_names_both_fields():
    with pytest.raises(ValueError, match="lookahead_s .* rescale_downtime_s"):
        KaleConfig(lookahead_s=60, rescale_downtime_s=90)


def test_pending_workers_block_further_scale_ups_but_not_scale_downs():
    p = kale(lambda t: 30_000.0)
    ds = [p.decide(obs(t, 10, rate=30_000, ready_workers=6)) for t in range(0, 300, 15)]
    assert {d.workers for d in ds} == {10} and ds[-1].reason == Reason.HOLD_PENDING
    assert "4 of 10 workers are Pending" in ds[-1].message
    q = kale(lambda t: 1_000.0)
    ds = [q.decide(obs(t, 10, rate=1_000, ready_workers=6)) for t in range(0, 2000, 15)]
    assert ds[-1].reason == Reason.SCALE_DOWN_FORECAST  # a smaller generation may fit the capacity
