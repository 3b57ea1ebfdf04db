"""Kubernetes GPU worker pods: the pod settings every worker pod gets, and its labels.

One ``KubernetesPodOperator`` per worker of a generation; the pod runs the same worker
command as a local process. The pod: ``nvidia.com/gpu`` limit, node selector and
tolerations for GPU nodes, the checkpoint PersistentVolumeClaim mounted at
``/checkpoints``, non-root security context with no privilege escalation and all
capabilities dropped, CPU/memory requests, a grace period long enough to checkpoint on
SIGTERM, and labels naming the generation and worker. The control-plane database URL
(``KALE_DATABASE_URL``, which carries a password) and the Kafka credentials
(``KALE_KAFKA_CONFIG``, ``KALE_KAFKA_SASL_USERNAME``/``_PASSWORD``, from the keys that
``kafka_secret_keys`` names) come from Secrets through ``secretKeyRef``, never as plain
values in the pod spec or the command line.

The pods are deferrable by default: the Airflow worker creates the pod and frees its slot,
the triggerer watches it (``KubernetesPodTrigger``) until it ends. Each mapped pod task runs
in the configured Airflow pool; a Pending pod may wait ``schedule_timeout_s`` for a GPU node
(a node autoscaler takes minutes) and keeps its labels meanwhile, so the autoscaler counts it
as not yet running.
"""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta

from kale_airflow.config import KubernetesWorkerConfig

CHECKPOINT_MOUNT = "/checkpoints"
# The ranks of a generation's job meet at rank 0's pod: rank 0 publishes its pod IP (POD_IP_ENV,
# from the downward API) and this port in the control-plane database, which every pod can
# already read; no Service and no extra Kubernetes API call (the chart's Role is unchanged).
RENDEZVOUS_PORT = 29500
RENDEZVOUS = f"control-plane:{RENDEZVOUS_PORT}"
POD_IP_ENV = "KALE_POD_IP"
METRICS_PORT = 9400
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"


def label_value(text: str) -> str:
    """A valid label value (<= 63 chars of [a-z0-9._-], alphanumeric ends) that stays unique."""
    clean = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    if len(clean) > 63 or clean != text:
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        clean = f"{clean[:54].strip('-._')}-{digest}"
    return clean or "x"


# Labels on every worker pod, and the job's: a job's autoscaler counts the Running pods of its
# own job (several jobs may share a namespace).
WORKER_LABELS = {"app.kubernetes.io/name": "kale-worker", "app.kubernetes.io/part-of": "kale-airflow"}
JOB_LABEL = "kale-airflow/job"


def worker_labels(job: str) -> dict[str, str]:
    """The labels of job ``job``'s worker pods."""
    return {**WORKER_LABELS, JOB_LABEL: label_value(job)}


def worker_selector(job: str) -> str:
    """The label selector of job ``job``'s worker pods (and no other job's)."""
    return f"app.kubernetes.io/name={WORKER_LABELS['app.kubernetes.io/name']},{JOB_LABEL}={label_value(job)}"
DATABASE_URL_ENV = "KALE_DATABASE_URL"


def worker_env(cfg: KubernetesWorkerConfig) -> list:
    """The environment of every worker pod: plain settings, the pod's IP, and the secrets as
    ``secretKeyRef`` (the database URL; the Kafka credentials when ``kafka_secret`` is set)."""
    from kubernetes.client import models as k8s

    def secret(name: str, secret_name: str, key: str):
        return k8s.V1EnvVar(name=name, value_from=k8s.V1EnvVarSource(
            secret_key_ref=k8s.V1SecretKeySelector(name=secret_name, key=key)))

    return [k8s.V1EnvVar(name="HOME", value="/tmp"),
            k8s.V1EnvVar(name="KALE_METRICS_PORT", value=str(METRICS_PORT)),
            k8s.V1EnvVar(name=POD_IP_ENV, value_from=k8s.V1EnvVarSource(
                field_ref=k8s.V1ObjectFieldSelector(field_path="status.podIP"))),
            secret(DATABASE_URL_ENV, cfg.database_secret, cfg.database_secret_key),
            *(secret(env, cfg.kafka_secret, key) for env, key in sorted(cfg.kafka_secret_keys.items()))]


def pod_kwargs(cfg: KubernetesWorkerConfig) -> dict:
    """KubernetesPodOperator arguments shared by every worker pod."""
    from kubernetes.client import models as k8s

    limits = {"memory": cfg.memory_limit}
    if cfg.gpus_per_worker:
        limits["nvidia.com/gpu"] = str(cfg.gpus_per_worker)
    return dict(
        namespace=cfg.namespace,
        image=cfg.image,
        image_pull_policy=cfg.image_pull_policy,
        # comma-separated (the provider splits it): a list of V1LocalObjectReference does not survive
        # DAG serialization of the mapped task's partial arguments
        image_pull_secrets=",".join(cfg.image_pull_secrets) or None,
        priority_class_name=cfg.priority_class_name,
        container_resources=k8s.V1ResourceRequirements(
            requests={"cpu": cfg.cpu_request, "memory": cfg.memory_request}, limits=limits),
        node_selector=dict(cfg.node_selector),
        tolerations=[k8s.V1Toleration(**t) for t in cfg.tolerations],
        volumes=[k8s.V1Volume(name="checkpoints", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
            claim_name=cfg.checkpoint_claim)),
            k8s.V1Volume(name="tmp", empty_dir=k8s.V1EmptyDirVolumeSource())],  # writable scratch, root fs is read-only
        volume_mounts=[k8s.V1VolumeMount(name="checkpoints", mount_path=CHECKPOINT_MOUNT),
                       k8s.V1VolumeMount(name="tmp", mount_path="/tmp")],
        env_vars=worker_env(cfg),
        security_context=k8s.V1PodSecurityContext(run_as_non_root=True, run_as_user=cfg.run_as_user,
                                                  run_as_group=cfg.run_as_user, fs_group=cfg.run_as_user),
        container_security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False, read_only_root_filesystem=True,
            capabilities=k8s.V1Capabilities(drop=["ALL"]), seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault")),
        # /metrics of each worker (runtime/exposition.py), scraped by the chart's PodMonitor or by annotation
        ports=[k8s.V1ContainerPort(name="metrics", container_port=METRICS_PORT)],
        annotations={"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                     # A node the cluster autoscaler drains to scale down kills a rank, and with it the
                     # whole generation (it restarts from its checkpoint): Kale decides when to rescale.
                     SAFE_TO_EVICT: "false"},
        service_account_name=cfg.service_account,
        termination_grace_period=cfg.grace_period_s,
        kubernetes_conn_id=cfg.kubernetes_conn_id,
        on_finish_action="delete_pod",
        reattach_on_restart=True,
        get_logs=True,
        # A killed or evicted worker pod fails its task; the retry starts a new pod, which
        # restores the checkpoint and resumes from the committed offsets.
        retries=3,
        retry_delay=timedelta(seconds=30),
        pool=cfg.pool,
        # Deferrable: the triggerer watches the pod, the Airflow worker slot is freed.
        deferrable=cfg.deferrable,
        schedule_timeout_seconds=cfg.schedule_timeout_s,
        startup_timeout_seconds=cfg.startup_timeout_s,
        poll_interval=cfg.poll_interval_s,
        logging_interval=cfg.logging_interval_s,
    )


# Every Kubernetes API call made for the workers: (API group, resource) -> verbs. The Helm
# chart's Role (bound to the Airflow worker and triggerer service accounts) grants exactly
# these; a test keeps the two equal. Read from apache-airflow-providers-cncf-kubernetes 10.25
# (operators/pod.py, utils/pod_manager.py, triggers/pod.py, hooks/kubernetes.py), no XCom
# sidecar (no pods/exec), both modes: deferrable (default; the worker creates the pod and the
# triggerer watches it) and synchronous (deferrable: false; the worker does everything).
KUBERNETES_API_CALLS = {
    ("", "pods"): {
        # create_namespaced_pod: PodManager.create_pod from KubernetesPodOperator.get_or_create_pod (worker)
        "create",
        # read_namespaced_pod: AsyncKubernetesHook.get_pod in KubernetesPodTrigger._get_pod and
        # AsyncPodManager.await_pod_start (triggerer, status polling every poll_interval_s);
        # KubernetesHook.get_pod in trigger_reentry and on reattach through the task state store,
        # PodManager.read_pod in await_pod_completion / await_pod_start (worker)
        "get",
        # list_namespaced_pod: KubernetesPodOperator.find_pod (reattach_on_restart, and our 409
        # reattach in WorkerPodOperator); the autoscaler counting Running worker pods by label
        # (control/autoscaler.py, through KubernetesHook)
        "list",
        # patch_namespaced_pod: KubernetesPodOperator.patch_already_checked in cleanup (worker)
        "patch",
        # delete_namespaced_pod: PodManager.delete_pod (on_finish_action="delete_pod") and
        # KubernetesPodOperator.on_kill (worker); AsyncKubernetesHook.delete_pod in
        # KubernetesPodTrigger.on_kill when a deferred task is killed (triggerer)
        "delete",
    },
    # read_namespaced_pod_log: KubernetesPodOperator._write_logs in trigger_reentry and
    # PodManager.read_pod_logs (worker, get_logs=True); AsyncKubernetesHook.read_logs every
    # logging_interval_s (triggerer)
    ("", "pods/log"): {"get"},
    ("", "events"): {
        # list_namespaced_event: PodManager.read_pod_events (worker, log_events_on_startup while
        # Pending); AsyncKubernetesHook.get_pod_events (triggerer, polling fallback)
        "list",
        # watch of list_namespaced_event: AsyncKubernetesHook.watch_pod_events from
        # AsyncPodManager.watch_pod_events while the pod is Pending (triggerer, log_events_on_startup)
        "watch",
    },
}
