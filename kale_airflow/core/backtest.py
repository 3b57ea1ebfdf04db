"""Rolling-origin backtests of forecasters, on past data only.

The forecaster is fitted on everything before the test window (``fit_seconds`` is that
fit's wall time). Then, at origins every ``stride`` steps through the test window, it
forecasts ``horizon`` steps from the history *up to the origin*, using its fitted
parameters (``forecast(history, h)`` when the forecaster declares ``supports_forecast``,
else a refit). No value at or after an origin reaches the forecast made at that origin.

Metrics, over every (origin, step) pair:

- ``mase``: the forecast's mean absolute error over that of the daily seasonal-naive
  forecast (the value one day earlier) on the same targets; < 1 beats it;
- ``smape``: symmetric MAPE in percent (pairs where both values are 0 count as 0);
- ``pinball``: mean pinball loss per quantile, in the series' units;
- ``coverage``: the share of actual values at or below each quantile forecast;
  ``coverage`` alone is the upper quantile's (q90 by default); ``coverage_last_day`` is
  the same over the forecasts made in the window's last day (rolling coverage: where a
  drifting series has taken the calibration by the end).

Adaptive calibration (``adaptive``, on by default): the quantiles are corrected online
by :class:`kale_airflow.core.calibration.AdaptiveCalibration`, one completed bin at a
time as a live forecast source would, starting from no correction at the first origin.
It walks the window in time order: at each origin it first learns from the bins
completed since the previous origin (all strictly before this one), then adjusts this
origin's quantiles with the offsets learned so far and remembers them; their own bins
score them only when later origins reach past those bins. The forecaster's own quantiles
stay in the forecasts as ``q90_unadjusted`` and score as ``coverage_unadjusted``,
``pinball_unadjusted``, ... side by side. The mean is never adjusted, so ``mase``,
``smape`` and ``mae`` are the same with and without it.

A forecaster that chooses among candidates when it is fitted (``auto``) adds
``selected`` and ``candidates`` (each candidate's scores on the held-out end of its
training history, before the test window).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kale_airflow.core.calibration import DEFAULT_RATE, AdaptiveCalibration
from kale_airflow.core.forecast import DAY_S, Forecaster, ForecastError, quantile_column, series_step_s

UNADJUSTED = "_unadjusted"  # suffix of the forecaster's own quantiles when adaptive calibration replaces them


@dataclass
class BacktestResult:
    """Metrics plus every forecast made (for plots)."""

    metrics: dict
    forecasts: pd.DataFrame  # columns: origin, target, step, actual, naive, mean, q..


def forecast_from(forecaster: Forecaster, history: pd.Series, horizon: int) -> pd.DataFrame:
    """Forecast ``horizon`` steps after ``history`` with the forecaster's fitted parameters."""
    if forecaster.supports_forecast:
        return forecaster.forecast(history, horizon)
    return forecaster.fit(history).predict(horizon)


def pinball(actual: np.ndarray, pred: np.ndarray, q: float) -> float:
    """Mean pinball (quantile) loss."""
    d = actual - pred
    return float(np.mean(np.maximum(q * d, (q - 1) * d)))


def smape(actual: np.ndarray, pred: np.ndarray) -> float:
    """Symmetric MAPE in percent."""
    denom = np.abs(actual) + np.abs(pred)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(denom > 0, 2 * np.abs(actual - pred) / denom, 0.0)
    return float(100 * r.mean())


def backtest(series: pd.Series, forecaster: Forecaster, horizon: int, *, test_days: float = 7.0,
             stride: int | None = None, max_train_days: float | None = None, upper_quantile: float = 0.9,
             adaptive: bool = True, adaptive_rate: float = DEFAULT_RATE, progress=None) -> BacktestResult:
    """Fit before the test window, then forecast from rolling origins inside it (quantiles
    calibrated online with ``adaptive``; see :func:`evaluate`)."""
    cut, start = split(series, horizon, test_days, max_train_days)
    t0 = time.perf_counter()
    forecaster.fit(series.iloc[start:cut])
    fit_seconds = time.perf_counter() - t0
    result = evaluate(series, forecaster, horizon, first_origin=cut, history_start=start, stride=stride,
                      upper_quantile=upper_quantile, adaptive=adaptive, adaptive_rate=adaptive_rate,
                      progress=progress)
    result.metrics.update({"fit_seconds": fit_seconds, "train_rows": cut - start, "test_days": test_days})
    result.metrics.update(selection_of(forecaster))
    return result


def selection_of(forecaster: Forecaster) -> dict:
    """``selected`` and every candidate's held-out scores, for forecasters that choose among
    candidates at fit time (``auto``); empty for the others."""
    summary = getattr(forecaster, "summary", None)
    if not callable(summary):
        return {}
    s = summary()
    return {"selected": s.get("selected"), "candidates": s.get("candidates", {})}


def split(series: pd.Series, horizon: int, test_days: float, max_train_days: float | None = None) -> tuple[int, int]:
    """(first test index, first training index) for a test window of ``test_days``."""
    step = series_step_s(series)
    season = int(round(DAY_S / step))
    n = len(series)
    cut = n - int(round(test_days * DAY_S / step))
    if horizon < 1:
        raise ForecastError(f"horizon must be at least one step ({step:g} s)")
    if cut < season + 1 or n - cut < horizon:
        raise ForecastError(
            f"series of {n * step / DAY_S:.1f} days is too short for a {test_days:g}-day test window plus "
            "at least one day of training; use a longer history or a shorter test window"
        )
    start = 0 if max_train_days is None else max(0, cut - int(round(max_train_days * DAY_S / step)))
    return cut, start


def evaluate(series: pd.Series, forecaster: Forecaster, horizon: int, *, first_origin: int, history_start: int = 0,
             stride: int | None = None, upper_quantile: float = 0.9, adaptive: bool = True,
             adaptive_rate: float = DEFAULT_RATE, progress=None) -> BacktestResult:
    """Forecast from origins ``first_origin, +stride, ...`` with an already fitted forecaster
    (with ``adaptive``, quantiles calibrated online from the bins before each origin)."""
    step = series_step_s(series)
    season = int(round(DAY_S / step))
    n = len(series)
    if first_origin < season:
        raise ForecastError("the first origin needs a day of history before it for the seasonal-naive reference")
    stride = stride or max(1, horizon // 2)
    y = series.to_numpy(dtype=float)
    qcols = [(q, quantile_column(q)) for q in sorted(forecaster.quantiles)]
    levels = tuple(q for q, _ in qcols)
    cal = AdaptiveCalibration(levels, horizon, step, adaptive_rate) if adaptive else None
    rows = []
    origins = range(first_origin, n - horizon + 1, stride)
    for o in origins:
        frame = forecast_from(forecaster, series.iloc[history_start:o], horizon)
        if len(frame) != horizon or not frame.index.equals(series.index[o:o + horizon]):
            raise ForecastError(f"{forecaster.name} returned timestamps that do not follow the history at origin {o}")
        block = {"origin": series.index[o], "target": series.index[o:o + horizon], "step": np.arange(1, horizon + 1),
                 "actual": y[o:o + horizon], "naive": y[o - season:o - season + horizon]}
        for col in frame.columns:
            block[col] = frame[col].to_numpy()
        if cal is not None:
            _calibrate(cal, y, max(first_origin, o - stride), o, block, [c for _, c in qcols if c in frame])
        rows.append(pd.DataFrame(block))
        if progress is not None:
            progress.update(1)
    if not rows:
        raise ForecastError("no origin fits in the test window; shorten the horizon")
    fc = pd.concat(rows, ignore_index=True)
    actual, mean, naive = fc["actual"].to_numpy(), fc["mean"].to_numpy(), fc["naive"].to_numpy()
    naive_mae = float(np.mean(np.abs(actual - naive)))
    mae = float(np.mean(np.abs(actual - mean)))
    qcols = [(q, c) for q, c in qcols if c in fc]
    metrics = {
        "forecaster": forecaster.name,
        "horizon_steps": horizon,
        "horizon_s": horizon * step,
        "origins": len(origins),
        "mae": mae,
        "naive_mae": naive_mae,
        "mase": mae / naive_mae if naive_mae > 0 else float("inf"),
        "smape": smape(actual, mean),
        "adaptive": cal is not None,
    }
    metrics |= quantile_metrics(fc, qcols, season * step, upper_quantile)
    if cal is not None:
        metrics["adaptive_rate"] = cal.rate
        unadjusted = quantile_metrics(fc, qcols, season * step, upper_quantile, suffix=UNADJUSTED)
        metrics |= {f"{k}{UNADJUSTED}": v for k, v in unadjusted.items()}
    return BacktestResult(metrics, fc)


def _calibrate(cal: AdaptiveCalibration, y: np.ndarray, first_bin: int, origin: int, block: dict,
               cols: list[str]) -> None:
    """Learn from the bins completed since the previous origin, then calibrate this origin's
    quantiles with what was learned (the forecaster's own are kept as ``q..{UNADJUSTED}``)."""
    for b in range(first_bin, origin):  # strictly before the origin: nothing this forecast targets
        cal.observe(b, y[b])
    if len(cols) != len(cal.quantiles):
        raise ForecastError(f"forecaster returned quantile columns {cols}, not one per level of {cal.quantiles}; "
                            "backtest it with adaptive=False (--no-adaptive)")
    raw = np.stack([block[c] for c in cols])
    adjusted = cal.adjust(raw)
    cal.issue(origin - 1, adjusted)
    for i, c in enumerate(cols):
        block[f"{c}{UNADJUSTED}"] = raw[i]
        block[c] = adjusted[i]


def quantile_metrics(fc: pd.DataFrame, qcols: list[tuple[float, str]], day_s: float, upper_quantile: float,
                     suffix: str = "") -> dict:
    """Pinball loss and coverage per quantile column over the whole window, and coverage over
    the forecasts made in its last day (``coverage_last_day``); ``coverage`` is the upper
    quantile's. The columns read are ``q.. + suffix``; the keys are ``q..``."""
    actual = fc["actual"].to_numpy()
    last_day = (fc["origin"] > fc["origin"].max() - pd.Timedelta(seconds=day_s)).to_numpy()
    pred = {c: fc[c + suffix].to_numpy() for _, c in qcols}
    out = {
        "pinball": {c: pinball(actual, pred[c], q) for q, c in qcols},
        "coverage_by_quantile": {c: float(np.mean(actual <= pred[c])) for _, c in qcols},
        "coverage_last_day": {c: float(np.mean(actual[last_day] <= pred[c][last_day])) for _, c in qcols},
    }
    out["coverage"] = out["coverage_by_quantile"].get(quantile_column(upper_quantile))
    return out
