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


FULL = {"mlflow": {"enabled": True, "allowedHosts": ["mlflow.example.com"]}, "dags": {"configMap": True},
        "database": {"url": "postgresql+psycopg://kale:pw@db.kale:5432/kale"}}
KAFKA = {"kafka": {"existingSecret": "kale-kafka", "configKey": "librdkafka.json", "usernameKey": "username",
                   "passwordKey": "password"}}


@pytest.mark.parametrize("values", [{}, {"mlflow": {"enabled": True}}, {"dags": {"configMap": False},
                                                                        "checkpoints": {"create": False}},
                                    FULL, {"database": {"existingSecret": "airflow-metadata", "secretKey": "connection"}},
                                    {**FULL, "airflow": {"namespace": "kale-training", "workerServiceAccount": "w",
                                                         "triggererServiceAccount": "t"}}, {**FULL, **KAFKA}],
                         ids=["defaults", "with-mlflow", "no-dags-no-pvc", "everything-database-url", "existing-secret",
                              "one-namespace", "kafka-secret"])
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
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"} == {"kale-config"}
    dep = kale_config(docs)  # the chart's default config is a valid deployment
    assert dep.kubernetes.pool == "kale_gpu" and dep.kubernetes.deferrable and dep.kubernetes.schedule_timeout_s == 1800
    text = notes["kale-airflow/templates/NOTES.txt"]
    assert "KALE_CONFIG" in text and "baked into the Airflow image" in text and "git-sync" in text
    assert "subPath" not in text


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


def test_no_database_value_warns_with_the_command(chart):
    docs, notes = render(chart)
    assert secrets(docs) == [] and kale_config(docs).kubernetes.database_secret == "kale-database"
    assert "kubectl create secret generic kale-database -n kale-training" in notes["kale-airflow/templates/NOTES.txt"]


def test_notes_cover_the_airflow_components_and_the_pool(chart):
    _, notes = render(chart, {"config": {"stream_url": "kafka://k:9092/t", "worker_backend": "kubernetes",
                                         "max_workers": 24, "kubernetes": {"pool": "a100"}}})
    text = notes["kale-airflow/templates/NOTES.txt"]
    assert "kubectl port-forward -n airflow svc/airflow-api-server 8080" in text and "http://localhost:8080/kale" in text
    assert "dagProcessor:\n       enabled: true" in text and "triggerer:\n       enabled: true" in text
    assert 'airflow pools set a100 24 "Kale GPU worker pods" --include-deferred' in text


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
    ],
    ids=["namespace", "stream-url", "backend", "size", "typo", "url-and-existing-secret", "secret-name", "secret-key",
         "url-not-a-url", "database-secret-in-config", "schedule-timeout", "pool", "allowed-hosts-comma",
         "kafka-secret-without-keys", "kafka-keys-without-secret", "kafka-secret-name", "kafka-key",
         "kafka-plain-password", "kafka-secret-in-config"],
)
def test_values_schema_rejects_bad_values(chart, values, where):
    with pytest.raises(helm_python.HelmValuesError) as err:
        chart.validate_schema(values)
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
