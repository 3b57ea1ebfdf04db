"""Kale autoscaler: wait for a stabilized scaling decision, apply it, start the new generation."""

from __future__ import annotations

from datetime import datetime

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Param, dag, task

from kale_airflow.config.schedules import schedule_from
from kale_airflow.operators.scale import ScaleWorkersOperator
from kale_airflow.sensors.scaling import ScalingSensor

DOC = """
### Kale autoscaler

1. **wait_for_decision** (`ScalingSensor`, deferrable): every `poll_interval_s` reads
   traffic, backlog, freshness and worker throughput, loads the champion forecaster and
   throughput model from MLflow (cached, reloaded when the `champion` alias moves), and
   asks the Kale policy. Every decision, holds included, is recorded with its reason
   (in the control-plane database, `KALE_DATABASE_URL`; shown on the Kale page). It
   completes when the stabilized decision differs from the running worker count (or
   after `max_polls`, with a hold).
2. **scale_workers** (`ScaleWorkersOperator`): supersedes the running generation (its
   workers checkpoint and exit) and names the new one; idempotent.
3. **start_generation**: triggers `kale_training` with `{workers, generation}`.

Schedule: Airflow Variable `kale_autoscaler_schedule` (default `@continuous`, one run at
a time; the policy's state carries over between runs).
"""


@dag(
    dag_id="kale_autoscaler",
    schedule=schedule_from("kale_autoscaler_schedule", "@continuous"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["kale"],
    doc_md=DOC,
    params={
        "poll_interval_s": Param(15, type="number", minimum=1, description="seconds between observations"),
        "max_polls": Param(240, type="integer", minimum=1, description="observations per run before a hold"),
    },
)
def kale_autoscaler():
    wait = ScalingSensor(task_id="wait_for_decision", poll_interval_s="{{ params.poll_interval_s }}",
                         max_polls="{{ params.max_polls }}", doc_md="Deferred until Kale decides a rescale is due.")
    applied = ScaleWorkersOperator(task_id="scale_workers", decision=wait.output,
                                   doc_md="Supersede the running generation; name the new one.")

    @task.short_circuit(doc_md="Skip the trigger when nothing was applied.")
    def changed(result: dict) -> bool:
        return not result["skip"]

    start = TriggerDagRunOperator(
        task_id="start_generation",
        trigger_dag_id="kale_training",
        conf={"workers": "{{ ti.xcom_pull(task_ids='scale_workers')['workers'] }}",
              "generation": "{{ ti.xcom_pull(task_ids='scale_workers')['generation'] }}"},
        doc_md="One `kale_training` run per generation of workers.",
    )
    changed(applied.output) >> start


kale_autoscaler()
