import dataclasses

import numpy as np
import pandas as pd
import pytest

from kale_airflow.core.backtest import forecast_from
from kale_airflow.core.forecast import (
    CAPABILITIES,
    Forecaster,
    ForecasterBase,
    ForecastError,
    SeasonalNaiveForecaster,
    conformal_offsets,
    forecaster_names,
    get_forecaster,
    register_forecaster,
)
from tests.conftest import daily_series


def test_predict_has_the_statsforecast_shape(daily):
    f = get_forecaster("seasonal").fit(daily)
    assert isinstance(f, Forecaster)
    frame = f.predict(12)
    assert list(frame.columns) == ["mean", "q50", "q80", "q90"]
    assert frame.index[0] == daily.index[-1] + pd.Timedelta(minutes=5)
    assert len(frame) == 12 and frame.index.freq is not None
    assert (frame["q50"] <= frame["q80"]).all() and (frame["q80"] <= frame["q90"]).all()


def test_a_clean_periodic_signal_is_forecast_exactly():
    s = daily_series(days=15)
    f = SeasonalNaiveForecaster().fit(s.iloc[:-24])
    frame = f.predict(24)
    np.testing.assert_allclose(frame["mean"].to_numpy(), s.iloc[-24:].to_numpy(), rtol=1e-6)
    np.testing.assert_allclose(frame["q90"].to_numpy(), s.iloc[-24:].to_numpy(), rtol=1e-6)


def test_level_shift_is_followed():
    s = daily_series(days=15)
    s.iloc[-36:] *= 1.5  # traffic jumped 3 hours ago
    f = SeasonalNaiveForecaster().fit(s.iloc[:-12])
    expected = daily_series(days=15).iloc[-12:] * 1.5
    np.testing.assert_allclose(f.predict(12)["mean"].to_numpy(), expected.to_numpy(), rtol=0.02)


def test_weekly_season_wins_on_a_weekly_pattern():
    s = daily_series(days=28)
    weekend = s.index.dayofweek >= 5
    s[weekend] *= 0.4
    f = SeasonalNaiveForecaster().fit(s)
    f.predict(12)
    assert f.chosen_season_s == 7 * 86400


def test_noisy_quantiles_cover_about_their_level():
    s = daily_series(days=30, noise=0.1, seed=3)
    f = SeasonalNaiveForecaster()
    hits, total = 0, 0
    for origin in range(len(s) - 288 * 8, len(s) - 12, 37):
        frame = f.fit(s.iloc[:origin]).predict(12)
        actual = s.iloc[origin:origin + 12].to_numpy()
        hits += int((actual <= frame["q90"].to_numpy()).sum())
        total += 12
    assert 0.8 <= hits / total <= 0.97


def test_short_history_falls_back_to_the_recent_level():
    s = daily_series(days=0.5)
    f = SeasonalNaiveForecaster().fit(s)
    assert f.mode == "level"
    assert f.predict(6)["mean"].iloc[0] == pytest.approx(s.iloc[-12:].mean())


@pytest.mark.parametrize(
    "history, message",
    [
        (pd.Series([1.0, np.nan, 2.0], index=pd.date_range("2024", periods=3, freq="5min")), "NaN"),
        (pd.Series([1.0, 2.0, 3.0], index=pd.DatetimeIndex(["2024-01-01 00:00", "2024-01-01 00:05",
                                                             "2024-01-01 00:20"])), "regular"),
        (pd.Series([1.0, 2.0, 3.0]), "DatetimeIndex"),
        (pd.Series([1.0, -2.0, 3.0], index=pd.date_range("2024", periods=3, freq="5min")), "negative"),
    ],
    ids=["nan", "gap", "no-datetime-index", "negative"],
)
def test_bad_history_is_refused(history, message):
    with pytest.raises(ForecastError, match=message):
        SeasonalNaiveForecaster().fit(history)


def test_season_must_divide_step():
    s = pd.Series(np.ones(100), index=pd.date_range("2024", periods=100, freq="7min"))
    with pytest.raises(ForecastError, match="does not divide"):
        SeasonalNaiveForecaster().fit(s)


def test_registry_knows_names_and_refuses_unknown():
    assert "seasonal" in forecaster_names()
    with pytest.raises(ForecastError, match="unknown forecaster 'prophet9'"):
        get_forecaster("prophet9")
    register_forecaster("seasonal-1d", lambda **kw: SeasonalNaiveForecaster(candidates=((86400.0, 1),), **kw))
    assert get_forecaster("seasonal-1d").candidates == ((86400.0, 1),)


def test_forecast_uses_only_the_history_it_was_given():
    s = daily_series(days=20, noise=0.05)
    a = SeasonalNaiveForecaster().fit(s.iloc[:-100]).predict(12)
    changed = s.copy()
    changed.iloc[-100:] *= 10  # the "future"
    b = SeasonalNaiveForecaster().fit(changed.iloc[:-100]).predict(12)
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("name", forecaster_names())
def test_every_registered_forecaster_declares_capabilities_matching_its_methods(name):
    f = get_forecaster(name)
    assert isinstance(f, Forecaster)
    for flag, methods in CAPABILITIES.items():
        declared = getattr(type(f), flag)
        assert isinstance(declared, bool), f"{name}: {flag} must be a bool class attribute"
        for method in methods:
            has = callable(getattr(f, method, None))
            assert has == declared, f"{name} declares {flag}={declared} but {method} is {'' if has else 'not '}there"


def test_capabilities_are_off_unless_declared():
    assert all(getattr(ForecasterBase, flag) is False for flag in CAPABILITIES)
    assert (SeasonalNaiveForecaster.supports_forecast, SeasonalNaiveForecaster.supports_fit_values,
            SeasonalNaiveForecaster.supports_save) == (True, True, False)
    # Class attributes, not constructor options (or fields of the dataclass).
    assert not set(CAPABILITIES) & {f.name for f in dataclasses.fields(SeasonalNaiveForecaster)}


def test_forecast_from_follows_the_declaration(daily):
    calls = []

    class RefitOnly(SeasonalNaiveForecaster):
        supports_forecast = False  # the inherited forecast method is not to be used

        def fit(self, history):
            calls.append(len(history))
            return super().fit(history)

        def forecast(self, history, horizon):
            raise AssertionError("forecast called although the forecaster does not declare it")

    forecast_from(RefitOnly(), daily, 6)
    assert calls == [len(daily)]


def test_predict_before_fit_is_refused():
    with pytest.raises(ForecastError, match="call fit"):
        SeasonalNaiveForecaster().predict(3)


def test_the_roster_and_its_members_are_registered_lazily():
    assert {"auto", "mstl", "neuralprophet", "seasonal"} <= set(forecaster_names())


def test_conformal_offsets_take_the_finite_sample_level_per_step_and_extend():
    rng = np.random.default_rng(0)
    errors = np.column_stack([rng.normal(0, 1, 400), rng.normal(0, 3, 400), np.full(400, np.nan)])
    errors[:, 2] = rng.normal(0, 3, 400)
    errors[::2, 2] = np.nan  # steps near the end of the window have fewer actuals
    offs = conformal_offsets(errors, (0.5, 0.9), horizon=5)
    assert offs.shape == (2, 5)
    assert abs(offs[0, 0]) < 0.5 and 1.0 < offs[1, 0] < offs[1, 1]  # the pooled first step is tighter
    assert offs[1, 3] == offs[1, 4] == offs[1, 2]                     # beyond the errors: the last step's
    # With n errors the 0.9 offset is the ceil((n + 1) 0.9)-th smallest: never below the plain quantile.
    one = np.arange(1.0, 11.0)[:, None]
    assert conformal_offsets(one, (0.9,))[0, 0] == 10.0
    assert (conformal_offsets(np.full((3, 2), np.nan), (0.9,)) == 0).all()
