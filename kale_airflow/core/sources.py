"""Where Kale's view of future traffic comes from: the online forecast of the observed
rates (deployed Kale) or the true future (clairvoyant Kale, a reference only)."""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

import numpy as np
import pandas as pd

from kale_airflow.core.calibration import AdaptiveCalibration
from kale_airflow.core.forecast import Forecaster, ForecastError, quantile_column
from kale_airflow.core.planning import Spread, within_bin_lag


class ForecastSource(Protocol):
    """Where Kale's view of future traffic comes from.

    ``stateful`` declares whether the source has state worth persisting between sensor
    pokes: :class:`KalePolicy` saves ``state_dict()`` (and restores it through
    ``load_state_dict``) only then. A stateless source implements both as no-ops.
    """

    stateful: bool
    version: int  # changes whenever what the source answers may have changed (a refit, a new rate)
    spread: Spread | None  # how uneven arrivals are within a bin (None: not known, planned as steady)

    def observe(self, now_s: float, rate: float | None) -> None: ...

    def state_dict(self) -> dict:
        """JSON-friendly state (``{}`` for a stateless source)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict` (a no-op for a stateless source)."""
        ...

    def peak(self, now_s: float, horizon_s: float) -> tuple[float | None, str]:
        """Max planned-quantile rate over (now, now + horizon]; (None, why) if unavailable."""
        ...

    def path(self, now_s: float, bins: int) -> tuple[np.ndarray | None, str]:
        """Planned-quantile rate (samples/s) of the bin containing ``now_s`` and the
        ``bins - 1`` after it; (None, why) if the forecast does not reach that far."""
        ...

    def recent_max(self, now_s: float, window_s: float) -> float | None: ...


class OnlineForecastSource:  # pragma: no mutate block
    """Feeds observed rates into bins and keeps a forecast of the next hours.

    Every ``refresh_every_s`` (default: each bin) the forecast is renewed from the bins
    so far. Forecasters declaring ``supports_fit_values`` are refitted on the raw bins;
    others that declare ``supports_forecast`` (like NeuralProphet) are retrained every
    ``retrain_every_s`` and only forecast in between; the rest are refitted. Only
    completed bins (strictly in the past) reach the forecaster.

    ``adaptive`` (default on) keeps the quantiles calibrated online: every completed bin
    scores the forecasts issued for it and moves their offsets
    (:class:`~kale_airflow.core.calibration.AdaptiveCalibration`), so a quantile that drift
    has made too low or too high returns to its nominal coverage, in the simulator and in
    production alike (the offsets are part of the persisted state).
    """

    stateful = True  # the bins are worth persisting between pokes

    def __init__(self, forecaster: Forecaster, *, bin_s: float = 300.0, quantile: float = 0.9,
                 history_s: float = 21 * 86400.0, max_horizon_s: float = 7200.0,
                 refresh_every_s: float | None = None, retrain_every_s: float | None = None,
                 pretrained: bool = False, adaptive: bool = True):
        if quantile not in forecaster.quantiles:
            raise ValueError(f"forecaster {forecaster.name} has no {quantile} quantile; it offers {forecaster.quantiles}")
        self.forecaster = forecaster
        self.bin_s = bin_s
        self._qi = forecaster.quantiles.index(quantile)
        self._keep = int(history_s // bin_s)
        self._refresh_bins = max(1, int(round((refresh_every_s or bin_s) / bin_s)))
        self._retrain_bins = None if retrain_every_s is None else max(1, int(round(retrain_every_s / bin_s)))
        self._horizon = int(math.ceil(max_horizon_s / bin_s)) + self._refresh_bins
        self._trained_at: int | None = None  # bin index of the last full training
        # A registered champion is already trained: only forecast with it, never refit.
        self._pretrained = pretrained and forecaster.supports_forecast
        self._buf = np.zeros(2 * self._keep)  # ring of completed bin means, compacted when full
        self._len = 0
        self._last_bin: int | None = None  # index of the last completed bin
        self._acc, self._acc_n, self._acc_bin = 0.0, 0, None
        self._ticks: list[float] = []  # the rates observed in the bin in progress
        self.spread: Spread | None = None  # how uneven the arrivals are within a bin, learned over a day
        self._upper: np.ndarray | None = None
        self._upper_from = 0  # bin index of _upper[0]
        self._error = "no forecast yet"
        self._cache: dict = {}
        self.version = 0
        self.calibration = AdaptiveCalibration(forecaster.quantiles, self._horizon, bin_s) if adaptive else None

    def state_dict(self) -> dict:
        """Bins, the bin in progress and the calibration (the forecast itself is recomputed on load)."""
        state = {"bins": self.bins.tolist(), "last_bin": self._last_bin, "acc": self._acc, "acc_n": self._acc_n,
                 "acc_bin": self._acc_bin, "ticks": list(self._ticks),
                 "spread": None if self.spread is None else list(self.spread.lag)}
        if self.calibration is not None:
            state["calibration"] = self.calibration.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`; refits the forecast from the restored bins."""
        bins = state.get("bins", [])
        self._len = 0
        for v in bins[-self._keep:]:
            self._append(float(v))
        self._last_bin = state.get("last_bin")
        self._acc, self._acc_n, self._acc_bin = state.get("acc", 0.0), state.get("acc_n", 0), state.get("acc_bin")
        self._ticks = [float(v) for v in state.get("ticks", [])]
        saved = state.get("spread")
        self.spread = Spread(tuple(float(v) for v in saved), self.bin_s) if saved else None
        if self.calibration is not None and "calibration" in state:
            try:
                self.calibration.load_state_dict(state["calibration"])
            except ValueError:  # saved for other quantiles or another horizon: learn afresh
                self.calibration = AdaptiveCalibration(self.forecaster.quantiles, self._horizon, self.bin_s)
        if self._len:
            self._refit(issue=False)  # the forecast the saved state already holds, not a new one to score

    @property
    def bins(self) -> np.ndarray:
        """Completed bin means, oldest first (at most ``history_s``)."""
        return self._buf[max(0, self._len - self._keep):self._len]

    def preload(self, history: pd.Series) -> None:
        """Seed with past rates (samples/s) on a regular index, resampled to ``bin_s``."""
        binned = history.resample(pd.Timedelta(seconds=self.bin_s)).mean().dropna()
        for ts, v in binned.items():
            self._push(int(ts.value // 1e9 // self.bin_s), float(v))
        self._refit()

    def _append(self, value: float) -> None:
        if self._len == len(self._buf):
            self._buf[: self._keep] = self._buf[self._len - self._keep:self._len]
            self._len = self._keep
        self._buf[self._len] = value
        self._len += 1

    def _push(self, b: int, value: float) -> None:
        if self._last_bin is not None and b > self._last_bin + 1:
            # A metrics gap: carry the last value forward so the series stays regular.
            for _ in range(min(b - self._last_bin - 1, self._keep)):
                self._append(self._buf[self._len - 1])
        self._append(value)
        self._last_bin = b
        if self.calibration is not None:
            self.calibration.observe(b, value)

    def _refit(self, issue: bool = True) -> None:
        bins = self.bins
        if len(bins) < 4:
            self._upper, self._error = None, f"only {len(bins)} bins of history"
            return
        f = self.forecaster
        try:
            if f.supports_fit_values:  # skips building a pandas index every few minutes
                f.fit_values(bins.copy(), self.bin_s, pd.Timestamp(self._last_bin * self.bin_s, unit="s"))
                paths = np.stack(f.predict_arrays(self._horizon)[1])
            else:
                start = (self._last_bin - len(bins) + 1) * self.bin_s
                idx = pd.date_range(pd.Timestamp(start, unit="s"), periods=len(bins), freq=f"{self.bin_s:g}s")
                series = pd.Series(bins.copy(), index=idx)
                due = (self._trained_at is None or self._retrain_bins is None
                       or self._last_bin - self._trained_at >= self._retrain_bins)
                if (due or not f.supports_forecast) and not self._pretrained:
                    f.fit(series)
                    self._trained_at = self._last_bin
                    frame = f.predict(self._horizon)
                else:
                    frame = f.forecast(series, self._horizon)
                paths = np.stack([frame[quantile_column(q)].to_numpy(dtype=float) for q in f.quantiles])
        except (ForecastError, ValueError, RuntimeError) as exc:
            self._upper, self._error = None, f"forecaster failed: {exc}"
            return
        if not np.isfinite(paths).all():
            self._upper, self._error = None, "forecast has NaN values"
            return
        if self.calibration is not None:
            paths = self.calibration.adjust(paths)
            if issue:
                self.calibration.issue(self._last_bin, paths)
        self._upper, self._upper_from = np.maximum(paths[self._qi], 0.0), self._last_bin + 1
        self._cache = {}
        self.version += 1

    def observe(self, now_s: float, rate: float | None) -> None:
        """Account the rate observed over the tick that ended at ``now_s``; refit when a bin closes."""
        if rate is None:
            return
        b = int((now_s - 1e-6) // self.bin_s)
        if self._acc_bin is not None and b != self._acc_bin:
            self._push(self._acc_bin, self._acc / self._acc_n)
            self._learn_spread()
            self._acc, self._acc_n = 0.0, 0
            if self._upper is None or self._last_bin + 1 - self._upper_from >= self._refresh_bins:
                self._refit()
        self._acc_bin = b
        self._acc += rate
        self._acc_n += 1
        self._ticks.append(rate)
        if now_s >= (b + 1) * self.bin_s - 1e-6:  # this tick ended the bin: it is complete now
            self._push(b, self._acc / self._acc_n)
            self._learn_spread()
            self._acc, self._acc_n, self._acc_bin = 0.0, 0, None
            if self._upper is None or self._last_bin + 1 - self._upper_from >= self._refresh_bins:
                self._refit()
        if self._upper is None:  # the fallback reads the recent rates
            self.version += 1

    def _learn_spread(self) -> None:
        """Fold the bin just completed into :attr:`spread` (an average over about a day)."""
        ticks, self._ticks = self._ticks, []
        if len(ticks) < 2:
            return
        lag = within_bin_lag(np.asarray(ticks), self.bin_s / len(ticks))[0]
        if self.spread is not None:
            lag = np.asarray(self.spread.lag) + min(1.0, self.bin_s / 86400.0) * (lag - np.asarray(self.spread.lag))
        self.spread = Spread(tuple(float(v) for v in lag), self.bin_s)

    def path(self, now_s: float, bins: int) -> tuple[np.ndarray | None, str]:
        """The forecast quantile of the bin containing ``now_s`` and the ``bins - 1`` after it."""
        if self._upper is None:
            return None, self._error
        first = max(0, int(now_s // self.bin_s) - self._upper_from)
        if first + bins > len(self._upper):
            return None, f"forecast is stale (last refit {first + 1} bins ago)"
        return self._upper[first:first + bins], "forecast"

    def peak(self, now_s: float, horizon_s: float) -> tuple[float | None, str]:
        """Max forecast quantile over the bins touching (now, now + horizon]."""
        if self._upper is None:
            return None, self._error
        b = int(now_s // self.bin_s)
        hit = self._cache.get(horizon_s)
        if hit is not None and hit[0] == b:
            return hit[1]
        first = max(0, b - self._upper_from)
        last = int((now_s + horizon_s) // self.bin_s) - self._upper_from
        if last >= len(self._upper):
            out = (None, f"forecast is stale (last refit {b - self._upper_from + 1} bins ago)")
        else:
            out = (float(self._upper[first:last + 1].max()), "forecast")
        self._cache[horizon_s] = (b, out)
        return out

    def recent_max(self, now_s: float, window_s: float) -> float | None:
        """Max bin mean over the last ``window_s`` (and the bin in progress)."""
        k = max(1, int(window_s // self.bin_s))
        if not self._len:
            best = None
        elif k == 1:
            best = float(self._buf[self._len - 1])
        else:
            best = float(self._buf[max(0, self._len - k):self._len].max())
        if self._acc_n:
            cur = self._acc / self._acc_n
            best = cur if best is None else max(best, cur)
        return best


class OracleForecastSource:  # pragma: no mutate block
    """The true future, binned like the online source (for the oracle limit only).

    ``resolution_s`` blurs it: each bin reads the true mean over a window of that length
    centred on it, what a forecaster exact at that resolution, and blind within it, would
    plan for (None: every bin exactly)."""

    stateful = False  # the future is given, nothing is learned
    version = 0

    def __init__(self, start_s: float, tick_s: float, rates: np.ndarray, bin_s: float = 300.0,
                 resolution_s: float | None = None):
        self.bin_s = bin_s
        b0 = int(start_s // bin_s)
        idx = ((start_s + tick_s * np.arange(len(rates))) // bin_s).astype(int) - b0
        sums = np.bincount(idx, weights=rates)
        cnt = np.bincount(idx)
        self._means = sums / np.maximum(cnt, 1)
        width = int(round((resolution_s or bin_s) / bin_s))
        if width > 1:
            self._means = pd.Series(self._means).rolling(width, center=True, min_periods=1).mean().to_numpy()
        self._b0 = b0
        self._recent = deque(maxlen=4096)
        per = int(round(bin_s / tick_s))
        skip = (-int(round((start_s % bin_s) / tick_s))) % per  # ticks before the first whole bin
        whole = (len(rates) - skip) // per
        self.spread = (Spread(tuple(within_bin_lag(rates[skip:skip + whole * per].reshape(whole, per), tick_s).mean(axis=0)),
                              bin_s) if whole and per > 1 else None)

    def observe(self, now_s: float, rate: float | None) -> None:
        """The oracle needs no observations."""

    def state_dict(self) -> dict:
        """Nothing to persist."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore."""

    def path(self, now_s: float, bins: int) -> tuple[np.ndarray | None, str]:
        """Exact bin means from the bin containing ``now_s`` on (the last one repeated past the end)."""
        first = max(0, int(now_s // self.bin_s) - self._b0)
        idx = np.minimum(np.arange(first, first + bins), len(self._means) - 1)
        return self._means[idx], "oracle"

    def peak(self, now_s: float, horizon_s: float) -> tuple[float | None, str]:
        """Exact max bin mean over the look-ahead."""
        first = max(0, int(now_s // self.bin_s) - self._b0)
        last = min(len(self._means) - 1, int((now_s + horizon_s) // self.bin_s) - self._b0)
        if first > last:
            return float(self._means[-1]), "oracle"
        return float(self._means[first:last + 1].max()), "oracle"

    def recent_max(self, now_s: float, window_s: float) -> float | None:
        """Not used by the oracle's decisions (its forecast is exact)."""
        return 0.0
