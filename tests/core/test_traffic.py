import numpy as np
import pandas as pd
import pytest

from kale_airflow.core.traffic import BUNDLED_TRACE, TraceError, load_trace, trace_from_csv_text


def csv(rows):
    return "timestamp,value\n" + "\n".join(rows) + "\n"


def regular(n=60, step_min=5, values=None):
    ts = pd.date_range("2024-01-01", periods=n, freq=f"{step_min}min")
    vals = values if values is not None else [str(10 + i % 7) for i in range(n)]
    return [f"{t:%Y-%m-%d %H:%M:%S},{v}" for t, v in zip(ts, vals)]


def test_bundled_trace_loads_as_documented():
    t = load_trace(BUNDLED_TRACE)
    assert len(t.series) == 10_320
    assert t.step_s == 1800
    assert t.series.index[0] == pd.Timestamp("2014-07-01 00:00")
    assert not t.report.repaired
    assert t.rates[0] == pytest.approx(10844 / 1800)


def _with(rows, i, value):
    rows = list(rows)
    ts = rows[i].split(",")[0]
    rows[i] = f"{ts},{value}"
    return rows


@pytest.mark.parametrize(
    "mutate, message",
    [
        pytest.param(lambda r: _with(r, 4, "abc"), "row 5: value 'abc' is not a number", id="non-numeric"),
        pytest.param(lambda r: _with(r, 7, "-3"), "row 8: value -3.0 is negative", id="negative"),
        pytest.param(lambda r: _with(r, 9, ""), "value is missing (NaN)", id="nan"),
        pytest.param(lambda r: r[:3] + [r[2]] + r[3:], "appears more than once", id="duplicate"),
        pytest.param(lambda r: [r[1], r[0]] + r[2:], "row 2: timestamp 2024-01-01 00:00:00 is earlier", id="unsorted"),
        pytest.param(lambda r: r[:10] + r[12:], "gap of 900 s after row 10", id="gap"),
        pytest.param(lambda r: r[:5], "5 rows is too short", id="too-short"),
        pytest.param(lambda r: ["yesterday,3"] + r[1:], "row 1: timestamp 'yesterday' is not a date-time", id="bad-ts"),
    ],
)
def test_bad_traces_name_row_and_problem(mutate, message):
    with pytest.raises(TraceError) as err:
        trace_from_csv_text(csv(mutate(regular())))
    assert message in str(err.value)


def test_missing_column_names_the_header():
    with pytest.raises(TraceError, match="timestamp,value"):
        load_trace(pd.DataFrame({"time": [1], "count": [2]}))


def test_missing_file_says_so(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nope.csv")


def test_repair_fills_gaps_and_nans_and_sorts_and_reports():
    rows = regular()
    rows = _with(rows, 20, "nan")
    rows = [rows[1], rows[0]] + rows[2:30] + rows[32:]
    t = trace_from_csv_text(csv(rows), repair=True)
    r = t.report
    assert r.sorted_rows and r.filled_gaps == 2 and r.filled_nans == 1
    assert len(t.series) == 60
    assert not t.series.isna().any()
    # Interpolated values lie between their neighbours.
    v = t.series.to_numpy()
    assert min(v[19], v[21]) <= v[20] <= max(v[19], v[21])
    assert len(r.notes) == 3


def test_series_and_frame_inputs_are_equivalent():
    rows = regular()
    a = trace_from_csv_text(csv(rows))
    b = load_trace(a.series)
    c = load_trace(pd.DataFrame({"timestamp": a.series.index, "value": a.series.to_numpy()}))
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.values, c.values)


def test_all_zero_trace_is_refused():
    with pytest.raises(TraceError, match="every value is zero"):
        trace_from_csv_text(csv(regular(values=["0"] * 60)))


def test_off_grid_timestamp_is_refused_even_with_repair():
    rows = regular()
    rows[10] = "2024-01-01 00:51:00,3"
    with pytest.raises(TraceError, match="off the 300 s grid"):
        trace_from_csv_text(csv(rows), repair=True)
