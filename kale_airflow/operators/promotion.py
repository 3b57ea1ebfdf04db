"""The end of the retrain and refit DAGs: review the challenger (alerting when it waits for
review) and announce a promotion as an Asset event (see :mod:`kale_airflow.control.promotions`)."""

from __future__ import annotations

from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowSkipException

from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.control.promotions import asset_uri


def model_asset(model: str) -> Asset:
    """The Asset whose events announce a new champion of ``model`` (a registered model name)."""
    return Asset(asset_uri(model))


def review_challenger(model: str, metric: str, summary: dict, registered: dict, auto_promote: bool,
                      job: str = DEFAULT_JOB) -> dict:
    """Promote the registered challenger if configured and winning on ``metric`` (lower is
    better), else tag it for review in MLflow and alert; returns the review's result."""
    from kale_airflow.config import settings
    from kale_airflow.control.alerts import review_pending
    from kale_airflow.pipelines.common import promote_or_hold

    result = promote_or_hold(settings(), model, registered["version"], summary["metrics"],
                             summary["champion_metrics"], metric, auto_promote)
    review_pending(result, model, job=job)
    return result


def announce_promotion(result: dict, model: str, context, job: str = DEFAULT_JOB) -> dict:
    """Body of an ``announce_champion`` task (outlet: :func:`model_asset`): after a promotion the
    asset event carries model and version and job ``job``'s control store records it (its
    autoscaler reloads); after a hold the task is skipped, so no asset event is emitted."""
    from kale_airflow.config import settings
    from kale_airflow.control.promotions import announce
    from kale_airflow.store import StateStore

    extra = announce(StateStore(settings().database_url, job), result, model)
    if extra is None:
        raise AirflowSkipException(f"{model} v{result.get('version')} was held for review: no new champion")
    context["outlet_events"][model_asset(model)].extra = extra
    return extra


def promotion_tasks(model: str, metric: str, job: str = DEFAULT_JOB):
    """The last two tasks of a retrain or refit DAG for ``model``: ``promote_or_hold(summary,
    registered)`` (:func:`review_challenger` on ``metric``, the run's ``auto_promote`` param)
    and ``announce_champion(result)`` (:func:`announce_promotion`, outlet :func:`model_asset`)."""
    from airflow.sdk import get_current_context, task

    from kale_airflow.operators.failures import no_retry_on_permanent_errors

    @task(task_id="promote_or_hold",
          doc_md=f"Promote if configured and winning (lower {metric}), else tag for review in MLflow (and alert).")
    @no_retry_on_permanent_errors
    def promote_or_hold(summary: dict, registered: dict, params: dict | None = None) -> dict:
        return review_challenger(model, metric, summary, registered, bool(params["auto_promote"]), job)

    @task(task_id="announce_champion", outlets=[model_asset(model)],
          doc_md=f"A promotion: an asset event on `{asset_uri(model)}` (the autoscaler reloads). A hold: skipped.")
    @no_retry_on_permanent_errors
    def announce_champion(result: dict) -> dict:
        return announce_promotion(result, model, get_current_context(), job)

    return promote_or_hold, announce_champion
