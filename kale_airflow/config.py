"""Where kale-airflow keeps things: one place, read from the environment.

- ``KALE_HOME``: state folder (embedded metrics store, model files); default
  ``$AIRFLOW_HOME/kale`` or ``~/.kale``;
- ``KALE_MLFLOW_URI``: MLflow tracking/registry URI; default a SQLite store
  ``sqlite:///$KALE_HOME/mlflow.db`` with artifacts under ``$KALE_HOME/mlartifacts``;
- ``KALE_METRICS_SOURCE``: where traffic and throughput history come from (``embedded``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    """Resolved locations."""

    home: Path
    mlflow_uri: str
    metrics_source: str = "embedded"

    @property
    def metrics_db(self) -> Path:
        """The embedded metrics store (SQLite)."""
        return self.home / "metrics.db"

    @property
    def artifacts(self) -> Path:
        """Local MLflow artifact root for the embedded default."""
        return self.home / "mlartifacts"


def settings() -> Settings:
    """Read the environment (each call, so tests and tasks see changes)."""
    if os.environ.get("KALE_HOME"):
        home = Path(os.environ["KALE_HOME"])
    elif os.environ.get("AIRFLOW_HOME"):
        home = Path(os.environ["AIRFLOW_HOME"]) / "kale"
    else:
        home = Path.home() / ".kale"
    home = home.expanduser().resolve()
    uri = os.environ.get("KALE_MLFLOW_URI") or f"sqlite:///{home / 'mlflow.db'}"
    return Settings(home=home, mlflow_uri=uri, metrics_source=os.environ.get("KALE_METRICS_SOURCE", "embedded"))
