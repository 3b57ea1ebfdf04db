"""The model grid shared by the heavy forecasters: they work at ``max(step, 5 min)``.

Finer traces are averaged into bins of the model resolution; forecasts are repeated back
onto the native steps. Only complete bins reach a model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kale_airflow.core.forecast import ForecastError, series_step_s


def checked_step(history: pd.Series) -> float:
    """The history's step, after refusing NaN, infinite and negative values."""
    step = series_step_s(history)
    values = history.to_numpy(dtype=float)
    if not np.isfinite(values).all():
        raise ForecastError("history has NaN or infinite values; repair the trace before fitting")
    if (values < 0).any():
        raise ForecastError("history has negative values; traffic counts must be >= 0")
    return step


def resolution(step: float, min_resolution_s: float) -> float:
    """The model resolution for a native step (a multiple of it)."""
    res = max(step, min_resolution_s)
    if res % step:
        raise ForecastError(f"step {step:g} s does not divide the model resolution {res:g} s")
    return res


def to_grid(history: pd.Series, step: float, res: float, complete_only: bool = True) -> pd.Series:
    """Mean per bin of ``res`` seconds (epoch-aligned); drops a trailing partial bin."""
    s = history.astype(float)
    if res <= step:
        return s
    binned = s.resample(pd.Timedelta(seconds=res), origin="epoch").mean().dropna()
    if complete_only:
        last_full = history.index[-1] + pd.Timedelta(seconds=step) - pd.Timedelta(seconds=res)
        binned = binned[binned.index <= last_full]
    return binned


def to_native(raw: pd.DataFrame, last: pd.Timestamp, step: float, res: float, horizon: int) -> pd.DataFrame:
    """Reindex a forecast at the model resolution onto ``horizon`` native steps after ``last``."""
    index = pd.date_range(last + pd.Timedelta(seconds=step), periods=horizon, freq=pd.Timedelta(seconds=step))
    bins = index.floor(pd.Timedelta(seconds=res)) if res > step else index
    out = raw.reindex(bins).set_axis(index)
    if out.isna().any().any():
        raise ForecastError("forecast does not cover the requested horizon (history ends on a partial bin?)")
    out.index.name = "timestamp"
    return out
