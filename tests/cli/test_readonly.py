"""Read-only commands create nothing: with a missing ``KALE_HOME``, a missing or empty
control-plane database, no embedded stream or no MLflow store, ``kale status``, ``kale
decide --dry-run``, ``kale db current``, ``kale db check`` and ``kale config validate`` leave
no folder, file or table behind, and say what is missing and how it gets created."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from kale_airflow.cli.main import main
from kale_airflow.store import StateStore


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (SQLite's transient -wal/-shm files aside)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.name.endswith(("-wal", "-shm"))}


@pytest.fixture
def env(tmp_path, monkeypatch):
    """The embedded default under ``tmp_path/home``, which does not exist."""
    home = tmp_path / "home"
    monkeypatch.setenv("KALE_HOME", str(home))
    for var in ("KALE_CONFIG", "KALE_DATABASE_URL", "KALE_MLFLOW_CONN_ID", "KALE_MLFLOW_URI", "KALE_DB_AUTO_UPGRADE"):
        monkeypatch.delenv(var, raising=False)
    yield home
    from kale_airflow.store.database import forget_databases

    forget_databases()


# argv, exit status, what the output must say
MISSING_HOME = {
    "status": (["status"], 0, ["(does not exist)", "control plane: no control-plane database:",
                               "kale.db does not exist (nor does the folder", "`kale db upgrade` creates it",
                               "models: no MLflow store:", "the first kale_forecaster_retrain run creates it"]),
    "status-json": (["status", "--json"], 0, ['"kale_home_exists": false', '"control_plane_error": "no control-plane',
                                              '"models": "no MLflow store']),
    "decide": (["decide", "--dry-run"], 2, ["nothing to decide on: no control-plane database",
                                            "`kale db upgrade` creates it", "Nothing was created."]),
    "db-current": (["db", "current"], 0, ["no database (", "kale.db does not exist); `kale db upgrade` creates it"]),
    "db-check": (["db", "check"], 1, ["no database (", "`kale db upgrade` creates it at revision"]),
    "config-validate": (["config", "validate"], 0, ["the embedded defaults apply (valid)"]),
}


@pytest.mark.parametrize("case", MISSING_HOME, ids=list(MISSING_HOME))
def test_a_missing_kale_home_is_reported_and_not_created(env, capsys, case):
    argv, code, says = MISSING_HOME[case]
    before = tree(env.parent)
    assert main(argv) == code
    captured = capsys.readouterr()
    for part in says:
        assert part in captured.out + captured.err, captured
    assert not env.exists() and tree(env.parent) == before


def test_an_empty_database_file_gets_no_tables(env, capsys):
    env.mkdir()
    sqlite3.connect(env / "kale.db").close()  # e.g. touched by hand, or another tool's
    assert main(["status"]) == 0
    assert "has no Kale tables yet; `kale db upgrade` creates them" in capsys.readouterr().out
    assert main(["decide", "--dry-run"]) == 2
    assert "nothing to decide on: the control-plane database" in capsys.readouterr().err
    with sqlite3.connect(env / "kale.db") as db:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == []
    assert tree(env) == {"kale.db"}


def test_decide_without_a_stream_or_an_mlflow_store_holds_and_creates_neither(env, capsys):
    """A control plane exists (the autoscaler ran), but nothing was produced and no model was
    trained yet: the decision holds, says both, and neither store appears."""
    StateStore(f"sqlite:///{env / 'kale.db'}").set_current_generation("g1", 2)
    before = tree(env)
    assert main(["decide", "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decision"]["workers"] == 2 and doc["decision"]["reason"] == "hold_missing_metrics"
    assert [m.split(":")[0] for m in doc["missing"]] == [f"the embedded stream {env / 'stream.db'} does not exist",
                                                         "no MLflow store"]
    assert "no MLflow store" in doc["model_error"] and doc["observation"]["arrival_rate"] is None
    assert tree(env) == before and not (env / "stream.db").exists() and not (env / "mlflow.db").exists()


def test_status_without_an_mlflow_store_does_not_create_one(env, capsys):
    StateStore(f"sqlite:///{env / 'kale.db'}")
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "generation: none started" in out and "models: no MLflow store:" in out
    assert not (env / "mlflow.db").exists()


def test_a_database_behind_this_schema_is_reported_not_upgraded(env, capsys):
    """Opening a SQLite control plane that is behind upgrades it (auto-upgrade is on for SQLite):
    status and decide only read, so they say so instead."""
    from kale_airflow.store import Database, migrate
    from tests.store.legacy import make_v1_database

    env.mkdir()
    url = f"sqlite:///{env / 'kale.db'}"
    make_v1_database(url)
    assert main(["status"]) == 0
    assert "is at schema_version 1 (kale-airflow 0.1.0's numbering" in capsys.readouterr().out
    assert main(["decide", "--dry-run"]) == 2
    assert "`kale db upgrade` upgrades an older one" in capsys.readouterr().err
    db = Database(url, prepare=False)
    try:
        assert migrate.current(db).legacy_versions == (1,) and not migrate.current(db).at_head
    finally:
        db.dispose()
