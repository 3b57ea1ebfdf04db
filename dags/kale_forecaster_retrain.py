"""Retrain the traffic forecaster, backtest it against the champion, register, promote or hold."""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from kale_airflow.config import dag_id
from kale_airflow.config.schedules import deployment_jobs, job_dag_args
from kale_airflow.operators.failures import kale_default_args, no_retry_on_permanent_errors
from kale_airflow.operators.promotion import promotion_tasks
from kale_airflow.registry.mlflow_registry import job_models

DOC = """
### Kale: retrain the traffic forecaster

One per job of the deployment file (`kale_forecaster_retrain__<job>`, training
`kale-traffic-forecaster-<job>` on that job's traffic; plain names for a single-job
deployment).

Extracts the traffic the autoscaler observed on the stream (recorded per bin in the
control-plane database; before anything was observed, the bundled NYC taxi trace stands
in and the MLflow run's `traffic_source` param says so), validates it, trains the forecaster
on all but the last `test_days`, backtests it **and the current champion** on those days
(rolling origins, past data only), logs the run to MLflow and registers a new version of
`kale-traffic-forecaster` with alias `challenger`.

The default forecaster, `auto`, is a roster: the seasonal baseline, MSTL, NeuralProphet and
two ensembles are backtested on the last days of the training history (before the test
window); the winner is what gets registered. The run logs `selected` (param and the
version tag `kale.selected`) and every candidate's scores (`candidate.<name>.mase`,
`.smape`, `.mae`), which also appear in the version's description.

With `auto_promote` on, a challenger with a lower MASE becomes `champion`; otherwise it is
tagged `kale.review=pending` with the comparison in its description (and the alert notifier
says so): review it in the MLflow UI and promote it with `kale promote forecaster VERSION`,
which records who approved it (an alias moved in the MLflow UI is recorded as
`approved-manually` when the autoscaler notices).

A promotion ends with `announce_champion`, whose outlet is the Asset
`kale://models/forecaster`: the asset event (model, version) tells the autoscaler to reload
its champions (skipped after a hold: no event).

Retries: 2, 5 min apart with backoff, for transient faults (MLflow briefly unreachable);
bad traffic history or a broken deployment file fails at once. A task that fails for good
reaches the alert notifier.

Schedule: Airflow Variable `kale_forecaster_retrain_schedule` (default `@daily`).
"""


def kale_forecaster_retrain_dag(job: str):
    """The retrain DAG of one job's forecaster (``kale_forecaster_retrain`` for the default job)."""
    model = job_models(job)[0]

    @dag(
        **job_dag_args("kale_forecaster_retrain", job, "@daily", DOC, "mlflow"),
        default_args=kale_default_args(retries=2, retry_delay_s=300, backoff=True),
        params={
            "history_days": Param(14, type="number", exclusiveMinimum=0,
                                  description="days of traffic history to train on (at least twice test_days)"),
            "horizon_minutes": Param(60, type="number", exclusiveMinimum=0,
                                     description="how far ahead the forecast is judged (at least one data step)"),
            "test_days": Param(1, type="number", exclusiveMinimum=0,
                               description="most recent days held out for the backtest"),
            "forecaster": Param("auto", type="string", enum=["auto", "mstl", "neuralprophet", "seasonal"],
                                description="auto: backtest the roster (seasonal, MSTL, NeuralProphet, ensembles) on "
                                            "the last days before the test window and keep the winner"),
            "forecaster_options": Param({}, type="object",
                                        description="constructor options of the forecaster, e.g. {\"epochs\": 20}; "
                                                    "logged as option.* params"),
            "auto_promote": Param(False, type="boolean", description="promote a winning challenger without review"),
        },
    )
    def kale_forecaster_retrain():
        @task(doc_md="Read the traffic history into the run folder.")
        @no_retry_on_permanent_errors
        def extract(params: dict | None = None) -> dict:
            from kale_airflow.config import settings
            from kale_airflow.pipelines.forecaster import extract_traffic

            return extract_traffic(settings(job), get_current_context()["run_id"], float(params["history_days"]))

        @task(doc_md="Fail with the row and the problem on gaps, NaNs, bad values, too short or constant history.")
        @no_retry_on_permanent_errors
        def validate(extracted: dict, params: dict | None = None) -> dict:
            from kale_airflow.pipelines.forecaster import validate_traffic

            return validate_traffic(extracted["path"], float(params["horizon_minutes"]), float(params["test_days"]))

        @task(doc_md="Train before the test window; backtest the challenger and the champion on it.")
        @no_retry_on_permanent_errors
        def train_backtest(extracted: dict, report: dict, params: dict | None = None) -> dict:
            from kale_airflow.config import settings
            from kale_airflow.pipelines.forecaster import train_and_backtest

            return train_and_backtest(settings(job), get_current_context()["run_id"], extracted["path"],
                                      params["forecaster"], float(params["horizon_minutes"]),
                                      float(params["test_days"]),
                                      params["forecaster_options"], source=extracted["source"])

        @task(doc_md="Log params, metrics, backtest plot, window and data hash; register with alias `challenger`.")
        @no_retry_on_permanent_errors
        def register(summary: dict) -> dict:
            from kale_airflow.config import settings
            from kale_airflow.pipelines.forecaster import register_forecaster

            return register_forecaster(settings(job), get_current_context()["run_id"], summary)

        promote_or_hold, announce_champion = promotion_tasks(model, "mase", job)
        extracted = extract()
        summary = train_backtest(extracted, validate(extracted))
        announce_champion(promote_or_hold(summary, register(summary)))



    return kale_forecaster_retrain()


for _job in deployment_jobs():
    globals()[dag_id("kale_forecaster_retrain", _job)] = kale_forecaster_retrain_dag(_job)
