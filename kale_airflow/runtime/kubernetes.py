"""Kubernetes GPU worker pods: the pod settings every worker pod gets, and its labels.

One ``KubernetesPodOperator`` per worker of a generation; the pod runs the same worker
command as a local process. The pod: ``nvidia.com/gpu`` limit, node selector and
tolerations for GPU nodes, the checkpoint PersistentVolumeClaim mounted at
``/checkpoints``, non-root security context with no privilege escalation and all
capabilities dropped, CPU/memory requests, a grace period long enough to checkpoint on
SIGTERM, and labels naming the generation and worker.
"""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta

from kale_airflow.config import KubernetesWorkerConfig

CHECKPOINT_MOUNT = "/checkpoints"


def label_value(text: str) -> str:
    """A valid label value (<= 63 chars of [a-z0-9._-], alphanumeric ends) that stays unique."""
    clean = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    if len(clean) > 63 or clean != text:
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        clean = f"{clean[:54].strip('-._')}-{digest}"
    return clean or "x"


# Labels on every worker pod; the autoscaler counts Running pods by the first one.
WORKER_LABELS = {"app.kubernetes.io/name": "kale-worker", "app.kubernetes.io/part-of": "kale-airflow"}
WORKER_SELECTOR = f"app.kubernetes.io/name={WORKER_LABELS['app.kubernetes.io/name']}"


def pod_kwargs(cfg: KubernetesWorkerConfig) -> dict:
    """KubernetesPodOperator arguments shared by every worker pod."""
    from kubernetes.client import models as k8s

    limits = {"memory": cfg.memory_limit}
    if cfg.gpus_per_worker:
        limits["nvidia.com/gpu"] = str(cfg.gpus_per_worker)
    return dict(
        namespace=cfg.namespace,
        image=cfg.image,
        container_resources=k8s.V1ResourceRequirements(
            requests={"cpu": cfg.cpu_request, "memory": cfg.memory_request}, limits=limits),
        node_selector=dict(cfg.node_selector),
        tolerations=[k8s.V1Toleration(**t) for t in cfg.tolerations],
        volumes=[k8s.V1Volume(name="checkpoints", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
            claim_name=cfg.checkpoint_claim)),
            k8s.V1Volume(name="tmp", empty_dir=k8s.V1EmptyDirVolumeSource())],  # writable scratch, root fs is read-only
        volume_mounts=[k8s.V1VolumeMount(name="checkpoints", mount_path=CHECKPOINT_MOUNT),
                       k8s.V1VolumeMount(name="tmp", mount_path="/tmp")],
        env_vars=[k8s.V1EnvVar(name="HOME", value="/tmp")],
        security_context=k8s.V1PodSecurityContext(run_as_non_root=True, run_as_user=cfg.run_as_user,
                                                  run_as_group=cfg.run_as_user, fs_group=cfg.run_as_user),
        container_security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False, read_only_root_filesystem=True,
            capabilities=k8s.V1Capabilities(drop=["ALL"]), seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault")),
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
    )


# Every Kubernetes API call made for the workers, all through KubernetesPodOperator's
# PodManager (synchronous mode, no XCom sidecar): (API group, resource) -> verbs. The Helm
# chart's Role grants exactly these; a test keeps the two equal.
KUBERNETES_API_CALLS = {
    ("", "pods"): {
        "create",   # create_namespaced_pod
        "get",      # read_namespaced_pod (status polling)
        "list",     # list_namespaced_pod (find the pod again on reattach_on_restart)
        "watch",    # PodManager's watch.Watch() on pod phases
        "patch",    # patch_namespaced_pod (mark the pod as checked before deletion)
        "delete",   # delete_namespaced_pod (on_finish_action="delete_pod")
    },
    ("", "pods/log"): {"get"},  # read_namespaced_pod_log (get_logs=True)
    ("", "events"): {"list"},   # list_namespaced_event (reported when a pod fails)
}
