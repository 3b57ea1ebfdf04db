"""One DAG run per generation of training workers: rebalance shards, then start the workers."""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from kale_airflow.config import dag_id
from kale_airflow.config.schedules import deployment_jobs, job_dag_args
from kale_airflow.operators.failures import kale_default_args
from kale_airflow.operators.rebalance import RebalanceShardsOperator
from kale_airflow.operators.worker_pod import (WorkerPodOperator, training_dag_max_active_tasks,
                                               worker_pods_partial_kwargs)

DOC = """
### Kale training generation

Triggered by its job's autoscaler DAG with `{workers, generation}` (or by hand); one per
job of the deployment file (`kale_training__<job>`; `kale_training` for a single-job
deployment).

1. **rebalance** (`RebalanceShardsOperator`): assigns stream partitions to the workers,
   balanced and sticky (hot partitions sliced); new slices start where the previous
   generation's slices of the same partition stopped (no sample skipped, committed before
   the assignment is published); idempotent per generation.
2. **backend**: the configured `worker_backend` picks the path; the DAG is the same.
   - `local` (embedded default): **start_local_workers** hands the generation to the
     deployment's pool supervisor (starting it if none runs), which keeps one rank process
     per slot across generations: a scale-up starts only the added ranks, a scale-down lets
     the removed ones exit, the others re-join in seconds with the model in memory
     (`worker_warm_wait_s: 0`: a new job per generation, as before).
   Starting the workers claims the generation for this run: another run of the same
   generation is refused (two jobs would train the same slices).
   - `kubernetes`: **worker_pods**, one mapped `KubernetesPodOperator` GPU pod per slot
     that no warm rank keeps (GPU limit, node selector, tolerations, checkpoint PVC,
     non-root, `KALE_DATABASE_URL` from a Secret): all of them for the first generation, a
     scale-up's added slots, none for a scale-down. A pod outlives the generation that
     started it: it re-joins every later generation that has room for its slot, and its
     task (in the run that created it) stays deferred until the pod exits 0, when its slot
     is removed. The pods are deferrable (the triggerer watches them, no worker slot is
     held), run in the `kubernetes.pool` Airflow pool, and may stay Pending up to
     `kubernetes.schedule_timeout_s` while a GPU node is added.
"""


def kale_training_dag(job: str, deployment):
    """The training DAG of one job (``kale_training`` for the default job); ``deployment``: its
    settings at parse time (pool sizes and pod settings)."""

    @dag(
        # Warm pods outlive the run that started them: every run that owns a living pod stays
        # running (at most one per slot), plus the newest generation's run.
        **job_dag_args("kale_training", job, None, DOC, max_active_runs=deployment.max_workers + 1),
        # Transient faults retry (worker pods set their own retries); a generation that fails for
        # good (pods out of retries included) alerts through the configured notifier.
        default_args=kale_default_args(retries=2, retry_delay_s=30),
        # a whole generation of worker pod tasks plus the branch and argument tasks
        max_active_tasks=training_dag_max_active_tasks(deployment),
        params={"workers": Param(1, type=["integer", "string"], description="worker count of this generation"),
                "generation": Param("manual", type="string", description="generation id (unique per run)")},
    )
    def kale_training():
        rebalance = RebalanceShardsOperator(task_id="rebalance", job=job, workers="{{ params.workers }}",
                                            generation="{{ params.generation }}")

        @task.branch(doc_md="Pick the worker backend from the deployment configuration.")
        def backend() -> str:
            from kale_airflow.config import load_config

            return "start_local_workers" if load_config(job).deployment.worker_backend == "local" else "worker_args"

        @task(doc_md="Hand the generation to the local pool of rank processes (embedded default); they outlive "
                     "this task.")
        def start_local_workers(summary: dict) -> list[int]:
            from airflow.sdk import get_current_context

            from kale_airflow.config import load_config
            from kale_airflow.control.generations import Generations

            # The run claims the generation: the autoscaler's retries then know it was started.
            return Generations(load_config(job)).start_local(summary["generation"], get_current_context()["run_id"])

        @task(doc_md="Worker command lines for the pods to start: one per slot that no warm rank keeps.")
        def worker_args(summary: dict) -> list[list[str]]:
            from airflow.sdk import get_current_context

            from kale_airflow.config import load_config
            from kale_airflow.control.generations import Generations

            return Generations(load_config(job)).pod_arguments(summary["generation"], get_current_context()["run_id"])

        summary = rebalance.output
        choice = backend()
        local = start_local_workers(summary)
        args = worker_args(summary)
        rebalance >> choice >> [local, args]
        # Mapped GPU pods (KubernetesPodOperator subclass), one per worker command line.
        WorkerPodOperator.partial(**worker_pods_partial_kwargs(deployment)).expand(arguments=args)

    return kale_training()


for _job, _deployment in deployment_jobs().items():
    globals()[dag_id("kale_training", _job)] = kale_training_dag(_job, _deployment)
