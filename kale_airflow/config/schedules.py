"""Small helpers shared by the DAG files (kept light: no heavy imports)."""

from __future__ import annotations

import os


def schedule_from(variable: str, default: str) -> str:
    """A DAG schedule users can change without editing code: the Airflow Variable
    ``variable`` (set it in Admin > Variables), else ``$KALE_<VARIABLE>``, else ``default``.

    Read at parse time; outside a running Airflow (no metadata DB) the default applies."""
    env = os.environ.get(variable.upper())
    try:
        from airflow.sdk import Variable

        return Variable.get(variable, default=env or default)
    except Exception:  # noqa: BLE001 - no Airflow context at parse time in tests/CLI
        return env or default
