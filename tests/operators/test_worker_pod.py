"""GPU worker pods through the real KubernetesPodOperator, validated offline (strict schema)."""

import kubernetes_validate
import pytest

from kale_airflow.config import KubernetesWorkerConfig
from kale_airflow.operators.worker_pod import pod_manifest, worker_pod_operator
from kale_airflow.runtime.backends import WorkerSpec
from kale_airflow.runtime.kubernetes import CHECKPOINT_MOUNT, label_value

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
