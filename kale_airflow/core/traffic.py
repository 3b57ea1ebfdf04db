"""Traffic traces: load ``timestamp,value`` CSV files or pandas frames and validate them.

A trace is a regular series of arrival counts per step. Validation is strict by
default and names the first offending row (1-based data row, header excluded, as a
user sees the file in a spreadsheet). ``repair=True`` applies documented repairs and
reports every one of them in :class:`TraceReport`:

- rows out of order are sorted;
- missing steps (gaps) and NaN values are filled by linear interpolation in time.

Duplicated timestamps, negative or non-numeric values and too-short traces are never
repaired: they mean the input is not what the user thinks it is.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kale_airflow.core.errors import KaleError

BUNDLED_TRACE = Path(__file__).resolve().parent.parent / "data" / "nyc_taxi_30min.csv"
MIN_ROWS = 48


class TraceError(KaleError, ValueError):
    """A trace that cannot be used as given; the message names the row and the fix."""


@dataclass(frozen=True)
class TraceReport:
    """What validation found and repaired."""

    rows_in: int
    sorted_rows: bool = False
    filled_gaps: int = 0
    filled_nans: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def repaired(self) -> bool:
        """True when the returned trace differs from the input rows."""
        return self.sorted_rows or self.filled_gaps > 0 or self.filled_nans > 0


@dataclass(frozen=True)
class Trace:
    """A validated, regular traffic trace: ``values[i]`` samples arrived during step i."""

    name: str
    series: pd.Series
    step_s: float
    report: TraceReport

    @property
    def values(self) -> np.ndarray:
        """Counts per step as float64."""
        return self.series.to_numpy(dtype=float)

    @property
    def rates(self) -> np.ndarray:
        """Arrival rate per step in samples per second."""
        return self.values / self.step_s

    @property
    def duration_s(self) -> float:
        """Covered time in seconds."""
        return len(self.series) * self.step_s

    def window(self, start: int, stop: int | None = None) -> "Trace":
        """Rows ``[start, stop)`` as a new trace (used to cut history and evaluation)."""
        return Trace(self.name, self.series.iloc[start:stop], self.step_s, self.report)


def load_trace(
    source: str | Path | pd.DataFrame | pd.Series,
    *,
    repair: bool = False,
    min_rows: int = MIN_ROWS,
    name: str | None = None,
) -> Trace:
    """Load and validate a trace from a CSV path, a ``timestamp,value`` frame or a Series.

    Raises :class:`TraceError` naming the row and the problem.
    """
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise TraceError(f"trace file {path} does not exist; pass a CSV with header 'timestamp,value'")
        try:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}: not a readable CSV ({exc}); expected header 'timestamp,value'") from exc
        label = name or path.stem
    elif isinstance(source, pd.Series):
        frame = pd.DataFrame({"timestamp": source.index, "value": source.to_numpy()})
        label = name or (str(source.name) if source.name is not None else "series")
    elif isinstance(source, pd.DataFrame):
        frame = source.reset_index(drop=True)
        label = name or "frame"
    else:
        raise TraceError(f"cannot read a trace from {type(source).__name__}; pass a CSV path, DataFrame or Series")
    return _validate(frame, label, repair=repair, min_rows=min_rows)


def _check_shape(frame: pd.DataFrame, label: str, min_rows: int) -> int:
    """Both columns present and at least ``min_rows`` rows; returns the row count."""
    missing = {"timestamp", "value"} - set(frame.columns)
    if missing:
        raise TraceError(
            f"{label}: missing column(s) {sorted(missing)}; found {list(frame.columns)}. "
            "A trace needs the header 'timestamp,value'."
        )
    rows_in = len(frame)
    if rows_in < min_rows:
        raise TraceError(f"{label}: {rows_in} rows is too short; at least {min_rows} rows are needed")
    return rows_in


def _parse_timestamps(frame: pd.DataFrame, label: str) -> pd.Series:
    """Timestamps as naive UTC date-times; refuses unparseable and duplicated ones."""
    ts = pd.to_datetime(frame["timestamp"], errors="coerce")
    bad_ts = np.flatnonzero(ts.isna().to_numpy())
    if bad_ts.size:
        i = bad_ts[0]
        raise TraceError(f"{label}: row {i + 1}: timestamp {frame['timestamp'].iloc[i]!r} is not a date-time")
    if getattr(ts.dt, "tz", None) is not None:
        ts = ts.dt.tz_convert("UTC").dt.tz_localize(None)
    return ts


def _parse_values(frame: pd.DataFrame, label: str) -> pd.Series:
    """Values as floats (blanks become NaN); refuses non-numeric, negative and infinite ones."""
    raw = frame["value"]
    is_blank = raw.astype(str).str.strip().str.lower().isin(["", "nan", "na", "null", "none"])
    values = pd.to_numeric(raw.where(~is_blank), errors="coerce")
    non_numeric = np.flatnonzero((values.isna() & ~is_blank).to_numpy())
    if non_numeric.size:
        i = non_numeric[0]
        raise TraceError(f"{label}: row {i + 1}: value {raw.iloc[i]!r} is not a number")
    values = values.astype(float)
    negative = np.flatnonzero((values < 0).to_numpy())
    if negative.size:
        i = negative[0]
        raise TraceError(f"{label}: row {i + 1}: value {values.iloc[i]} is negative; counts must be >= 0")
    infinite = np.flatnonzero(np.isinf(values.to_numpy()))
    if infinite.size:
        raise TraceError(f"{label}: row {infinite[0] + 1}: value is infinite")
    return values


def _check_unique(ts: pd.Series, label: str) -> None:
    """Duplicated timestamps are never repaired."""
    dup = ts.duplicated(keep="first").to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise TraceError(
            f"{label}: row {i + 1}: timestamp {ts.iloc[i]} appears more than once; "
            "aggregate duplicate rows before loading"
        )


def _check_order(ts: pd.Series, label: str, repair: bool) -> bool:
    """True when rows are out of order (allowed only with ``repair``: they get sorted)."""
    order = ts.to_numpy()
    unsorted = np.flatnonzero(order[1:] < order[:-1])
    if not unsorted.size:
        return False
    i = int(unsorted[0]) + 1
    if not repair:
        raise TraceError(
            f"{label}: row {i + 1}: timestamp {ts.iloc[i]} is earlier than the row before it; "
            "sort the trace or load it with repair=True"
        )
    return True


def _regularize(series: pd.Series, label: str, repair: bool) -> tuple[pd.Series, float, int, str | None]:
    """Infer the step (median spacing); with ``repair``, reindex whole missing steps to NaN.
    Returns ``(series, step_s, filled_gaps, note)``, ``note`` None when nothing was
    re-gridded; off-grid rows are never repaired."""
    diffs = np.diff(series.index.asi8) / 1e9
    step_s = float(np.median(diffs))
    if step_s <= 0:
        raise TraceError(f"{label}: cannot infer a time step")
    off_grid = np.flatnonzero(np.abs(diffs - step_s) > 1e-6)
    if not off_grid.size:
        return series, step_s, 0, None
    bad = [k for k in off_grid if diffs[k] < step_s or abs(diffs[k] / step_s - round(diffs[k] / step_s)) > 1e-6]
    if bad:
        k = bad[0]
        raise TraceError(
            f"{label}: row {k + 2}: timestamp {series.index[k + 1]} is off the {step_s:g} s grid "
            f"(previous row {series.index[k]}); resample the trace to a regular step"
        )
    if not repair:
        k = off_grid[0]
        raise TraceError(
            f"{label}: gap of {diffs[k]:g} s after row {k + 1} ({series.index[k]}), step is {step_s:g} s; "
            "fill the gap or load with repair=True (linear interpolation)"
        )
    full = pd.date_range(series.index[0], series.index[-1], freq=pd.Timedelta(seconds=step_s))
    filled_gaps = len(full) - len(series)
    return series.reindex(full), step_s, filled_gaps, f"{filled_gaps} missing step(s) filled by linear interpolation"


def _fill_missing(series: pd.Series, label: str, repair: bool, filled_gaps: int) -> tuple[pd.Series, int]:
    """Interpolate NaNs in time (gap rows and, with ``repair``, NaN values); returns the
    series and the number of NaN values among the input rows."""
    nan_rows = int(series.isna().sum()) - filled_gaps
    if nan_rows and not repair:
        i = int(np.flatnonzero(series.isna().to_numpy())[0])
        raise TraceError(
            f"{label}: row {i + 1} ({series.index[i]}): value is missing (NaN); "
            "fill it or load with repair=True (linear interpolation)"
        )
    if series.isna().any():
        series = series.interpolate(method="time", limit_direction="both")
        if series.isna().any():
            raise TraceError(f"{label}: every value is missing; nothing to interpolate from")
    return series, nan_rows


def _validate(frame: pd.DataFrame, label: str, *, repair: bool, min_rows: int) -> Trace:
    """The checks and repairs of the module docstring, in order; the first failure raises."""
    rows_in = _check_shape(frame, label, min_rows)
    ts = _parse_timestamps(frame, label)
    values = _parse_values(frame, label)
    _check_unique(ts, label)
    sorted_rows = _check_order(ts, label, repair)
    notes = ["rows were out of order and have been sorted by timestamp"] if sorted_rows else []

    series = pd.Series(values.to_numpy(), index=pd.DatetimeIndex(ts.to_numpy()), name="value").sort_index()
    series, step_s, filled_gaps, gap_note = _regularize(series, label, repair)
    if gap_note is not None:
        notes.append(gap_note)
    series, nan_rows = _fill_missing(series, label, repair, filled_gaps)
    if nan_rows:
        notes.append(f"{nan_rows} NaN value(s) filled by linear interpolation")

    if (series.to_numpy() == 0).all():
        raise TraceError(f"{label}: every value is zero; a trace needs some traffic")
    series.index.name = "timestamp"
    report = TraceReport(rows_in, sorted_rows, filled_gaps, max(nan_rows, 0), tuple(notes))
    return Trace(label, series, step_s, report)


def trace_from_csv_text(text: str, **kwargs) -> Trace:
    """Convenience for tests and small inline traces."""
    return load_trace(pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False), **kwargs)
