"""Where kale-airflow keeps things, read from the environment, with every path derived here.

- ``KALE_HOME``: state folder (embedded stores, checkpoints, run folders); default
  ``$AIRFLOW_HOME/kale`` or ``~/.kale``;
- ``KALE_MLFLOW_CONN_ID``: a ``kale_mlflow`` Airflow connection holding the tracking URI and
  token (see :mod:`kale_airflow.registry.connection`); when set it wins over ``KALE_MLFLOW_URI``;
- ``KALE_MLFLOW_URI``: MLflow tracking/registry URI; default a SQLite store
  ``sqlite:///$KALE_HOME/mlflow.db`` with artifacts under ``$KALE_HOME/mlartifacts``;
- ``KALE_DATABASE_URL``: the control-plane database every component shares (generations,
  assignments, decisions, autoscaler state, the embedded metrics); default a SQLite file
  ``sqlite:///$KALE_HOME/kale.db``, ``postgresql://...`` in production;
- ``KALE_DB_AUTO_UPGRADE``: ``1``/``0``: whether a component that opens a control-plane
  database whose schema is behind upgrades it; default on for SQLite files, off for
  PostgreSQL, where ``kale db upgrade`` is the deliberate step (read by the store when it
  opens a database: :func:`kale_airflow.store.database.auto_upgrade`);
- ``KALE_METRICS_SOURCE``: where traffic and throughput history come from (``embedded``);
- ``KALE_CONFIG``: the deployment file (default ``$KALE_HOME/kale.yaml`` when present).

Read where they are used (listed here so that one place names every variable):

- ``KALE_KAFKA_CONFIG``: a JSON object of librdkafka settings merged last (keys prefixed
  ``producer.`` or ``consumer.`` reach that client only, ``kale.`` keys are Kale's own, e.g.
  ``kale.arrivals``); see :mod:`kale_airflow.stream.kafka`;
- ``KALE_KAFKA_SASL_USERNAME``: the Kafka SASL username (``sasl.username``, over
  ``KALE_KAFKA_CONFIG``; without a protocol or mechanism it means SASL_SSL with PLAIN);
  worker pods get it from a Secret;
- ``KALE_KAFKA_SASL_PASSWORD``: the Kafka SASL password (``sasl.password``), from a Secret;
- ``KALE_PROMETHEUS_URL``: the Prometheus server when ``KALE_METRICS_SOURCE=prometheus``;
- ``KALE_PROMETHEUS_QUERIES``: PromQL queries replaced by name (``traffic``,
  ``partition_rates``, ``throughput``), as inline JSON or the path of a JSON/YAML file;
- ``KALE_MLFLOW_UI_URL``: the MLflow UI the Kale page links to (default
  ``http://localhost:5000``);
- ``KALE_METRICS_PORT``: the port of a worker's ``/metrics`` (the worker pods get 9400;
  unset: no server);
- ``KALE_EXPORTER_PORT``: the port of the decision exporter
  (``python -m kale_airflow.control.exposition``, default 9401);
- ``KALE_WORKER_DEVICE``: a worker's default ``--device`` (``auto``, ``cpu``, ``cuda``);
- ``KALE_WORKER_AMP``: a worker's default ``--amp`` (``1``, ``true`` or ``yes``: bf16 on CUDA);
- ``KALE_WORKER_THREADS``: torch threads per worker process (local workers get their share
  of the cores);
- ``KALE_WORKER_CORES``: the cores a local pool's ranks share (set by the pool: each rank
  takes ``cores // world size`` threads in every generation, unless ``KALE_WORKER_THREADS``);
- ``KALE_TRAINER``: a worker's default ``--trainer`` (``module:attribute`` of a Trainer; the
  deployment's ``trainer``);
- ``KALE_WARM_WAIT_S``: a worker's default ``--warm-wait`` (seconds a rank waits for the next
  generation after its own stops; 0: one generation per process);
- ``KALE_CHECKPOINT_EVERY_S``: a worker's default ``--checkpoint-every-s`` (at most this many
  seconds of training between checkpoints and the commits they carry; the deployment's
  ``worker_checkpoint_every_s``);
- ``KALE_JOB``: a worker's default ``--job`` and the decision exporter's ``--job``: the
  deployment's job whose control-plane rows it uses (``jobs:`` in the deployment file;
  default ``default``);
- ``KALE_START_REASON``: why the local pool started a rank process (``start``, ``scale-up``,
  ``restart after slot 1 ended with signal SIGKILL``, ...), recorded with a restart's pause;
- ``KALE_RENDEZVOUS``: a worker's default ``--rendezvous`` (``HOST:PORT``, or
  ``control-plane:PORT`` to meet through the control-plane database);
- ``KALE_ALLOW_FRESH_MODEL``: a worker's default ``--allow-fresh-model`` (``1``, ``true`` or
  ``yes``): when no checkpoint can be read although the stream's commits show the job has
  trained, start a new model from the committed offsets instead of refusing to start;
- ``KALE_DATABASE_WAIT_S``: seconds a worker retries the control-plane database at start
  before it exits with code 75 (default 300);
- ``KALE_POD_IP``: the pod's IP, which rank 0 publishes for the others (set on worker pods
  from the downward API ``status.podIP``);
- ``AIRFLOW_VAR_KALE_AUTOSCALER_SCHEDULE``: schedule of ``kale_autoscaler`` (or
  ``KALE_AUTOSCALER_SCHEDULE``; default ``@continuous``), read at parse time without a
  metadata-database lookup;
- ``AIRFLOW_VAR_KALE_FORECASTER_RETRAIN_SCHEDULE``: schedule of ``kale_forecaster_retrain``
  (or ``KALE_FORECASTER_RETRAIN_SCHEDULE``; default ``@daily``);
- ``AIRFLOW_VAR_KALE_THROUGHPUT_REFIT_SCHEDULE``: schedule of ``kale_throughput_refit`` (or
  ``KALE_THROUGHPUT_REFIT_SCHEDULE``; default ``@hourly``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kale_airflow.core.jobs import DEFAULT_JOB



@dataclass(frozen=True)
class Settings:
    """Resolved locations (the environment, read once per :func:`settings` call)."""

    home: Path
    mlflow_uri: str
    metrics_source: str = "embedded"
    config_file: Path | None = None
    database: str | None = field(default=None, repr=False)  # may hold a password: never in reprs or logs
    # The training job whose rows, models and folders a component works on (``jobs:`` in the
    # deployment file; ``default`` for a single-job deployment, whose paths have no job in them).
    job: str = DEFAULT_JOB

    def _folder(self, name: str) -> Path:
        return self.home / name if self.job == DEFAULT_JOB else self.home / "jobs" / self.job / name

    @property
    def database_url(self) -> str:
        """The control-plane database: generations, assignments, decisions, autoscaler state and
        the embedded metrics, for every component (``KALE_DATABASE_URL``, else a SQLite file)."""
        return self.database or f"sqlite:///{self.home / 'kale.db'}"

    @property
    def stream_db(self) -> Path:
        """The embedded stream, when the configuration names no other."""
        return self.home / "stream.db"

    @property
    def artifacts(self) -> Path:
        """Local MLflow artifact root for the embedded default."""
        return self.home / "mlartifacts"

    @property
    def checkpoints(self) -> Path:
        """Local workers' checkpoint folder (the job's own)."""
        return self._folder("checkpoints")

    @property
    def worker_logs(self) -> Path:
        """Local workers' log files (the job's own)."""
        return self._folder("worker-logs")

    def run_dir(self, run_id: str) -> Path:
        """Per-run working folder of the retrain/refit pipelines (created; the job's own)."""
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)
        path = self._folder("runs") / safe
        path.mkdir(parents=True, exist_ok=True)
        return path


def settings(job: str = DEFAULT_JOB) -> Settings:
    """Read the environment (each call, so tests and tasks see changes), for job ``job``."""
    if os.environ.get("KALE_HOME"):
        home = Path(os.environ["KALE_HOME"])
    elif os.environ.get("AIRFLOW_HOME"):
        home = Path(os.environ["AIRFLOW_HOME"]) / "kale"
    else:
        home = Path.home() / ".kale"
    home = home.expanduser().resolve()
    conn_id = os.environ.get("KALE_MLFLOW_CONN_ID")
    # A kale_mlflow Airflow connection wins; the registry resolves the reference when it connects.
    uri = (f"airflow-connection:{conn_id}" if conn_id else None) or os.environ.get("KALE_MLFLOW_URI") \
        or f"sqlite:///{home / 'mlflow.db'}"
    explicit = os.environ.get("KALE_CONFIG")
    return Settings(home=home, mlflow_uri=uri, metrics_source=os.environ.get("KALE_METRICS_SOURCE", "embedded"),
                    config_file=Path(explicit).expanduser() if explicit else None,
                    database=os.environ.get("KALE_DATABASE_URL") or None, job=job)

