"""GPU worker pods through the real KubernetesPodOperator, validated offline (strict schema)."""

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kale_airflow.config import KubernetesWorkerConfig
from kale_airflow.operators.worker_pod import pod_manifest, worker_pod_operator
from kale_airflow.runtime.backends import WorkerSpec
from kale_airflow.runtime.kubernetes import CHECKPOINT_MOUNT, SAFE_TO_EVICT, label_value

SPEC = WorkerSpec(stream_url="kafka://kafka.kale:9092/samples", checkpoint_dir=CHECKPOINT_MOUNT)
ASSIGNMENT = {"assignment": {"0": [["0", 1.0], ["1", 0.5]], "1": [["1", 0.5]]}}
RUN_ID = "manual__2026-11-29T10:00:00.123456+00:00"


def manifest(cfg=KubernetesWorkerConfig(), worker=0):
    return pod_manifest(worker_pod_operator(cfg, SPEC, RUN_ID, worker, 2, ASSIGNMENT))


@pytest.mark.parametrize("version", ["1.25.0", "1.30.0", "1.37.0"])
def test_pod_validates_strictly_against_the_kubernetes_schema(version):
    kubernetes_validate.validate(manifest(), version, strict=True)


def test_pod_requests_gpus_on_gpu_nodes_as_non_root_with_checkpoints():
    m = manifest(KubernetesWorkerConfig(gpus_per_worker=2, namespace="ml"))
    spec, c = m["spec"], m["spec"]["containers"][0]
    assert m["metadata"]["namespace"] == "ml"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "kale-checkpoints"}} in spec["volumes"]
    assert {"mountPath": "/checkpoints", "name": "checkpoints"} in c["volumeMounts"]
    assert spec["terminationGracePeriodSeconds"] == 120


def test_cpu_only_pods_have_no_gpu_limit():
    c = manifest(KubernetesWorkerConfig(gpus_per_worker=0))["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]


def test_pod_runs_the_same_command_as_a_local_worker():
    c = manifest(worker=1)["spec"]["containers"][0]
    assert [*c["command"], *c["args"]] == SPEC.command(RUN_ID, 1, 2, ASSIGNMENT)
    assert "--worker-id" in c["args"] and c["args"][c["args"].index("--worker-id") + 1] == "1"


def test_labels_are_valid_and_unique_for_run_ids():
    labels = manifest()["metadata"]["labels"]
    value = labels["kale-airflow/generation"]
    assert len(value) <= 63 and value == label_value(RUN_ID)
    assert label_value(RUN_ID) != label_value(RUN_ID.replace("123456", "123457"))
    assert label_value("g1") == "g1"


def test_root_user_is_refused():
    with pytest.raises(ValueError, match="non-root"):
        KubernetesWorkerConfig(run_as_user=0)


def _raising(status):
    from kubernetes.client.exceptions import ApiException

    def boom(self, pod_request_obj, context):
        raise ApiException(status=status, reason="Forbidden" if status == 403 else "AlreadyExists")

    return boom


def test_403_names_the_missing_permission_and_the_fix(monkeypatch):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from kale_airflow.operators.worker_pod import KubernetesPermissionError

    op = worker_pod_operator(KubernetesWorkerConfig(namespace="ml"), SPEC, RUN_ID, 0, 2, ASSIGNMENT)
    monkeypatch.setattr(KubernetesPodOperator, "get_or_create_pod", _raising(403))  # the provider's call fails
    pod = op.build_pod_request_obj(dry_run=True)
    with pytest.raises(KubernetesPermissionError) as err:
        op.get_or_create_pod(pod, {})
    msg = str(err.value)
    assert "'create' verb on 'pods'" in msg and "namespace 'ml'" in msg and "Role and RoleBinding" in msg


def test_409_on_our_own_pod_reattaches(monkeypatch):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    op = worker_pod_operator(KubernetesWorkerConfig(), SPEC, RUN_ID, 0, 2, ASSIGNMENT)
    pod = op.build_pod_request_obj(dry_run=True)
    monkeypatch.setattr(KubernetesPodOperator, "get_or_create_pod", _raising(409))
    monkeypatch.setattr(KubernetesPodOperator, "find_pod", lambda self, ns, context, exclude_checked=True: pod)
    assert op.get_or_create_pod(pod, {}) is pod
    monkeypatch.setattr(KubernetesPodOperator, "find_pod", lambda self, ns, context, exclude_checked=True: None)
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException):
        op.get_or_create_pod(pod, {})


# ------------------------------------------------------------ the kale_training DAG's mapped pod
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "kale_training.py"
SECRET_URL = "postgresql+psycopg://kale:s3cr3t-pw@db.kale:5432/kale"
K8S_DEPLOYMENT = {"stream_url": "kafka://kafka.kale:9092/samples", "worker_backend": "kubernetes", "max_workers": 40,
                  "partitions": 64, "kubernetes": {"namespace": "kale-training", "database_secret": "airflow-metadata",
                                                   "database_secret_key": "connection", "pool": "gpu_a100",
                                                   "schedule_timeout_s": 2400, "image": "reg.example.com/kale-worker:7",
                                                   "image_pull_policy": "Always",
                                                   "image_pull_secrets": ["regcred", "mirror-cred"],
                                                   "priority_class_name": "gpu-training"}}


@pytest.fixture
def training_dag(tmp_path, monkeypatch):
    """kale_training parsed by Airflow's DagBag with a Kubernetes deployment (and a database
    URL with a password in the environment, which must not leak into the pod)."""
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "kale.yaml").write_text(yaml.safe_dump(K8S_DEPLOYMENT))
    monkeypatch.setenv("KALE_HOME", str(tmp_path))
    monkeypatch.setenv("KALE_CONFIG", str(tmp_path / "kale.yaml"))
    monkeypatch.setenv("KALE_DATABASE_URL", SECRET_URL)
    bag = DagBag(dag_folder=str(DAG_FILE), safe_mode=False)
    assert bag.import_errors == {}
    return bag.dags["kale_training"]


def mapped_pod(dag, index=1, workers=3):
    """The pod of one mapped worker, built as the task runner does: the DAG's partial kwargs
    plus that index's command line (what worker_args returns), rendered without a cluster."""
    argv = SPEC.command(RUN_ID, index, workers, ASSIGNMENT)
    op = dag.get_task("worker_pods").unmap({"arguments": argv[1:]})
    return op, pod_manifest(op), argv


@pytest.mark.parametrize("version", ["1.25.0", "1.37.0"])
def test_the_dags_mapped_pod_validates_strictly(training_dag, version):
    _, m, _ = mapped_pod(training_dag)
    kubernetes_validate.validate(m, version, strict=True)


def test_the_dags_mapped_pod_obeys_the_deployment(training_dag):
    from kale_airflow.config import parse_deployment
    from kale_airflow.operators.worker_pod import WorkerPodOperator, worker_pods_partial_kwargs

    op, m, argv = mapped_pod(training_dag)
    assert isinstance(op, WorkerPodOperator)
    assert op.pool == "gpu_a100" and op.deferrable is True
    assert op.schedule_timeout_seconds == 2400 and op.startup_timeout_seconds == 600
    assert op.max_active_tis_per_dagrun == 40 and training_dag.max_active_tasks >= 40 + 2
    c = m["spec"]["containers"][0]
    assert [*c["command"], *c["args"]] == argv and m["metadata"]["namespace"] == "kale-training"
    assert m["metadata"]["labels"]["app.kubernetes.io/name"] == "kale-worker"  # the autoscaler's selector
    assert (c["image"], c["imagePullPolicy"]) == ("reg.example.com/kale-worker:7", "Always")
    assert m["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]
    assert m["spec"]["priorityClassName"] == "gpu-training"
    assert m["metadata"]["annotations"][SAFE_TO_EVICT] == "false"
    env = {e["name"]: e for e in c["env"]}
    assert env["KALE_DATABASE_URL"] == {"name": "KALE_DATABASE_URL", "valueFrom": {
        "secretKeyRef": {"name": "airflow-metadata", "key": "connection"}}}
    # the DAG's mapped task is exactly the shared helper's kwargs
    expected = worker_pods_partial_kwargs(parse_deployment(K8S_DEPLOYMENT))
    assert {k: training_dag.get_task("worker_pods").partial_kwargs.get(k) for k in ("pool", "deferrable", "poll_interval",
                                                                                    "logging_interval")} == \
        {k: expected[k] for k in ("pool", "deferrable", "poll_interval", "logging_interval")}


def test_no_database_url_or_password_reaches_the_pod_spec(training_dag):
    _, m, _ = mapped_pod(training_dag)
    text = json.dumps(m)
    assert "s3cr3t-pw" not in text and SECRET_URL not in text
    c = m["spec"]["containers"][0]
    url_with_password = re.compile(r"[a-z0-9+.-]+://[^/\s:@]+:[^@\s]+@")
    assert not any(url_with_password.search(a) for a in [*c["command"], *c["args"]])
    assert not any(url_with_password.search(e.get("value", "")) for e in c["env"])
    assert all("value" not in e for e in c["env"] if e["name"] == "KALE_DATABASE_URL")


def test_the_secret_and_pod_scheduling_settings_are_config_fields():
    m = manifest(KubernetesWorkerConfig(database_secret="kale-db", database_secret_key="dsn"))
    env = {e["name"]: e for e in m["spec"]["containers"][0]["env"]}
    assert env["KALE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "kale-db", "key": "dsn"}
    op = worker_pod_operator(KubernetesWorkerConfig(deferrable=False, pool="p", schedule_timeout_s=60,
                                                    logging_interval_s=None), SPEC, RUN_ID, 0, 2, ASSIGNMENT)
    assert (op.deferrable, op.pool, op.schedule_timeout_seconds, op.logging_interval) == (False, "p", 60, None)
    for bad in ({"database_secret": "Bad_Name"}, {"database_secret_key": "a/b"}, {"pool": ""},
                {"schedule_timeout_s": 0}, {"deferrable": "yes"}):
        with pytest.raises(ValueError):
            KubernetesWorkerConfig(**bad)


def test_the_kafka_secret_keys_become_secret_key_refs_and_come_in_pairs():
    import typing

    from kale_airflow.config.deployment import KafkaSecretEnv
    from kale_airflow.stream.kafka import CONFIG_ENV, SASL_PASSWORD_ENV, SASL_USERNAME_ENV

    assert set(typing.get_args(KafkaSecretEnv)) == {CONFIG_ENV, SASL_USERNAME_ENV, SASL_PASSWORD_ENV}
    m = manifest(KubernetesWorkerConfig(kafka_secret="kafka-user",
                                        kafka_secret_keys={"KALE_KAFKA_SASL_PASSWORD": "pw"}))
    kubernetes_validate.validate(m, "1.37.0", strict=True)
    env = {e["name"]: e for e in m["spec"]["containers"][0]["env"]}
    assert env["KALE_KAFKA_SASL_PASSWORD"] == {"name": "KALE_KAFKA_SASL_PASSWORD", "valueFrom": {
        "secretKeyRef": {"name": "kafka-user", "key": "pw"}}}
    assert "KALE_KAFKA_CONFIG" not in env and "KALE_KAFKA_SASL_USERNAME" not in env
    assert not [e for e in manifest()["spec"]["containers"][0]["env"] if e["name"].startswith("KALE_KAFKA")]
    for bad in ({"kafka_secret": "kafka-user"}, {"kafka_secret_keys": {"KALE_KAFKA_CONFIG": "c"}},
                {"kafka_secret": "k", "kafka_secret_keys": {"KAFKA_PASSWORD": "p"}},
                {"kafka_secret": "Bad_Name", "kafka_secret_keys": {"KALE_KAFKA_CONFIG": "c"}},
                {"kafka_secret": "k", "kafka_secret_keys": {"KALE_KAFKA_CONFIG": "a/b"}}):
        with pytest.raises(ValueError):
            KubernetesWorkerConfig(**bad)
    with pytest.raises(ValueError, match="kafka_secret and kafka_secret_keys go together"):
        KubernetesWorkerConfig(kafka_secret="kafka-user")


def test_local_deployments_parse_without_the_gpu_pool():
    from kale_airflow.config import parse_deployment
    from kale_airflow.operators.worker_pod import worker_pods_partial_kwargs

    assert worker_pods_partial_kwargs(parse_deployment({"stream_url": "sqlite:///x"}))["pool"] == "default_pool"


def test_pull_policy_pull_secrets_priority_and_no_autoscaler_eviction():
    m = manifest(KubernetesWorkerConfig(image_pull_policy="Never", image_pull_secrets=["regcred"],
                                        priority_class_name="gpu-training"))
    kubernetes_validate.validate(m, "1.25.0", strict=True)
    assert m["spec"]["containers"][0]["imagePullPolicy"] == "Never"
    assert (m["spec"]["imagePullSecrets"], m["spec"]["priorityClassName"]) == ([{"name": "regcred"}], "gpu-training")
    # the cluster autoscaler must not drain a node to scale it down under a running rank
    assert m["metadata"]["annotations"][SAFE_TO_EVICT] == "false"
    default = manifest()
    assert default["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert "priorityClassName" not in default["spec"] and not default["spec"].get("imagePullSecrets")
    assert default["metadata"]["annotations"][SAFE_TO_EVICT] == "false"
    for bad in ({"image_pull_policy": "Sometimes"}, {"image_pull_secrets": ["Reg_Cred"]},
                {"image_pull_secrets": "regcred"}, {"priority_class_name": "High_Priority"}):
        with pytest.raises(ValueError):
            KubernetesWorkerConfig(**bad)


def test_the_mapped_pods_settings_survive_dag_serialization(training_dag):
    """The scheduler and the UI see the serialized DAG: the pull secrets, priority and
    annotation of the mapped worker pods must come back as they were given."""
    from airflow.serialization.serialized_objects import DagSerialization

    task = DagSerialization.from_dict(DagSerialization.to_dict(training_dag)).get_task("worker_pods")
    kwargs = task.partial_kwargs
    assert kwargs["image_pull_secrets"] == "regcred,mirror-cred"
    assert (kwargs["priority_class_name"], kwargs["image_pull_policy"]) == ("gpu-training", "Always")
    assert kwargs["annotations"][SAFE_TO_EVICT] == "false"


def selects(selector: str, labels: dict) -> bool:
    """Whether an equality-based label selector (``k=v,k2=v2``, as the autoscaler lists pods
    with) matches a pod's labels."""
    return all(labels.get(key) == value for key, value in (term.split("=", 1) for term in selector.split(",")))


def test_each_jobs_autoscaler_counts_only_its_own_jobs_pods_in_a_shared_namespace():
    """Bug class: two jobs' worker pods in one namespace (the chart's default) told apart by no
    label, so a job's autoscaler counted the other job's Running pods as its own and missed its
    own Pending ones (no hold_pending)."""
    from kale_airflow.config import parse_deployment
    from kale_airflow.operators.worker_pod import WorkerPodOperator, worker_pods_partial_kwargs
    from kale_airflow.runtime.kubernetes import worker_selector

    dep = parse_deployment({**K8S_DEPLOYMENT, "jobs": [{"name": "ranking", "stream_url": "kafka://k:9092/ranking"},
                                                       {"name": "ads", "stream_url": "kafka://k:9092/ads"}]})
    argv = SPEC.command(RUN_ID, 0, 1, ASSIGNMENT)
    labels = {}
    for name, job in dep.all_jobs.items():
        op = WorkerPodOperator(**{**worker_pods_partial_kwargs(job), "task_id": "w"}, arguments=argv[1:])
        m = pod_manifest(op)
        kubernetes_validate.validate(m, "1.37.0", strict=True)
        assert m["metadata"]["namespace"] == "kale-training"  # both jobs share the namespace
        labels[name] = m["metadata"]["labels"]
    assert selects(worker_selector("ranking"), labels["ranking"]) and selects(worker_selector("ads"), labels["ads"])
    assert not selects(worker_selector("ranking"), labels["ads"]) and not selects(worker_selector("ads"),
                                                                                  labels["ranking"])
    one = pod_manifest(worker_pod_operator(KubernetesWorkerConfig(), SPEC, RUN_ID, 0, 2, ASSIGNMENT, job="ads"))
    assert selects(worker_selector("ads"), one["metadata"]["labels"])
