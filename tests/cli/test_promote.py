"""``kale promote MODEL VERSION`` against a real SQLite MLflow store: the champion moves, the
reviewer and the time are recorded, the old champion is marked superseded, the autoscaler is
told through the control plane when there is one (none is created); an unknown model or
version and an unreachable MLflow exit 2 with a clear, masked message and change nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kale_airflow.cli.main import main
from kale_airflow.control.promotions import PROMOTION_KEY
from kale_airflow.registry import mlflow_registry as reg
from kale_airflow.registry.mlflow_registry import CHAMPION, FORECASTER_MODEL, THROUGHPUT_MODEL
from kale_airflow.store import StateStore


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """An MLflow store holding v1 (champion) and v2 of the forecaster (creating one takes seconds: copied per test)."""
    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    client = reg.registry_client(f"sqlite:///{path}")
    client.create_registered_model(FORECASTER_MODEL)
    for _ in range(2):
        client.create_model_version(FORECASTER_MODEL, source="file:///nowhere")
    client.set_registered_model_alias(FORECASTER_MODEL, CHAMPION, "1")
    return path


@pytest.fixture
def home(tmp_path, monkeypatch, template):
    """KALE_HOME with a copy of the template MLflow store and no control plane."""
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    for var in ("KALE_CONFIG", "KALE_DATABASE_URL", "KALE_MLFLOW_CONN_ID", "KALE_MLFLOW_URI"):
        monkeypatch.delenv(var, raising=False)
    shutil.copy(template, tmp_path / "mlflow.db")
    yield tmp_path, reg.registry_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    from kale_airflow.store.database import forget_databases

    forget_databases()


def test_promote_records_the_reviewer_and_leaves_no_control_plane_behind(home, capsys):
    tmp_path, client = home
    assert main(["promote", "forecaster", "v2", "--by", "alice"]) == 0
    out = capsys.readouterr().out
    assert f"{FORECASTER_MODEL} v2 is now the champion, approved by alice at " in out
    assert "v1 is tagged superseded" in out and "no control-plane database to announce it in" in out
    assert reg.current_version(client, FORECASTER_MODEL, CHAMPION) == "2"
    tags = client.get_model_version(FORECASTER_MODEL, "2").tags
    assert (tags["kale.review"], tags["kale.approved_by"]) == ("approved", "alice")
    assert client.get_model_version(FORECASTER_MODEL, "1").tags["kale.superseded_by"] == "2"
    assert not (tmp_path / "kale.db").exists()


def test_promote_announces_to_the_autoscaler_and_defaults_to_the_os_user(home, capsys, monkeypatch):
    tmp_path, client = home
    store = StateStore(f"sqlite:///{tmp_path / 'kale.db'}")
    monkeypatch.setattr("kale_airflow.cli.promote.getpass.getuser", lambda: "os-user")
    assert main(["promote", FORECASTER_MODEL, "2"]) == 0
    assert "the autoscaler reloads the champions at its next poke" in capsys.readouterr().out
    assert client.get_model_version(FORECASTER_MODEL, "2").tags["kale.approved_by"] == "os-user"
    assert store.get_value(PROMOTION_KEY) | {"promoted_at": None} == {"model": FORECASTER_MODEL, "version": "2",
                                                                      "promoted_at": None}


@pytest.mark.parametrize(("argv", "message"), [
    (["promote", "forcaster", "2"], "argument MODEL: unknown model 'forcaster'; use forecaster, throughput, "
                                    f"{FORECASTER_MODEL} or {THROUGHPUT_MODEL}"),
    (["promote", "forecaster", "latest"], "argument VERSION: 'latest' is no model version"),
    (["promote", "forecaster", "7"], f"{FORECASTER_MODEL} has no version '7' in MLflow at sqlite:///"),
    (["promote", "throughput", "1"], f"has no registered model {THROUGHPUT_MODEL}: its first version comes from"),
    (["promote", "forecaster", "2", "--by", " "], "--by must name who approves the promotion"),
], ids=["unknown-model", "not-a-version", "unknown-version", "no-such-registered-model", "empty-by"])
def test_an_unknown_model_or_version_exits_2_and_changes_nothing(home, capsys, argv, message):
    _, client = home
    assert exit_code(argv) == 2
    assert message in capsys.readouterr().err
    assert reg.current_version(client, FORECASTER_MODEL, CHAMPION) == "1"
    assert "kale.review" not in client.get_model_version(FORECASTER_MODEL, "2").tags


def exit_code(argv) -> int:
    """``kale``'s exit status: argparse's usage errors exit 2 through SystemExit."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize(("uri", "message"), [
    ("http://kale:s3cret-pw@127.0.0.1:1", "MLflow at http://kale:***@127.0.0.1:1 is unreachable"),
    ("sqlite:///{home}/nowhere/mlflow.db", "no MLflow store: {home}/nowhere/mlflow.db does not exist"),
], ids=["unreachable-server", "missing-sqlite-store"])
def test_an_unreachable_mlflow_exits_2_with_its_url_masked(home, capsys, monkeypatch, uri, message):
    tmp_path, _ = home
    monkeypatch.setenv("KALE_MLFLOW_URI", uri.format(home=tmp_path))
    assert main(["promote", "forecaster", "2", "--by", "alice"]) == 2
    err = capsys.readouterr().err
    assert message.format(home=tmp_path) in err and "s3cret-pw" not in err
    assert not (tmp_path / "nowhere").exists()
