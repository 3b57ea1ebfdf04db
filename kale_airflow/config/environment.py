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
- ``KALE_METRICS_SOURCE``: where traffic and throughput history come from (``embedded``);
- ``KALE_CONFIG``: the deployment file (default ``$KALE_HOME/kale.yaml`` when present).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    """Resolved locations (the environment, read once per :func:`settings` call)."""

    home: Path
    mlflow_uri: str
    metrics_source: str = "embedded"
    config_file: Path | None = None
    database: str | None = field(default=None, repr=False)  # may hold a password: never in reprs or logs

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
        """Local workers' checkpoint folder."""
        return self.home / "checkpoints"

    @property
    def worker_logs(self) -> Path:
        """Local workers' log files."""
        return self.home / "worker-logs"

    def run_dir(self, run_id: str) -> Path:
        """Per-run working folder of the retrain/refit pipelines (created)."""
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)
        path = self.home / "runs" / safe
        path.mkdir(parents=True, exist_ok=True)
        return path


def settings() -> Settings:
    """Read the environment (each call, so tests and tasks see changes)."""
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
                    database=os.environ.get("KALE_DATABASE_URL") or None)
