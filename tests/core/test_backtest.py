import numpy as np
import pandas as pd
import pytest

from kale_airflow.core.backtest import backtest, evaluate, pinball, smape
from kale_airflow.core.forecast import ForecastError, SeasonalNaiveForecaster
from tests.conftest import daily_series


@pytest.mark.parametrize(
    "actual, pred, q, expected",
    [([10.0], [8.0], 0.9, 1.8), ([10.0], [12.0], 0.9, 0.2), ([10.0, 10.0], [10.0, 10.0], 0.5, 0.0)],
    ids=["under", "over", "exact"],
)
def test_pinball(actual, pred, q, expected):
    assert pinball(np.array(actual), np.array(pred), q) == pytest.approx(expected)


def test_smape_handles_zeros():
    assert smape(np.array([0.0, 10.0]), np.array([0.0, 30.0])) == pytest.approx(50.0)


def test_backtest_uses_only_data_before_each_origin():
    s = daily_series(days=12, noise=0.05, seed=2)
    f = SeasonalNaiveForecaster()
    a = backtest(s, f, horizon=6, test_days=2).forecasts
    changed = s.copy()
    k = len(s) - 200
    changed.iloc[k:] *= 5  # everything after index k
    b = backtest(changed, SeasonalNaiveForecaster(), horizon=6, test_days=2).forecasts
    before = a["origin"] <= s.index[k]
    pd.testing.assert_series_equal(a.loc[before, "mean"], b.loc[before, "mean"])
    pd.testing.assert_series_equal(a.loc[before, "q90"], b.loc[before, "q90"])
    assert not np.allclose(a.loc[~before, "mean"], b.loc[~before, "mean"])


def test_metrics_on_a_perfect_forecast():
    s = daily_series(days=10)
    r = backtest(s, SeasonalNaiveForecaster(), horizon=12, test_days=1, adaptive=False)
    m = r.metrics
    assert m["mae"] == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(r.forecasts["q90"], r.forecasts["actual"], rtol=1e-9)
    assert {"mase", "smape", "coverage", "fit_seconds", "pinball", "origins"} <= set(m)


def test_seasonal_beats_daily_naive_when_the_level_shifts():
    s = daily_series(days=12)
    s.iloc[-144:] *= 1.4  # the last half day is 40 % busier than the days before
    m = backtest(s, SeasonalNaiveForecaster(), horizon=12, test_days=0.5).metrics
    assert m["mase"] < 0.5


def test_too_short_series_is_refused():
    with pytest.raises(ForecastError, match="too short"):
        backtest(daily_series(days=3), SeasonalNaiveForecaster(), horizon=12, test_days=7)


def test_evaluate_refuses_a_forecaster_that_misdates_its_output():
    class Shifted(SeasonalNaiveForecaster):
        def forecast(self, history, horizon):
            out = super().forecast(history, horizon)
            return out.set_axis(out.index + pd.Timedelta(minutes=5))

    s = daily_series(days=5)
    f = Shifted().fit(s.iloc[:-288])
    with pytest.raises(ForecastError, match="do not follow the history"):
        evaluate(s, f, 6, first_origin=len(s) - 288)


def test_a_forecaster_that_chooses_reports_selected_and_its_candidates():
    class Choosing(SeasonalNaiveForecaster):
        def summary(self):
            return {"selected": "seasonal", "candidates": {"seasonal": {"mase": 0.5}}, "weights": {}}

    s = daily_series(days=10, noise=0.05)
    m = backtest(s, Choosing(), 12, test_days=2).metrics
    assert m["selected"] == "seasonal" and m["candidates"] == {"seasonal": {"mase": 0.5}}
    assert "selected" not in backtest(s, SeasonalNaiveForecaster(), 12, test_days=2).metrics


class BiasedLow(SeasonalNaiveForecaster):
    """The seasonal baseline with every quantile 30 % too low (the mean left alone)."""

    def forecast(self, history, horizon):
        out = super().forecast(history, horizon)
        cols = [c for c in out if c.startswith("q")]
        out[cols] *= 0.7
        return out


def test_adaptive_calibration_brings_a_biased_forecaster_to_nominal_coverage_at_the_same_mase():
    s = daily_series(days=5, noise=0.1, seed=3)
    on = backtest(s, BiasedLow(), horizon=12, test_days=3).metrics
    off = backtest(s, BiasedLow(), horizon=12, test_days=3, adaptive=False).metrics
    assert off["coverage"] < 0.3 and on["coverage_unadjusted"] == off["coverage"]
    assert 0.8 <= on["coverage"] <= 0.95  # the whole window, the first hours of learning included
    assert 0.85 <= on["coverage_last_day"]["q90"] <= 0.95
    assert on["mase"] == off["mase"] and on["smape"] == off["smape"]  # the mean is never adjusted
    assert on["adaptive"] and not off["adaptive"] and "coverage_unadjusted" not in off
    assert set(on["coverage_last_day"]) == {"q50", "q80", "q90"}


def test_adaptive_calibration_learns_only_from_bins_before_each_origin():
    s = daily_series(days=4, noise=0.1, seed=4)
    a = backtest(s, BiasedLow(), horizon=12, test_days=1.5).forecasts
    changed = s.copy()
    k = len(s) - 150
    changed.iloc[k:] *= 3  # everything from index k on
    b = backtest(changed, BiasedLow(), horizon=12, test_days=1.5).forecasts
    before = a["origin"] <= s.index[k]  # origin k forecasts bin k from bins before it
    assert (a.loc[before, "q90"] != a.loc[before, "q90_unadjusted"]).any()  # the calibration is at work
    pd.testing.assert_series_equal(a.loc[before, "q90"], b.loc[before, "q90"])
    pd.testing.assert_series_equal(a.loc[before, "q50"], b.loc[before, "q50"])
    after = a["origin"] > s.index[k + 12]
    assert not np.allclose(a.loc[after, "q90"] / a.loc[after, "q90_unadjusted"],
                           b.loc[after, "q90"] / b.loc[after, "q90_unadjusted"])
