"""Refit the resource-to-throughput model from recorded (workers, samples/s) observations."""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from kale_airflow.config import dag_id
from kale_airflow.config.schedules import deployment_jobs, job_dag_args
from kale_airflow.operators.failures import kale_default_args, no_retry_on_permanent_errors
from kale_airflow.operators.promotion import promotion_tasks
from kale_airflow.registry.mlflow_registry import job_models

DOC = """
### Kale: refit the throughput model

One per job of the deployment file (`kale_throughput_refit__<job>`, fitting
`kale-throughput-model-<job>` on that job's observations; plain names for a single-job
deployment).

Reads (workers, samples/s) observations from the metrics source (the training job's rank 0
records them; on a new deployment `kale profile` runs the job at a few world sizes to record
the first ones), fits the Ernest-style model on all but the newest `holdout_fraction`, scores
it and the champion on those, registers `kale-throughput-model` with alias `challenger`, then
promotes or holds it for review exactly like the forecaster. A promotion ends with `announce_champion`, an asset
event on `kale://models/throughput` that tells the autoscaler to reload its champions.

Without at least 4 measured observations at 2 or more worker counts `fit` fails at once,
naming `kale profile`; it never fits simulated data (rows at timestamp 0, which earlier
versions seeded into every empty store, are ignored).

A challenger held for review and a task that fails for good (2 retries, 5 min apart with
backoff; a broken deployment file or missing observations are not retried) reach the
configured alert notifier.

Schedule: `AIRFLOW_VAR_KALE_THROUGHPUT_REFIT_SCHEDULE` (or `KALE_THROUGHPUT_REFIT_SCHEDULE`)
in the DAG processor's environment, read without a metadata-DB lookup (default `@hourly`).
"""


def kale_throughput_refit_dag(job: str):
    """The refit DAG of one job's throughput model (``kale_throughput_refit`` for the default job)."""
    model = job_models(job)[1]

    @dag(
        **job_dag_args("kale_throughput_refit", job, "@hourly", DOC, "mlflow"),
        default_args=kale_default_args(retries=2, retry_delay_s=300, backoff=True),
        params={
            "holdout_fraction": Param(0.2, type="number", minimum=0.05, maximum=0.5,
                                      description="newest observations held out for scoring"),
            "auto_promote": Param(True, type="boolean", description="promote a winning challenger without review"),
        },
    )
    def kale_throughput_refit():
        @task(doc_md="Fit on older observations; score it and the champion on the newest.")
        @no_retry_on_permanent_errors
        def fit(params: dict | None = None) -> dict:
            from kale_airflow.config import settings
            from kale_airflow.pipelines.throughput import refit_throughput

            return refit_throughput(settings(job), get_current_context()["run_id"], float(params["holdout_fraction"]))

        @task(doc_md="Log and register with alias `challenger`.")
        @no_retry_on_permanent_errors
        def register(summary: dict) -> dict:
            from kale_airflow.config import settings
            from kale_airflow.pipelines.throughput import register_throughput

            return register_throughput(settings(job), get_current_context()["run_id"], summary)

        promote_or_hold, announce_champion = promotion_tasks(model, "rel_rmse", job)
        summary = fit()
        announce_champion(promote_or_hold(summary, register(summary)))



    return kale_throughput_refit()


for _job in deployment_jobs():
    globals()[dag_id("kale_throughput_refit", _job)] = kale_throughput_refit_dag(_job)
