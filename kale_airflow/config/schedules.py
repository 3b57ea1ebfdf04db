"""Small helpers shared by the DAG files (kept light: no heavy imports, no metadata-DB reads)."""

from __future__ import annotations

import os


def schedule_from(variable: str, default: str) -> str:
    """A DAG schedule users can change without editing code, read at parse time from the
    environment only (Airflow's guidance: no Variable or metadata-DB reads at parse time):
    ``AIRFLOW_VAR_<VARIABLE>`` (the environment route of the Airflow Variable ``variable``),
    else ``$<VARIABLE>`` (e.g. ``KALE_AUTOSCALER_SCHEDULE``), else ``default``."""
    name = variable.upper()
    return os.environ.get(f"AIRFLOW_VAR_{name}") or os.environ.get(name) or default
