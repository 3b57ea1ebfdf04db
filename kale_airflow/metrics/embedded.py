"""The embedded metrics source: traffic and throughput history kept in the control-plane
database (``KALE_DATABASE_URL``: one SQLite file by default, PostgreSQL in production).

Tables (each row also names its training job, ``job``: a store reads and writes its own
job's rows only): ``traffic(ts, value)`` (samples per step, ``ts`` in epoch seconds),
``throughput(ts, workers, rate)`` (samples/s measured by a worker set) and
``partition_rates(ts, partition, rate)``. Every row is something that was observed: the
autoscaler records the stream's arrivals per bin, the training job's rank 0 records its
samples/s (``kale profile`` runs the job at a few world sizes to do so on a new deployment),
the stream or workers record partition rates. Opening a store never writes a row: a fresh
control plane, PostgreSQL or SQLite, is empty until one of them records something, and the
throughput refit fails (naming ``kale profile``) rather than fit anything else.

Earlier versions seeded every empty store with the simulator's profiling curve and a Zipf
spread of partition rates, all at timestamp 0 (:data:`SIMULATED_TS`); the refit ignores
throughput rows at that timestamp, so a store opened by such a version fits real rows only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import delete, func, select

from kale_airflow.core.errors import KaleError
from kale_airflow.store.database import Database, masked, open_database
from kale_airflow.store.schema import DEFAULT_JOB, partition_rates, throughput, traffic

# Timestamp of the simulated rows earlier versions seeded into every empty store (the epoch:
# no worker records an observation there).
SIMULATED_TS = 0.0


class MetricsError(KaleError, RuntimeError):
    """The metrics source cannot answer; the message says what is missing. It is masked where
    it is made: it may name a server URL with ``user:password@`` (``KALE_PROMETHEUS_URL``)."""

    def __init__(self, message: str):
        super().__init__(masked(message))


class EmbeddedMetrics:
    """Traffic and throughput history in the control-plane database (several readers and writers)."""

    name = "embedded"

    def __init__(self, url: str | Path, job: str = DEFAULT_JOB):
        self.db: Database = open_database(url)
        self.job = job  # the training job whose history this reads and writes

    def __repr__(self) -> str:
        return f"EmbeddedMetrics({self.db!r}, job={self.job!r})"

    def _write_traffic(self, c, series: pd.Series) -> int:
        ts = (series.index.asi8 // 10**9).tolist()
        vals = [None if not np.isfinite(v) else float(v) for v in series.to_numpy(dtype=float)]
        # The last value of a repeated step wins (as before); PostgreSQL refuses one statement
        # that updates the same row twice, so duplicates are dropped here.
        rows = [{"job": self.job, "ts": t, "value": v} for t, v in dict(zip(ts, vals)).items()]
        if rows:
            stmt = self.db.insert(traffic)
            c.execute(stmt.on_conflict_do_update(index_elements=[traffic.c.job, traffic.c.ts],
                                                 set_={"value": stmt.excluded.value}), rows)
        return len(ts)

    def _write_throughput(self, c, ts, workers, rates) -> int:
        rows = [{"job": self.job, "ts": float(t), "workers": int(n), "rate": float(r)}
                for t, n, r in zip(ts, workers, rates)]
        if rows:
            c.execute(throughput.insert(), rows)
        return len(rows)

    def _write_partition_rates(self, c, ts: float, rates: dict[str, float]) -> int:
        rows = [{"job": self.job, "ts": float(ts), "partition": str(p), "rate": float(r)} for p, r in rates.items()]
        if rows:
            c.execute(partition_rates.insert(), rows)
        return len(rows)

    def write_traffic(self, series: pd.Series) -> int:
        """Insert or replace samples per step (NaN is stored as NULL: a missing value).

        Idempotent: INSERT .. ON CONFLICT (ts) DO UPDATE, so a replayed write changes nothing."""
        with self.db.begin() as c:
            return self._write_traffic(c, series)

    def write_throughput(self, ts, workers, rates) -> int:
        """Append (time, workers, samples/s) observations."""
        with self.db.begin() as c:
            return self._write_throughput(c, ts, workers, rates)

    def write_partition_rates(self, ts: float, rates: dict[str, float]) -> int:
        """Record samples/s per partition measured at ``ts``."""
        with self.db.begin() as c:
            return self._write_partition_rates(c, ts, rates)

    def partition_rates(self) -> dict[str, float]:
        """The latest measured rate of every partition."""
        p, q = partition_rates.alias("p"), partition_rates.alias("q")
        latest = select(func.max(q.c.ts)).where(q.c.job == p.c.job, q.c.partition == p.c.partition).scalar_subquery()
        with self.db.connect() as c:
            rows = c.execute(select(p.c.partition, p.c.rate).where(p.c.job == self.job, p.c.ts == latest)).all()
        if not rows:
            raise MetricsError(f"no partition rates in {masked(self.db.url)}; the stream or workers must record them")
        return dict(sorted((str(k), float(v)) for k, v in rows))

    def traffic_history(self, days: float, end: pd.Timestamp | None = None) -> pd.Series:
        """The last ``days`` of traffic up to ``end`` (default: the latest stored point).

        Missing values come back as NaN, so validation can name them."""
        with self.db.connect() as c:
            last = c.execute(select(func.max(traffic.c.ts)).where(traffic.c.job == self.job)).scalar()
            if last is None:
                raise MetricsError(f"no traffic in {masked(self.db.url)}; record some or point "
                                   "KALE_METRICS_SOURCE elsewhere")
            stop = int(end.timestamp()) if end is not None else int(last)
            rows = c.execute(select(traffic.c.ts, traffic.c.value)
                             .where(traffic.c.job == self.job, traffic.c.ts > stop - int(days * 86400),
                                    traffic.c.ts <= stop)
                             .order_by(traffic.c.ts)).all()
        if not rows:
            raise MetricsError(f"no traffic in the {days:g} days before {pd.Timestamp(stop, unit='s')}")
        ts, vals = zip(*rows)
        idx = pd.to_datetime(np.asarray(ts, dtype="int64"), unit="s")
        return pd.Series(np.asarray([np.nan if v is None else v for v in vals], dtype=float), index=idx, name="value")

    def clear_throughput(self) -> None:
        """Forget all throughput observations (e.g. measurements of a job that has since changed)."""
        with self.db.begin() as c:
            c.execute(delete(throughput).where(throughput.c.job == self.job))

    def throughput_observations(self, since: float | None = None) -> pd.DataFrame:
        """(ts, workers, rate) observations, all or those after ``since`` (epoch seconds)."""
        q = (select(throughput.c.ts, throughput.c.workers, throughput.c.rate).where(throughput.c.job == self.job)
             .order_by(throughput.c.ts, throughput.c.id))
        if since is not None:
            q = q.where(throughput.c.ts > since)
        with self.db.connect() as c:
            rows = [tuple(r) for r in c.execute(q).all()]
        return pd.DataFrame(rows, columns=["ts", "workers", "rate"])


def open_metrics(source: str, url: str | Path, job: str = DEFAULT_JOB, **options):
    """The metrics source named in configuration (``KALE_METRICS_SOURCE``):

    - ``embedded``: job ``job``'s history in the control-plane database at ``url``;
    - ``prometheus``: PromQL over the HTTP API of ``KALE_PROMETHEUS_URL`` (``url`` is then
      unused), about job ``job``'s workers; ``options`` (e.g. ``queries={...}``,
      ``topic=...``, ``traffic_step_s=...``) go to
      :class:`~kale_airflow.metrics.prometheus.PrometheusOptions`, and
      ``KALE_PROMETHEUS_QUERIES`` overrides queries by name.
    """
    if source == "embedded":
        return EmbeddedMetrics(url, job)
    if source == "prometheus":
        from kale_airflow.metrics.prometheus import open_prometheus

        return open_prometheus(options.pop("prometheus_url", None), job=job, **options)
    raise MetricsError(f"unknown metrics source {source!r}; available: embedded, prometheus")


def open_job_metrics(settings, deployment=None):
    """:func:`open_metrics` for one job of the deployment (``settings.job``): the Prometheus
    source asks about that job's workers, its stream's topic (a Kafka URL's), its consumer
    groups and its traffic bin (``bin_s``). ``deployment``: the job's validated settings
    (None: read from the deployment file, only for the Prometheus source)."""
    if settings.metrics_source != "prometheus":
        return open_metrics(settings.metrics_source, settings.database_url, settings.job)
    if deployment is None:
        from kale_airflow.config import load_deployment

        deployment = load_deployment(settings).for_job(settings.job)
    from kale_airflow.stream import KAFKA

    options = {"group": deployment.group, "traffic_step_s": float(deployment.bin_s)}
    if deployment.stream_url.startswith(KAFKA):  # validated with the deployment: it names a topic
        from kale_airflow.stream.kafka import parse_url

        options["topic"] = parse_url(deployment.stream_url)[2]
    return open_metrics("prometheus", settings.database_url, settings.job, **options)
