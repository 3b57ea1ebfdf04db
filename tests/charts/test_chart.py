"""The Helm chart rendered by the real Helm engine (helm-python-sdk), linted, and every
manifest validated strictly against the Kubernetes schema."""

from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

from kale_airflow.runtime.kubernetes import KUBERNETES_API_CALLS

CHART = Path(__file__).resolve().parents[2] / "charts" / "kale-airflow"
DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def chart():
    return helm_python.Chart.load(str(CHART))


def render(chart, values=None):
    out = chart.render(values or {}, name="kale", namespace="airflow")
    return [d for path, text in out.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d], out


def test_lint_has_no_errors():
    assert helm_python.lint(str(CHART))["errors"] == []


@pytest.mark.parametrize("values", [{}, {"mlflow": {"enabled": True}}, {"dags": {"configMap": False},
                                                                        "checkpoints": {"create": False}}],
                         ids=["defaults", "with-mlflow", "no-dags-no-pvc"])
@pytest.mark.parametrize("version", ["1.25.0", "1.37.0"])
def test_every_manifest_validates_strictly(chart, values, version):
    docs, _ = render(chart, values)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_dags_and_config_ship_as_configmaps(chart):
    docs, notes = render(chart)
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    assert set(maps["kale-dags"]["data"]) == {p.name for p in DAGS.glob("*.py")}
    assert maps["kale-dags"]["data"]["kale_autoscaler.py"] == (DAGS / "kale_autoscaler.py").read_text()
    config = yaml.safe_load(maps["kale-config"]["data"]["kale.yaml"])
    from kale_airflow.config import Deployment

    Deployment(**config)  # the chart's default config is a valid deployment
    assert "KALE_CONFIG" in notes["kale-airflow/templates/NOTES.txt"]


def test_role_grants_exactly_what_the_code_calls(chart):
    docs, _ = render(chart)
    role = next(d for d in docs if d["kind"] == "Role")
    granted = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"]}
    assert granted == KUBERNETES_API_CALLS
    assert role["metadata"]["namespace"] == "kale-training"
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert {s["name"] for s in binding["subjects"]} == {"airflow-worker", "airflow-triggerer"}


def test_service_account_names_are_values(chart):
    docs, _ = render(chart, {"airflow": {"namespace": "orchestration", "workerServiceAccount": "wk",
                                         "triggererServiceAccount": "tr"}})
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert {(s["name"], s["namespace"]) for s in binding["subjects"]} == {("wk", "orchestration"),
                                                                           ("tr", "orchestration")}


@pytest.mark.parametrize(
    "values, where",
    [
        ({"training": {"namespace": "Bad_NS"}}, "/training/namespace"),
        ({"config": {"stream_url": "redis://x", "worker_backend": "kubernetes"}}, "/config/stream_url"),
        ({"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "slurm"}}, "/config/worker_backend"),
        ({"checkpoints": {"size": "lots"}}, "/checkpoints/size"),
        ({"mlflow": {"enabeld": True}}, "enabeld"),
    ],
    ids=["namespace", "stream-url", "backend", "size", "typo"],
)
def test_values_schema_rejects_bad_values(chart, values, where):
    with pytest.raises(helm_python.HelmValuesError) as err:
        chart.validate_schema(values)
    assert where in str(err.value)
