"""Kale's forecast sources: the online forecast sees only completed bins and never the future."""

import numpy as np
import pytest

from kale_airflow.core.forecast import SeasonalNaiveForecaster
from kale_airflow.core.planning import SPREAD_RATIOS, within_bin_lag
from kale_airflow.core.sources import OnlineForecastSource, OracleForecastSource
from tests.conftest import daily_series


def test_online_source_sees_only_completed_bins_and_forecasts_ahead():
    s = daily_series(days=15) * 100
    src = OnlineForecastSource(SeasonalNaiveForecaster(), bin_s=300, quantile=0.9)
    assert src.peak(0, 3600)[0] is None
    src.preload(s.iloc[:-288])
    start = s.index[-288].value / 1e9
    for k in range(40):  # 10 minutes of 15 s ticks into the held-out day
        now = start + 15 * (k + 1)
        src.observe(now, float(s.iloc[-288 + (15 * k) // 300]))
    # The tick ending at +10 min completes the second bin: both are in, nothing is in progress.
    assert len(src.bins) == len(s) - 288 + 2
    upper, source = src.peak(start + 600, 3600)
    truth = s.iloc[-288 + 2:-288 + 15].max()  # bins touching (start + 10 min, start + 70 min]
    assert source == "forecast" and upper == pytest.approx(truth, rel=1e-6)


def test_online_source_forecast_at_t_is_the_same_whatever_the_future():
    """Two sources see the same past and different futures (one 10x from tick k on): every
    forecast made up to and including tick k's decision is identical, and the change does
    reach the forecast once its bins have closed (so the test can tell)."""
    s = daily_series(days=15, noise=0.1, seed=3) * 100
    start = s.index[-288].value / 1e9
    rates = np.repeat(s.iloc[-288:].to_numpy(), 20)  # 15 s ticks of the held-out day
    future = rates.copy()
    k = 400
    future[k:] *= 10
    a, b = (OnlineForecastSource(SeasonalNaiveForecaster(), bin_s=300, quantile=0.9) for _ in range(2))
    for src in (a, b):
        src.preload(s.iloc[:-288])
    diverged = False
    for i in range(k + 200):
        now = start + 15 * i
        # At the decision of tick i a source has observed ticks < i (as the simulator feeds it).
        if i:
            a.observe(now, float(rates[i - 1]))
            b.observe(now, float(future[i - 1]))
        ua, ub = a.peak(now, 3600), b.peak(now, 3600)
        ra, rb = a.recent_max(now, 300), b.recent_max(now, 300)
        if i <= k:
            assert ua == ub and ra == rb, f"tick {i}: the forecast depends on tick >= {k}"
        else:
            diverged |= ua != ub
    assert diverged


def test_online_source_reports_a_failing_forecaster():
    class Broken(SeasonalNaiveForecaster):
        def fit_values(self, *a, **k):
            raise ValueError("model file corrupt")

    src = OnlineForecastSource(Broken(), bin_s=300)
    src.preload(daily_series(days=2))
    upper, why = src.peak(daily_series(days=2).index[-1].value / 1e9, 3600)
    assert upper is None and "model file corrupt" in why


def test_online_source_refuses_a_quantile_the_forecaster_lacks():
    with pytest.raises(ValueError, match="no 0.95 quantile"):
        OnlineForecastSource(SeasonalNaiveForecaster(), quantile=0.95)


def test_online_source_path_starts_at_the_bin_in_progress_and_refuses_to_run_past_the_forecast():
    s = daily_series(days=15) * 100
    src = OnlineForecastSource(SeasonalNaiveForecaster(), bin_s=300, quantile=0.5, max_horizon_s=3600)
    src.preload(s.iloc[:-288])
    start = s.index[-288].value / 1e9  # the first bin after the history is in progress
    path, source = src.path(start + 10, 12)
    peak, _ = src.peak(start + 10, 3300)
    assert source == "forecast" and len(path) == 12 and path.max() == pytest.approx(peak)
    assert src.path(start + 10, 20)[0] is None and "stale" in src.path(start + 10, 20)[1]


def test_oracle_path_is_the_true_bin_means_and_repeats_the_last_past_the_end():
    rates = np.repeat([10.0, 20.0, 30.0], 20)  # three 5-minute bins of 15 s ticks
    src = OracleForecastSource(0.0, 15.0, rates, bin_s=300.0)
    assert list(src.path(310.0, 4)[0]) == [20.0, 30.0, 30.0, 30.0]


def test_oracle_at_a_coarser_resolution_reads_the_centred_mean_of_each_window():
    rates = np.repeat([0.0, 30.0, 0.0, 0.0, 60.0, 0.0], 20)  # six 5-minute bins of 15 s ticks
    exact = OracleForecastSource(0.0, 15.0, rates, bin_s=300.0, resolution_s=300.0)
    assert list(exact.path(0.0, 6)[0]) == [0.0, 30.0, 0.0, 0.0, 60.0, 0.0]
    blurred = OracleForecastSource(0.0, 15.0, rates, bin_s=300.0, resolution_s=900.0)
    assert list(blurred.path(0.0, 6)[0]) == pytest.approx([15.0, 10.0, 10.0, 20.0, 20.0, 30.0])


def test_online_source_learns_the_spread_within_its_bins_over_about_a_day_and_keeps_it_in_its_state():
    """Each completed bin's tick rates fold into the spread, one bin's weight 300 s / 1 day:
    steady bins leave it flat at 0, an uneven one makes it that bin's within_bin_lag, and the
    bins after move it part of the way; the state carries it and the bin in progress."""
    src = OnlineForecastSource(SeasonalNaiveForecaster(), bin_s=300, quantile=0.9)
    burst = np.r_[np.full(4, 400.0), np.full(16, 100.0)]  # a minute at 4x, twenty 15 s ticks

    def feed(bin_index, rates):
        for k, r in enumerate(rates):
            src.observe(bin_index * 300.0 + 15.0 * (k + 1), float(r))

    assert src.spread is None
    feed(0, np.full(20, 160.0))
    assert src.spread.lag == (0.0,) * len(SPREAD_RATIOS) and src.spread.bin_s == 300
    src.spread = None
    feed(1, burst)
    once = np.array(src.spread.lag)
    np.testing.assert_allclose(once, within_bin_lag(burst[None, :], 15.0)[0])
    assert once[0] > 0
    feed(2, np.full(20, 160.0))
    np.testing.assert_allclose(src.spread.lag, once * (1 - 300 / 86400))
    feed(3, burst[:7])  # a bin in progress
    again = OnlineForecastSource(SeasonalNaiveForecaster(), bin_s=300, quantile=0.9)
    again.load_state_dict(src.state_dict())
    assert again.spread == src.spread and again.state_dict() == src.state_dict()


def test_oracle_spread_is_the_mean_within_bin_lag_of_the_true_whole_bins():
    burst = np.r_[np.full(4, 400.0), np.full(16, 100.0)]
    rates = np.r_[np.full(5, 100.0), burst, np.full(20, 160.0), np.full(3, 100.0)]  # starts 75 s into a bin
    src = OracleForecastSource(225.0, 15.0, rates, bin_s=300.0)
    np.testing.assert_allclose(src.spread.lag, within_bin_lag(burst[None, :], 15.0)[0] / 2)
    assert OracleForecastSource(0.0, 300.0, np.full(4, 1.0), bin_s=300.0).spread is None  # one tick per bin
