"""KubernetesPodOperator for Kale's GPU workers, with Kubernetes errors a user can act on,
and the factory that builds one worker's pod operator."""

from __future__ import annotations

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk.exceptions import AirflowFailException

from kale_airflow.config import Deployment, KubernetesWorkerConfig
from kale_airflow.core.errors import KaleError
from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.runtime.backends import WorkerSpec
from kale_airflow.runtime.kubernetes import KUBERNETES_API_CALLS, label_value, pod_kwargs, worker_labels


def _required_permissions() -> str:
    """'create, delete, ... on pods; get on pods/log; ...' from KUBERNETES_API_CALLS."""
    return "; ".join(f"{', '.join(sorted(verbs))} on {resource}"
                     for (_, resource), verbs in sorted(KUBERNETES_API_CALLS.items(), key=lambda kv: kv[0][1]))


class KubernetesPermissionError(KaleError, AirflowFailException):
    """The Airflow service account lacks an RBAC permission (403); retrying cannot help,
    so the task fails without using its retries."""


class WorkerPodOperator(KubernetesPodOperator):
    """A worker pod. A 403 names the missing permission and the fix; a 409 on creating our
    own pod (a retry racing an earlier attempt) reattaches to the pod that already exists."""

    def get_or_create_pod(self, pod_request_obj, context):
        from kubernetes.client.exceptions import ApiException

        namespace = pod_request_obj.metadata.namespace or self.namespace
        try:
            return super().get_or_create_pod(pod_request_obj, context)
        except ApiException as exc:
            if exc.status == 403:
                raise KubernetesPermissionError(
                    f"Kubernetes refused to create pod {pod_request_obj.metadata.name} in namespace '{namespace}' "
                    f"(403 Forbidden): the Airflow worker's service account needs the 'create' verb on 'pods' "
                    f"(the worker and triggerer need: {_required_permissions()}) in '{namespace}'. Install the "
                    f"kale-airflow chart's Role and RoleBinding for those service accounts (values "
                    f"airflow.workerServiceAccount / airflow.triggererServiceAccount / training.namespace). "
                    f"API said: {exc.reason}"
                ) from exc
            if exc.status == 409:
                pod = self.find_pod(namespace, context=context, exclude_checked=False)
                if pod is not None:
                    self.log.info("pod %s already exists (409): reattaching to it", pod.metadata.name)
                    return pod
            raise


def worker_pod_operator(cfg: KubernetesWorkerConfig, spec: WorkerSpec, generation: str, worker_id: int,
                        workers: int, assignment: dict, job: str = DEFAULT_JOB,
                        **operator_kwargs) -> WorkerPodOperator:
    """The pod operator (a KubernetesPodOperator) for one worker of a generation of job ``job``."""
    cmd = spec.command(generation, worker_id, workers, assignment)
    return WorkerPodOperator(
        task_id=operator_kwargs.pop("task_id", f"worker_{worker_id}"),
        name=f"kale-worker-{worker_id}",
        cmds=cmd[:1],
        arguments=cmd[1:],
        labels={**worker_labels(job), "kale-airflow/generation": label_value(generation),
                "kale-airflow/worker": str(worker_id)},
        **pod_kwargs(cfg),
        **operator_kwargs,
    )


def worker_pods_partial_kwargs(dep: Deployment) -> dict:
    """``WorkerPodOperator.partial(**these).expand(arguments=...)``: the kale_training DAG's
    mapped GPU pods, one per worker command line (the DAG and its tests share this)."""
    return dict(
        task_id="worker_pods", name="kale-worker", cmds=["python"], labels=worker_labels(dep.job),
        # a whole generation (up to max_workers pods) may be in flight (deferred counts here)
        max_active_tis_per_dagrun=dep.max_workers,
        **{**pod_kwargs(dep.kubernetes),
           # local deployments never start pods: parse in default_pool, no "non-existent pool" warning
           **({} if dep.worker_backend == "kubernetes" else {"pool": "default_pool"})},
    )


def training_dag_max_active_tasks(dep: Deployment) -> int:
    """The kale_training DAG's max_active_tasks: every worker pod task plus the branch and the
    argument task (Airflow's default of 16 per DAG would hold larger generations back)."""
    return dep.max_workers + 2


def pod_manifest(operator: KubernetesPodOperator) -> dict:
    """The pod the operator would create, as a plain manifest (no cluster needed)."""
    from kubernetes.client import ApiClient

    pod = operator.build_pod_request_obj(dry_run=True)
    return ApiClient().sanitize_for_serialization(pod)
