"""The end of the retrain and refit DAGs: review the challenger (alerting when it waits for
review) and announce a promotion as an Asset event (see :mod:`kale_airflow.control.promotions`)."""

from __future__ import annotations

from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowSkipException

from kale_airflow.control.promotions import asset_uri


def model_asset(model: str) -> Asset:
    """The Asset whose events announce a new champion of ``model`` (a registered model name)."""
    return Asset(asset_uri(model))


def review_challenger(model: str, metric: str, summary: dict, registered: dict, auto_promote: bool,
                      job: str = "default") -> dict:
    """Promote the registered challenger if configured and winning on ``metric`` (lower is
    better), else tag it for review in MLflow and alert; returns the review's result."""
    from kale_airflow.config import settings
    from kale_airflow.control.alerts import review_pending
    from kale_airflow.pipelines.common import promote_or_hold

    result = promote_or_hold(settings(), model, registered["version"], summary["metrics"],
                             summary["champion_metrics"], metric, auto_promote)
    review_pending(result, model, job=job)
    return result


def announce_promotion(result: dict, model: str, context, job: str = "default") -> dict:
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
