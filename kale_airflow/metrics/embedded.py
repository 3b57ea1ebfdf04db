"""The embedded metrics store: one SQLite file, safe for several processes.

Tables: ``traffic(ts, value)`` (samples per step, ``ts`` in epoch seconds) and
``throughput(ts, workers, rate)`` (samples/s measured by a worker set). On first use an
empty store is seeded so the embedded default works out of the box: traffic from the
bundled NYC taxi trace (its original timestamps), throughput from the simulator's
profiling run of its reference cluster, partition rates from a Zipf(0.8) spread over 64
partitions, until the stream and real workers record their own.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pandas as pd

from kale_airflow.core.errors import KaleError
from kale_airflow.core.shards import zipf_shares
from kale_airflow.core.simulator import SimConfig, profile_observations
from kale_airflow.core.traffic import BUNDLED_TRACE, load_trace

SCHEMA = """
CREATE TABLE IF NOT EXISTS traffic (ts INTEGER PRIMARY KEY, value REAL);
CREATE TABLE IF NOT EXISTS throughput (ts REAL, workers INTEGER NOT NULL, rate REAL NOT NULL);
CREATE INDEX IF NOT EXISTS throughput_ts ON throughput (ts);
CREATE TABLE IF NOT EXISTS partition_rates (ts REAL NOT NULL, partition TEXT NOT NULL, rate REAL NOT NULL);
"""
SEED_PARTITIONS, SEED_SKEW = 64, 0.8


class MetricsError(KaleError, RuntimeError):
    """The metrics source cannot answer; the message says what is missing."""


class EmbeddedMetrics:
    """Traffic and throughput history in SQLite (WAL mode, several readers and writers)."""

    name = "embedded"

    def __init__(self, path: str | Path, *, seed: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._conn() as c:
            c.executescript(SCHEMA)
        if seed:
            self._seed()

    def _conn(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def _seed(self) -> None:
        with closing(self._conn()) as c:
            have_traffic = c.execute("SELECT COUNT(*) FROM traffic").fetchone()[0]
            have_tput = c.execute("SELECT COUNT(*) FROM throughput").fetchone()[0]
        if not have_traffic:
            self.write_traffic(load_trace(BUNDLED_TRACE).series)
        if not have_tput:
            n, r = profile_observations(SimConfig())
            self.write_throughput(np.zeros(len(n)), n, r)
        with closing(self._conn()) as c:
            have_parts = c.execute("SELECT COUNT(*) FROM partition_rates").fetchone()[0]
        if not have_parts:
            shares = zipf_shares(SEED_PARTITIONS, SEED_SKEW, seed=0)
            level = float(SimConfig().cluster.capacity(16))
            self.write_partition_rates(0.0, {f"p{i:03d}": level * s for i, s in enumerate(shares)})

    def write_traffic(self, series: pd.Series) -> int:
        """Insert or replace samples per step (NaN is stored as NULL: a missing value)."""
        ts = (series.index.asi8 // 10**9).tolist()
        vals = [None if not np.isfinite(v) else float(v) for v in series.to_numpy(dtype=float)]
        with closing(self._conn()) as c, c:
            c.executemany("INSERT OR REPLACE INTO traffic (ts, value) VALUES (?, ?)", zip(ts, vals))
        return len(ts)

    def write_throughput(self, ts, workers, rates) -> int:
        """Append (time, workers, samples/s) observations."""
        rows = [(float(t), int(n), float(r)) for t, n, r in zip(ts, workers, rates)]
        with closing(self._conn()) as c, c:
            c.executemany("INSERT INTO throughput (ts, workers, rate) VALUES (?, ?, ?)", rows)
        return len(rows)

    def write_partition_rates(self, ts: float, rates: dict[str, float]) -> int:
        """Record samples/s per partition measured at ``ts``."""
        with closing(self._conn()) as c, c:
            c.executemany("INSERT INTO partition_rates (ts, partition, rate) VALUES (?, ?, ?)",
                          [(float(ts), str(p), float(r)) for p, r in rates.items()])
        return len(rates)

    def partition_rates(self) -> dict[str, float]:
        """The latest measured rate of every partition."""
        with closing(self._conn()) as c:
            rows = c.execute("SELECT partition, rate FROM partition_rates p WHERE ts = "
                             "(SELECT MAX(ts) FROM partition_rates q WHERE q.partition = p.partition)").fetchall()
        if not rows:
            raise MetricsError(f"no partition rates in {self.path}; the stream or workers must record them")
        return dict(sorted(rows))

    def traffic_history(self, days: float, end: pd.Timestamp | None = None) -> pd.Series:
        """The last ``days`` of traffic up to ``end`` (default: the latest stored point).

        Missing values come back as NaN, so validation can name them."""
        with closing(self._conn()) as c:
            last = c.execute("SELECT MAX(ts) FROM traffic").fetchone()[0]
            if last is None:
                raise MetricsError(f"no traffic in {self.path}; record some or point KALE_METRICS_SOURCE elsewhere")
            stop = int(end.timestamp()) if end is not None else last
            rows = c.execute("SELECT ts, value FROM traffic WHERE ts > ? AND ts <= ? ORDER BY ts",
                             (stop - int(days * 86400), stop)).fetchall()
        if not rows:
            raise MetricsError(f"no traffic in the {days:g} days before {pd.Timestamp(stop, unit='s')}")
        ts, vals = zip(*rows)
        idx = pd.to_datetime(np.asarray(ts, dtype="int64"), unit="s")
        return pd.Series(np.asarray([np.nan if v is None else v for v in vals], dtype=float), index=idx, name="value")

    def clear_throughput(self) -> None:
        """Forget all throughput observations (e.g. the seed, before profiling real workers)."""
        with closing(self._conn()) as c, c:
            c.execute("DELETE FROM throughput")

    def throughput_observations(self, since: float | None = None) -> pd.DataFrame:
        """(ts, workers, rate) observations, all or those after ``since`` (epoch seconds)."""
        with closing(self._conn()) as c:
            rows = c.execute("SELECT ts, workers, rate FROM throughput WHERE ts > ? ORDER BY ts",
                             (float("-inf") if since is None else since,)).fetchall()
        return pd.DataFrame(rows, columns=["ts", "workers", "rate"])


def open_metrics(source: str, path: str | Path) -> EmbeddedMetrics:
    """The metrics source named in configuration."""
    if source == "embedded":
        return EmbeddedMetrics(path)
    raise MetricsError(f"unknown metrics source {source!r}; available: embedded")
