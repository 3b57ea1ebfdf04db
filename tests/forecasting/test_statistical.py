"""MSTL (statsforecast) behind the core interface."""

import pandas as pd
import pytest

from kale_airflow.core.backtest import backtest
from kale_airflow.core.forecast import ForecastError, get_forecaster
from kale_airflow.forecasting.persist import load_forecaster, save_forecaster
from kale_airflow.forecasting.statistical import MSTLForecaster
from tests.conftest import assert_next_bins_forecast, daily_series


@pytest.fixture(scope="module")
def fitted():
    s = daily_series(days=6, step_s=1800, noise=0.05, seed=1)
    return MSTLForecaster().fit(s.iloc[:-8]), s


def test_forecast_shape_order_and_dates(fitted):
    f, s = fitted
    assert_next_bins_forecast(f.predict(4), s, max_mae=15)


def test_forecast_from_newer_history_reuses_the_fit(fitted):
    f, s = fitted
    out = f.forecast(s, 3)
    assert out.index[0] == s.index[-1] + pd.Timedelta(minutes=30)
    assert len(out) == 3


def test_a_level_shift_moves_the_level_and_no_slope_runs_away():
    s = daily_series(days=8, step_s=1800, noise=0.02, seed=2)
    s.iloc[-48:] *= 3  # the last day triples (a surge)
    f = MSTLForecaster(calibration_days=0).fit(s.iloc[:-4])
    out = f.predict(6)["mean"].to_numpy()
    assert (out > 1.5 * s.iloc[-52:-48].mean() / 3).all()  # followed the new level
    assert out.max() < 3 * s.max()                            # no runaway


def test_calibrated_coverage_on_held_out_noise():
    s = daily_series(days=12, step_s=1800, noise=0.1, seed=3)
    m = backtest(s, MSTLForecaster(), 2, test_days=3).metrics
    assert 0.75 <= m["coverage"] <= 1.0
    assert m["mase"] < 1.0


def test_pickle_round_trip(fitted, tmp_path):
    f, _ = fitted
    g = load_forecaster(save_forecaster(f, tmp_path / "m"))
    pd.testing.assert_frame_equal(f.predict(4), g.predict(4))


def test_registry_and_refusals():
    assert isinstance(get_forecaster("mstl"), MSTLForecaster)
    with pytest.raises(ForecastError, match="two days"):
        MSTLForecaster().fit(daily_series(days=1.5, step_s=1800))
    with pytest.raises(ForecastError, match="constant"):
        MSTLForecaster().fit(pd.Series(5.0, index=pd.date_range("2024", periods=200, freq="30min")))
