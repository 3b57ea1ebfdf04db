"""The ``kale_mlflow`` Airflow Connection: MLflow's tracking URI and credentials kept where
Airflow users keep endpoints and secrets.

Set ``KALE_MLFLOW_CONN_ID`` (e.g. ``kale_mlflow_default``) and every Kale component resolves
the tracking URI from that connection instead of ``KALE_MLFLOW_URI``: the tasks, the
triggerer's autoscaler, the Kale page and the ``kale`` command. The connection may come from
the metadata DB (Admin > Connections), a secrets backend or ``AIRFLOW_CONN_<ID>``::

    AIRFLOW_CONN_KALE_MLFLOW_DEFAULT='{"conn_type": "kale_mlflow", "host": "https://mlflow.example.com",
                                       "password": "<token>"}'

Fields: ``host`` is the tracking URI (``https://mlflow.example.com`` or a host name, then
``schema`` is the scheme, default ``http``, and ``port`` is used); ``password`` alone is a
bearer token (``MLFLOW_TRACKING_TOKEN``), with ``login`` it is basic auth
(``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``); ``extra.tracking_uri`` overrides the rest
(e.g. ``databricks`` or ``sqlite:///...``). MLflow's client reads credentials only from the
environment, so they are set in the process that resolves the connection.
"""

from __future__ import annotations

import os
import time

from airflow.sdk import BaseHook

CONN_PREFIX = "airflow-connection:"
CACHE_S = 60.0  # a connection edited in the UI is picked up within a minute
_cache: dict[str, tuple[float, str]] = {}


class KaleMlflowHook(BaseHook):
    """The ``kale_mlflow`` connection type (declared in the provider info)."""

    conn_name_attr = "kale_mlflow_conn_id"
    default_conn_name = "kale_mlflow_default"
    conn_type = "kale_mlflow"
    hook_name = "Kale MLflow"

    def __init__(self, kale_mlflow_conn_id: str = default_conn_name, **kwargs):
        super().__init__(**kwargs)
        self.kale_mlflow_conn_id = kale_mlflow_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict:
        return {"hidden_fields": [],
                "relabeling": {"host": "Tracking URI", "password": "Token (or password with a login)",
                               "login": "Username (basic auth only)", "schema": "Scheme (http/https)"},
                "placeholders": {"host": "https://mlflow.example.com", "extra": '{"tracking_uri": "databricks"}'}}

    def tracking_uri(self) -> str:
        """The tracking URI; sets the client's auth environment from the connection."""
        return tracking_uri_of(self.get_connection(self.kale_mlflow_conn_id))

    def test_connection(self) -> tuple[bool, str]:
        from kale_airflow.registry.mlflow_registry import check_reachable
        from kale_airflow.store.database import masked

        try:
            uri = self.tracking_uri()
            check_reachable(uri)
            return True, f"MLflow at {masked(uri)} answers"
        except Exception as exc:  # noqa: BLE001 - the UI shows the message
            return False, masked(exc)


def tracking_uri_of(conn) -> str:
    """Tracking URI of a ``kale_mlflow`` connection; its credentials go to MLflow's env variables."""
    extra = conn.extra_dejson or {}
    host = (conn.host or "").rstrip("/")
    if extra.get("tracking_uri"):
        uri = str(extra["tracking_uri"])
    elif "://" in host:
        uri = host if conn.port is None or host.count(":") > 1 else f"{host}:{conn.port}"
    elif host:
        uri = f"{conn.schema or 'http'}://{host}" + (f":{conn.port}" if conn.port else "")
    else:
        raise ValueError(f"connection {conn.conn_id!r} has no host (the tracking URI) and no extra.tracking_uri")
    if conn.password and conn.login:
        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = conn.login, conn.password
    elif conn.password:
        os.environ["MLFLOW_TRACKING_TOKEN"] = conn.password
    return uri


def resolve_uri(uri: str) -> str:
    """``airflow-connection:<conn id>`` (what ``KALE_MLFLOW_CONN_ID`` makes of the MLflow URI)
    becomes the connection's tracking URI (cached for a minute); any other URI is returned as is."""
    if not uri.startswith(CONN_PREFIX):
        return uri
    conn_id = uri[len(CONN_PREFIX):]
    hit = _cache.get(conn_id)
    if hit and time.monotonic() - hit[0] < CACHE_S:
        return hit[1]
    resolved = KaleMlflowHook(conn_id).tracking_uri()
    _cache[conn_id] = (time.monotonic(), resolved)
    return resolved
