"""A statistical roster member: statsforecast's MSTL with an AutoETS trend, on log counts.

Choices (all derived from the history's step and length, none per trace):

- works at ``max(step, 5 min)`` like NeuralProphet (:mod:`kale_airflow.forecasting.grid`);
- the target is ``log1p(count)``: a burst is a bounded excursion on that scale, seasonality
  becomes multiplicative, and forecasts stay positive;
- seasons: daily when the history holds two days, weekly when it holds two weeks;
  the decomposition is STL's robust variant (bursts get down-weighted instead of bending
  the seasonal profile), with LOESS jumps of a tenth of a day so a fit takes seconds;
- the deseasonalised series is forecast by AutoETS with no trend (``ANN``) or a *damped*
  one (``AAdN``), whichever has the lower AICc, so a level shift moves the level, never a
  slope that runs away;
- ``forecast(history, h)`` reuses the fitted seasonal profile and ETS parameters: it
  deseasonalises the recent history, runs the fitted ETS filter over it and re-adds the
  profile (no decomposition per forecast);
- quantiles: split-conformal on held-out data. The model is fitted on all but the last
  ``calibration_days``, forecasts rolling origins through them, and the log errors per
  horizon step give the quantile offsets (:func:`conformal_offsets`); then it is refitted
  on the whole history. ``calibration_days=0`` skips this (the ``auto`` roster calibrates
  itself).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kale_airflow.core.forecast import DAY_S, ForecasterBase, ForecastError, conformal_offsets, quantile_column
from kale_airflow.forecasting.grid import checked_step, resolution, to_grid, to_native


@dataclass
class MSTLForecaster(ForecasterBase):
    """MSTL (robust STL, daily + weekly) with a damped-or-flat AutoETS on log counts."""

    quantiles: tuple[float, ...] = (0.5, 0.8, 0.9)
    horizon_s: float = 10800.0
    min_resolution_s: float = 300.0
    max_fit_days: float = 28.0
    filter_days: float = 2.0
    calibration_days: float = 2.0
    name: str = "mstl"

    supports_forecast = True     # forecast(history, h) with the fitted profile and ETS parameters
    supports_fit_values = False
    supports_save = False        # pickled

    _fitted = None

    # ---------------------------------------------------------------- fitting
    def _fit_log(self, z: np.ndarray, last: pd.Timestamp) -> dict:
        """Fit on log values ``z`` at the model resolution ending at ``last``."""
        from statsforecast.models import MSTL, AutoETS

        day = int(round(DAY_S / self._res))
        periods = [p for p in (day, 7 * day) if len(z) >= 2 * p + 1]
        if not periods:
            raise ForecastError(f"history of {len(z) * self._res / DAY_S:.1f} days is too short for MSTL: "
                                "it needs two days")
        jump = max(1, int(math.ceil(day / 10)))
        model = MSTL(season_length=periods, trend_forecaster=AutoETS(model="ANN"),
                     stl_kwargs={"robust": True, "trend_jump": jump, "low_pass_jump": jump})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(z)
            ets = model.trend_forecaster
            # No trend or a damped one, whichever has the lower AICc: never a slope that runs away.
            x_sa = model.model_[["trend", "remainder"]].sum(axis=1).to_numpy()
            try:
                damped = AutoETS(model="AAN", damped=True).fit(x_sa)
                if damped.model_["aicc"] < ets.model_["aicc"]:
                    ets = damped
            except Exception:  # noqa: BLE001 - statsforecast raises bare exceptions on degenerate fits
                pass
        seas = model.model_.filter(regex="seasonal*")
        profiles = [(p, seas.iloc[-p:, i].to_numpy().copy()) for i, p in enumerate(periods)]
        return {"ets": ets, "profiles": profiles, "last": last, "periods": periods}

    def _seasonal(self, fitted: dict, times: pd.DatetimeIndex) -> np.ndarray:
        d = np.round((times - fitted["last"]).total_seconds().to_numpy() / self._res).astype(np.int64)
        out = np.zeros(len(times))
        for p, prof in fitted["profiles"]:
            out += prof[(d - 1) % p]
        return out

    def _forecast_log(self, fitted: dict, grid: pd.Series, n: int) -> np.ndarray:
        """Log forecasts for ``n`` bins after the grid series (fitted parameters, no refit)."""
        tail = grid.iloc[-max(self._min_filter, 2):]
        z = np.log1p(tail.to_numpy(dtype=float))
        x = z - self._seasonal(fitted, tail.index)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean = fitted["ets"].forward(y=x, h=n)["mean"]
        future = pd.date_range(tail.index[-1] + pd.Timedelta(seconds=self._res), periods=n,
                               freq=pd.Timedelta(seconds=self._res))
        return np.asarray(mean, dtype=float) + self._seasonal(fitted, future)

    def fit(self, history: pd.Series) -> "MSTLForecaster":
        """Fit (after a held-out calibration when ``calibration_days`` > 0); returns self."""
        step = checked_step(history)
        self._step = step
        self._res = resolution(step, self.min_resolution_s)
        grid = to_grid(history, step, self._res)
        keep = int(round(self.max_fit_days * DAY_S / self._res))
        grid = grid.iloc[-keep:]
        if np.ptp(grid.to_numpy()) == 0:
            raise ForecastError("history is constant; there is nothing for MSTL to learn")
        self._n = max(1, int(math.ceil(self.horizon_s / self._res)))
        self._min_filter = max(int(round(self.filter_days * DAY_S / self._res)), 12)
        self._offsets = np.zeros((len(self.quantiles), self._n))
        cal = int(round(self.calibration_days * DAY_S / self._res))
        if cal > 0 and len(grid) - cal >= 2 * int(round(DAY_S / self._res)) + 1:
            early = self._fit_log(np.log1p(grid.iloc[:-cal].to_numpy()), grid.index[-cal - 1])
            stride = max(1, self._n // 2)
            errs = []
            for o in range(len(grid) - cal, len(grid) - 1, stride):
                pred = self._forecast_log(early, grid.iloc[:o], self._n)
                actual = np.log1p(grid.to_numpy()[o:o + self._n])
                e = np.full(self._n, np.nan)
                e[: len(actual)] = actual - pred[: len(actual)]
                errs.append(e)
            if errs:
                self._offsets = conformal_offsets(np.array(errs), self.quantiles, self._n)
        self._fitted = self._fit_log(np.log1p(grid.to_numpy()), grid.index[-1])
        self._history = history.iloc[-int(math.ceil((self._min_filter + 2) * self._res / step)):]
        return self

    # ------------------------------------------------------------- forecasting
    def forecast(self, history: pd.Series, horizon: int) -> pd.DataFrame:
        """Forecast ``horizon`` native steps after ``history`` with the fitted parameters."""
        if self._fitted is None:
            raise ForecastError("call fit(history) before forecasting")
        step = checked_step(history)
        if step != self._step:
            raise ForecastError(f"history step {step:g} s differs from the training step {self._step:g} s")
        if horizon < 1:
            raise ForecastError(f"horizon must be >= 1 step, got {horizon}")
        grid = to_grid(history, step, self._res)
        if len(grid) < 2:
            raise ForecastError("forecasting needs at least two bins of history")
        last_needed = history.index[-1] + pd.Timedelta(seconds=step * horizon)
        n = max(1, int(math.ceil((last_needed - grid.index[-1]).total_seconds() / self._res)))
        z = self._forecast_log(self._fitted, grid, n)
        offs = self._offsets if n <= self._offsets.shape[1] else np.pad(
            self._offsets, ((0, 0), (0, n - self._offsets.shape[1])), mode="edge")
        index = pd.date_range(grid.index[-1] + pd.Timedelta(seconds=self._res), periods=n,
                              freq=pd.Timedelta(seconds=self._res))
        cols = {"mean": np.expm1(z)}
        for i, q in enumerate(self.quantiles):
            cols[quantile_column(q)] = np.expm1(z + offs[i, :n])
        raw = pd.DataFrame(cols, index=index).clip(lower=0.0)
        out = to_native(raw, history.index[-1], step, self._res, horizon)
        qcols = [quantile_column(q) for q in self.quantiles]
        out[qcols] = out[qcols].cummax(axis=1)
        return out[["mean"] + qcols]

    def predict(self, horizon: int) -> pd.DataFrame:
        """Forecast after the end of the training history."""
        if self._fitted is None:
            raise ForecastError("call fit(history) before predict")
        return self.forecast(self._history, horizon)
