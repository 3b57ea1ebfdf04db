"""The chart's Prometheus pieces (decision exporter, PodMonitor, ServiceMonitor, Grafana
dashboard ConfigMap) rendered by the real Helm engine, and the dashboard JSON checked: it
loads, has the panels the README promises, and its PromQL names only series we export or
the documented Kafka exporter series."""

import json
import re
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest

from kale_airflow.control.exposition import DecisionMetrics
from kale_airflow.runtime.exposition import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kale-airflow"
DASHBOARD = CHART / "files" / "grafana-dashboard.json"
KAFKA_EXPORTER_SERIES = {"kafka_topic_partition_current_offset", "kafka_consumergroup_lag"}
ALL_ON = {"metrics": {"exporter": {"enabled": True}, "podMonitor": {"enabled": True, "labels": {"release": "kps"}},
                      "serviceMonitor": {"enabled": True}, "dashboard": {"configMap": True}}}


# A release needs a database Secret (the schema refuses one without); database.url renders kale-database.
DATABASE = {"database": {"url": "postgresql+psycopg://kale@db.kale:5432/kale"}}


def render(values):
    out = helm_python.Chart.load(str(CHART)).render({**DATABASE, **values}, name="kale", namespace="airflow")
    return [d for path, text in out.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def exported_names() -> set[str]:
    w, d = WorkerMetrics(), DecisionMetrics()
    w.identify(0, "g", 1)
    w.observe_step(1, 0.1, lag={"0/0": 1.0})  # labelled series appear once they have a value
    from kale_airflow.core.policies import Decision, Observation, Reason
    d.record(Decision(1, Reason.HOLD, "", {"forecast_upper": 1.0}), Observation(0.0, 1), forecast_quantile=0.9)
    text = (generate_latest(w.registry) + generate_latest(d.registry)).decode()
    return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}


def test_metrics_are_off_by_default():
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render({})}
    assert not {k for k in kinds if "exporter" in k[1] or k[0] in ("PodMonitor", "ServiceMonitor")}


@pytest.mark.parametrize("version", ["1.25.0", "1.37.0"])
def test_everything_on_renders_and_validates(version):
    docs = render(ALL_ON)
    builtin = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    for doc in builtin:
        kubernetes_validate.validate(doc, version, strict=True)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    dep = by[("Deployment", "kale-exporter")]
    pod = dep["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9401"
    c = pod["spec"]["containers"][0]
    assert c["command"][:3] == ["python", "-m", "kale_airflow.control.exposition"]
    assert (c["image"], c["imagePullPolicy"]) == ("ghcr.io/kale-airflow/worker:0.1.0", "IfNotPresent")  # images.worker
    env = {e["name"]: e for e in c["env"]}
    assert env["KALE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "kale-database"
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    svc = by[("Service", "kale-exporter")]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    sm = by[("ServiceMonitor", "kale-exporter")]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    pm = by[("PodMonitor", "kale-workers")]
    assert pm["metadata"]["namespace"] == "kale-training" and pm["metadata"]["labels"]["release"] == "kps"
    from kale_airflow.runtime.kubernetes import WORKER_LABELS
    assert pm["spec"]["selector"]["matchLabels"].items() <= WORKER_LABELS.items()
    cm = by[("ConfigMap", "kale-grafana-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["kale-airflow.json"]) == json.loads(DASHBOARD.read_text())


def test_unknown_metrics_values_are_refused():
    with pytest.raises(Exception, match="(?i)additional|schema"):
        render({"metrics": {"exporter": {"enabeld": True}}})


def test_the_dashboard_loads_and_docs_ship_the_same_file():
    assert (ROOT / "docs" / "grafana-dashboard.json").read_text() == DASHBOARD.read_text()
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    titles = [p["title"] for p in dash["panels"]]
    for want in ("Traffic vs capacity", "Workers: desired vs running", "Freshness lag vs SLO",
                 "Decisions by reason", "Rescales"):
        assert want in titles
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert {"h", "w", "x", "y"} <= g.keys() and g["x"] + g["w"] <= 24
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"])


FUNCTIONS_AND_KEYWORDS = {"sum", "avg", "max", "min", "count", "rate", "increase", "by", "without", "on", "ignoring",
                          "group_left", "group_right", "histogram_quantile", "clamp_min", "and", "or", "unless"}


def test_every_dashboard_query_names_only_exported_or_documented_series():
    known = exported_names() | KAFKA_EXPORTER_SERIES
    assert "kale_worker_samples_trained_total" in known and "kale_autoscaler_decisions_total" in known
    dash = json.loads(DASHBOARD.read_text())
    for p in dash["panels"]:
        for t in p["targets"]:
            expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", t["expr"])       # matchers, ranges, strings
            expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)     # grouping labels
            names = {n for n in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
                     if n not in FUNCTIONS_AND_KEYWORDS and not re.fullmatch(r"e\d*", n)}
            assert names, t["expr"]
            assert names <= known, (p["title"], t["expr"], names - known)
