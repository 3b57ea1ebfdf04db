"""``auto``: a roster of forecasters, one chosen by backtest on the training history only.

``fit(history)`` holds out the last ``selection_days`` of the history (7: one weekly cycle,
so every weekday counts once; at most a quarter of the history), fits every member on
what comes before, forecasts from rolling origins through the
held-out days (each origin sees only data before it) and scores every candidate there:

- the members: the seasonal baseline, NeuralProphet, MSTL (see their modules);
- ``ensemble_median``: the per-step median of the members' forecasts;
- ``ensemble_weighted``: the members weighted by the inverse of their held-out MAE.

The candidate with the lowest MASE over the first ``score_horizon_s`` (1 h) wins
(``selected``; every candidate's ``mase``, ``smape``, ``mae``, ``coverage`` in
``scores``); a tie goes to the earlier, simpler candidate. Its quantiles come from the
same held-out forecasts: split-conformal offsets of the log errors per horizon step
(:func:`kale_airflow.core.forecast.conformal_offsets`), so coverage is calibrated on data
no model was fitted on. The members the winner needs are kept as they were scored (split
conformal: no refit on the held-out days; each forecasts from the latest history it is
given, through its lags, ETS filter or seasonal profile), and their own held-out
calibration is skipped: ``auto`` calibrates its choice. One NeuralProphet training per
fit keeps the roster within the retrain budget.

Nothing is set per trace: the held-out window, horizons and roster are fixed, and every
choice comes from the history given to ``fit``.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kale_airflow.core.forecast import (
    DAY_S,
    ForecasterBase,
    ForecastError,
    conformal_offsets,
    get_forecaster,
    quantile_column,
    series_step_s,
)

MEMBERS = ("seasonal", "mstl", "neuralprophet")
ENSEMBLES = ("ensemble_median", "ensemble_weighted")
# Members' constructor options inside the roster: auto calibrates its own choice.
MEMBER_OPTIONS = {"neuralprophet": {"calibration_days": 0.0}, "mstl": {"calibration_days": 0.0}}


def _forecast(member, history: pd.Series, horizon: int) -> np.ndarray:
    if member.supports_forecast:
        frame = member.forecast(history, horizon)
    else:
        frame = member.fit(history).predict(horizon)
    return frame["mean"].to_numpy(dtype=float)


@dataclass
class AutoForecaster(ForecasterBase):
    """Backtest-selected roster member or ensemble, with held-out conformal quantiles."""

    quantiles: tuple[float, ...] = (0.5, 0.8, 0.9)
    members: tuple[str, ...] = MEMBERS
    member_options: dict = field(default_factory=dict)
    selection_days: float = 7.0
    score_horizon_s: float = 3600.0
    calibration_horizon_s: float = 10800.0
    max_history_days: float = 28.0
    name: str = "auto"

    supports_forecast = True     # forecast(history, h) with the members' fitted parameters
    supports_fit_values = False  # the members retrain rarely (NeuralProphet)
    supports_save = True         # torch pickle when NeuralProphet is in it, else pickle

    selected: str | None = field(default=None, init=False)
    scores: dict = field(default_factory=dict, init=False)
    weights: dict = field(default_factory=dict, init=False)
    fit_seconds_by_member: dict = field(default_factory=dict, init=False)

    def _member(self, name: str):
        opts = MEMBER_OPTIONS.get(name, {}) | self.member_options.get(name, {})
        return get_forecaster(name, quantiles=self.quantiles, **opts)

    # ---------------------------------------------------------------- fitting
    def fit(self, history: pd.Series) -> "AutoForecaster":
        """Select on the last ``selection_days`` of ``history``, calibrate, refit; returns self."""
        step = series_step_s(history)
        unknown = [m for m in self.members if m not in MEMBERS]
        if unknown or not self.members:
            raise ForecastError(f"unknown roster member(s) {unknown}; choose from {list(MEMBERS)}")
        history = history.iloc[-int(round(self.max_history_days * DAY_S / step)):]
        first, score_h, cal_h, origins, actual, naive = self._held_out(history, step)
        preds, errors, fitted = self._member_predictions(history, first, origins, cal_h)
        mae = {name: float(np.nanmean(np.abs(actual[:, :score_h] - p[:, :score_h]))) for name, p in preds.items()}
        if len(preds) > 1:
            stack = np.stack(list(preds.values()))
            preds["ensemble_median"] = np.median(stack, axis=0)
            inv = {name: 1.0 / max(mae[name], 1e-12) for name in mae}
            total = sum(inv.values())
            self.weights = {name: w / total for name, w in inv.items()}
            preds["ensemble_weighted"] = sum(self.weights[name] * preds[name] for name in self.weights)
        eps = max(1e-9, 1e-3 * float(np.mean(history.to_numpy(dtype=float))))
        self.scores = self._score(preds, actual, naive, score_h, cal_h, eps)
        for name, why in errors.items():
            self.scores[name] = {"mase": float("inf"), "error": why}
        order = [c for c in (*self.members, *ENSEMBLES) if c in self.scores]
        self.selected = min(order, key=lambda c: (self.scores[c]["mase"], order.index(c)))
        self._offsets = self.scores[self.selected]["_offsets"]
        for s in self.scores.values():
            s.pop("_offsets", None)
        self.scores = {c: self.scores[c] for c in order}
        # Keep what the winner needs exactly as it was scored and calibrated (split conformal:
        # no refit; every member forecasts from the latest history it is given).
        needed = [self.selected] if self.selected in self.members else list(mae)
        self._members = {name: fitted[name] for name in needed}
        self._step = step
        self._history = history
        return self

    def _held_out(self, history: pd.Series, step: float):
        """The held-out selection window: its first index, the scoring and calibration horizons,
        the rolling origins, and the actual and daily-naive values after each origin."""
        n = len(history)
        day = int(round(DAY_S / step))
        sel = min(int(round(self.selection_days * DAY_S / step)), n // 4)
        score_h = max(1, int(round(self.score_horizon_s / step)))
        cal_h = max(score_h, int(round(self.calibration_horizon_s / step)))
        first = n - sel
        if sel < score_h or first < day + score_h:
            raise ForecastError(f"history of {n * step / DAY_S:.1f} days is too short to choose a forecaster: it "
                                f"needs a day plus a held-out window of at least {self.score_horizon_s / 3600:g} h")
        y = history.to_numpy(dtype=float)
        origins = list(range(first, n - score_h + 1, max(1, score_h // 2)))
        actual = np.full((len(origins), cal_h), np.nan)
        naive = np.full((len(origins), cal_h), np.nan)
        for i, o in enumerate(origins):
            k = min(cal_h, n - o)
            actual[i, :k] = y[o:o + k]
            lo = o - day
            naive[i, :min(k, day)] = y[lo:lo + min(k, day)]
        return first, score_h, cal_h, origins, actual, naive

    def _member_predictions(self, history: pd.Series, first: int, origins: list[int], cal_h: int):
        """Each member fitted before the window and forecasting from every origin; a member that
        fails is recorded with its error instead of breaking the selection."""
        preds: dict[str, np.ndarray] = {}
        errors: dict[str, str] = {}
        fitted = {}
        self.fit_seconds_by_member = {}
        for name in self.members:
            t0 = time.perf_counter()
            try:
                member = fitted[name] = self._member(name).fit(history.iloc[:first])
                preds[name] = np.array([_forecast(member, history.iloc[:o], cal_h) for o in origins])
            except (ForecastError, ValueError, RuntimeError) as exc:
                errors[name] = str(exc)
            self.fit_seconds_by_member[name] = time.perf_counter() - t0
        if not preds:
            raise ForecastError(f"no roster member could forecast the held-out window: {errors}")
        return preds, errors, fitted

    def _score(self, preds: dict, actual: np.ndarray, naive: np.ndarray, score_h: int, cal_h: int,
               eps: float) -> dict:
        """MASE, sMAPE and MAE over the scoring horizon, and conformal offsets, per candidate."""
        naive_mae = float(np.nanmean(np.abs(actual[:, :score_h] - naive[:, :score_h])))
        scores = {}
        for name, p in preds.items():
            err = np.log((actual + eps) / (np.maximum(p, 0.0) + eps))
            offs = conformal_offsets(err, self.quantiles, cal_h)
            m = float(np.nanmean(np.abs(actual[:, :score_h] - p[:, :score_h])))
            a, f = actual[:, :score_h], p[:, :score_h]
            denom = np.abs(a) + np.abs(f)
            with np.errstate(invalid="ignore", divide="ignore"):
                sm = float(100 * np.nanmean(np.where(denom > 0, 2 * np.abs(a - f) / denom, 0.0)))
            scores[name] = {"mase": m / naive_mae if naive_mae > 0 else float("inf"), "smape": sm, "mae": m,
                            "_offsets": offs}
        return scores

    # ------------------------------------------------------------- forecasting
    def forecast(self, history: pd.Series, horizon: int) -> pd.DataFrame:
        """Forecast ``horizon`` steps after ``history`` with the selected candidate."""
        if self.selected is None:
            raise ForecastError("call fit(history) before forecasting")
        if horizon < 1:
            raise ForecastError(f"horizon must be >= 1 step, got {horizon}")
        step = series_step_s(history)
        if step != self._step:
            raise ForecastError(f"history step {step:g} s differs from the training step {self._step:g} s")
        means = {name: _forecast(m, history, horizon) for name, m in self._members.items()}
        if self.selected in means:
            mean = means[self.selected]
        elif self.selected == "ensemble_median":
            mean = np.median(np.stack(list(means.values())), axis=0)
        else:
            mean = sum(self.weights[name] * means[name] for name in means)
        mean = np.maximum(mean, 0.0)
        offs = self._offsets
        if horizon > offs.shape[1]:
            offs = np.pad(offs, ((0, 0), (0, horizon - offs.shape[1])), mode="edge")
        eps = max(1e-9, 1e-3 * float(self._history.mean()))
        index = pd.date_range(history.index[-1] + pd.Timedelta(seconds=step), periods=horizon,
                              freq=pd.Timedelta(seconds=step))
        frame = pd.DataFrame({"mean": mean}, index=index)
        cols = [quantile_column(q) for q in self.quantiles]
        for i, col in enumerate(cols):
            frame[col] = np.maximum((mean + eps) * np.exp(offs[i, :horizon]) - eps, 0.0)
        frame[cols] = frame[cols].cummax(axis=1)
        frame.index.name = "timestamp"
        return frame

    def predict(self, horizon: int) -> pd.DataFrame:
        """Forecast after the end of the training history."""
        return self.forecast(self._history, horizon)

    def summary(self) -> dict:
        """``selected``, every candidate's held-out scores, ensemble weights, fit seconds."""
        return {"selected": self.selected, "candidates": self.scores, "weights": self.weights,
                "fit_seconds_by_member": self.fit_seconds_by_member}

    # ------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the roster (a torch pickle when it holds NeuralProphet, else a pickle)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if "neuralprophet" in getattr(self, "_members", {}):
            import torch

            torch.save({"forecaster": self}, path)
        else:
            path.write_bytes(pickle.dumps({"forecaster": self}))
        return path

    @staticmethod
    def load(path: str | Path) -> "AutoForecaster":
        """Inverse of :meth:`save` (restores NeuralProphet's trainer)."""
        path = Path(path)
        raw = path.read_bytes()
        if raw[:2] == b"PK":  # torch's zip format
            import torch

            obj = torch.load(path, weights_only=False)["forecaster"]
        else:
            obj = pickle.loads(raw)["forecaster"]
        np_member = obj._members.get("neuralprophet")
        if np_member is not None:
            from kale_airflow.forecasting.neuralprophet import _quiet

            _quiet()
            np_member._model.restore_trainer()
        return obj

