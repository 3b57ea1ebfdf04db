"""A fresh control plane holds no throughput and no partition-rate rows after every component
that opens it in production has done so (the metrics source, the state store, the
autoscaler with its metrics, generations, the retrain/refit pipelines, ``kale status``),
until a worker or a profile records one: simulated data never enters a real store. Once per
backend: a SQLite file and a real PostgreSQL server (``postgres`` marker)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from kale_airflow.config import Config, Deployment, Settings
from kale_airflow.store.database import open_database
from kale_airflow.store.schema import partition_rates, throughput
from kale_airflow.stream.embedded import EmbeddedStream


class NoChampions:
    """A registry in which nothing was registered yet (a new deployment)."""

    def versions(self):
        return None, None

    def load(self):
        raise LookupError("nothing registered")


def rows(url: str) -> dict[str, int]:
    """Row counts read with plain SQL, so no reader's filter can hide a row."""
    with open_database(url).connect() as c:
        return {t.name: c.execute(select(func.count()).select_from(t)).scalar() for t in (throughput, partition_rates)}


def open_everything(tmp_path, url: str, monkeypatch) -> None:
    """Open the control plane the way each production component does, using it a little."""
    from kale_airflow.cli.ops import status
    from kale_airflow.control.autoscaler import Autoscaler
    from kale_airflow.control.generations import Generations
    from kale_airflow.metrics.embedded import open_metrics
    from kale_airflow.pipelines.forecaster import extract_traffic
    from kale_airflow.pipelines.throughput import NoThroughputObservations, refit_throughput
    from kale_airflow.store import StateStore

    EmbeddedStream(tmp_path / "stream.db", partitions=4)
    settings = Settings(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", database=url)
    config = Config(settings, Deployment(stream_url=f"sqlite:///{tmp_path / 'stream.db'}", max_workers=4))
    open_metrics("embedded", url).throughput_observations()  # the metrics source (workers open it too)
    StateStore(url).current()  # the state store (triggerer, API server, tasks)
    auto = Autoscaler(config, registry=NoChampions(), pods=lambda: [])  # its own metrics source
    auto.poke(time.time())
    Generations(config).rebalance("g1", 2)
    extract_traffic(settings, "retrain", 1)  # the forecaster retrain reads traffic
    with pytest.raises(NoThroughputObservations):
        refit_throughput(settings, "refit")
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.setenv("KALE_DATABASE_URL", url)
    status(models=False)  # kale status


def test_a_fresh_control_plane_holds_no_throughput_or_partition_rates_until_one_is_measured(
        tmp_path, db_url, monkeypatch):
    open_everything(tmp_path, db_url, monkeypatch)
    assert rows(db_url) == {"kale_throughput": 0, "kale_partition_rates": 0}
    open_everything(tmp_path / "again", db_url, monkeypatch)  # a second start of every component
    assert rows(db_url) == {"kale_throughput": 0, "kale_partition_rates": 0}
    from kale_airflow.metrics.embedded import open_metrics

    open_metrics("embedded", db_url).write_throughput([time.time()], [2], [1234.0])  # what a job's rank 0 does
    assert rows(db_url) == {"kale_throughput": 1, "kale_partition_rates": 0}
