"""The official apache-airflow chart (1.18.0) rendered with the values kale-airflow prints for it
(ConfigMap ``kale-airflow-values``, also in NOTES), for KubernetesExecutor and CeleryExecutor:
every manifest of both charts validates strictly, every Airflow component gets the Kale
configuration and Secrets, every reference resolves, the image and version pins hold, and the
scheduler's init container creates the GPU pool (its command run against a real Airflow database).

The chart is read from a copy outside the project: ``$KALE_AIRFLOW_CHART``, or
``shared/vendor/apache-airflow-chart-1.18.0`` beside this checkout (or beside the checkout it
was cloned from). Without one the tests fail and name the folders they looked in."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KALE_CHART = ROOT / "charts" / "kale-airflow"
VALUES = {"database": {"existingSecret": "kale-db"}, "mlflow": {"enabled": True}}
CHART_ENV = "KALE_AIRFLOW_CHART"
VENDORED = Path("shared") / "vendor" / "apache-airflow-chart-1.18.0"
EXECUTORS = ("KubernetesExecutor", "CeleryExecutor")
K8S_VERSIONS = ("1.25.0", "1.37.0")  # the schemas tests/charts/test_chart.py validates with
# The Airflow components Kale needs, by the official chart's pod label "component" (KubernetesExecutor:
# the task pods of pod_template_file are the workers).
COMPONENTS = ("scheduler", "triggerer", "dag-processor", "api-server", "worker")
SECRETS_GIVEN = {VALUES["database"]["existingSecret"]}  # the user's own Secret, created before installing


def official_chart_dir() -> Path:
    if os.environ.get(CHART_ENV):
        path = Path(os.environ[CHART_ENV])
        if not (path / "Chart.yaml").is_file():
            pytest.fail(f"{CHART_ENV}={path} holds no Chart.yaml: point it at an unpacked apache-airflow chart 1.18.0")
        return path
    bases = [ROOT, *ROOT.parents]
    origin = subprocess.run(["git", "-C", str(ROOT), "remote", "get-url", "origin"], capture_output=True, text=True)
    if origin.returncode == 0 and Path(origin.stdout.strip()).is_dir():  # a clone of a local checkout
        here = Path(origin.stdout.strip()).resolve()
        bases += [here, *here.parents]
    for base in bases:
        if (base / VENDORED / "Chart.yaml").is_file():
            return base / VENDORED
    pytest.fail(f"the official Airflow chart 1.18.0 is in none of {sorted({str(b / VENDORED) for b in bases})}: "
                f"unpack it at ../{VENDORED} beside this checkout or set {CHART_ENV} to its folder")


def kale_render(values: dict = VALUES) -> list[dict]:
    rendered = helm_python.Chart.load(str(KALE_CHART)).render(values, name="kale", namespace="airflow")
    return [d for path, text in rendered.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def kale_overlay(values: dict = VALUES) -> dict:
    """The official chart's values from kale-airflow's ConfigMap (the file NOTES tells to pass with -f)."""
    cm = next(d for d in kale_render(values) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kale-airflow-values")
    return yaml.safe_load(cm["data"]["values.yaml"])


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """The official chart, loaded from a scratch copy whose appVersion is the overlay's airflowVersion.

    The published chart gates its components on ``.Values.airflowVersion``; the vendored copy was
    repackaged to gate them on ``.Chart.AppVersion`` ("3.1.2-python3.12"), which semver reads as a
    pre-release that fails every ">=x.y.z" gate: as shipped it renders no API server, triggerer or
    DAG processor whatever the values say. With appVersion set to the overlay's airflowVersion
    both read the version the overlay pins."""
    copy = tmp_path_factory.mktemp("official") / "airflow"
    shutil.copytree(official_chart_dir(), copy)
    meta = yaml.safe_load((copy / "Chart.yaml").read_text())
    meta["appVersion"] = kale_overlay()["airflowVersion"]
    (copy / "Chart.yaml").write_text(yaml.safe_dump(meta))
    return helm_python.Chart.load(str(copy))


def official_render(chart, overlay: dict, executor: str) -> list[dict]:
    """The official chart's manifests, plus the KubernetesExecutor's task pod (pod_template_file)."""
    rendered = chart.render(overlay | {"executor": executor}, name="airflow", namespace="airflow")
    docs = [d for path, text in rendered.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "airflow-config")
    if "pod_template_file.yaml" in config["data"]:
        docs.append(yaml.safe_load(config["data"]["pod_template_file.yaml"]))
    return docs


@pytest.fixture(scope="module")
def renders(official):
    overlay = kale_overlay()
    return {executor: official_render(official, overlay, executor) for executor in EXECUTORS}


def pod_specs(docs: list[dict]) -> list[tuple[dict, dict, set[str]]]:
    """(pod metadata, pod spec, names of its StatefulSet's volume claim templates) of every
    workload and bare pod."""
    out = []
    for d in docs:
        if d["kind"] == "Pod":
            out.append((d["metadata"], d["spec"], set()))
        elif d["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
            claims = {t["metadata"]["name"] for t in d["spec"].get("volumeClaimTemplates", [])}
            out.append((d["spec"]["template"]["metadata"], d["spec"]["template"]["spec"], claims))
        elif d["kind"] == "CronJob":
            template = d["spec"]["jobTemplate"]["spec"]["template"]
            out.append((template["metadata"], template["spec"], set()))
    return out


def main_container(spec: dict, component: str) -> dict:
    containers = spec["containers"]
    return next((c for c in containers if c["name"] == component), containers[0])


# What every Airflow component reads (release "kale" in namespace airflow, VALUES): kale.yaml from
# the kale-config ConfigMap, the models' MLflow server; KALE_DATABASE_URL comes from the Secret.
KALE_ENV = {"KALE_CONFIG": "/opt/kale/kale.yaml", "KALE_MLFLOW_URI": "http://kale-mlflow.airflow:5000"}


def wiring_problems(docs: list[dict]) -> list[str]:
    """What an Airflow component lacks to run Kale: KALE_CONFIG pointing into the mounted
    kale-config ConfigMap, KALE_DATABASE_URL from the database Secret, KALE_MLFLOW_URI."""
    problems = []
    pods = {(meta.get("labels") or {}).get("component"): spec for meta, spec, _ in pod_specs(docs)}
    for component in COMPONENTS:
        if component not in pods:
            problems.append(f"{component}: not rendered")
            continue
        spec = pods[component]
        container = main_container(spec, component)
        env = {e["name"]: e for e in container.get("env", [])}
        for name, value in KALE_ENV.items():
            if env.get(name, {}).get("value") != value:
                problems.append(f"{component}: no {name}={value}")
        ref = env.get("KALE_DATABASE_URL", {}).get("valueFrom", {}).get("secretKeyRef")
        if ref != {"name": VALUES["database"]["existingSecret"], "key": "url"}:
            problems.append(f"{component}: KALE_DATABASE_URL not from Secret kale-db key url ({ref})")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = [m for m in container.get("volumeMounts", [])
                  if volumes.get(m["name"], {}).get("configMap", {}).get("name") == "kale-config"]
        config = env.get("KALE_CONFIG", {}).get("value", "")
        if not any(config.startswith(m["mountPath"].rstrip("/") + "/") for m in mounts):
            problems.append(f"{component}: KALE_CONFIG {config!r} is not in a mount of ConfigMap kale-config")
    return problems


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_every_manifest_of_both_charts_validates_strictly(renders, executor, version):
    docs = kale_render() + renders[executor]
    assert {"Deployment", "StatefulSet", "Job", "RoleBinding"} <= {d["kind"] for d in docs}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_every_airflow_component_gets_kale_config_and_secrets(renders, executor):
    assert wiring_problems(renders[executor]) == []


def test_a_component_that_loses_kale_config_is_reported(official):
    """The check above fails for the bug it names: an overlay that gives KALE_CONFIG to the
    scheduler alone (scheduler.env instead of the top-level env)."""
    broken = kale_overlay()
    env = broken.pop("env")
    broken["scheduler"]["env"] = env
    problems = wiring_problems(official_render(official, broken, "CeleryExecutor"))
    lost = {p.split(":")[0] for p in problems if "no KALE_CONFIG" in p}
    assert lost == set(COMPONENTS) - {"scheduler"}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_every_reference_resolves(renders, executor):
    """Volume mounts name a volume of their pod; ConfigMaps, Secrets and service accounts exist in
    one of the two releases (or are the user's database Secret); the RoleBinding's subjects are
    service accounts the official chart creates."""
    both = kale_render() + renders[executor]
    names = {kind: {(d["metadata"].get("namespace", "airflow"), d["metadata"]["name"]) for d in both
                    if d["kind"] == kind} for kind in ("ConfigMap", "Secret", "ServiceAccount")}
    names["Secret"] |= {("airflow", s) for s in SECRETS_GIVEN}
    names["ServiceAccount"].add(("airflow", "default"))  # every namespace has it
    missing = []
    for meta, spec, claims in pod_specs(renders[executor]):
        pod = (meta.get("labels") or {}).get("component") or meta.get("name")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in (spec.get("initContainers") or []) + spec["containers"]:
            missing += [f"{pod}/{c['name']}: volume {m['name']}" for m in c.get("volumeMounts", [])
                        if m["name"] not in volumes and m["name"] not in claims]
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ("airflow", ref["name"]) not in names["Secret"]:
                    missing.append(f"{pod}/{c['name']}: Secret {ref['name']} ({e['name']})")
        for v in volumes.values():
            if "configMap" in v and ("airflow", v["configMap"]["name"]) not in names["ConfigMap"]:
                missing.append(f"{pod}: ConfigMap {v['configMap']['name']}")
            if "secret" in v and ("airflow", v["secret"]["secretName"]) not in names["Secret"]:
                missing.append(f"{pod}: Secret {v['secret']['secretName']}")
        account = spec.get("serviceAccountName")
        if account and ("airflow", account) not in names["ServiceAccount"]:
            missing.append(f"{pod}: ServiceAccount {account}")
    assert missing == []
    subjects = [(s["namespace"], s["name"]) for d in kale_render() if d["kind"] == "RoleBinding" for s in d["subjects"]]
    official_accounts = {(d["metadata"].get("namespace", "airflow"), d["metadata"]["name"])
                         for d in renders[executor] if d["kind"] == "ServiceAccount"}
    assert subjects and set(subjects) <= official_accounts


@pytest.mark.parametrize("executor", EXECUTORS)
def test_every_airflow_container_runs_the_pinned_image_and_version(renders, executor):
    overlay = kale_overlay()
    image = f"{overlay['defaultAirflowRepository']}:{overlay['defaultAirflowTag']}"
    docs = renders[executor]
    airflow_pods = [(meta["labels"]["component"], spec) for meta, spec, _ in pod_specs(docs)
                    if (meta.get("labels") or {}).get("tier") == "airflow"
                    and meta["labels"].get("component") not in ("statsd", "redis", "pgbouncer")]
    assert {component for component, _ in airflow_pods} >= set(COMPONENTS)
    wrong = {f"{component}/{c['name']}": c["image"] for component, spec in airflow_pods
             for c in (spec.get("initContainers") or []) + spec["containers"] if c["image"] != image}
    assert wrong == {}
    cfg = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "airflow-config")
    lines = {line.strip() for line in cfg["data"]["airflow.cfg"].splitlines()}
    assert {f"worker_container_repository = {overlay['defaultAirflowRepository']}",
            f"worker_container_tag = {overlay['defaultAirflowTag']}"} <= lines
    # the version the chart is told is the one the image is built on
    base = next(line.split()[1] for line in (ROOT / "docker" / "airflow.Dockerfile").read_text().splitlines()
                if line.startswith("FROM "))
    assert base.split(":")[1].split("-")[0] == overlay["airflowVersion"]
    kale_values = yaml.safe_load((KALE_CHART / "values.yaml").read_text())
    assert overlay["airflowVersion"] == kale_values["airflow"]["version"]


def test_the_official_chart_accepts_the_overlay(official):
    """Every key the overlay sets is one the official chart defines, with the default's kind
    (mapping, list or scalar), and the chart's values.schema.json (when the copy ships one: the
    vendored copy does not) accepts the merged values."""
    defaults = official.values if isinstance(official.values, dict) else official.values()

    def unknown(given, default, path=""):
        if isinstance(default, dict) and isinstance(given, dict):
            return [p for k, v in given.items() for p in
                    (unknown(v, default[k], f"{path}.{k}") if k in default else [f"{path}.{k} (not a value of the chart)"])]
        kind = lambda v: dict if isinstance(v, dict) else list if isinstance(v, list) else "scalar"  # noqa: E731
        return [] if default is None or kind(given) == kind(default) else [f"{path} ({kind(given)}, default {kind(default)})"]

    for executor in EXECUTORS:
        assert unknown(kale_overlay() | {"executor": executor}, defaults) == []
        official.validate_schema(kale_overlay() | {"executor": executor})
    assert unknown({"scheduler": {"extraInitContainer": []}}, defaults) == [".scheduler.extraInitContainer (not a value of the chart)"]


def scheduler_pool_container(docs: list[dict]) -> tuple[list[str], dict]:
    scheduler = next(spec for meta, spec, _ in pod_specs(docs) if meta["labels"].get("component") == "scheduler")
    return [c["name"] for c in scheduler["initContainers"]], next(c for c in scheduler["initContainers"]
                                                                  if c["name"] == "kale-pool")


@pytest.mark.parametrize("executor", EXECUTORS)
def test_the_scheduler_creates_the_pool_after_the_migrations(renders, executor):
    order, pool = scheduler_pool_container(renders[executor])
    assert order.index("wait-for-airflow-migrations") < order.index("kale-pool")
    max_workers = str(yaml.safe_load((KALE_CHART / "values.yaml").read_text())["config"]["max_workers"])
    assert pool["args"][:5] == ["airflow", "pools", "set", "kale_gpu", max_workers] and "--include-deferred" in pool["args"]
    ref = pool["env"][0]["valueFrom"]["secretKeyRef"]
    assert pool["env"][0]["name"] == "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" and ref == {"name": "airflow-metadata",
                                                                                         "key": "connection"}


@pytest.mark.slow
def test_the_pool_command_works_against_an_airflow_database(renders, tmp_path):
    """The init container's command, as the official chart renders it, run by this venv's Airflow
    (the version the Airflow image pins) against a migrated database, twice (every scheduler start)."""
    _, pool = scheduler_pool_container(renders["KubernetesExecutor"])
    airflow = str(Path(sys.executable).parent / "airflow")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}"}
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    for _ in range(2):
        done = subprocess.run([airflow, *pool["args"][1:]], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    got = subprocess.run([airflow, "pools", "get", "kale_gpu", "-o", "json"], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    (row,) = json.loads(got.stdout[got.stdout.index("["):])
    assert (row["pool"], row["slots"], row["include_deferred"]) == ("kale_gpu", "64", "True")
