"""NeuralProphet behind the core forecaster interface.

Choices (all derived from the history's step, none per trace):

- **resolution**: the model works at ``max(step, 5 min)``; finer traces are averaged into
  5-minute bins and forecasts are repeated back onto the native steps, so 14 days of
  1-minute data train in seconds on a CPU;
- **AR-Net lags** cover the last ``lags_s`` (1 h) or 12 steps, whichever is longer, and
  the model forecasts ``horizon_s`` (3 h) ahead in one pass (``n_forecasts``), so
  predicting needs only recent history;
- **epochs** are chosen for about ``target_steps`` optimizer steps (10 to 100 epochs),
  so short coarse histories are not under-trained and long fine ones stay fast;
- **seasonality**: daily always, weekly from 14 days of history on; no yearly;
- **no trend** (``growth="off"``): the AR lags carry the level, so a level shift moves
  the forecast's level within the lag window and a multi-day surge cannot be extrapolated
  into a runaway slope;
- **log target**: the model learns ``log1p(count)`` with NeuralProphet's Huber loss, so
  one burst is a bounded excursion, not a squared error that dominates the fit;
  quantiles are invariant under the monotone transform, so ``expm1`` of a log quantile
  is the quantile of the count;
- **quantiles**: the point forecast is the median (``q50``); upper quantiles come from
  NeuralProphet's quantile regression, then are conformalized (CQR, like
  NeuralProphet's ``conformal_predict(method="cqr")``) on **held-out** data: the model
  trains on all but the last ``calibration_days`` and the conformity scores come from
  its rolling forecasts through them, per horizon step on the log scale
  (``calibration_days=0`` trains on everything and skips this; the ``auto`` roster
  calibrates its own choice);
- CPU trainer, no progress bars, seeded (``seed``).

NeuralProphet 0.9.0 quirks handled here: ``neuralprophet.load`` calls ``torch.load``
without ``weights_only=False`` (fails on torch >= 2.6), and a loaded model needs
``restore_trainer()`` before ``predict``.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kale_airflow.core.forecast import (
    ForecasterBase,
    ForecastError,
    conformal_offsets,
    quantile_column,
    series_step_s,
)
from kale_airflow.forecasting.grid import checked_step, resolution, to_grid

log = logging.getLogger(__name__)


def _quiet():
    warnings.filterwarnings("ignore", module="neuralprophet")
    warnings.filterwarnings("ignore", module="pytorch_lightning")
    warnings.filterwarnings("ignore", module="lightning_fabric")
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("NP", "neuralprophet", "pytorch_lightning", "lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


@dataclass
class NeuralProphetForecaster(ForecasterBase):
    """NeuralProphet with AR lags, daily/weekly seasonality and calibrated quantiles."""

    quantiles: tuple[float, ...] = (0.5, 0.8, 0.9)
    horizon_s: float = 10800.0
    lags_s: float = 3600.0
    min_resolution_s: float = 300.0
    epochs: int | None = None
    target_steps: int = 1000
    learning_rate: float = 0.01
    batch_size: int = 128
    calibration_days: float = 2.0
    seed: int = 0
    name: str = "neuralprophet"
    _model: object = field(default=None, repr=False)

    # Declared capabilities (class attributes, not dataclass fields).
    supports_forecast = True     # forecast(history, h) with the trained weights: retrain rarely
    supports_fit_values = False  # no array fast path: every fit trains the network
    supports_save = True         # save(path) / load(path) through torch

    # ---------------------------------------------------------------- helpers
    def _to_model_frame(self, history: pd.Series) -> tuple[pd.DataFrame, float]:
        step = checked_step(history)
        s = to_grid(history, step, resolution(step, self.min_resolution_s), complete_only=False)
        return pd.DataFrame({"ds": s.index, "y": np.log1p(s.to_numpy())}), step

    def _new_model(self, days: float):
        _quiet()
        from neuralprophet import NeuralProphet, set_log_level, set_random_seed

        set_log_level("ERROR")
        set_random_seed(self.seed)
        upper = tuple(q for q in self.quantiles if q != 0.5)
        return NeuralProphet(
            n_lags=self._lags,
            n_forecasts=self._n_forecasts,
            growth="off",
            daily_seasonality=True,
            weekly_seasonality=days >= 14,
            yearly_seasonality=False,
            quantiles=list(upper),
            epochs=self._epochs,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            trainer_config={"accelerator": "cpu", "logger": False,
                            "enable_checkpointing": False, "enable_model_summary": False},
        )

    def _raw_forecast(self, df: pd.DataFrame) -> pd.DataFrame:
        """Latest forecast after ``df`` (needs >= n_lags rows): columns mean, q<pct>."""
        m = self._model
        future = m.make_future_dataframe(df.iloc[-self._lags:], periods=self._n_forecasts, n_historic_predictions=False)
        out = m.predict(future)
        fut = out.iloc[self._lags:]
        cols = {"mean": [fut[f"yhat{i + 1}"].iloc[i] for i in range(self._n_forecasts)]}
        for q in self.quantiles:
            if q == 0.5:
                continue
            cols[quantile_column(q)] = [fut[f"yhat{i + 1} {q * 100:.1f}%"].iloc[i] for i in range(self._n_forecasts)]
        return pd.DataFrame(cols, index=pd.DatetimeIndex(fut["ds"].to_numpy()))

    # -------------------------------------------------------------- interface
    def fit(self, history: pd.Series) -> "NeuralProphetForecaster":
        """Train on the whole history (seeded); calibrates the upper quantiles."""
        df, step = self._to_model_frame(history)
        self._res = max(step, self.min_resolution_s)
        self._lags = max(12, int(round(self.lags_s / self._res)))
        # One more bin when bins are coarser than the data: a history that ends inside a bin
        # is forecast from the last complete bin, which starts up to a bin earlier.
        self._n_forecasts = max(1, int(np.ceil(self.horizon_s / self._res))) + (1 if self._res > step else 0)
        days = len(df) * self._res / 86400
        if len(df) < self._lags + self._n_forecasts + int(86400 / self._res):
            raise ForecastError(
                f"history of {days:.1f} days is too short for NeuralProphet: it needs at least one day plus "
                f"{(self._lags + self._n_forecasts) * self._res / 3600:.1f} h at a {self._res:g} s resolution"
            )
        if np.ptp(df["y"].to_numpy()) == 0:
            raise ForecastError("history is constant; there is nothing for NeuralProphet to learn")
        # Held out for calibration: calibration_days, at most a quarter of the history.
        cal = min(int(round(self.calibration_days * 86400 / self._res)), len(df) // 4)
        train = df.iloc[:-cal] if cal > 0 else df
        batches = max(1, int(np.ceil(len(train) / self.batch_size)))
        self._epochs = self.epochs or int(np.clip(round(self.target_steps / batches), 10, 100))
        self._model = self._new_model(len(train) * self._res / 86400)
        _quiet()
        self._model.fit(train, freq=f"{int(self._res)}s", progress=None, minimal=True)
        self._step = step
        self._history = history.iloc[-int(np.ceil((self._lags + 1) * self._res / step)) - 1:]
        self._calibrate(df, len(df) - cal)
        return self

    def _calibrate(self, df: pd.DataFrame, first: int) -> None:
        """Conformalized quantile regression on the held-out rows ``df[first:]`` (log scale)."""
        self._shift = {}
        origins = range(max(self._lags, first), len(df) - 1, max(1, self._n_forecasts // 2))
        upper = [q for q in self.quantiles if q != 0.5]
        scores: dict[str, list] = {quantile_column(q): [] for q in upper}
        y = df["y"].to_numpy()
        for o in origins:
            fc = self._raw_forecast(df.iloc[:o])
            actual = y[o:o + self._n_forecasts]
            for col in scores:
                e = np.full(self._n_forecasts, np.nan)
                e[: len(actual)] = actual - fc[col].to_numpy()[: len(actual)]
                scores[col].append(e)
        for q in upper:
            col = quantile_column(q)
            if scores[col]:
                self._shift[col] = conformal_offsets(np.array(scores[col]), (q,), self._n_forecasts)[0]

    def forecast(self, history: pd.Series, horizon: int) -> pd.DataFrame:
        """Forecast ``horizon`` native steps after ``history`` with the trained weights."""
        if self._model is None:
            raise ForecastError("call fit(history) before forecasting")
        step = series_step_s(history)
        if step != self._step:
            raise ForecastError(f"history step {step:g} s differs from the training step {self._step:g} s")
        if horizon * step > np.ceil(self.horizon_s / self._res) * self._res:
            raise ForecastError(
                f"horizon {horizon * step / 3600:.2f} h exceeds the trained horizon {self.horizon_s / 3600:.2f} h; "
                "refit with a larger horizon_s"
            )
        df, _ = self._to_model_frame(history)
        if self._res > step:
            # The last bin may be partial: forecast from complete bins only.
            last_full = history.index[-1] + pd.Timedelta(seconds=step) - pd.Timedelta(seconds=self._res)
            df = df[df["ds"] <= last_full]
        if len(df) < self._lags:
            raise ForecastError(f"forecasting needs the last {self.lags_s / 3600:g} h of history")
        raw = self._raw_forecast(df)
        for col, shift in self._shift.items():
            raw[col] = raw[col] + shift[: len(raw)]
        raw = np.expm1(raw).clip(lower=0.0)
        raw["q50"] = raw["mean"]
        # Back onto the native grid: each native step takes its bin's value.
        index = pd.date_range(history.index[-1] + pd.Timedelta(seconds=step), periods=horizon,
                              freq=pd.Timedelta(seconds=step))
        bins = index.floor(pd.Timedelta(seconds=self._res)) if self._res > step else index
        out = raw.reindex(bins).set_axis(index)
        if out.isna().any().any():
            raise ForecastError("forecast does not cover the requested horizon (history ends on a partial bin?)")
        cols = ["mean"] + [quantile_column(q) for q in self.quantiles]
        upper = out[cols[1:]].cummax(axis=1)  # keep quantiles ordered
        out[cols[1:]] = upper
        out.index.name = "timestamp"
        return out[cols]

    def predict(self, horizon: int) -> pd.DataFrame:
        """Forecast after the end of the training history."""
        return self.forecast(self._history, horizon)

    # ------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the model (torch pickle of the NeuralProphet object plus our state)."""
        import torch

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"forecaster": self}, path)
        return path

    @staticmethod
    def load(path: str | Path) -> "NeuralProphetForecaster":
        """Load a saved model; restores the trainer as NeuralProphet 0.9 requires."""
        import torch

        _quiet()
        obj = torch.load(path, weights_only=False)["forecaster"]
        obj._model.restore_trainer()
        return obj
