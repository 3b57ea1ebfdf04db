"""The embedded metrics source, on SQLite and PostgreSQL: opening it writes nothing, every
method round-trips, and traffic writes are idempotent upserts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import func, select

from kale_airflow.metrics.embedded import EmbeddedMetrics, MetricsError, open_metrics
from kale_airflow.store.schema import traffic


def series(start="2024-01-01", n=288, step="5min", values=None):
    idx = pd.date_range(start, periods=n, freq=step)
    return pd.Series(np.arange(n, dtype=float) if values is None else values, index=idx, name="value")


def traffic_rows(m: EmbeddedMetrics) -> int:
    with m.db.connect() as c:
        return c.execute(select(func.count()).select_from(traffic)).scalar()


def test_opening_writes_nothing_and_the_errors_say_what_is_missing(db_url):
    m = open_metrics("embedded", db_url)
    EmbeddedMetrics(db_url)  # opened again, as every component does
    with pytest.raises(MetricsError, match="no traffic"):  # traffic is only ever what was observed
        m.traffic_history(1)
    with pytest.raises(MetricsError, match="no partition rates"):  # so are partition rates
        m.partition_rates()
    assert m.throughput_observations().empty  # and throughput: no simulated profile in any store


def test_traffic_round_trips_with_missing_values(db_url):
    m = EmbeddedMetrics(db_url)
    s = series()
    s.iloc[10] = np.nan
    assert m.write_traffic(s) == len(s)
    back = m.traffic_history(1)
    pd.testing.assert_series_equal(back, s, check_freq=False)  # the day ends at the last point
    assert np.isnan(back.iloc[10])
    window = m.traffic_history(0.5, end=s.index[143])
    assert window.index[-1] == s.index[143] and len(window) == 144


def test_traffic_writes_are_idempotent_and_the_last_value_wins(db_url):
    m = EmbeddedMetrics(db_url)
    s = series()
    m.write_traffic(s)
    m.write_traffic(s)  # a replayed write changes nothing
    assert traffic_rows(m) == len(s)
    m.write_traffic(series(values=np.full(288, 7.0)))
    assert (m.traffic_history(2) == 7.0).all() and traffic_rows(m) == len(s)
    dup = pd.Series([1.0, 2.0], index=pd.DatetimeIndex(["2024-01-03", "2024-01-03"]))
    m.write_traffic(dup)  # the same step twice in one write: the last one wins
    assert m.traffic_history(0.001).iloc[-1] == 2.0


def test_throughput_round_trips_and_clears(db_url):
    m = EmbeddedMetrics(db_url)
    assert m.write_throughput([1.0, 2.0, 3.0], [1, 2, 2], [100.0, 190.0, 195.5]) == 3
    obs = m.throughput_observations()
    assert obs.to_dict("list") == {"ts": [1.0, 2.0, 3.0], "workers": [1, 2, 2], "rate": [100.0, 190.0, 195.5]}
    assert m.throughput_observations(since=1.5)["ts"].tolist() == [2.0, 3.0]
    m.clear_throughput()
    assert m.throughput_observations().empty


def test_partition_rates_answer_the_latest_per_partition(db_url):
    m = EmbeddedMetrics(db_url)
    m.write_partition_rates(1.0, {"a": 10.0, "b": 20.0})
    m.write_partition_rates(2.0, {"a": 30.0})
    assert m.partition_rates() == {"a": 30.0, "b": 20.0}


def test_an_unknown_source_is_named():
    with pytest.raises(MetricsError, match="unknown metrics source 'graphite'"):
        open_metrics("graphite", "sqlite:///x.db")
