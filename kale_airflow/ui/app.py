"""FastAPI app mounted at ``/kale`` by the Airflow API server.

Plugin apps are served without authentication unless their routes ask for it, so every
route depends on Airflow's ``get_user`` (a valid Airflow JWT, from the Authorization header
or the UI's session cookie; anonymous requests get 401) and on a permission asked of the
deployment's auth manager (SimpleAuthManager, FAB, Keycloak...): read access to the
``kale_autoscaler`` DAG, whose decisions the page shows; a user without it gets 403.
Everything served is masked (:func:`~kale_airflow.store.database.masked`): a recorded
message or an MLflow error may quote a URL with its password.
"""

from __future__ import annotations

import html
import os
import time

from airflow.api_fastapi.core_api.security import get_user, requires_access_dag
from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse, Response

from kale_airflow.store.database import masked, masked_values

TITLE, DESCRIPTION = "Kale", "Kale autoscaler: forecasts, workers and decisions"
AUTOSCALER_DAG_ID = "kale_autoscaler"
# Airflow's own check (the auth manager's is_authorized_dag, with the DAG's team when
# multi-team is on), so a role's DAG permissions govern the page as they govern the DAG's views.
can_read_kale = requires_access_dag("GET", param_dag_id=AUTOSCALER_DAG_ID)


def _store():  # pragma: no mutate block
    from kale_airflow.config import settings
    from kale_airflow.store import StateStore

    return StateStore(settings().database_url)


def _state(limit: int = 500) -> dict:  # pragma: no mutate block
    from kale_airflow.config import settings

    store = _store()
    return masked_values({"decisions": store.decisions(limit), "current": store.current(),
                          "models": _models(settings()), "shadow": _shadow(store)})


def _shadow(store) -> dict | None:  # pragma: no mutate block
    """Shadow mode: Kale's decisions against the worker counts that actually ran, with the
    GPU-hours and the (fluid-model) freshness each had or would have had; None without
    shadow decisions."""
    from kale_airflow.config import ConfigError, load_config
    from kale_airflow.control.shadow import SHADOW_WINDOW, compare

    rows = [d for d in store.decisions(SHADOW_WINDOW) if d.get("shadow")]
    if not rows:
        return None
    try:
        dep = load_config().deployment
        gpus = dep.kubernetes.gpus_per_worker if dep.worker_backend == "kubernetes" else 1
        poll, slo = dep.poll_interval_s, dep.slo_s
    except ConfigError:
        gpus, poll, slo = 1, 15.0, None
    return compare(rows, gpus, poll, slo) | {"on": bool(rows[-1].get("shadow")), "gpus_per_worker": gpus}


def _models(cfg) -> list[dict]:  # pragma: no mutate block
    """Champion and challenger versions with links into the MLflow UI (empty if unreachable)."""
    from kale_airflow.registry.mlflow_registry import (
        CHALLENGER,
        CHAMPION,
        FORECASTER_MODEL,
        THROUGHPUT_MODEL,
        RegistryUnavailable,
        alias_version,
        registry_client,
    )

    ui = os.environ.get("KALE_MLFLOW_UI_URL", "http://localhost:5000").rstrip("/")
    out = []
    try:
        client = registry_client(cfg.mlflow_uri)  # cached per URI; no MLflow global (API server threads)
        for name in (FORECASTER_MODEL, THROUGHPUT_MODEL):
            for alias in (CHAMPION, CHALLENGER):
                mv = alias_version(client, name, alias)  # None only when the model or alias does not exist
                if mv is None:
                    continue
                out.append({"model": name, "alias": alias, "version": str(mv.version),
                            "review": mv.tags.get("kale.review", ""),
                            "url": f"{ui}/#/models/{name}/versions/{mv.version}"})
    except RegistryUnavailable as exc:
        out.append({"model": "MLflow unavailable", "alias": "", "version": "", "review": masked(exc)[:300], "url": ""})
    return out


def state() -> dict:  # pragma: no mutate block
    """Decisions (holds included), the running generation and the registered models."""
    return _state()


def _figure_settings() -> tuple[float | None, float | None, int]:  # pragma: no mutate block
    """The deployment's freshness SLO, planned forecast quantile, and how many decisions make
    a day at its poll interval; (None, None, 2000) when its configuration cannot be read."""
    from kale_airflow.config import ConfigError, load_config

    try:
        dep = load_config().deployment
    except ConfigError:
        return None, None, 2000
    return dep.slo_s, dep.kale_config.forecast_quantile, min(20000, int(86400 / dep.poll_interval_s) + 1)


def plot() -> Response:  # pragma: no mutate block
    """The last day of decisions on a wall-clock axis: forecast vs actual traffic with the
    forecast band and the workers' capacity, the workers against the plan's target with
    each rescale's reason, every decision by reason, and the freshness lag against the SLO."""
    from kale_airflow.reporting.plots import plot_decisions, png_bytes

    slo_s, quantile, day = _figure_settings()
    decisions = _store().decisions(day)  # the control store only: no MLflow round trip for the image
    return Response(png_bytes(plot_decisions(decisions, slo_s, quantile)), media_type="image/png")


def _link(m: dict) -> str:  # pragma: no mutate block
    if not m["url"]:
        return ""
    return f'<a href="{html.escape(m["url"])}">v{html.escape(m["version"])}</a>'


def _num(value, fmt: str) -> str:  # pragma: no mutate block
    return "-" if value is None else fmt.format(value)


def _shadow_html(sh: dict | None) -> str:  # pragma: no mutate block
    if not sh or not sh.get("ran"):
        return ""
    rows = "".join(
        f"<tr><td>{who}</td><td>{_num(side['gpu_hours'], '{:.3f}')}</td><td>{_num(side['mean_workers'], '{:.2f}')}</td>"
        f"<td>{side['worker_changes']}</td><td>{_num(side.get('max_lag_s'), '{:.0f} s')}</td>"
        f"<td>{_num(side.get('slo_violation_rate'), '{:.1%}')}</td></tr>"
        for who, side in (("ran (autoscaler in charge)", sh["ran"]), ("Kale (shadow, not applied)", sh["kale"])))
    return (f"<h2>Shadow mode</h2><p>{'On' if sh['on'] else 'Was on'}: Kale decides and records, never applies. "
            f"{sh['decisions']} decisions over {sh['hours']:.2f} h; Kale agreed with the running count "
            f"{_num(sh['agreement'], '{:.0%}')} of the time. Freshness is a fluid-model estimate on the observed "
            f"traffic.</p><table><tr><th></th><th>GPU-hours</th><th>mean workers</th><th>changes</th>"
            f"<th>est. max freshness lag</th><th>est. SLO violations</th></tr>{rows}</table>")


def page() -> str:  # pragma: no mutate block
    """The Kale page."""
    s = _state(200)
    cur = s["current"] or {}
    rows = "".join(
        f"<tr class='{'change' if d['target'] != d['workers'] else ''}'><td>{time.strftime('%H:%M:%S', time.localtime(d['ts']))}</td>"
        f"<td>{d['workers']}</td><td>{d['target']}</td><td><code>{html.escape(d['reason'])}</code>"
        f"{' <em>shadow: not applied</em>' if d.get('applied') is False else ''}</td>"
        f"<td>{html.escape(d['message'])}</td></tr>"
        for d in reversed(s["decisions"][-40:]))
    models = "".join(
        f"<tr><td>{html.escape(m['model'])}</td><td>{html.escape(m['alias'])}</td><td>{_link(m)}</td>"
        f"<td>{html.escape(m['review'])}</td></tr>" for m in s["models"])
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Kale</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left}} tr.change{{background:#eef6ff}}
.cards{{display:flex;gap:16px;margin:12px 0}} .card{{border:1px solid #ddd;border-radius:8px;padding:10px 14px}}</style>
</head><body><h1>Kale autoscaler</h1>
<div class="cards"><div class="card">Generation<br><b>{html.escape(str(cur.get('generation', 'none')))}</b></div>
<div class="card">Workers<br><b>{cur.get('workers', 0)}</b></div>
<div class="card">Decisions recorded<br><b>{len(s['decisions'])}</b></div></div>
<img src="plot.png" alt="forecast vs actual traffic and workers" style="max-width:100%">
{_shadow_html(s["shadow"])}
<h2>Models</h2><table><tr><th>model</th><th>alias</th><th>version (MLflow)</th><th>review</th></tr>{models}</table>
<h2>Decisions</h2><table><tr><th>time</th><th>workers (ran)</th><th>decided</th><th>reason</th><th>why</th></tr>{rows}</table>
</body></html>"""


def create_app() -> FastAPI:
    """The plugin's app (``app`` below; tests build fresh ones). Every route depends on
    Airflow's ``get_user`` and on :data:`can_read_kale`; FastAPI's own documentation routes
    (/docs, /redoc, /openapi.json), which app-level dependencies do not cover and which would
    answer anonymous requests, are switched off."""
    new = FastAPI(dependencies=[Depends(get_user), Depends(can_read_kale)], docs_url=None, redoc_url=None,
                  openapi_url=None)
    new.title, new.description = TITLE, DESCRIPTION  # pragma: no mutate - cosmetic: only the (off) OpenAPI doc shows them
    new.get("/api/state")(state)
    new.get("/plot.png")(plot)
    new.get("/", response_class=HTMLResponse)(page)
    return new


app = create_app()
