"""Small helpers shared by the DAG files (kept light: no heavy imports, no metadata-DB reads)."""

from __future__ import annotations

import os
from datetime import datetime

from kale_airflow.config.deployment import dag_id
from kale_airflow.core.jobs import DEFAULT_JOB


def schedule_from(variable: str, default: str) -> str:
    """A DAG schedule users can change without editing code, read at parse time from the
    environment only (Airflow's guidance: no Variable or metadata-DB reads at parse time):
    ``AIRFLOW_VAR_<VARIABLE>`` (the environment route of the Airflow Variable ``variable``),
    else ``$<VARIABLE>`` (e.g. ``KALE_AUTOSCALER_SCHEDULE``), else ``default``."""
    name = variable.upper()
    return os.environ.get(f"AIRFLOW_VAR_{name}") or os.environ.get(name) or default


def deployment_jobs() -> dict:
    """Every job of the deployment file by name (its :class:`~kale_airflow.config.Deployment`),
    read at parse time from the file alone, so the DAG files make one set of DAGs per job.
    When the file cannot be read, the ``default`` job with default settings: its DAGs still
    parse, and their first task fails with the file's problem (parsing must not)."""
    from kale_airflow.config import ConfigError, Deployment, load_deployment, settings

    try:
        return dict(load_deployment(settings()).all_jobs)
    except ConfigError:
        return {DEFAULT_JOB: Deployment(stream_url="unconfigured")}


def job_tags(job: str) -> list[str]:
    """The tags of a job's DAGs: ``kale``, and ``job:<name>`` in a deployment of several jobs."""
    return ["kale"] if job == DEFAULT_JOB else ["kale", f"job:{job}"]


def job_dag_args(name: str, job: str, schedule: str | None, doc: str, *tags: str, **overrides) -> dict:
    """The ``@dag`` arguments every Kale DAG of ``job`` shares: its id (``name`` or
    ``name__job``), its schedule (``schedule`` unless ``<NAME>_SCHEDULE`` overrides it, see
    :func:`schedule_from`; None: triggered only), no catch-up, one active run, the job's tags
    plus ``tags``, and ``doc`` as its documentation; ``overrides`` add to or replace them."""
    return {
        "dag_id": dag_id(name, job),
        "schedule": schedule_from(f"{name}_schedule", schedule) if schedule is not None else None,
        "start_date": datetime(2026, 1, 1),
        "catchup": False,
        "max_active_runs": 1,
        "tags": [*job_tags(job), *tags],
        "doc_md": doc,
    } | overrides
