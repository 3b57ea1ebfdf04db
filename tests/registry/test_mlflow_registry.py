"""The MLflow registry workflow against a real SQLite MLflow store in tmp_path.

Only MLflow's "not found" means "no champion"; any other registry error raises
RegistryUnavailable and promotes nothing. The read path (autoscaler, Kale page) changes no
MLflow global and no environment variable; the write path restores what it changes.
"""

from __future__ import annotations

import itertools
import re
import json
import os

import pytest
from mlflow.exceptions import MlflowException, RestException
from mlflow.protos.databricks_pb2 import (
    INVALID_PARAMETER_VALUE,
    PERMISSION_DENIED,
    RESOURCE_DOES_NOT_EXIST,
)

from kale_airflow.config import Settings
from kale_airflow.registry import mlflow_registry as reg
from kale_airflow.registry.mlflow_registry import (
    CHALLENGER,
    CHAMPION,
    RegistryUnavailable,
)
from tests.conftest import daily_series

CLOSED = "http://127.0.0.1:1"  # nothing listens on port 1


def _mlflow_state() -> tuple:
    from mlflow.tracking import _model_registry, _tracking_service, fluent

    return (_tracking_service.utils._tracking_uri, _model_registry.utils._registry_uri, fluent._active_experiment_id,
            {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")})


@pytest.fixture(autouse=True)
def restore_mlflow_globals():
    """Every MLflow global (tracking/registry URI, experiment, MLFLOW_* env) as it was before the test."""
    import mlflow
    from mlflow.tracking import _model_registry, fluent

    tracking, registry, experiment, env = _mlflow_state()
    yield
    mlflow.set_tracking_uri(tracking)
    _model_registry.utils._registry_uri = registry
    fluent._active_experiment_id = experiment
    for key in [k for k in os.environ if k.startswith("MLFLOW_")]:
        del os.environ[key]
    os.environ.update(env)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite registry for the module (creating its tables takes seconds); tests use their own model names."""
    home = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{home / 'mlflow.db'}"
    reg.registry_client(uri).search_experiments(max_results=1)
    return uri


_names = (f"model-{i}" for i in itertools.count())


def _model(uri: str, champion: bool) -> tuple[str, str, str | None]:
    """A registered model with an optional champion v1 and a challenger; (name, challenger, champion)."""
    client = reg.registry_client(uri)
    name = next(_names)
    client.create_registered_model(name)
    champ = None
    if champion:
        champ = client.create_model_version(name, source="file:///nowhere/champion").version
        client.set_registered_model_alias(name, CHAMPION, champ)
    chal = client.create_model_version(name, source="file:///nowhere/challenger").version
    client.set_registered_model_alias(name, CHALLENGER, chal)
    return name, str(chal), None if champ is None else str(champ)


# ----------------------------------------------------------------------------- (a) review table
CASES = [(relation, auto, present)
         for relation in ("better", "worse", "equal") for auto in (True, False) for present in (True, False)]


@pytest.mark.parametrize(("relation", "auto_promote", "champion_present"), CASES)
def test_review_promotes_only_a_winning_challenger_with_auto_promote(store, relation, auto_promote,
                                                                     champion_present):
    name, chal, champ = _model(store, champion_present)
    champion_score = 1.0 if champion_present else None
    challenger_score = {"better": 0.5, "worse": 2.0, "equal": 1.0}[relation]
    wins = (not champion_present) or relation == "better"  # lower is better; a tie keeps the champion

    out = reg.review(reg.registry_client(store), name, chal, challenger_score, champion_score, "mase",
                     auto_promote, {"challenger mase": challenger_score})

    client = reg.registry_client(store)
    now = reg.current_version(client, name, CHAMPION)
    tags = client.get_model_version(name, chal).tags
    assert out.promoted is (wins and auto_promote)
    assert out.champion_version == champ
    assert now == (chal if wins and auto_promote else champ)
    assert tags["kale.review"] == ("promoted" if wins and auto_promote else "pending")
    assert tags["kale.challenger_wins"] == str(wins).lower()
    assert ("no champion yet" in out.reason) is (not champion_present)
    if not out.promoted:  # the reviewer is told whether it won, and how to promote it
        assert re.fullmatch(r"held for review: (no champion yet|mase \S+ vs champion v\d+ \S+)"
                            r"( \(the challenger does not win\))?; promote it with `kale promote model-\d+ \d+` "
                            r"\(or move the 'champion' alias in the MLflow UI\)", out.reason), out.reason
        assert ("does not win" in out.reason) is (not wins)
    if champ is not None:
        assert "kale.review" not in client.get_model_version(name, champ).tags


def test_review_records_the_comparison_and_the_verdict_for_the_reviewer(store):
    """Bug class: the comparison table or the verdict missing from the version's description
    (a reviewer promotes blind in the MLflow UI), or a held challenger not told it lost."""
    name, chal, champ = _model(store, champion=True)
    client = reg.registry_client(store)
    out = reg.review(client, name, chal, 2.0, 1.0, "mase", True, {"challenger mase": 2.0, "champion mase": 1.0})
    lines = client.get_model_version(name, chal).description.splitlines()
    assert lines[0] == f"Challenger v{chal}: mase 2 vs champion v{champ} 1."
    assert lines[2:6] == ["| metric | value |", "| --- | --- |", "| challenger mase | 2 |", "| champion mase | 1 |"]
    assert lines[-1] == out.reason and not out.promoted
    assert out.reason.startswith(f"held for review: mase 2 vs champion v{champ} 1 (the challenger does not win); ")
    assert f"promote it with `kale promote {name} {chal}`" in out.reason
    assert out.to_dict() == {"version": chal, "promoted": False, "reason": out.reason, "champion_version": champ,
                             "comparison": {"challenger mase": 2.0, "champion mase": 1.0}}


def test_review_with_a_score_but_no_champion_alias_counts_as_no_champion(store):
    name, chal, _ = _model(store, champion=False)
    out = reg.review(reg.registry_client(store), name, chal, 5.0, 1.0, "mase", True, {})
    assert out.promoted and out.reason == "promoted automatically: no champion yet"


def test_promote_or_hold_against_the_store(store, tmp_path):
    from kale_airflow.pipelines.common import promote_or_hold

    name, chal, champ = _model(store, champion=True)
    out = promote_or_hold(Settings(tmp_path, store), name, chal, {"mase": 1.5}, {"mase": 1.0}, "mase", True)
    assert not out["promoted"] and out["champion_version"] == champ
    # bug classes: the metric's name, the challenger's figures or the auto-promote flag lost on the way
    assert out["reason"].startswith("held for review: mase 1.5 vs champion")
    assert out["comparison"] == {"challenger mase": 1.5, "champion mase": 1.0}
    name2, chal2, _ = _model(store, champion=True)
    won = promote_or_hold(Settings(tmp_path, store), name2, chal2, {"mase": 0.5}, {"mase": 1.0}, "mase", True)
    assert won["promoted"] and reg.current_version(reg.registry_client(store), name2, CHAMPION) == chal2
    assert reg.current_version(reg.registry_client(store), name, CHAMPION) == champ


# ----------------------------------------------------------------------------- (b) failures promote nothing
class FailingLookups:
    """A real client whose registry reads fail like MLflow does (the fake is MLflow, not our logic)."""

    def __init__(self, real, exc: BaseException):
        self.real, self.exc, self._registry_uri = real, exc, "fake://registry"

    def get_model_version_by_alias(self, name, alias):
        raise self.exc

    def get_registered_model(self, name):
        raise self.exc

    def create_registered_model(self, *a, **kw):  # pragma: no cover - must not be reached
        raise AssertionError("created a registered model after a failed lookup")

    def __getattr__(self, attr):
        return getattr(self.real, attr)


FAILURES = {
    "permission": MlflowException("Permission denied for model", error_code=PERMISSION_DENIED),
    "rest 403": RestException({"error_code": "PERMISSION_DENIED", "message": "User lacks READ on model"}),
    "server error": RestException({"error_code": "INTERNAL_ERROR", "message": "database is locked"}),
    "connection lost": MlflowException("API request to http://mlflow/api/2.0/mlflow/registered-models/alias "
                                       "failed with exception ConnectionError: Max retries exceeded"),
    "bad request": MlflowException("Invalid model name ''", error_code=INVALID_PARAMETER_VALUE),
    "not mlflow": OSError("network is unreachable"),
}


@pytest.mark.parametrize("failure", FAILURES, ids=list(FAILURES))
@pytest.mark.parametrize("auto_promote", [True, False])
def test_a_failed_champion_lookup_raises_and_changes_nothing(store, failure, auto_promote):
    name, chal, champ = _model(store, champion=True)
    real = reg.registry_client(store)
    with pytest.raises(RegistryUnavailable, match="refused or failed") as err:
        reg.review(FailingLookups(real, FAILURES[failure]), name, chal, 0.1, 1.0, "mase", auto_promote, {})
    assert err.value.__cause__ is FAILURES[failure]
    assert "No model or alias was changed" in str(err.value)
    # which registry refused which lookup (bug class: an error that names neither)
    assert f"MLflow at fake://registry refused or failed the lookup of {name}@champion (" in str(err.value)
    assert reg.current_version(real, name, CHAMPION) == champ
    assert "kale.review" not in real.get_model_version(name, chal).tags


def test_promote_or_hold_raises_when_the_registry_refuses(store, tmp_path, monkeypatch):
    from kale_airflow.pipelines.common import promote_or_hold

    name, chal, champ = _model(store, champion=True)
    real = reg.registry_client(store)
    monkeypatch.setattr(reg, "_client", lambda uri: FailingLookups(real, FAILURES["permission"]))
    with pytest.raises(RegistryUnavailable, match="PERMISSION_DENIED"):
        promote_or_hold(Settings(tmp_path, store), name, chal, {"mase": 0.1}, None, "mase", True)
    assert reg.current_version(real, name, CHAMPION) == champ


def test_an_unreachable_registry_fails_fast_everywhere(tmp_path):
    import time

    from kale_airflow.control.autoscaler import MlflowChampions
    from kale_airflow.pipelines.common import promote_or_hold

    t0 = time.monotonic()
    with pytest.raises(RegistryUnavailable, match=f"MLflow at {CLOSED} is unreachable"):
        promote_or_hold(Settings(tmp_path, CLOSED), "m", "2", {"mase": 0.1}, None, "mase", True)
    with pytest.raises(RegistryUnavailable, match="No model or alias was changed"):
        MlflowChampions(CLOSED).versions()
    with pytest.raises(RegistryUnavailable, match="unreachable"):
        reg.load_champion(reg.FORECASTER_MODEL, CLOSED)
    with pytest.raises(RegistryUnavailable, match="unreachable"), reg.mlflow_at(CLOSED):
        pass
    assert time.monotonic() - t0 < 10  # no minutes of MLflow retries


def test_no_registry_error_shows_the_password_of_the_tracking_uri(tmp_path, monkeypatch):
    """Every way in fails on the closed port with ``user:***@`` where the password was, and so
    does the kale_mlflow connection's test in Admin > Connections."""
    from kale_airflow.control.autoscaler import MlflowChampions
    from kale_airflow.registry.connection import KaleMlflowHook

    uri = CLOSED.replace("http://", "http://kale:s3cret-pw@")
    calls = [lambda: reg.check_reachable(uri), lambda: reg.registry_client(uri), MlflowChampions(uri).versions,
             lambda: reg.load_champion(reg.FORECASTER_MODEL, uri),
             lambda: reg.load_version(reg.FORECASTER_MODEL, "1", uri), lambda: reg.mlflow_at(uri).__enter__()]
    for call in calls:
        with pytest.raises(RegistryUnavailable) as err:
            call()
        assert "s3cret-pw" not in str(err.value) and "http://kale:***@127.0.0.1:1" in str(err.value)
    monkeypatch.setenv("AIRFLOW_CONN_KALE_MLFLOW_LEAK", json.dumps({"conn_type": "kale_mlflow", "host": uri}))
    ok, message = KaleMlflowHook("kale_mlflow_leak").test_connection()
    assert not ok and "s3cret-pw" not in message and "kale:***@" in message


def test_register_does_not_create_a_model_after_a_failed_lookup(store):
    real = reg.registry_client(store)
    with pytest.raises(RegistryUnavailable, match="^MLflow at fake://registry refused or failed the lookup of "
                                                  "registered model never-created .*PERMISSION_DENIED"):
        reg.register(FailingLookups(real, FAILURES["permission"]), "never-created", "models:/m-none", "d")
    assert reg.current_version(real, "never-created", CHALLENGER) is None


def test_the_kale_page_reports_a_refusing_registry_instead_of_no_models(store, tmp_path, monkeypatch):
    from kale_airflow.ui.app import _models

    real = reg.registry_client(store)
    monkeypatch.setattr(reg, "_client", lambda uri: FailingLookups(real, FAILURES["permission"]))
    rows = _models(Settings(tmp_path, store))
    assert len(rows) == 1 and rows[0]["model"] == "MLflow unavailable" and "PERMISSION_DENIED" in rows[0]["review"]


# ----------------------------------------------------------------------------- (c) what "absent" means
def test_current_version_is_none_only_for_a_missing_model_or_alias(store):
    client = reg.registry_client(store)
    name, chal, _ = _model(store, champion=False)
    assert reg.current_version(client, "no-such-model", CHAMPION) is None  # RESOURCE_DOES_NOT_EXIST
    assert reg.current_version(client, name, CHAMPION) is None  # INVALID_PARAMETER_VALUE "alias ... not found"
    assert reg.current_version(client, name, CHALLENGER) == chal


@pytest.mark.parametrize(("exc", "absent"), [
    # What MLflow 3.17 raises, SQLite store and REST store (RestException) alike:
    (MlflowException("Registered Model with name=x not found", error_code=RESOURCE_DOES_NOT_EXIST), True),
    (MlflowException("Registered model alias champion not found.", error_code=INVALID_PARAMETER_VALUE), True),
    (RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "Registered Model with name=x not found"}),
     True),
    (RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "Registered model alias champion not found."}),
     True),
    # Everything else is a failure, not an absence:
    (RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "Invalid alias name"}), False),
    (MlflowException("denied", error_code=PERMISSION_DENIED), False),
    (MlflowException("no such host"), False),  # INTERNAL_ERROR
    (RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "try later"}), False),
    (KeyError("not found"), False),
])
def test_only_not_found_is_absent(exc, absent):
    assert reg.is_absent(exc) is absent


def test_current_version_raises_for_anything_but_not_found(store):
    real = reg.registry_client(store)
    for exc in FAILURES.values():
        with pytest.raises(RegistryUnavailable):
            reg.current_version(FailingLookups(real, exc), "m", CHAMPION)


# ----------------------------------------------------------------------------- (d) no global state
@pytest.fixture(scope="module")
def champions(store, tmp_path_factory):
    """Real pyfunc champions of both models, logged through the write path."""
    import mlflow

    from kale_airflow.core.forecast import get_forecaster
    from kale_airflow.core.throughput import ThroughputModel
    from kale_airflow.forecasting.persist import save_forecaster
    from kale_airflow.registry.pyfunc import ForecasterModel, ThroughputModelPyfunc

    work = tmp_path_factory.mktemp("models")
    save_forecaster(get_forecaster("seasonal").fit(daily_series(days=2)), work / "forecaster")
    (work / "throughput.json").write_text(json.dumps(
        ThroughputModel.fit([1, 2, 4, 8], [10.0, 19.0, 37.0, 70.0]).to_dict()))
    before = _mlflow_state()
    versions = {}
    for name, model, artifacts in ((reg.FORECASTER_MODEL, ForecasterModel(), {"forecaster": str(work / "forecaster")}),
                                   (reg.THROUGHPUT_MODEL, ThroughputModelPyfunc(),
                                    {"throughput": str(work / "throughput.json")})):
        with reg.mlflow_at(store, (work / "artifacts").as_uri()) as client:
            with mlflow.start_run():
                info = mlflow.pyfunc.log_model(name="model", python_model=model, artifacts=artifacts,
                                               pip_requirements=["pandas"])
            version = reg.register(client, name, info.model_uri, "test")
            client.set_registered_model_alias(name, CHAMPION, version)
            versions[name] = version
    assert _mlflow_state() == before  # the write path restores every global it set
    # register() creates the model with its description (bug class: the description dropped)
    assert reg.registry_client(store).get_registered_model(reg.FORECASTER_MODEL).description == "test"
    return versions


def test_the_read_path_changes_no_mlflow_global_or_environment(store, champions, tmp_path):
    import mlflow

    from kale_airflow.control.autoscaler import MlflowChampions
    from kale_airflow.ui.app import _models

    before = (mlflow.get_tracking_uri(), mlflow.get_registry_uri(), dict(os.environ), _mlflow_state())
    source = MlflowChampions(store)
    assert source.versions() == (champions[reg.FORECASTER_MODEL], champions[reg.THROUGHPUT_MODEL])
    forecaster, throughput = source.load()
    assert forecaster.name == "seasonal" and throughput.predict(__import__("numpy").array([2.0]))[0] > 0
    assert reg.load_champion(reg.THROUGHPUT_MODEL, store).predict(
        __import__("pandas").DataFrame({"workers": [1, 4]}))["samples_per_s"].iloc[1] > 0
    rows = _models(Settings(tmp_path, store))
    assert {(r["model"], r["alias"]) for r in rows} >= {(reg.FORECASTER_MODEL, CHAMPION),
                                                        (reg.THROUGHPUT_MODEL, CHAMPION)}
    with pytest.raises(RegistryUnavailable):
        MlflowChampions(CLOSED).versions()
    after = (mlflow.get_tracking_uri(), mlflow.get_registry_uri(), dict(os.environ), _mlflow_state())
    assert after == before


def test_load_champion_without_a_champion_is_a_lookup_error(store):
    name, _, _ = _model(store, champion=False)
    with pytest.raises(LookupError, match="no model-"):
        reg.load_champion(name, store)


def test_one_cached_client_per_uri(store):
    assert reg.registry_client(store) is reg.registry_client(store)


@pytest.mark.parametrize("name, job", [
    ("kale-traffic-forecaster", "default"), ("kale-throughput-model", "default"),
    ("kale-traffic-forecaster-ads", "ads"), ("kale-throughput-model-ads-eu", "ads-eu"),
    ("kale-traffic-forecasterx", None), ("kale-throughput", None), ("someone-elses-model", None),
])
def test_a_registered_models_job_is_the_suffix_after_its_kale_name(name, job):
    from kale_airflow.registry.mlflow_registry import job_of_model

    assert job_of_model(name) == job


FILE_STORE = ("is a folder, MLflow's file store, which MLflow 3 refuses (unless MLFLOW_ALLOW_FILE_STORE=true): use "
              "sqlite:///PATH or an MLflow server's http(s):// URL in KALE_MLFLOW_URI. No model or alias was changed.")


@pytest.mark.parametrize(("uri", "message"), [
    ("", "the MLflow tracking URI is empty: set KALE_MLFLOW_URI (http(s)://HOST:PORT or sqlite:///PATH) or "
         "KALE_MLFLOW_CONN_ID. No model or alias was changed."),
    ("/srv/mlruns", f"the tracking URI /srv/mlruns {FILE_STORE}"),
    ("file:///srv/mlruns", f"the tracking URI file:///srv/mlruns {FILE_STORE}"),
    ("bogus://x", "MLflow cannot open the tracking URI bogus://x (Model registry functionality is unavailable; "),
], ids=["empty", "folder", "file", "unknown scheme"])
def test_a_tracking_uri_mlflow_would_refuse_is_refused_first_and_says_what_to_set(uri, message, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(reg.TrackingUriError) as err:
        reg.check_tracking_uri(uri)
    assert str(err.value).startswith(message)
    if uri == "bogus://x":
        assert str(err.value).endswith("); fix KALE_MLFLOW_URI. No model or alias was changed.")


@pytest.mark.parametrize("uri", ["databricks", "databricks-uc", "uc", "sqlite:///srv/mlflow.db", "http://mlflow:5000",
                                 "airflow-connection:kale_mlflow"])
def test_named_stores_databases_and_servers_pass_the_tracking_uri_check(uri, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    reg.check_tracking_uri(uri)


def test_the_file_store_passes_where_mlflow_is_told_to_allow_it(monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    reg.check_tracking_uri("/srv/mlruns")
    reg.check_tracking_uri("file:///srv/mlruns")
