"""Kale autoscaler: wait for a stabilized scaling decision, apply it, start the new generation."""

from __future__ import annotations

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, task

from kale_airflow.config import dag_id
from kale_airflow.config.schedules import deployment_jobs, job_dag_args
from kale_airflow.operators.failures import kale_default_args
from kale_airflow.operators.promotion import model_asset
from kale_airflow.operators.scale import ScaleWorkersOperator
from kale_airflow.registry.mlflow_registry import job_models
from kale_airflow.sensors.scaling import ScalingSensor

DOC = """
### Kale autoscaler

One per job of the deployment file (`kale_autoscaler__<job>`; `kale_autoscaler` for a
single-job deployment), each starting its own job's training DAG.

1. **wait_for_decision** (`ScalingSensor`, deferrable): every `poll_interval_s` reads
   traffic, backlog, freshness and worker throughput, loads the champion forecaster and
   throughput model from MLflow (cached; reloaded when a retrain/refit announces a
   promotion, the `kale://models/...` Asset event, or an alias moved by hand shows up at
   the 10-minute check), and
   asks the Kale policy. Every decision, holds included, is recorded with its reason
   (in the control-plane database, `KALE_DATABASE_URL`; shown on the Kale page). It
   completes when the stabilized decision differs from the running worker count (or
   after `max_polls`, with a hold).
2. **scale_workers** (`ScaleWorkersOperator`): supersedes the running generation (its
   workers checkpoint and exit) and names the new one, in one compare-and-set transaction
   against the generation the decision saw; a retry returns the generation its first try
   made, to be started if no training run has started it yet.
3. **start_generation**: triggers `kale_training` with `{workers, generation}`, under a run
   id made of this run's and the generation's, so a retry never starts a second run.

**Shadow mode** (`shadow: true` in the deployment file, or the `shadow` param of a run):
decisions are recorded with `applied: false` next to the worker count that actually ran
(pods, heartbeats or throughput observations) and `scale_workers` starts nothing; compare
on the Kale page or with `kale status`.

Retries: 2 (30 s apart) for transient faults; a broken deployment file fails at once.
Failures and an SLO at risk for `alerts.slo_risk_minutes` reach the configured notifier.

Schedule: `AIRFLOW_VAR_KALE_AUTOSCALER_SCHEDULE` (or `KALE_AUTOSCALER_SCHEDULE`) in the
DAG processor's environment, read at parse time without a metadata-DB lookup (default
`@continuous`, one run at a time; the policy's state carries over between runs).
"""


def kale_autoscaler_dag(job: str):
    """The autoscaler DAG of one job (``kale_autoscaler`` for the default job)."""
    forecaster, throughput = job_models(job)

    @dag(
        **job_dag_args("kale_autoscaler", job, "@continuous", DOC),
        default_args=kale_default_args(retries=2, retry_delay_s=30),
        params={
            "poll_interval_s": Param(15, type="number", minimum=1, description="seconds between observations"),
            "max_polls": Param(240, type="integer", minimum=1, description="observations per run before a hold"),
            "shadow": Param(None, type=["null", "boolean"],
                            description="decide and record only, never apply (empty: the deployment's `shadow`)"),
        },
    )
    def kale_autoscaler():
        wait = ScalingSensor(task_id="wait_for_decision", job=job, poll_interval_s="{{ params.poll_interval_s }}",
                             max_polls="{{ params.max_polls }}", shadow="{{ params.shadow }}",
                             # the champions it reloads when their promotion is announced (lineage in the graph)
                             inlets=[model_asset(forecaster), model_asset(throughput)],
                             doc_md="Deferred until Kale decides a rescale is due.")
        applied = ScaleWorkersOperator(task_id="scale_workers", job=job, decision=wait.output,
                                       shadow="{{ params.shadow }}",
                                       doc_md="Supersede the running generation; name the new one (shadow: nothing).")

        @task.short_circuit(doc_md="Skip the trigger when nothing was applied.")
        def changed(result: dict) -> bool:
            return not result["skip"]

        start = TriggerDagRunOperator(
            task_id="start_generation",
            trigger_dag_id=dag_id("kale_training", job),
            conf={"workers": "{{ ti.xcom_pull(task_ids='scale_workers')['workers'] }}",
                  "generation": "{{ ti.xcom_pull(task_ids='scale_workers')['generation'] }}"},
            # One training run per generation: a retry of this task finds the run it made.
            trigger_run_id="{{ run_id }}__{{ ti.xcom_pull(task_ids='scale_workers')['generation'] }}",
            skip_when_already_exists=True,
            doc_md="One training run per generation of workers.",
        )
        changed(applied.output) >> start

    return kale_autoscaler()


for _job in deployment_jobs():
    globals()[dag_id("kale_autoscaler", _job)] = kale_autoscaler_dag(_job)
