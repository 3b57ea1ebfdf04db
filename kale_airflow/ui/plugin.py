"""Registers the Kale page with Airflow (provider ``plugins`` entry)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from kale_airflow.ui.app import app


class KalePlugin(AirflowPlugin):
    """A FastAPI app under ``/kale`` and a "Kale" entry in the Airflow navigation.

    Airflow registers provider plugins as classes, so these are class attributes."""

    name = "kale"
    fastapi_apps = [{"app": app, "url_prefix": "/kale", "name": "Kale"}]
    external_views = [{"name": "Kale", "href": "/kale/", "destination": "nav", "url_route": "kale"}]
