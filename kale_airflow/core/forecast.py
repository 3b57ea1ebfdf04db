"""Forecaster interface and fast baselines.

Every forecaster has the statsforecast shape::

    f = get_forecaster("seasonal").fit(history)   # history: pd.Series on a regular DatetimeIndex
    frame = f.predict(horizon)                    # horizon: number of future steps

``predict`` returns a frame indexed by the future timestamps with a ``mean`` column and
one column per quantile named ``q<percent>`` (``q50``, ``q90``). Heavier forecasters
(NeuralProphet) register themselves under the same interface and are imported lazily.

Optional capabilities are declared, not probed: a forecaster subclasses
:class:`ForecasterBase` and sets the ``supports_*`` flags of what it can do (like
statsforecast's ``_TS`` base), and callers read the flags (see :data:`CAPABILITIES`).

No peeking: a forecaster sees only the history it is given, and ``predict`` starts at the
step after the last history timestamp.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Callable, ClassVar, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from kale_airflow.core.errors import KaleError

DAY_S = 86400.0


class ForecastError(KaleError, ValueError):
    """The forecaster cannot fit or predict with what it was given."""


# Optional capability flag -> the methods a forecaster declaring it must provide.
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "supports_forecast": ("forecast",),
    "supports_fit_values": ("fit_values", "predict_arrays"),
    "supports_save": ("save", "load"),
}


class ForecasterBase:
    """Declares which optional capabilities a forecaster has (all off by default).

    Every forecaster has ``fit(history) -> self`` and ``predict(horizon) -> frame``. On top
    of that, a subclass sets a flag to True exactly when it provides the methods:

    - ``supports_forecast``: ``forecast(history, horizon) -> frame`` forecasts after a new
      history with the already fitted parameters (no retraining). Heavy forecasters are
      then retrained rarely and only forecast in between;
    - ``supports_fit_values``: ``fit_values(values, step_s, last_timestamp) -> self`` and
      ``predict_arrays(horizon) -> (mean, [quantile arrays])``, a fast path without
      pandas indexes for refitting every few minutes;
    - ``supports_save``: ``save(path)`` and a static/class ``load(path)`` in the
      forecaster's own format (otherwise it is pickled).
    """

    supports_forecast: ClassVar[bool] = False
    supports_fit_values: ClassVar[bool] = False
    supports_save: ClassVar[bool] = False


@runtime_checkable
class Forecaster(Protocol):
    """Anything with ``fit(history) -> self`` and ``predict(horizon) -> frame`` that declares
    its optional capabilities (the ``supports_*`` flags of :class:`ForecasterBase`)."""

    name: str
    quantiles: tuple[float, ...]
    supports_forecast: bool
    supports_fit_values: bool
    supports_save: bool

    def fit(self, history: pd.Series) -> "Forecaster": ...

    def predict(self, horizon: int) -> pd.DataFrame: ...


def quantile_column(q: float) -> str:
    """Column name for quantile ``q`` (0.9 -> ``q90``)."""
    return f"q{round(q * 100):d}"


def series_step_s(history: pd.Series) -> float:
    """Step of a regular series in seconds (errors name the problem)."""
    if not isinstance(history.index, pd.DatetimeIndex):
        raise ForecastError("history must be a pandas Series indexed by timestamps (DatetimeIndex)")
    if len(history) < 2:
        raise ForecastError(f"history has {len(history)} point(s); at least 2 are needed")
    diffs = np.diff(history.index.asi8)
    if (diffs <= 0).any() or (diffs != diffs[0]).any():
        raise ForecastError("history must be sorted and regular (one value per step, no gaps); load it with load_trace")
    return diffs[0] / 1e9


def _check_values(values: np.ndarray) -> None:
    if not np.isfinite(values).all():
        i = int(np.flatnonzero(~np.isfinite(values))[0])
        raise ForecastError(f"history value {i} is NaN or infinite; repair the trace before fitting")
    if (values < 0).any():
        raise ForecastError("history has negative values; traffic counts must be >= 0")


def conformal_offsets(errors: np.ndarray, quantiles: tuple[float, ...], horizon: int | None = None) -> np.ndarray:
    """Split-conformal offsets per horizon step from held-out errors.

    ``errors`` has shape (origins, steps): ``actual - forecast`` on a transformed scale
    (log), NaN where no actual exists. Step ``k`` pools the errors of steps within
    ``k +- max(1, k // 4)`` (neighbouring steps err alike; pooling steadies the tails)
    and takes the finite-sample conformal level ``ceil((n + 1) q) / n`` of them. Returns
    shape (len(quantiles), horizon); steps beyond the errors reuse the last step's.
    """
    errors = np.asarray(errors, dtype=float)
    steps = errors.shape[1] if errors.ndim == 2 else 0
    horizon = horizon or steps
    out = np.zeros((len(quantiles), horizon))
    if steps == 0 or not np.isfinite(errors).any():
        return out
    cols = []
    for k in range(steps):
        w = max(1, k // 4)
        pool = errors[:, max(0, k - w):k + w + 1].ravel()
        pool = pool[np.isfinite(pool)]
        cols.append(pool)
    for k in range(horizon):
        pool = cols[min(k, steps - 1)]
        if len(pool) == 0:
            continue
        for i, q in enumerate(quantiles):
            level = min(1.0, np.ceil((len(pool) + 1) * q) / len(pool))
            out[i, k] = np.quantile(pool, level)
    return out


@dataclass
class SeasonalNaiveForecaster(ForecasterBase):
    """Level-corrected seasonal naive forecast with empirical quantiles and automatic
    choice of season.

    Each candidate ``(season_s, count)`` forecasts a future step as the mean of the same
    phase over the last ``count`` seasons, multiplied by a level ratio (the last
    ``level_window_s`` of history over the same profile at those times, clipped to
    ``level_clip``). The defaults try a daily profile over the last 7 days and a weekly
    profile over the last 2 weeks. At ``fit`` each candidate is backtested on the last
    ``calibration_days`` of the history (rolling origins, past data only) and the one
    with the smaller mean absolute log error wins; the quantiles come from that
    winner's errors, per horizon step.

    The season choice and the quantile calibration are refreshed at most every
    ``recalibrate_s`` of history time, so refitting every few minutes stays cheap.

    With less history than the shortest season plus the level window it falls back to
    the recent mean level with quantiles from recent variation (``mode == "level"``).
    """

    quantiles: tuple[float, ...] = (0.5, 0.8, 0.9)
    candidates: tuple[tuple[float, int], ...] = ((DAY_S, 7), (7 * DAY_S, 2))
    level_window_s: float = 3600.0
    level_clip: tuple[float, float] = (0.5, 2.0)
    calibration_days: float = 3.0
    max_calibration_origins: int = 128
    recalibrate_s: float = 3600.0
    name: str = "seasonal"

    # Declared capabilities (class attributes, not dataclass fields).
    supports_forecast = True     # forecast(history, h): a refit, the profile has no other parameters
    supports_fit_values = True   # fit_values / predict_arrays fast path
    supports_save = False        # pickled
    # Fitted state (instance attributes once fitted; None before).
    _y = None
    _calibrated = None

    def fit(self, history: pd.Series) -> "SeasonalNaiveForecaster":
        """Remember the history and pick the season; returns self."""
        return self.fit_values(history.to_numpy(dtype=float), series_step_s(history), history.index[-1])

    def fit_values(self, values: np.ndarray, step: float, last: pd.Timestamp) -> "SeasonalNaiveForecaster":
        """Fast path of :meth:`fit` for a regular series given as values, step and last timestamp."""
        _check_values(values)
        self._step = step
        self._last = last
        self._y = values
        self._eps = max(1e-9, 1e-3 * float(values.mean()))
        self._level_n = max(1, int(round(self.level_window_s / step)))
        seasons = []
        for season_s, count in self.candidates:
            m = int(round(season_s / step))
            if abs(m * step - season_s) > 1e-6:
                raise ForecastError(f"step {step:g} s does not divide the season {season_s:g} s")
            if len(values) > m + self._level_n:
                seasons.append((m, count))
        fresh = (
            self._calibrated is not None
            and self._calibrated[1] == step
            and self._calibrated[2] == seasons
            and 0 <= (self._last - self._calibrated[0]).total_seconds() < self.recalibrate_s
        )
        self._seasons = seasons
        self.mode = "seasonal" if seasons else "level"
        if not fresh:
            self._chosen: tuple[int, int] | None = None
            self._errors: np.ndarray | None = None
            self._calibrated = None
        return self

    def _point(self, origins: np.ndarray, horizon: int, season: int, count: int) -> np.ndarray:
        """Point forecasts, shape (len(origins), horizon), using only y[< origin]: the mean
        of the same phase over the last ``count`` seasons before each origin (all offsets at
        once, as many seasons back as the longest step needs), times the level ratio."""
        y = self._y
        back = np.arange(1, count + horizon // season + 2)[:, None, None] * season
        j = origins[None, :, None] + np.arange(horizon)[None, None, :] - back  # (seasons back, origin, step)
        ok = (j >= 0) & (j < origins[None, :, None])
        cnt = np.cumsum(ok, axis=0)
        enough = np.flatnonzero((cnt >= count).all(axis=(1, 2)))
        used = enough[0] + 1 if enough.size else len(back)  # seasons back until every step has ``count``
        acc = np.where(ok[:used], y[np.clip(j[:used], 0, len(y) - 1)], 0.0).sum(axis=0)
        prof = np.where(cnt[used - 1] > 0, acc / np.maximum(cnt[used - 1], 1), np.nan)
        # Level ratio: the last level window against the same profile at those times.
        L = self._level_n
        csum = np.concatenate([[0.0], np.cumsum(y)])
        recent = csum[origins] - csum[origins - L]
        past = (origins[None, :, None] - L + np.arange(L)[None, None, :]
                - np.arange(1, count + 1)[:, None, None] * season)
        seen = past >= 0
        ref_acc = np.where(seen, y[np.maximum(past, 0)], 0.0).sum(axis=0)
        ref = (ref_acc / np.maximum(seen.sum(axis=0), 1)).sum(axis=1)
        ratio = np.clip((recent + self._eps) / (ref + self._eps), *self.level_clip)
        return prof * ratio[:, None]

    def _backtest(self, horizon: int, season: int, count: int) -> np.ndarray:
        """Log-ratio errors of one candidate at rolling origins in the recent past."""
        n = len(self._y)
        last = n - horizon
        lo = max(season + self._level_n, last - int(self.calibration_days * DAY_S / self._step))
        if last <= lo:
            return np.zeros((0, horizon))
        origins = np.unique(np.linspace(lo, last, min(self.max_calibration_origins, last - lo + 1)).astype(int))
        pred = self._point(origins, horizon, season, count)
        actual = self._y[origins[:, None] + np.arange(horizon)[None, :]]
        err = np.log((actual + self._eps) / (pred + self._eps))
        return err[np.isfinite(err).all(axis=1)]

    def _calibrate(self, horizon: int) -> None:
        best = None
        for season, count in self._seasons:
            err = self._backtest(horizon, season, count)
            score = float(np.abs(err).mean()) if len(err) else np.inf
            if best is None or score < best[0]:
                best = (score, (season, count), err)
        _, self._chosen, self._errors = best
        self._calibrated = (self._last, self._step, self._seasons)
        if len(self._errors):
            self._qs = np.quantile(self._errors, self.quantiles, axis=0)
        else:
            self._qs = np.zeros((len(self.quantiles), self._errors.shape[1]))

    @property
    def chosen_season_s(self) -> float | None:
        """Season picked by the last calibration (None before predict or in level mode)."""
        return None if self._chosen is None else self._chosen[0] * self._step

    def forecast(self, history: pd.Series, horizon: int) -> pd.DataFrame:
        """Forecast after ``history`` (a seasonal profile has no parameters beyond the data)."""
        return self.fit(history).predict(horizon)

    def predict(self, horizon: int) -> pd.DataFrame:
        """Forecast ``horizon`` future steps: ``mean`` and one ``q<pct>`` column per quantile."""
        mean, quants = self.predict_arrays(horizon)
        index = pd.date_range(self._last + pd.Timedelta(seconds=self._step), periods=horizon,
                              freq=pd.Timedelta(seconds=self._step))
        frame = pd.DataFrame({"mean": mean}, index=index)
        for q, col in zip(self.quantiles, quants):
            frame[quantile_column(q)] = col
        frame.index.name = "timestamp"
        return frame

    def predict_arrays(self, horizon: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """Fast path for the simulator: (mean, [quantile arrays in ``self.quantiles`` order])."""
        if self._y is None:
            raise ForecastError("call fit(history) before predict")
        if horizon < 1:
            raise ForecastError(f"horizon must be >= 1 step, got {horizon}")
        if self.mode == "level":
            recent = self._y[-max(self._level_n * 4, 4):]
            lvl = float(self._y[-self._level_n:].mean())
            err = np.log((recent + self._eps) / (recent.mean() + self._eps))
            mean = np.full(horizon, lvl)
            return mean, [mean * np.exp(np.quantile(err, q)) for q in self.quantiles]
        if self._errors is None or self._errors.shape[1] < horizon:
            self._calibrate(horizon)
        season, count = self._chosen
        mean = self._point(np.array([len(self._y)]), horizon, season, count)[0]
        factors = np.exp(self._qs[:, :horizon])
        return mean, [mean * factors[i] for i in range(len(self.quantiles))]


# name -> "module:attribute" (imported lazily so heavy forecasters cost nothing until used)
_REGISTRY: dict[str, str | Callable[..., Forecaster]] = {
    "seasonal": SeasonalNaiveForecaster,
    "neuralprophet": "kale_airflow.forecasting.neuralprophet:NeuralProphetForecaster",
    "mstl": "kale_airflow.forecasting.statistical:MSTLForecaster",
    # The roster chosen by backtest on the last days of the training history.
    "auto": "kale_airflow.forecasting.auto:AutoForecaster",
}


def register_forecaster(name: str, factory: str | Callable[..., Forecaster]) -> None:
    """Register a forecaster factory (a callable, or ``"module:attr"`` imported on first use).

    The forecasters it makes declare their optional capabilities (subclass
    :class:`ForecasterBase` and set its ``supports_*`` flags)."""
    _REGISTRY[name] = factory


def forecaster_names() -> list[str]:
    """Names accepted by :func:`get_forecaster`."""
    return sorted(_REGISTRY)


def get_forecaster(name: str, **kwargs) -> Forecaster:
    """Instantiate a forecaster by name."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ForecastError(f"unknown forecaster {name!r}; choose one of {forecaster_names()}") from None
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    try:
        return factory(**kwargs)
    except TypeError as exc:
        fields = [f.name for f in dataclasses.fields(factory)] if dataclasses.is_dataclass(factory) else []
        raise ForecastError(f"bad options {kwargs} for forecaster {name!r} ({exc}); "
                            f"it accepts {fields or 'no options'}") from None
