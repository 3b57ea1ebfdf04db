"""Errors that retrying cannot fix fail the task at once (``AirflowFailException``).

A module of an optional extra that is not installed (torch, NeuralProphet, Kafka, ...)
fails the same way, with the ``pip install 'kale-airflow[EXTRA]'`` command to run.

A wrong deployment file, a trace that fails validation, a forecaster given bad options or
unusable history, a control-plane database of another schema version, an impossible
rebalance or a throughput refit without measured observations (``kale profile`` records
them) stay wrong on the next try: the glue re-raises
them as ``AirflowFailException`` (the message kept), so Airflow skips the retries the DAGs'
``default_args`` grant to transient faults (a database or MLflow briefly unreachable)."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from datetime import timedelta

from airflow.sdk.exceptions import AirflowFailException


def permanent_errors() -> tuple[type[BaseException], ...]:
    """The error classes no retry can fix."""
    from kale_airflow.config import ConfigError
    from kale_airflow.core.forecast import ForecastError
    from kale_airflow.core.rebalance import RebalanceError
    from kale_airflow.core.traffic import TraceError
    from kale_airflow.pipelines.throughput import NoThroughputObservations
    from kale_airflow.store.database import SchemaVersionError

    return ConfigError, TraceError, SchemaVersionError, RebalanceError, ForecastError, NoThroughputObservations


# Modules of the optional extras (pip install 'kale-airflow[EXTRA]').
EXTRAS = {"torch": "worker", "neuralprophet": "forecast", "statsforecast": "forecast", "pytorch_lightning": "forecast",
          "confluent_kafka": "kafka", "psycopg": "postgres", "prometheus_client": "prometheus"}


class KaleFailure(AirflowFailException):
    """A permanent Kale error, failing the task without retries."""


def missing_extra(exc: BaseException) -> str | None:
    """For a missing module of an optional extra: the message with the pip command to run."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    extra = EXTRAS.get(exc.name.split(".")[0])
    if extra is None:
        return None
    return (f"this task needs {exc.name!r}, which the light kale-airflow install leaves out: "
            f"pip install 'kale-airflow[{extra}]' (or '[all]') in this Airflow image")


@contextmanager
def fail_fast():
    """Re-raise permanent errors as :class:`KaleFailure`; others propagate (and are retried)."""
    try:
        yield
    except AirflowFailException:
        raise
    except permanent_errors() as exc:
        raise KaleFailure(f"{type(exc).__name__}: {exc} (not retried: fix the cause, then clear the task)") from exc
    except ModuleNotFoundError as exc:
        message = missing_extra(exc)
        if message is None:
            raise
        raise KaleFailure(message) from exc


def no_retry_on_permanent_errors(fn):
    """Decorator form of :func:`fail_fast` for ``@task`` bodies."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with fail_fast():
            return fn(*args, **kwargs)

    return wrapper


def kale_default_args(retries: int, retry_delay_s: float, *, backoff: bool = False) -> dict:
    """``default_args`` of a Kale DAG: retries for transient faults and the failure alert
    (:func:`kale_airflow.control.alerts.task_failure_callback`) once a task fails for good."""
    from kale_airflow.control.alerts import task_failure_callback

    return {"retries": retries, "retry_delay": timedelta(seconds=retry_delay_s),
            "retry_exponential_backoff": 2.0 if backoff else 0, "on_failure_callback": task_failure_callback}
