"""FastAPI app mounted at ``/kale`` by the Airflow API server.

Plugin apps are served without authentication unless their routes ask for it, so every
route depends on Airflow's ``get_user`` (a valid Airflow JWT, from the Authorization header
or the UI's session cookie; anonymous requests get 401) and on a permission asked of the
deployment's auth manager (SimpleAuthManager, FAB, Keycloak...): read access to the
autoscaler DAG of every job the request shows (``kale_autoscaler``, or
``kale_autoscaler__<job>`` in a deployment of several jobs), whose decisions the page shows;
a user without it gets 403.

With several jobs the page is a fleet overview (each job's workers, the count it asks for,
its SLO state and whether the GPU budget holds it back) linking to each job's own page
(``?job=NAME``), which is a single job's page.
Everything served is masked (:func:`~kale_airflow.store.database.masked`): a recorded
message or an MLflow error may quote a URL with its password.
"""

from __future__ import annotations

import html
import os
import time

from airflow.api_fastapi.core_api.security import GetUserDep, get_user, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

from kale_airflow.config.deployment import dag_id
from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.control.fleet import active_pin
from kale_airflow.store.database import masked, masked_values

TITLE, DESCRIPTION = "Kale", "Kale autoscaler: forecasts, workers and decisions"
AUTOSCALER_DAG_ID = "kale_autoscaler"


def jobs_shown(job: str | None) -> list[str]:
    """The jobs a request shows: the one it names (``?job=``), else every job of the
    deployment file (``default`` when the file cannot be read); an unknown name is a 404."""
    from kale_airflow.config import ConfigError, load_deployment, settings

    try:
        names = list(load_deployment(settings()).all_jobs)
    except ConfigError:
        names = [DEFAULT_JOB]
    if job is None:
        return names
    if job not in names:
        raise HTTPException(404, f"no job {job!r} in this deployment; its jobs: {', '.join(names)}")
    return [job]


def can_read_kale(request: Request, user: GetUserDep) -> None:
    """Read access to the autoscaler DAG of every job the request shows: Airflow's own check
    (the auth manager's is_authorized_dag, with the DAG's team when multi-team is on), so a
    role's DAG permissions govern the page as they govern the DAGs' views."""
    for job in jobs_shown(request.query_params.get("job")):
        requires_access_dag("GET", param_dag_id=dag_id(AUTOSCALER_DAG_ID, job))(request, user)


def _store(job: str = DEFAULT_JOB):  # pragma: no mutate block
    from kale_airflow.config import settings
    from kale_airflow.store import StateStore

    return StateStore(settings().database_url, job)


def _state(limit: int = 500, job: str = DEFAULT_JOB) -> dict:  # pragma: no mutate block
    from kale_airflow.config import settings

    store = _store(job)
    return masked_values({"job": job, "decisions": store.decisions(limit), "current": store.current(),
                          "models": _models(settings(), job), "shadow": _shadow(store, job), "pin": active_pin(store)})


def _fleet() -> list[dict]:  # pragma: no mutate block
    """One row per job: workers, the count it asks for, its last reason, its SLO state and
    whether the budget holds it back (from each job's last decision)."""
    from kale_airflow.config import ConfigError, load_config

    rows = []
    for job in jobs_shown(None):
        store = _store(job)
        cur, last = store.current() or {}, (store.decisions(1) or [{}])[-1]
        try:
            slo_s = load_config(job).deployment.slo_s
        except ConfigError:
            slo_s = None
        lag = last.get("freshness_lag_s")
        rows.append({"job": job, "generation": cur.get("generation"), "workers": cur.get("workers") or 0,
                     "asks": last.get("plan_workers", last.get("target")), "reason": last.get("reason"),
                     "message": last.get("message", ""), "freshness_lag_s": lag, "slo_s": slo_s,
                     "slo_ok": None if lag is None or slo_s is None else lag <= slo_s,
                     "held_by_budget": last.get("reason") == "hold_budget", "pin": active_pin(store)})
    return masked_values(rows)


def _shadow(store, job: str = DEFAULT_JOB) -> dict | None:  # pragma: no mutate block
    """Shadow mode: Kale's decisions against the worker counts that actually ran, with the
    GPU-hours and the (fluid-model) freshness each had or would have had; None without
    shadow decisions."""
    from kale_airflow.config import ConfigError, load_config
    from kale_airflow.control.shadow import SHADOW_WINDOW, compare

    rows = [d for d in store.decisions(SHADOW_WINDOW) if d.get("shadow")]
    if not rows:
        return None
    try:
        dep = load_config(job).deployment
        gpus = dep.kubernetes.gpus_per_worker if dep.worker_backend == "kubernetes" else 1
        poll, slo = dep.poll_interval_s, dep.slo_s
    except ConfigError:
        gpus, poll, slo = 1, 15.0, None
    return compare(rows, gpus, poll, slo) | {"on": bool(rows[-1].get("shadow")), "gpus_per_worker": gpus}


def _models(cfg, job: str = DEFAULT_JOB) -> list[dict]:  # pragma: no mutate block
    """A job's champion and challenger versions with links into the MLflow UI (empty if unreachable)."""
    from kale_airflow.registry.mlflow_registry import (
        CHALLENGER,
        CHAMPION,
        RegistryUnavailable,
        alias_version,
        job_models,
        registry_client,
    )

    ui = os.environ.get("KALE_MLFLOW_UI_URL", "http://localhost:5000").rstrip("/")
    out = []
    try:
        client = registry_client(cfg.mlflow_uri)  # cached per URI; no MLflow global (API server threads)
        for name in job_models(job):
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


def _one_job(job: str | None) -> str | None:  # pragma: no mutate block
    """The job a request is about; None for the fleet overview (several jobs, none named)."""
    shown = jobs_shown(job)
    return shown[0] if len(shown) == 1 else None


def state(job: str | None = None) -> dict:  # pragma: no mutate block
    """A job's decisions (holds included), running generation and registered models; with
    several jobs and none named, the fleet overview (``fleet``: one row per job)."""
    one = _one_job(job)
    return _state(job=one) if one else {"fleet": _fleet()}


def _figure_settings(job: str = DEFAULT_JOB) -> tuple[float | None, float | None, int]:  # pragma: no mutate block
    """The job's freshness SLO, planned forecast quantile, and how many decisions make a day
    at its poll interval; (None, None, 2000) when its configuration cannot be read."""
    from kale_airflow.config import ConfigError, load_config

    try:
        dep = load_config(job).deployment
    except ConfigError:
        return None, None, 2000
    return dep.slo_s, dep.kale_config.forecast_quantile, min(20000, int(86400 / dep.poll_interval_s) + 1)


def plot(job: str | None = None) -> Response:  # pragma: no mutate block
    """A job's last day of decisions on a wall-clock axis: forecast vs actual traffic with the
    forecast band and the workers' capacity, the workers against the plan's target with
    each rescale's reason, every decision by reason, and the freshness lag against the SLO."""
    from kale_airflow.reporting.plots import plot_decisions, png_bytes

    one = _one_job(job)
    if one is None:
        raise HTTPException(400, "this deployment has several jobs: name one, plot.png?job=NAME")
    slo_s, quantile, day = _figure_settings(one)
    decisions = _store(one).decisions(day)  # the control store only: no MLflow round trip for the image
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


STYLE = """<style>body{font-family:system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;font-size:13px} td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left} tr.change{background:#eef6ff}
tr.held{background:#fff4e5} .cards{display:flex;gap:16px;margin:12px 0}
.card{border:1px solid #ddd;border-radius:8px;padding:10px 14px}</style>"""


def _pin_text(pin: dict | None) -> str:  # pragma: no mutate block
    if not pin:
        return ""
    until = time.strftime("%Y-%m-%d %H:%M", time.localtime(pin["until"]))
    note = f" ({html.escape(pin['note'])})" if pin.get("note") else ""
    return f"pinned to {pin['workers']} until {until}{note}"


def _fleet_page(rows: list[dict]) -> str:  # pragma: no mutate block
    body = "".join(
        f"<tr class='{'held' if r['held_by_budget'] else ''}'><td><a href='?job={html.escape(r['job'])}'>"
        f"{html.escape(r['job'])}</a></td><td>{r['workers']}</td><td>{_num(r['asks'], '{}')}</td>"
        f"<td>{'-' if r['slo_ok'] is None else ('ok' if r['slo_ok'] else 'VIOLATED')} "
        f"({_num(r['freshness_lag_s'], '{:.0f} s')} of {_num(r['slo_s'], '{:g} s')})</td>"
        f"<td><code>{html.escape(r['reason'] or '-')}</code></td><td>{html.escape(r['message'])}</td>"
        f"<td>{_pin_text(r['pin'])}</td></tr>"
        for r in rows)
    total = sum(r["workers"] for r in rows)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Kale fleet</title>{STYLE}</head><body>
<h1>Kale fleet</h1><div class="cards"><div class="card">Jobs<br><b>{len(rows)}</b></div>
<div class="card">Workers<br><b>{total}</b></div>
<div class="card">Held by the budget<br><b>{sum(r['held_by_budget'] for r in rows)}</b></div></div>
<table><tr><th>job</th><th>workers</th><th>asks for</th><th>freshness SLO</th><th>last reason</th><th>why</th>
<th>pin</th></tr>
{body}</table></body></html>"""


def page(job: str | None = None) -> str:  # pragma: no mutate block
    """The Kale page: a job's, or with several jobs and none named the fleet overview."""
    one = _one_job(job)
    if one is None:
        return _fleet_page(_fleet())
    s = _state(200, one)
    cur = s["current"] or {}
    title = "Kale autoscaler" + ("" if one == DEFAULT_JOB else f": {html.escape(one)}")
    plot_src = "plot.png" if job is None else f"plot.png?job={html.escape(one)}"
    rows = "".join(
        f"<tr class='{'change' if d['target'] != d['workers'] else ''}'><td>{time.strftime('%H:%M:%S', time.localtime(d['ts']))}</td>"
        f"<td>{d['workers']}</td><td>{d['target']}</td><td><code>{html.escape(d['reason'])}</code>"
        f"{' <em>shadow: not applied</em>' if d.get('applied') is False else ''}</td>"
        f"<td>{html.escape(d['message'])}</td></tr>"
        for d in reversed(s["decisions"][-40:]))
    models = "".join(
        f"<tr><td>{html.escape(m['model'])}</td><td>{html.escape(m['alias'])}</td><td>{_link(m)}</td>"
        f"<td>{html.escape(m['review'])}</td></tr>" for m in s["models"])
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Kale</title>{STYLE}
</head><body><h1>{title}</h1>
<div class="cards"><div class="card">Generation<br><b>{html.escape(str(cur.get('generation', 'none')))}</b></div>
<div class="card">Workers<br><b>{cur.get('workers', 0)}</b></div>
<div class="card">Decisions recorded<br><b>{len(s['decisions'])}</b></div>
{f'<div class="card">Pin<br><b>{_pin_text(s["pin"])}</b></div>' if s["pin"] else ""}</div>
<img src="{plot_src}" alt="forecast vs actual traffic and workers" style="max-width:100%">
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
