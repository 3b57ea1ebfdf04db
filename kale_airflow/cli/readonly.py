"""What the read-only commands (``kale status``, ``kale decide --dry-run``, ``kale db current``,
``kale db check``) look at before they open anything.

Opening a store creates it: the control-plane database (its folder, the SQLite file, the
tables), the embedded stream, MLflow's SQLite store. A command that only reads must not leave
any of them behind, so these functions say what is missing, and how it gets created, from the
file system and a schema read alone; a command opens only what they find.
"""

from __future__ import annotations

from pathlib import Path

from kale_airflow.core.errors import KaleError


class MissingState(KaleError, LookupError):
    """What a read-only command needs does not exist yet; the message says how it gets created."""


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite:///PATH`` URL (or a bare path) names; None for any other URL and for
    an in-memory database."""
    text = str(url)
    if "://" not in text:
        return Path(text).expanduser()
    if not text.startswith("sqlite:///"):
        return None
    path = text[len("sqlite:///"):].split("?", 1)[0]
    return Path(path).expanduser() if path and path != ":memory:" else None


def _absent(path: Path) -> str:
    folder = next((p for p in reversed(path.parents) if not p.exists()), None)
    return f"{path} does not exist" + (f" (nor does the folder {folder})" if folder is not None else "")


def control_plane_problem(url: str) -> str | None:
    """Why the control-plane database at ``url`` cannot be read as it is (missing, empty, or at
    another schema revision: opening it would create or upgrade it), or None when it can."""
    from kale_airflow.store import Database, masked, migrate
    from kale_airflow.store.schema import HEAD_REVISION

    path = sqlite_file(url)
    if path is not None and not path.exists():
        return (f"no control-plane database: {_absent(path)}; `kale db upgrade` creates it (so does the first "
                "Kale task or worker), or point KALE_DATABASE_URL at the deployment's database")
    db = Database(url, prepare=False)
    try:
        state = migrate.current(db)
    finally:
        db.dispose()
    if state.empty:
        return f"the control-plane database {masked(db.url)} has no Kale tables yet; `kale db upgrade` creates them"
    if not state.at_head:
        return (f"the control-plane database {masked(db.url)} is at {state.describe()}, not this kale-airflow's "
                f"revision {HEAD_REVISION}: `kale db current` says more, `kale db upgrade` upgrades an older one")
    return None


def stream_problem(url: str) -> str | None:
    """Why the embedded stream at ``url`` cannot be read without creating it, or None (a Kafka
    stream is never created by reading it)."""
    path = sqlite_file(url) if url.startswith("sqlite:///") else None
    if path is None or path.exists():
        return None
    return (f"the embedded stream {_absent(path)}: nothing was produced to it yet (the first producer or Kale task "
            "creates it)")


def mlflow_problem(uri: str) -> str | None:
    """Why MLflow's SQLite store at ``uri`` cannot be asked without creating it, or None (a
    tracking server or a connection is asked as it is)."""
    path = sqlite_file(uri) if uri.startswith("sqlite:///") else None
    if path is None or path.exists():
        return None
    return (f"no MLflow store: {_absent(path)}; the first kale_forecaster_retrain run creates it (or point "
            "KALE_MLFLOW_URI at the deployment's tracking server)")


class Missing:
    """Stands in for a source that does not exist yet (the embedded stream, MLflow's store):
    every method raises ``error``, which the autoscaler treats as that source being
    unavailable (missing metrics hold, never scale down)."""

    def __init__(self, error: Exception):
        self.error = error

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise self.error

        return unavailable
