"""KubernetesPodOperator for Kale's GPU workers, with Kubernetes errors a user can act on."""

from __future__ import annotations

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk.exceptions import AirflowException


class KubernetesPermissionError(AirflowException):
    """The Airflow service account lacks an RBAC permission (403); retrying cannot help."""


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
                    f"(plus get, list, watch, patch, delete on pods, get on pods/log, list on events) in "
                    f"'{namespace}'. Install the kale-airflow chart's Role and RoleBinding for that service account "
                    f"(values airflow.workerServiceAccount / training.namespace). API said: {exc.reason}"
                ) from exc
            if exc.status == 409:
                pod = self.find_pod(namespace, context=context, exclude_checked=False)
                if pod is not None:
                    self.log.info("pod %s already exists (409): reattaching to it", pod.metadata.name)
                    return pod
            raise
