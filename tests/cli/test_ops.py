"""``kale --version``, ``kale config validate``, ``kale status`` and ``kale decide --dry-run``."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kale_airflow import __version__
from kale_airflow.cli.main import main
from kale_airflow.store import StateStore

KALE = Path(sys.executable).parent / "kale"


@pytest.fixture
def kale_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("KALE_MLFLOW_URI", "http://127.0.0.1:9")  # nothing listens: MLflow unreachable
    for var in ("KALE_CONFIG", "KALE_DATABASE_URL", "KALE_MLFLOW_CONN_ID"):
        monkeypatch.delenv(var, raising=False)
    yield tmp_path
    from kale_airflow.store.database import forget_databases

    forget_databases()


def test_version():
    out = subprocess.run([str(KALE), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"kale-airflow {__version__}"


BROKEN = {
    "wrong_type.yaml": ("max_workers: '8'\n", ["max_workers", "valid integer", "'8' (str)"]),
    "unknown_key.yaml": ("max_worker: 8\n", ["max_worker: unknown setting", "allowed here:", "max_workers"]),
    "nested_type.yaml": ("kubernetes:\n  gpus_per_worker: 1.5\n",
                         ["kubernetes.gpus_per_worker", "valid integer", "1.5 (float)"]),
    "not_yaml.yaml": ("max_workers: [1,\n", ["is not valid YAML"]),
    "shadow_string.yaml": ("shadow: 'yes'\n", ["shadow", "valid boolean", "'yes' (str)"]),
    "conflict.yaml": ("min_workers: 6\nmax_workers: 2\n", ["min_workers", "max_workers"]),
    "bad_notifier.yaml": ("alerts:\n  notifier: no_such_module.Notifier\n",
                          ["alerts.notifier", "no_such_module.Notifier", "cannot be imported"]),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_config_validate_names_file_field_and_expected_type(kale_home, capsys, name):
    text, expected = BROKEN[name]
    path = kale_home / name
    path.write_text(text)
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kale: error: {path}")  # the file
    for part in expected:
        assert part in err, err


def test_config_validate_accepts_a_good_file_and_the_default(kale_home, capsys, monkeypatch):
    assert main(["config", "validate"]) == 0
    assert "embedded defaults apply" in capsys.readouterr().out
    (kale_home / "kale.yaml").write_text("max_workers: 12\nshadow: true\nalerts: {slo_risk_minutes: 5}\n")
    assert main(["config", "validate"]) == 0
    out = capsys.readouterr().out
    assert "kale.yaml: valid" in out and "1-12" in out and "shadow on" in out and "alerts log only" in out
    assert main(["config", "validate", str(kale_home / "missing.yaml")]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err


def test_config_validate_through_the_console_script_exits_2(kale_home):
    (kale_home / "bad.yaml").write_text("poll_interval_s: fast\n")
    proc = subprocess.run([str(KALE), "config", "validate", str(kale_home / "bad.yaml")], capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert "poll_interval_s: input should be a valid number, got 'fast' (str)" in proc.stderr


def test_status_reports_generation_workers_decisions_and_an_unreachable_mlflow(kale_home, capsys):
    now = time.time()
    store = StateStore(kale_home / "kale.db")
    store.record_decision(now - 30, 2, {"workers": 4, "reason": "scale_up_forecast", "message": "peak ahead"})
    store.record_decision(now - 15, 4, {"workers": 4, "reason": "hold", "message": "steady"})
    store.set_current_generation("g9", 4)
    for w in range(3):
        store.worker_seen("g9", w, "running", now=now - 5)
    store.worker_seen("g8", 0, "running", now=now - 3600)  # a stale heartbeat: not counted
    assert main(["status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["generation"]["generation"] == "g9" and doc["generation"]["workers"] == 4
    assert doc["workers"] | {"by_generation": None} == {"running": 3, "running_in_generation": 3, "pending": 1,
                                                        "stale_heartbeats": 1, "heartbeat_fresh_s": 120.0,
                                                        "by_generation": None}
    assert [d["reason"] for d in doc["decisions"]] == ["scale_up_forecast", "hold"]
    assert doc["models"].startswith("MLflow unreachable")
    assert doc["shadow"] is None
    assert main(["status", "--no-models"]) == 0
    text = capsys.readouterr().out
    assert "generation: g9 with 4 worker(s)" in text and "3 running" in text and "1 pending" in text
    assert "2 -> 4  scale_up_forecast" in text


def test_decide_dry_run_prints_and_records_nothing(kale_home):
    """One poke through the real console script: MLflow is unreachable, so Kale holds and says why;
    the control plane is left exactly as it was."""
    store = StateStore(kale_home / "kale.db")
    store.set_current_generation("g1", 2)
    proc = subprocess.run([str(KALE), "decide", "--dry-run"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "decision: 2 -> 2 (hold_missing_metrics)" in proc.stdout and "models unavailable" in proc.stdout
    assert "dry run: nothing recorded, nothing applied" in proc.stdout
    assert store.decisions() == [] and store.get_value("autoscaler_state") is None
    assert store.current_generation() == "g1"
    usage = subprocess.run([str(KALE), "decide"], capture_output=True, text=True)
    assert usage.returncode == 2 and "--dry-run" in usage.stderr


def test_status_reads_mlflow_from_the_kale_mlflow_connection(kale_home, capsys, monkeypatch):
    """KALE_MLFLOW_CONN_ID wins over KALE_MLFLOW_URI: the tracking URI and token come from the
    Airflow connection (here through Airflow's AIRFLOW_CONN_* environment route)."""
    monkeypatch.setenv("KALE_MLFLOW_CONN_ID", "kale_mlflow_test")
    monkeypatch.setenv("AIRFLOW_CONN_KALE_MLFLOW_TEST", json.dumps(
        {"conn_type": "kale_mlflow", "host": "127.0.0.1", "port": 7, "schema": "http", "password": "s3cret-token"}))
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "before")  # restored (removed) after the test
    assert main(["status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["models"].startswith("MLflow unreachable: MLflow at http://127.0.0.1:7 is unreachable")
    import os

    assert os.environ["MLFLOW_TRACKING_TOKEN"] == "s3cret-token"  # the client's auth, from the connection
    monkeypatch.setenv("KALE_MLFLOW_CONN_ID", "no_such_connection")
    assert main(["status", "--json"]) == 0
    assert "no_such_connection" in json.loads(capsys.readouterr().out)["models"]


@pytest.mark.parametrize("fields, uri", [
    ({"host": "https://mlflow.example.com"}, "https://mlflow.example.com"),
    ({"host": "mlflow.kale", "port": 5000}, "http://mlflow.kale:5000"),
    ({"host": "mlflow.kale", "schema": "https"}, "https://mlflow.kale"),
    ({"host": "ignored", "extra": json.dumps({"tracking_uri": "databricks"})}, "databricks"),
])
def test_kale_mlflow_connection_fields(fields, uri, monkeypatch):
    from airflow.models.connection import Connection

    from kale_airflow.get_provider_info import get_provider_info
    from kale_airflow.registry.connection import tracking_uri_of

    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(var, "before")  # restored (removed) after the test
    assert tracking_uri_of(Connection(conn_id="c", conn_type="kale_mlflow", **fields)) == uri
    tracking_uri_of(Connection(conn_id="c", conn_type="kale_mlflow", host="h", login="me", password="pw"))
    import os

    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "me"
    assert {"connection-type": "kale_mlflow", "hook-class-name": "kale_airflow.registry.connection.KaleMlflowHook"} \
        in get_provider_info()["connection-types"]


def test_the_kale_kafka_connection_type_is_declared_and_is_what_the_kafka_stream_reads(monkeypatch):
    """Airflow's providers manager lists the hook under the declared type (a misnamed class or a
    conn_type that differs from the declaration drops it), and a connection of that type gives
    the Kafka stream its brokers and SASL settings (a type the stream refused would raise)."""
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    from kale_airflow.stream.connection import KaleKafkaHook

    info = ProvidersManagerTaskRuntime().hooks["kale_kafka"]
    assert (info.hook_class_name, info.package_name) == ("kale_airflow.stream.connection.KaleKafkaHook", "kale-airflow")
    monkeypatch.setenv("AIRFLOW_CONN_KALE_KAFKA", json.dumps({
        "conn_type": "kale_kafka", "host": "b1.example:9093,b2.example:9093", "login": "alice", "password": "pw",
        "extra": {"ssl.ca.location": "/etc/ca.pem"}}))
    assert KaleKafkaHook().config() == ("b1.example:9093,b2.example:9093", {
        "ssl.ca.location": "/etc/ca.pem", "sasl.username": "alice", "sasl.password": "pw",
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"})
    assert KaleKafkaHook.get_ui_field_behaviour()["relabeling"]["host"] == "Bootstrap servers"


FLEET = {"fleet": {"gpus": 8}, "jobs": [{"name": "ranking", "stream_url": "sqlite:///ranking.db", "priority": 3},
                                        {"name": "ads", "stream_url": "sqlite:///ads.db"}]}


def test_pin_release_and_status_per_job_and_in_total(kale_home, capsys):
    """Bug classes: a pin recorded for the wrong job (or none), ``kale status`` of a fleet
    failing for want of a job name, the fleet's total missing, a job name not in the file
    accepted."""
    (kale_home / "kale.yaml").write_text(json.dumps(FLEET))
    db = f"sqlite:///{kale_home / 'kale.db'}"
    StateStore(db, "ranking").set_current_generation("g000001-3w", 3)
    StateStore(db, "ads").set_current_generation("g000001-2w", 2)
    assert main(["pin", "ads", "4", "--for", "2h", "--note", "final"]) == 0
    assert "job ads pinned to 4 worker(s) until" in capsys.readouterr().out
    assert StateStore(db, "ads").get_value("fleet/pin")["workers"] == 4
    assert StateStore(db, "ranking").get_value("fleet/pin") is None

    assert main(["status", "--no-models"]) == 0
    text = capsys.readouterr().out
    assert "fleet: 2 jobs, 5 worker(s) in their current generations of a budget of 8" in text
    ranking, ads = text.index("job ranking:"), text.index("job ads:")
    assert "pinned to 4 worker(s)" in text[ads:] and "pinned" not in text[ranking:ads]
    assert "priority 3" in text[ranking:ads] and "generation: g000001-2w with 2 worker(s)" in text[ads:]
    assert main(["status", "--no-models", "--json", "--job", "ads"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["job"] == "ads" and one["pin"]["note"] == "final" and "jobs" not in one

    assert main(["release", "ads"]) == 0 and "pin to 4 worker(s) released" in capsys.readouterr().out
    assert main(["release", "ads"]) == 0 and "was not pinned" in capsys.readouterr().out
    assert main(["pin", "ads", "4", "--until", "2001-01-01"]) == 2
    assert "must end in the future" in capsys.readouterr().err
    assert main(["pin", "feed", "2", "--for", "1h"]) == 2
    assert "no job 'feed' in this deployment; its jobs: ranking, ads" in capsys.readouterr().err
