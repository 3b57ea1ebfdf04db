"""``auto``: the roster chosen by backtest on the training history's last days."""

import numpy as np
import pandas as pd
import pytest

from kale_airflow.core.backtest import backtest
from kale_airflow.core.forecast import ForecastError, get_forecaster
from kale_airflow.forecasting.auto import AutoForecaster
from kale_airflow.forecasting.persist import load_forecaster, save_forecaster
from tests.conftest import daily_series

CHEAP = ("seasonal", "mstl")


def test_selection_uses_the_training_history_only_and_records_every_candidate():
    s = daily_series(days=10, step_s=1800, noise=0.05, seed=1)
    f = AutoForecaster(members=CHEAP).fit(s.iloc[:-48])
    assert f.selected in {"seasonal", "mstl", "ensemble_median", "ensemble_weighted"}
    assert set(f.scores) == {"seasonal", "mstl", "ensemble_median", "ensemble_weighted"}
    best = min(v["mase"] for v in f.scores.values())
    assert f.scores[f.selected]["mase"] == best
    assert pytest.approx(sum(f.weights.values())) == 1.0
    # Refitting on a history whose future is scrambled changes nothing: the future is unseen.
    t = s.copy()
    t.iloc[-48:] = t.iloc[-48:].sample(frac=1, random_state=0).to_numpy()
    g = AutoForecaster(members=CHEAP).fit(t.iloc[:-48])
    assert g.selected == f.selected and g.scores == f.scores


def test_a_member_that_fails_loses_and_the_rest_are_used(monkeypatch):
    from kale_airflow.forecasting import statistical

    def broken(self, history):
        raise ForecastError("broken on purpose")

    monkeypatch.setattr(statistical.MSTLForecaster, "fit", broken)
    f = AutoForecaster(members=CHEAP).fit(daily_series(days=8, step_s=1800, noise=0.05))
    assert f.selected == "seasonal"
    assert f.scores["mstl"]["error"] == "broken on purpose" and f.scores["mstl"]["mase"] == float("inf")


def test_backtest_writes_selected_and_calibrated_coverage():
    s = daily_series(days=14, step_s=1800, noise=0.1, seed=4)
    m = backtest(s, get_forecaster("auto", members=CHEAP), 2, test_days=3).metrics
    assert m["selected"] in m["candidates"]
    assert 0.75 <= m["coverage"] <= 1.0 and m["mase"] < 1.0


def test_forecast_shape_and_round_trip(tmp_path):
    s = daily_series(days=8, step_s=1800, noise=0.05, seed=5)
    f = AutoForecaster(members=CHEAP).fit(s.iloc[:-4])
    out = f.predict(8)  # beyond the calibration horizon reuses the last step's offsets
    assert list(out.columns) == ["mean", "q50", "q80", "q90"]
    assert out.index[0] == s.index[-5] + pd.Timedelta(minutes=30)
    assert (out["q80"] <= out["q90"]).all() and (out.to_numpy() >= 0).all()
    g = load_forecaster(save_forecaster(f, tmp_path / "m"))
    pd.testing.assert_frame_equal(f.forecast(s, 3), g.forecast(s, 3))


def test_too_short_history_and_unknown_member_are_refused():
    with pytest.raises(ForecastError, match="too short to choose"):
        AutoForecaster(members=CHEAP).fit(daily_series(days=1, step_s=1800))
    with pytest.raises(ForecastError, match="unknown roster member"):
        AutoForecaster(members=("prophet",)).fit(daily_series(days=8, step_s=1800))


@pytest.mark.slow
def test_the_full_roster_with_neuralprophet_saves_and_loads(tmp_path):
    s = daily_series(days=6, step_s=1800, noise=0.05, seed=6)
    f = AutoForecaster(member_options={"neuralprophet": {"epochs": 3}}).fit(s)
    assert set(f.members) <= set(f.scores)
    g = load_forecaster(save_forecaster(f, tmp_path / "m"))
    pd.testing.assert_frame_equal(f.predict(3), g.predict(3), check_dtype=False)
    assert np.isfinite(g.predict(3).to_numpy()).all()
