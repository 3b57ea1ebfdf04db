"""Retrain the traffic forecaster, backtest it against the champion, register, promote or hold."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Param, dag, get_current_context, task

from kale_airflow.config.schedules import schedule_from

DOC = """
### Kale: retrain the traffic forecaster

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
tagged `kale.review=pending` with the comparison in its description: review it in the
MLflow UI and move the `champion` alias to promote it.

Schedule: Airflow Variable `kale_forecaster_retrain_schedule` (default `@daily`).
"""


@dag(
    dag_id="kale_forecaster_retrain",
    schedule=schedule_from("kale_forecaster_retrain_schedule", "@daily"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["kale", "mlflow"],
    doc_md=DOC,
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
    def extract(params: dict | None = None) -> dict:
        from kale_airflow.config import settings
        from kale_airflow.pipelines.forecaster import extract_traffic

        return extract_traffic(settings(), get_current_context()["run_id"], float(params["history_days"]))

    @task(doc_md="Fail with the row and the problem on gaps, NaNs, bad values, too short or constant history.")
    def validate(extracted: dict, params: dict | None = None) -> dict:
        from kale_airflow.pipelines.forecaster import validate_traffic

        return validate_traffic(extracted["path"], float(params["horizon_minutes"]), float(params["test_days"]))

    @task(doc_md="Train before the test window; backtest the challenger and the champion on it.")
    def train_backtest(extracted: dict, report: dict, params: dict | None = None) -> dict:
        from kale_airflow.config import settings
        from kale_airflow.pipelines.forecaster import train_and_backtest

        return train_and_backtest(settings(), get_current_context()["run_id"], extracted["path"],
                                  params["forecaster"], float(params["horizon_minutes"]), float(params["test_days"]),
                                  params["forecaster_options"], source=extracted["source"])

    @task(doc_md="Log params, metrics, backtest plot, window and data hash; register with alias `challenger`.")
    def register(summary: dict) -> dict:
        from kale_airflow.config import settings
        from kale_airflow.pipelines.forecaster import register_forecaster

        return register_forecaster(settings(), get_current_context()["run_id"], summary)

    @task(doc_md="Promote to `champion` if configured and winning, else tag for review in MLflow.")
    def promote_or_hold(summary: dict, registered: dict, params: dict | None = None) -> dict:
        from kale_airflow.config import settings
        from kale_airflow.pipelines.common import promote_or_hold as decide
        from kale_airflow.registry.mlflow_registry import FORECASTER_MODEL

        return decide(settings(), FORECASTER_MODEL, registered["version"], summary["metrics"],
                      summary["champion_metrics"], "mase", bool(params["auto_promote"]))

    extracted = extract()
    summary = train_backtest(extracted, validate(extracted))
    promote_or_hold(summary, register(summary))


kale_forecaster_retrain()
