"""NeuralProphet behind the core interface (real training, small data)."""

import pandas as pd
import pytest

from kale_airflow.core.forecast import ForecastError, get_forecaster
from kale_airflow.forecasting.neuralprophet import NeuralProphetForecaster
from kale_airflow.forecasting.persist import load_forecaster, save_forecaster
from tests.conftest import assert_next_bins_forecast, daily_series

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fitted():
    s = daily_series(days=5, step_s=1800, noise=0.05, seed=1)
    return NeuralProphetForecaster().fit(s.iloc[:-8]), s


def test_forecast_shape_order_and_dates(fitted):
    f, s = fitted
    assert_next_bins_forecast(f.predict(4), s, max_mae=30)


def test_forecast_from_newer_history_uses_the_trained_weights(fitted):
    f, s = fitted
    out = f.forecast(s, 2)
    assert out.index[0] == s.index[-1] + pd.Timedelta(minutes=30)


def test_minute_data_is_forecast_at_five_minute_resolution_and_regridded():
    s = daily_series(days=2, step_s=60, noise=0.02)
    f = NeuralProphetForecaster(epochs=5).fit(s)
    out = f.predict(10)
    assert len(out) == 10 and out.index.freq == pd.Timedelta(minutes=1)
    assert out["mean"].iloc[:5].nunique() <= 2  # repeated within a 5-minute bin
    # A history that ends inside a bin still gets the whole trained horizon (3 h).
    assert len(f.forecast(s.iloc[:-2], 180)) == 180


def test_save_and_load_round_trip(fitted, tmp_path):
    f, _ = fitted
    folder = save_forecaster(f, tmp_path / "m")
    g = load_forecaster(folder)
    pd.testing.assert_frame_equal(f.predict(4), g.predict(4), check_dtype=False)


def test_registry_builds_it_lazily():
    assert isinstance(get_forecaster("neuralprophet"), NeuralProphetForecaster)


@pytest.mark.parametrize(
    "series, message",
    [
        (daily_series(days=0.8, step_s=1800), "too short for NeuralProphet"),
        (pd.Series(5.0, index=pd.date_range("2024", periods=200, freq="30min")), "constant"),
        (daily_series(days=3, step_s=1800).where(lambda x: x.index.hour != 3), "NaN"),
    ],
    ids=["too-short", "constant", "nan"],
)
def test_bad_history_is_refused(series, message):
    with pytest.raises(ForecastError, match=message):
        NeuralProphetForecaster().fit(series)


def test_horizon_beyond_training_is_refused(fitted):
    f, _ = fitted
    with pytest.raises(ForecastError, match="exceeds the trained horizon"):
        f.predict(10)
