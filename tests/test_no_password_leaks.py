"""A password in the MLflow tracking URI (``user:password@``, MLflow unreachable on a closed
port) through the real autoscaler's poke, ``kale status``, ``kale decide --dry-run`` and the
Kale page's JSON and HTML: it is in no stored decision, no output, no response and no log line.
A decision an older writer stored with the password is masked where it is served."""

import json
import logging
import socket
import time

import pytest
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from kale_airflow.cli.main import main
from kale_airflow.store import StateStore

PASSWORD = "s3cret-Pw0rd"


@pytest.fixture
def closed_port():
    """A port bound but not listening: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def kale_home(tmp_path, monkeypatch, closed_port):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.setenv("KALE_MLFLOW_URI", f"http://kale:{PASSWORD}@127.0.0.1:{closed_port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    for var in ("KALE_CONFIG", "KALE_DATABASE_URL", "KALE_MLFLOW_CONN_ID"):
        monkeypatch.delenv(var, raising=False)
    yield tmp_path
    from kale_airflow.store.database import forget_databases

    forget_databases()


def served(path: str) -> str:
    from kale_airflow.ui.app import can_read_kale, create_app

    app = create_app()
    app.dependency_overrides[get_user] = lambda: object()
    app.dependency_overrides[can_read_kale] = lambda: None
    response = TestClient(app).get(path)
    assert response.status_code == 200
    return response.text


def test_the_password_reaches_no_decision_output_response_or_log(kale_home, closed_port, capsys, caplog):
    from kale_airflow.control.autoscaler import Autoscaler

    caplog.set_level(logging.DEBUG)
    store = StateStore(kale_home / "kale.db")
    store.set_current_generation("g1", 2)
    auto = Autoscaler.from_environment()  # the real MLflow champion source, at the unreachable URI
    decision, _ = auto.poke(time.time())
    assert decision.workers == 2 and "unreachable" in decision.message
    stored = json.dumps(store.decisions())
    assert PASSWORD not in stored and f"kale:***@127.0.0.1:{closed_port}" in stored
    assert PASSWORD not in auto.model_error

    # a row written by another writer (an older version) with the password in it
    store.record_decision(time.time(), 2, {"workers": 2, "reason": "hold", "message": f"at http://kale:{PASSWORD}@x",
                                           "error": f"kafka://kale:{PASSWORD}@broker:9092/samples"})
    assert main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["models"].startswith(f"MLflow unreachable: MLflow at http://kale:***@127.0.0.1:{closed_port}")
    assert main(["status"]) == 0
    assert main(["decide", "--dry-run"]) == 0
    assert main(["decide", "--dry-run", "--json"]) == 0
    out = capsys.readouterr()
    assert "models unavailable" in out.out and "kale:***@" in out.out
    state, page = served("/api/state"), served("/")
    assert "MLflow unavailable" in state and "kale:***@" in state and "kale:***@" in page
    for text in (json.dumps(status), out.out, out.err, state, page, caplog.text):
        assert PASSWORD not in text
