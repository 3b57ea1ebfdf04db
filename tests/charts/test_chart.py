"""The Helm chart rendered by the real Helm engine (helm-python-sdk), linted, and every
manifest validated strictly against the Kubernetes schema."""

import re
import textwrap
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

from kale_airflow.runtime.kubernetes import KUBERNETES_API_CALLS, SAFE_TO_EVICT, WORKER_LABELS

CHART = Path(__file__).resolve().parents[2] / "charts" / "kale-airflow"
# Every release names its database Secret (the schema refuses one without: every pod reads it).
DATABASE = {"database": {"existingSecret": "kale-db"}}
DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def chart():
    return helm_python.Chart.load(str(CHART))


def render(chart, values=None):
    out = chart.render({**DATABASE, **(values or {})}, name="kale", namespace="airflow")
    return [d for path, text in out.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d], out


def test_lint_has_no_errors():
    assert helm_python.lint(str(CHART), DATABASE)["errors"] == []
    # the chart's defaults alone are not a release: they name no database Secret
    errors = helm_python.lint(str(CHART))["errors"]
    assert errors and all("/database/existingSecret" in e and "/database/url" in e for e in errors)


FULL = {"mlflow": {"enabled": True, "allowedHosts": ["mlflow.example.com"]}, "dags": {"configMap": True},
        "database": {"url": "postgresql+psycopg://kale:pw@db.kale:5432/kale"}}
PODS = {"images": {"worker": {"repository": "reg.example.com:5000/ml/kale-worker", "tag": "0.1.0-cu128",
                              "pullPolicy": "Always", "pullSecrets": ["regcred", "mirror-cred"]}},
        "workerPods": {"priorityClassName": "gpu-training", "disruptionBudget": {"minAvailable": 3}},
        "training": {"namespace": "ml-training", "createNamespace": True},
        "checkpoints": {"storageClassName": "fast-rwx", "accessModes": ["ReadWriteMany", "ReadOnlyMany"]},
        "metrics": {"exporter": {"enabled": True}}}
KAFKA = {"kafka": {"existingSecret": "kale-kafka", "configKey": "librdkafka.json", "usernameKey": "username",
                   "passwordKey": "password"}}


@pytest.mark.parametrize("values", [{}, {"mlflow": {"enabled": True}}, {"dags": {"configMap": False},
                                                                        "checkpoints": {"create": False}},
                                    FULL, {"database": {"existingSecret": "airflow-metadata", "secretKey": "connection"}},
                                    {**FULL, "airflow": {"namespace": "kale-training", "workerServiceAccount": "w",
                                                         "triggererServiceAccount": "t"}}, {**FULL, **KAFKA},
                                    {**FULL, **PODS}],
                         ids=["defaults", "with-mlflow", "no-dags-no-pvc", "everything-database-url", "existing-secret",
                              "one-namespace", "kafka-secret", "images-namespace-pdb-storage"])
@pytest.mark.parametrize("version", ["1.25.0", "1.37.0"])
def test_every_manifest_validates_strictly(chart, values, version):
    docs, _ = render(chart, values)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def kale_config(docs):
    from kale_airflow.config import parse_deployment

    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kale-config")
    return parse_deployment(yaml.safe_load(cm["data"]["kale.yaml"]), "chart")  # a valid deployment


def test_config_ships_as_a_configmap_and_dags_do_not_by_default(chart):
    docs, notes = render(chart)
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"} == {"kale-config", "kale-airflow-values"}
    dep = kale_config(docs)  # the chart's default config is a valid deployment
    assert dep.kubernetes.pool == "kale_gpu" and dep.kubernetes.deferrable and dep.kubernetes.schedule_timeout_s == 1800
    text = notes["kale-airflow/templates/NOTES.txt"]
    assert "KALE_CONFIG" in text and "baked into the Airflow image" in text and "git-sync" in text
    assert "kale-dags" not in text  # no subPath mount of DAG files


def test_dags_configmap_is_mounted_file_by_file_with_subpath(chart):
    docs, notes = render(chart, {"dags": {"configMap": True}})
    dags = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kale-dags")
    assert set(dags["data"]) == {p.name for p in DAGS.glob("*.py")}
    assert dags["data"]["kale_autoscaler.py"] == (DAGS / "kale_autoscaler.py").read_text()
    text = notes["kale-airflow/templates/NOTES.txt"]
    for p in DAGS.glob("*.py"):
        assert (f"{{name: kale-dags, mountPath: /opt/airflow/dags/{p.name}, subPath: {p.name}, readOnly: true}}"
                in text)
    assert "Detected recursive loop" in text
    values = (CHART / "values.yaml").read_text()
    assert "configMap: false" in values and "NOT supported by Airflow 3's DAG processor" in values


def secrets(docs):
    return [d for d in docs if d["kind"] == "Secret"]


def test_database_url_becomes_a_chart_secret_in_both_namespaces_and_reaches_the_pods(chart):
    from kale_airflow.runtime.kubernetes import pod_kwargs

    docs, notes = render(chart, FULL)
    found = secrets(docs)
    assert {(s["metadata"]["name"], s["metadata"]["namespace"]) for s in found} == {("kale-database", "kale-training"),
                                                                                 ("kale-database", "airflow")}
    assert all(s["stringData"] == {"url": FULL["database"]["url"]} for s in found)
    dep = kale_config(docs)
    assert (dep.kubernetes.database_secret, dep.kubernetes.database_secret_key) == ("kale-database", "url")
    env = next(e for e in pod_kwargs(dep.kubernetes)["env_vars"] if e.name == "KALE_DATABASE_URL")
    assert (env.value, env.value_from.secret_key_ref.name, env.value_from.secret_key_ref.key) == (
        None, "kale-database", "url")
    # the URL (and its password) is only in the Secrets, never in the ConfigMap or NOTES
    assert not any("pw@" in yaml.safe_dump(d) for d in docs if d["kind"] != "Secret")
    assert "pw@" not in notes["kale-airflow/templates/NOTES.txt"]
    one_ns, _ = render(chart, {**FULL, "airflow": {"namespace": "kale-training"}})
    assert [(s["metadata"]["namespace"]) for s in secrets(one_ns)] == ["kale-training"]


def test_existing_secret_is_referenced_not_created(chart):
    docs, notes = render(chart, {"database": {"existingSecret": "airflow-metadata", "secretKey": "connection"}})
    assert secrets(docs) == []
    dep = kale_config(docs)
    assert (dep.kubernetes.database_secret, dep.kubernetes.database_secret_key) == ("airflow-metadata", "connection")
    text = notes["kale-airflow/templates/NOTES.txt"]
    assert ("secret:\n       - envName: KALE_DATABASE_URL\n         secretName: airflow-metadata\n"
            "         secretKey: connection" in text)


def test_a_release_without_a_database_is_refused_naming_both_values(chart):
    """Neither chart would create the Secret, and every Airflow pod (the official chart's
    migration Job first) and worker pod reads it: the install must fail, not hang."""
    for values in ({}, {"database": {"existingSecret": "", "url": ""}}, {"database": {"secretKey": "connection"}}):
        with pytest.raises(helm_python.HelmValuesError) as err:
            chart.validate_schema(values)
        assert "/database/existingSecret" in str(err.value) and "/database/url" in str(err.value)
        with pytest.raises(helm_python.HelmValuesError):
            chart.render(values, name="kale", namespace="airflow")
    chart.validate_schema({"database": {"url": "postgresql://kale@db/kale"}})
    chart.validate_schema({"database": {"existingSecret": "kale-db"}})


def test_notes_cover_the_airflow_components_and_the_pool(chart):
    _, notes = render(chart, {"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes",
                                         "max_workers": 24, "kubernetes": {"pool": "a100"}}})
    text = notes["kale-airflow/templates/NOTES.txt"]
    assert "kubectl port-forward -n airflow svc/airflow-api-server 8080" in text and "http://localhost:8080/kale" in text
    assert "dagProcessor:\n       enabled: true" in text and "triggerer:\n       enabled: true" in text
    assert 'args: [airflow, pools, set, "a100", "24", "Kale GPU worker pods", --include-deferred]' in text
    steps = [int(m) for m in re.findall(r"^(\d+)\. ", text, re.M)]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 8  # numbered in order
    assert text.index("helm install airflow apache-airflow/airflow --version 1.18.0") < text.index("kale profile")


def airflow_values(docs):
    """The official chart's values, from ConfigMap kale-airflow-values (what NOTES tells to use)."""
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kale-airflow-values")
    return yaml.safe_load(cm["data"]["values.yaml"])


def test_notes_print_the_same_values_as_the_configmap_pinning_version_and_image(chart):
    docs, notes = render(chart, {"images": {"airflow": {"repository": "reg.example.com/ml/airflow", "tag": "7.1"}}})
    values = airflow_values(docs)
    assert (values["airflowVersion"], values["defaultAirflowRepository"], values["defaultAirflowTag"]) == (
        "3.3.2", "reg.example.com/ml/airflow", "7.1")
    text = notes["kale-airflow/templates/NOTES.txt"]
    block = text[text.index("     # For the official apache-airflow chart"):text.index("\n\n4. Database")]
    assert yaml.safe_load(textwrap.dedent(block)) == values
    assert "kubectl get configmap kale-airflow-values -n airflow -o jsonpath='{.data.values\\.yaml}'" in text
    docs, _ = render(chart)
    assert airflow_values(docs)["defaultAirflowTag"] == chart_app_version()  # empty tag: the chart's appVersion


def chart_app_version():
    return yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def test_mlflow_uri_reaches_the_airflow_components_or_notes_warn(chart):
    def env(values):
        docs, notes = render(chart, values)
        return ({e["name"]: e["value"] for e in airflow_values(docs)["env"]},
                notes["kale-airflow/templates/NOTES.txt"])

    found, _ = env({"mlflow": {"enabled": True}})
    assert found["KALE_MLFLOW_URI"] == "http://kale-mlflow.airflow:5000"
    found, _ = env({"mlflow": {"trackingUri": "https://mlflow.example.com"}})
    assert found["KALE_MLFLOW_URI"] == "https://mlflow.example.com"
    found, text = env({})
    assert "KALE_MLFLOW_URI" not in found and "neither mlflow.enabled nor mlflow.trackingUri" in text


def test_mlflow_accepts_its_service_names_as_host(chart):
    docs, _ = render(chart, FULL)
    mlflow = next(d for d in docs if d["kind"] == "Deployment")
    args = mlflow["spec"]["template"]["spec"]["containers"][0]["args"]
    hosts = set(args[args.index("--allowed-hosts") + 1].split(","))
    for name in ("kale-mlflow", "kale-mlflow.airflow", "kale-mlflow.airflow.svc", "kale-mlflow.airflow.svc.cluster.local"):
        assert {name, f"{name}:5000"} <= hosts
    assert {"localhost", "localhost:*", "mlflow.example.com"} <= hosts


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
        ({"database": {"existingSecret": "s", "url": "postgresql://a:b@h/d"}}, "/database/url"),
        ({"database": {"existingSecret": "Bad_Secret"}}, "/database/existingSecret"),
        ({"database": {"secretKey": "a/b"}}, "/database/secretKey"),
        ({"database": {"url": "password123"}}, "/database/url"),
        ({"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes",
                     "kubernetes": {"database_secret": "x"}}}, "database_secret"),
        ({"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes",
                     "kubernetes": {"schedule_timeout_s": "30m"}}}, "/config/kubernetes/schedule_timeout_s"),
        ({"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes",
                     "kubernetes": {"pool": ""}}}, "/config/kubernetes/pool"),
        ({"mlflow": {"allowedHosts": ["a.example.com,b.example.com"]}}, "/mlflow/allowedHosts/0"),
        ({"kafka": {"existingSecret": "kale-kafka"}}, "/kafka/passwordKey"),
        ({"kafka": {"passwordKey": "password"}}, "/kafka/passwordKey"),
        ({"kafka": {"existingSecret": "Kale_Kafka", "passwordKey": "password"}}, "/kafka/existingSecret"),
        ({"kafka": {"existingSecret": "kale-kafka", "passwordKey": "a/b"}}, "/kafka/passwordKey"),
        ({"kafka": {"existingSecret": "kale-kafka", "password": "s3cret"}}, "password"),
        ({"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes",
                     "kubernetes": {"kafka_secret": "x"}}}, "kafka_secret"),
        ({"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes",
                     "kubernetes": {"image": "x:1"}}}, "image"),
        ({"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes",
                     "kubernetes": {"priority_class_name": "x"}}}, "priority_class_name"),
        ({"images": {"worker": {"tag": "latest"}}}, "/images/worker/tag"),
        ({"images": {"airflow": {"tag": "latest"}}}, "/images/airflow/tag"),
        ({"images": {"worker": {"pullPolicy": "Sometimes"}}}, "/images/worker/pullPolicy"),
        ({"images": {"worker": {"pullSecrets": ["Reg_Cred"]}}}, "/images/worker/pullSecrets/0"),
        ({"images": {"worker": {"repository": "Registry/Worker"}}}, "/images/worker/repository"),
        ({"airflow": {"version": "2.10.5"}}, "/airflow/version"),
        ({"workerPods": {"priorityClassName": "High_Priority"}}, "/workerPods/priorityClassName"),
        ({"workerPods": {"disruptionBudget": {"minAvailable": "50%"}}}, "/workerPods/disruptionBudget/minAvailable"),
        ({"checkpoints": {"storageClass": "fast"}}, "storageClass"),
        ({"checkpoints": {"storageClassName": "Fast_SSD"}}, "/checkpoints/storageClassName"),
        ({"checkpoints": {"accessModes": ["ReadWriteSometimes"]}}, "/checkpoints/accessModes/0"),
        ({"training": {"createNamespace": "yes"}}, "/training/createNamespace"),
        ({"mlflow": {"trackingUri": "mlflow:5000"}}, "/mlflow/trackingUri"),
    ],
    ids=["namespace", "stream-url", "backend", "size", "typo", "url-and-existing-secret", "secret-name", "secret-key",
         "url-not-a-url", "database-secret-in-config", "schedule-timeout", "pool", "allowed-hosts-comma",
         "kafka-secret-without-keys", "kafka-keys-without-secret", "kafka-secret-name", "kafka-key",
         "kafka-plain-password", "kafka-secret-in-config", "image-in-config", "priority-class-in-config",
         "worker-tag-latest", "airflow-tag-latest", "pull-policy", "pull-secret-name", "repository",
         "airflow-version-too-old", "priority-class-name", "min-available-percent", "old-storage-class-key",
         "storage-class-name", "access-mode", "create-namespace", "tracking-uri"],
)
def test_values_schema_rejects_bad_values(chart, values, where):
    with pytest.raises(helm_python.HelmValuesError) as err:
        chart.validate_schema({**DATABASE, **values})
    assert where in str(err.value)


# ------------------------------------------------------------ Kafka credentials of the worker pods
def kafka_pod(dep):
    """A worker pod built from the rendered kale.yaml, as the kale_training DAG builds it."""
    from kale_airflow.operators.worker_pod import pod_manifest, worker_pod_operator
    from kale_airflow.runtime.backends import WorkerSpec

    spec = WorkerSpec(stream_url=dep.stream_url, checkpoint_dir="/checkpoints")
    return pod_manifest(worker_pod_operator(dep.kubernetes, spec, "g1", 0, 2, {"assignment": {"0": [["0", 1.0]]}}))


SECRET_DATA = {"librdkafka.json": '{"sasl.mechanism": "SCRAM-SHA-512", "ssl.ca.location": "/etc/ca.pem"}',
               "username": "kale-user", "password": "s3cret-kafka-pw"}


def test_kafka_credentials_reach_every_worker_pod_from_the_secret_and_the_stream_reads_them(chart, monkeypatch):
    """kafka.existingSecret and its keys become kale.yaml's kafka_secret(_keys), each key a
    secretKeyRef on the pod and an entry for the official chart in NOTES; no Secret is rendered
    and no value is in the pod spec. The pod's environment, resolved from the Secret as the
    kubelet does, configures the Kafka clients (SASL over the KALE_KAFKA_CONFIG settings)."""
    import types

    from kale_airflow.stream.kafka import KafkaStream

    docs, notes = render(chart, KAFKA)
    assert secrets(docs) == []  # the Secret is the user's
    dep = kale_config(docs)
    assert (dep.kubernetes.kafka_secret, dep.kubernetes.kafka_secret_keys) == ("kale-kafka", {
        "KALE_KAFKA_CONFIG": "librdkafka.json", "KALE_KAFKA_SASL_USERNAME": "username",
        "KALE_KAFKA_SASL_PASSWORD": "password"})
    pod = kafka_pod(dep)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    for name, key in dep.kubernetes.kafka_secret_keys.items():
        assert env[name] == {"name": name, "valueFrom": {"secretKeyRef": {"name": "kale-kafka", "key": key}}}
    text = yaml.safe_dump(pod) + "".join(yaml.safe_dump(d) for d in docs) + notes["kale-airflow/templates/NOTES.txt"]
    assert not any(value in text for value in ("s3cret-kafka-pw", "kale-user", "SCRAM"))
    assert ("       - envName: KALE_KAFKA_SASL_PASSWORD\n         secretName: kale-kafka\n         secretKey: password"
            in notes["kale-airflow/templates/NOTES.txt"])

    for name, e in env.items():  # the kubelet: plain values as they are, secretKeyRefs from the Secret's data
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["name"] == "kale-kafka":
            monkeypatch.setenv(name, SECRET_DATA[ref["key"]])
    stream = KafkaStream.from_url(dep.stream_url, client=types.SimpleNamespace())
    assert stream.config == {"bootstrap.servers": "kafka.kafka:9092", "sasl.mechanism": "SCRAM-SHA-512",
                             "ssl.ca.location": "/etc/ca.pem", "sasl.username": "kale-user",
                             "sasl.password": "s3cret-kafka-pw", "security.protocol": "SASL_SSL"}
    assert "s3cret-kafka-pw" not in repr(stream)


def test_without_a_kafka_secret_the_pods_get_no_kafka_env_and_notes_say_how(chart):
    docs, notes = render(chart)
    dep = kale_config(docs)
    assert dep.kubernetes.kafka_secret is None and dep.kubernetes.kafka_secret_keys == {}
    assert not [e for e in kafka_pod(dep)["spec"]["containers"][0]["env"] if e["name"].startswith("KALE_KAFKA")]
    text = notes["kale-airflow/templates/NOTES.txt"]
    assert "kafka.existingSecret is empty" in text and "cannot be read inside the worker pods" in text
    only_password, notes = render(chart, {"kafka": {"existingSecret": "kafka-user", "passwordKey": "password"}})
    assert kale_config(only_password).kubernetes.kafka_secret_keys == {"KALE_KAFKA_SASL_PASSWORD": "password"}
    assert "KALE_KAFKA_SASL_PASSWORD <- key password" in notes["kale-airflow/templates/NOTES.txt"]


# ------------------------------------------------------------ images, scheduling and disruption of the worker pods
def test_images_worker_and_pod_scheduling_values_reach_every_worker_pod(chart):
    """images.worker and workerPods become kale.yaml fields; the pod the kale_training DAG
    builds from them pulls that image with those Secrets, at that priority, and tells the
    cluster autoscaler not to evict it."""
    docs, _ = render(chart, PODS)
    k8s = kale_config(docs).kubernetes
    assert (k8s.image, k8s.image_pull_policy, k8s.image_pull_secrets, k8s.priority_class_name, k8s.namespace) == (
        "reg.example.com:5000/ml/kale-worker:0.1.0-cu128", "Always", ["regcred", "mirror-cred"], "gpu-training",
        "ml-training")
    pod = kafka_pod(kale_config(docs))
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    assert (c["image"], c["imagePullPolicy"]) == ("reg.example.com:5000/ml/kale-worker:0.1.0-cu128", "Always")
    assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]
    assert spec["priorityClassName"] == "gpu-training"
    assert pod["metadata"]["annotations"][SAFE_TO_EVICT] == "false"
    assert pod["metadata"]["namespace"] == "ml-training"
    kubernetes_validate.validate(pod, "1.37.0", strict=True)
    exporter = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "kale-exporter")
    assert exporter["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]

    defaults_dep = kale_config(render(chart)[0])
    defaults = defaults_dep.kubernetes
    assert (defaults.image, defaults.image_pull_policy, defaults.image_pull_secrets, defaults.priority_class_name) == (
        f"ghcr.io/kale-airflow/worker:{chart_app_version()}", "IfNotPresent", [], None)
    pod = kafka_pod(defaults_dep)
    assert "priorityClassName" not in pod["spec"] and not pod["spec"].get("imagePullSecrets")
    assert pod["metadata"]["annotations"][SAFE_TO_EVICT] == "false"


def test_the_chart_version_the_package_version_and_the_image_tags_agree(chart):
    pyproject = (CHART.parents[1] / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["appVersion"] == version  # the empty image tags mean this version
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["images"]["worker"]["tag"] == values["images"]["airflow"]["tag"] == ""


def test_the_disruption_budget_selects_exactly_the_worker_pods(chart):
    docs, _ = render(chart)
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["metadata"]["namespace"] == "kale-training"
    assert pdb["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": WORKER_LABELS["app.kubernetes.io/name"]}}
    assert pdb["spec"]["minAvailable"] == 64  # config.max_workers: no voluntary eviction while pods run
    assert "maxUnavailable" not in pdb["spec"]  # needs a controller; KubernetesPodOperator pods have none
    pod = kafka_pod(kale_config(docs))
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    docs, _ = render(chart, {"workerPods": {"disruptionBudget": {"minAvailable": 0}}})
    assert next(d for d in docs if d["kind"] == "PodDisruptionBudget")["spec"]["minAvailable"] == 0
    docs, notes = render(chart, {"workerPods": {"disruptionBudget": {"enabled": False}}})
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert "no PodDisruptionBudget" in notes["kale-airflow/templates/NOTES.txt"]


def test_create_namespace_renders_a_kept_namespace_and_not_the_releases_own(chart):
    docs, _ = render(chart)
    assert not [d for d in docs if d["kind"] == "Namespace"]
    docs, notes = render(chart, {"training": {"namespace": "gpu-jobs", "createNamespace": True}})
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == "gpu-jobs" and ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] in ("Role", "PersistentVolumeClaim",
                                                                      "PodDisruptionBudget")} == {"gpu-jobs"}
    assert kale_config(docs).kubernetes.namespace == "gpu-jobs"
    with pytest.raises(helm_python.HelmRenderError, match="release's own namespace"):
        render(chart, {"training": {"namespace": "airflow", "createNamespace": True}})


@pytest.mark.parametrize("field, values", [
    ("namespace", {"training": {"namespace": "gpu-jobs"}}),
    ("checkpoint_claim", {"checkpoints": {"claimName": "ckpt"}}),
    ("service_account", {"workerServiceAccount": {"name": "trainer"}}),
])
def test_pod_settings_follow_the_chart_values_and_a_contradiction_is_refused(chart, field, values):
    docs, _ = render(chart, values)
    want = getattr(kale_config(docs).kubernetes, field)
    assert want in ("gpu-jobs", "ckpt", "trainer")
    config = {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes", "kubernetes": {field: "other"}}
    with pytest.raises(helm_python.HelmRenderError, match=f"config.kubernetes.{field} is \"other\""):
        render(chart, {**values, "config": config})
    render(chart, {**values, "config": {**config, "kubernetes": {field: want}}})  # the same value is fine


@pytest.mark.parametrize("storage_class, rendered", [("", None), ("fast-rwx", "fast-rwx"), ("-", "")])
def test_checkpoint_claim_storage_class_and_access_modes(chart, storage_class, rendered):
    docs, _ = render(chart, {"checkpoints": {"storageClassName": storage_class, "accessModes": ["ReadWriteOnce"]}})
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"].get("storageClassName", None) == rendered
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    kubernetes_validate.validate(pvc, "1.37.0", strict=True)


def test_jobs_reach_the_config_and_one_role_covers_them(chart):
    """Bug classes: the chart dropping ``jobs``/``fleet`` from kale.yaml, a job's pods sent to
    a namespace no Role, claim or service account of the release covers."""
    jobs = [{"name": "ranking", "stream_url": "kafka://k:9092/ranking", "priority": 3},
            {"name": "ads", "stream_url": "kafka://k:9092/ads"}]
    config = {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes", "fleet": {"gpus": 16}, "jobs": jobs}
    docs, _ = render(chart, {"config": config})
    dep = kale_config(docs)
    assert list(dep.all_jobs) == ["ranking", "ads"] and dep.fleet.gpus == 16
    assert {job.kubernetes.namespace for job in dep.all_jobs.values()} == {"kale-training"}
    assert [d["metadata"]["namespace"] for d in docs if d["kind"] == "Role"] == ["kale-training"]
    claim = [jobs[0], {**jobs[1], "kubernetes": {"checkpoint_claim": "own"}}]
    with pytest.raises(helm_python.HelmRenderError, match=r"config.jobs\[1\] \(ads\) sets kubernetes.checkpoint_claim"):
        render(chart, {"config": {**config, "jobs": claim}})
    with pytest.raises(helm_python.HelmValuesError, match="/config/jobs/0': missing property 'name'"):
        render(chart, {"config": {**config, "jobs": [{"stream_url": "kafka://k:9092/x"}]}})


def test_a_job_in_its_own_namespace_gets_the_role_claim_account_and_secret_there(chart):
    """Bug class: a job whose pods run in a namespace of their own (kubernetes.namespace) with
    no Role there (403 at pod creation), no checkpoint claim, service account, database Secret
    or disruption budget."""
    jobs = [{"name": "ranking", "stream_url": "kafka://k:9092/ranking"},
            {"name": "ads", "stream_url": "kafka://k:9092/ads", "kubernetes": {"namespace": "ads-training"}},
            {"name": "feed", "stream_url": "kafka://k:9092/feed", "kubernetes": {"namespace": "kale-training"}}]
    values = {"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes", "jobs": jobs},
              "database": {"url": "postgresql+psycopg://kale:pw@db.kale:5432/kale"},
              "training": {"createNamespace": True}, "metrics": {"podMonitor": {"enabled": True}}}
    docs, notes = render(chart, values)
    dep = kale_config(docs)
    assert {n: j.kubernetes.namespace for n, j in dep.all_jobs.items()} == {
        "ranking": "kale-training", "ads": "ads-training", "feed": "kale-training"}
    assert {n: j.kubernetes.checkpoint_claim for n, j in dep.all_jobs.items()} == dict.fromkeys(dep.all_jobs,
                                                                                                 "kale-checkpoints")
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d["metadata"].get("namespace", d["metadata"]["name"]))
    for kind in ("Role", "RoleBinding", "ServiceAccount", "PersistentVolumeClaim", "PodDisruptionBudget",
                 "Namespace", "PodMonitor"):
        assert sorted(by_kind[kind]) == ["ads-training", "kale-training"], (kind, by_kind[kind])
    assert sorted(by_kind["Secret"]) == ["ads-training", "airflow", "kale-training"]
    binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == "ads-training")
    assert {s["namespace"] for s in binding["subjects"]} == {"airflow"}  # Airflow's worker and triggerer
    for doc in docs:
        if doc["kind"] != "PodMonitor":  # a CRD
            kubernetes_validate.validate(doc, "1.37.0", strict=True)
    assert "kale-training, ads-training" in notes["kale-airflow/templates/NOTES.txt"]
