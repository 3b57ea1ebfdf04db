"""``kale config validate`` refuses every URL the components refuse when they open it, with the
very message they raise (it runs the same checks, connecting to nothing), and accepts the URLs
they accept. One table per kind: the stream (``stream_url`` in the file), the control-plane
database (``KALE_DATABASE_URL``, ``KALE_DB_AUTO_UPGRADE``) and MLflow (``KALE_MLFLOW_URI``)."""

from __future__ import annotations

import pytest

from kale_airflow.cli.main import main
from kale_airflow.registry.mlflow_registry import RegistryUnavailable, registry_client
from kale_airflow.store.database import Database, DatabaseError, masked
from kale_airflow.stream import StreamError, open_stream


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    for var in ("KALE_CONFIG", "KALE_DATABASE_URL", "KALE_MLFLOW_CONN_ID", "KALE_DB_AUTO_UPGRADE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KALE_MLFLOW_URI", "http://127.0.0.1:1")  # a server URL: never asked by validate
    return tmp_path


def validate(capsys) -> tuple[int, str]:
    code = main(["config", "validate"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def runtime_message(open_it, error) -> str:
    with pytest.raises(error) as err:
        open_it()
    return str(err.value)


REFUSED_STREAMS = {
    "kafka-credentials": "kafka://kale:s3cret-pw@broker:9092/samples",
    "airflow-conn-credentials": "airflow-conn://kale:s3cret-pw@kafka_conn/samples",
    "http-is-no-stream": "http://x",
    "redis-with-password": "redis://kale:s3cret-pw@cache:6379/0",
    "kafka-without-topic": "kafka://broker:9092/",
    "kafka-without-broker": "kafka:///samples",
    "airflow-conn-without-topic": "airflow-conn://kafka_conn",
    "embedded-without-file": "sqlite:///",
}


@pytest.mark.parametrize("url", REFUSED_STREAMS.values(), ids=list(REFUSED_STREAMS))
def test_a_stream_url_the_stream_refuses_is_refused_with_its_message(home, capsys, url):
    message = runtime_message(lambda: open_stream(url), StreamError)
    (home / "kale.yaml").write_text(f"stream_url: '{url}'\n")
    code, out = validate(capsys)
    assert code == 2 and f"{home / 'kale.yaml'}: invalid configuration:\n  stream_url: {message}" in out, out
    assert "s3cret-pw" not in out


REFUSED_DATABASES = {
    "unsupported-dialect": ({"KALE_DATABASE_URL": "mysql://kale:s3cret-pw@db/kale"}, "KALE_DATABASE_URL"),
    "http-is-no-database": ({"KALE_DATABASE_URL": "http://db.example/kale"}, "KALE_DATABASE_URL"),
    "bad-port": ({"KALE_DATABASE_URL": "postgresql://kale:s3cret-pw@db:port/kale"}, "KALE_DATABASE_URL"),
    "unparsable": ({"KALE_DATABASE_URL": "pg sql://kale:s3cret-pw@db/kale"}, "KALE_DATABASE_URL"),
    "bad-auto-upgrade": ({"KALE_DB_AUTO_UPGRADE": "maybe"}, "KALE_DB_AUTO_UPGRADE"),
}


@pytest.mark.parametrize(("environ", "setting"), REFUSED_DATABASES.values(), ids=list(REFUSED_DATABASES))
def test_a_database_setting_the_store_refuses_is_refused_with_its_message(home, capsys, monkeypatch, environ,
                                                                           setting):
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    url = environ.get("KALE_DATABASE_URL", f"sqlite:///{home / 'kale.db'}")
    # ValueError: SQLAlchemy's own for a bad port; validate shows the message masked (the store
    # quotes an unparsable URL whole, password included)
    message = masked(runtime_message(lambda: Database(url), (DatabaseError, ValueError)))
    code, out = validate(capsys)
    assert code == 2 and f"environment: invalid configuration:\n  {setting}: {message}" in out, out
    assert "s3cret-pw" not in out and not (home / "kale.db").exists()


REFUSED_TRACKING_URIS = {
    "unsupported-scheme": "ftp://mlflow.example/store",
    "a-folder": "mlruns",
    "a-file-uri": "file:///tmp/mlruns",
}


@pytest.mark.parametrize("uri", REFUSED_TRACKING_URIS.values(), ids=list(REFUSED_TRACKING_URIS))
def test_a_tracking_uri_the_registry_refuses_is_refused_with_its_message(home, capsys, monkeypatch, uri):
    monkeypatch.setenv("KALE_MLFLOW_URI", uri)
    message = runtime_message(lambda: registry_client(uri), RegistryUnavailable)
    code, out = validate(capsys)
    assert code == 2 and f"environment: invalid configuration:\n  KALE_MLFLOW_URI: {message}" in out, out
    assert not (home / "mlruns").exists()


def test_file_and_environment_problems_are_reported_together(home, capsys, monkeypatch):
    (home / "kale.yaml").write_text("stream_url: 'http://x'\n")
    monkeypatch.setenv("KALE_MLFLOW_URI", "mlruns")
    code, out = validate(capsys)
    assert code == 2 and "kale.yaml: invalid configuration:\n  stream_url: unknown stream URL" in out
    assert "\nenvironment: invalid configuration:\n  KALE_MLFLOW_URI: the tracking URI mlruns is a folder" in out


ACCEPTED = {
    "kafka": ("kafka://b1:9092,b2:9092/samples", "postgresql://kale:pw@db:5432/kale", "https://mlflow.example"),
    "airflow-conn": ("airflow-conn://kafka_conn/samples", "sqlite:///{home}/kale.db", "sqlite:///{home}/mlflow.db"),
    "connections": ("sqlite:///{home}/stream.db", "{home}/kale.db", "databricks"),
}


@pytest.mark.parametrize(("stream", "database", "mlflow"), ACCEPTED.values(), ids=list(ACCEPTED))
def test_urls_the_components_accept_are_valid_without_connecting(home, capsys, monkeypatch, stream, database,
                                                                 mlflow):
    """Nothing listens at these hosts and no Airflow connection exists: validate asks none of them."""
    (home / "kale.yaml").write_text(f"stream_url: '{stream.format(home=home)}'\n")
    monkeypatch.setenv("KALE_DATABASE_URL", database.format(home=home))
    monkeypatch.setenv("KALE_MLFLOW_URI", mlflow.format(home=home))
    code, out = validate(capsys)
    assert code == 0 and "kale.yaml: valid" in out, out
    assert sorted(p.name for p in home.iterdir()) == ["kale.yaml"]  # nothing opened, nothing created
