"""Operations commands: ``kale status``, ``kale config validate``, ``kale decide --dry-run``.

They read the same environment as the Airflow tasks (``KALE_HOME``, ``KALE_CONFIG``,
``KALE_DATABASE_URL``, ``KALE_MLFLOW_URI`` or ``KALE_MLFLOW_CONN_ID``) and never change or
create anything: ``status`` reads the control plane and MLflow, ``config validate`` parses
the deployment file and checks its URLs as the components do, ``decide --dry-run`` makes
one observation and decision without recording or applying it. A store that does not
exist yet is reported, with how it gets created, and never opened (:mod:`.readonly`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from kale_airflow.core.jobs import DEFAULT_JOB

STATUS_DECISIONS = 5


# ------------------------------------------------------------------ validate
def cmd_config_validate(args: argparse.Namespace) -> int:
    """Exit 0 with a one-line summary, or raise ConfigError (exit 2) naming file, field, expected type;
    the URLs are checked as the components check them when they open them (:func:`url_problems`)."""
    from kale_airflow.config import ConfigError, load_deployment, settings

    env = settings()
    if args.file:
        path = Path(args.file).expanduser()
        if not path.exists():
            raise ConfigError(f"{path}: no such file")
        env = dataclasses.replace(env, config_file=path)
    else:
        path = env.config_file or env.home / "kale.yaml"
    defaults = not path.exists() and env.config_file is None
    dep = load_deployment(env)
    problems = url_problems(env, dep)
    if dep.alerts.notifier:
        from kale_airflow.control.alerts import Alerter

        try:
            Alerter(dep.alerts).notifier()
        except Exception as exc:  # noqa: BLE001 - import error or bad notifier_kwargs: a config error here
            problems["file"].append(f"alerts.notifier: {exc}")
    blocks = [f"{where}: invalid configuration:\n  " + "\n  ".join(lines)
              for where, lines in ((path, problems["file"]), ("environment", problems["environment"])) if lines]
    if blocks:
        raise ConfigError("\n".join(blocks))
    if defaults:
        print(f"no deployment file at {path}: the embedded defaults apply (valid)")
        return 0
    print(f"{path}: valid ({dep.worker_backend} workers {dep.min_workers}-{dep.max_workers}, stream "
          f"{dep.stream_url.split('://')[0]}, SLO {dep.slo_s:g} s, poll {dep.poll_interval_s:g} s, "
          f"shadow {'on' if dep.shadow else 'off'}, alerts {dep.alerts.notifier or 'log only'})")
    return 0


def url_problems(env, dep) -> dict[str, list[str]]:
    """``{"file": [...], "environment": [...]}``: ``setting: message`` for each URL a component
    would refuse when it opens it, from the very checks those components run (the stream's,
    the control-plane database's, the MLflow registry's), without connecting or creating
    anything."""
    from kale_airflow.core.errors import KaleError
    from kale_airflow.registry.connection import CONN_PREFIX
    from kale_airflow.registry.mlflow_registry import check_tracking_uri
    from kale_airflow.store.database import auto_upgrade, masked, normalize_url
    from kale_airflow.stream import check_stream_url

    mlflow_setting = "KALE_MLFLOW_CONN_ID" if env.mlflow_uri.startswith(CONN_PREFIX) else "KALE_MLFLOW_URI"
    checks = (("file", "stream_url", lambda: check_stream_url(dep.stream_url)),
              ("environment", "KALE_DATABASE_URL", lambda: normalize_url(env.database_url)),
              ("environment", "KALE_DB_AUTO_UPGRADE", lambda: auto_upgrade("postgresql")),
              ("environment", mlflow_setting, lambda: check_tracking_uri(env.mlflow_uri)))
    out: dict[str, list[str]] = {"file": [], "environment": []}
    for where, setting, check in checks:
        try:
            check()
        except (KaleError, ValueError) as exc:  # ValueError: SQLAlchemy's own, e.g. for a port that is no number
            out[where].append(f"{setting}: {masked(exc)}")  # a URL that cannot be parsed is quoted whole
    return out


# -------------------------------------------------------------------- status
def _champions(uri: str, job: str = DEFAULT_JOB) -> list[dict] | str:
    """Champion and challenger versions of a job's two models, or why MLflow could not be
    asked (a SQLite store that does not exist is not asked: asking would create it)."""
    from kale_airflow.cli.readonly import mlflow_problem

    problem = mlflow_problem(uri)
    if problem:
        return problem
    try:
        from kale_airflow.registry.mlflow_registry import (
            CHALLENGER,
            CHAMPION,
            alias_version,
            job_models,
            registry_client,
        )

        client = registry_client(uri)
        out = []
        for name in job_models(job):
            for alias in (CHAMPION, CHALLENGER):
                mv = alias_version(client, name, alias)
                if mv is not None:
                    out.append({"model": name, "alias": alias, "version": str(mv.version),
                                "review": mv.tags.get("kale.review", "")})
        return out
    except Exception as exc:  # noqa: BLE001 - status reports what it cannot reach, it does not fail
        from kale_airflow.store.database import masked

        return f"MLflow unreachable: {masked(str(exc).splitlines()[0][:300]) if str(exc) else type(exc).__name__}"


def status(now: float | None = None, decisions: int = STATUS_DECISIONS, models: bool = True,
           job: str | None = None) -> dict:
    """Everything ``kale status`` prints, as a dict, with every credential in it masked: one
    job's state (``job``, or the deployment's only one), or with several jobs each job's under
    ``jobs`` and their total under ``fleet``.

    Creates nothing: a control-plane database or MLflow store that does not exist (or is not
    at this kale-airflow's schema) is reported in ``control_plane_error`` / ``models``, with
    how it gets created, instead of being opened."""
    from kale_airflow.cli.readonly import control_plane_problem
    from kale_airflow.config import ConfigError, load_deployment, settings
    from kale_airflow.store.database import masked_values

    now = time.time() if now is None else now
    env = settings()
    doc: dict = {"kale_home": str(env.home), "kale_home_exists": env.home.is_dir(), "config_error": None,
                 "control_plane_error": control_plane_problem(env.database_url)}
    deps: dict = {job or DEFAULT_JOB: None}
    fleet = None
    try:
        full = load_deployment(env)
        deps = {job: full.for_job(job)} if job else dict(full.all_jobs)
        fleet = full.fleet
    except ConfigError as exc:
        doc["config_error"] = str(exc)
    per_job = {name: _job_status(env, name, dep, doc["control_plane_error"], now, decisions, models)
               for name, dep in deps.items()}
    if len(per_job) == 1:
        doc |= next(iter(per_job.values()))
    else:
        running = sum((j["generation"] or {}).get("workers") or 0 for j in per_job.values())
        doc |= {"jobs": per_job, "fleet": {"jobs": len(per_job), "gpus": fleet.gpus if fleet else None,
                                           "workers": running}}
    return masked_values(doc)  # recorded messages come from other processes and versions: mask them here too


def _job_status(env, job: str, dep, problem: str | None, now: float, decisions: int, models: bool) -> dict:
    doc: dict = {"job": job, "config": None if dep is None else {
        "backend": dep.worker_backend, "min_workers": dep.min_workers, "max_workers": dep.max_workers,
        "shadow": dep.shadow, "slo_s": dep.slo_s, "priority": dep.priority}}
    if problem:
        doc |= {"generation": None, "workers": None, "rescale": None, "decisions": [], "shadow": None, "pin": None}
    else:
        doc |= _control_plane(env.database_url, dep, now, decisions, job)
    doc["models"] = _champions(env.mlflow_uri, job) if models else "not asked"
    return doc


def _control_plane(url: str, dep, now: float, decisions: int, job: str = DEFAULT_JOB) -> dict:
    """A job's generation, workers, pin, recent decisions and the shadow comparison, from a
    database at head."""
    from kale_airflow.control.fleet import active_pin
    from kale_airflow.control.shadow import SHADOW_WINDOW, compare
    from kale_airflow.store import StateStore

    poll = dep.poll_interval_s if dep else 15.0
    fresh_s = max(120.0, 4 * poll)
    store = StateStore(url, job)
    cur = store.current()
    doc: dict = {"generation": cur and {"generation": cur["generation"], "workers": cur["workers"],
                                        "rebalanced": cur["assignment"] is not None, "since": cur["created"]}}
    running = store.running_workers()
    fresh = [(g, w, r) for g, w, r in running if now - float(r.get("heartbeat", 0)) <= fresh_s]
    current_gen = cur["generation"] if cur else None
    in_current = sorted(w for g, w, _ in fresh if g == current_gen)
    doc["workers"] = {
        "running": len(fresh),
        "running_in_generation": len(in_current),
        "pending": max(0, int(cur["workers"] or 0) - len(in_current)) if cur else 0,
        "stale_heartbeats": len(running) - len(fresh),
        "heartbeat_fresh_s": fresh_s,
        "by_generation": {g: sorted(w for gg, w, _ in fresh if gg == g) for g in sorted({g for g, _, _ in fresh})},
    }
    doc["rescale"] = _last_rescale(store, current_gen)
    doc["pin"] = active_pin(store, now)
    recent = store.decisions(decisions)
    doc["decisions"] = [{"ts": d["ts"], "workers": d["workers"], "target": d["target"], "reason": d["reason"],
                         "message": d["message"], "applied": d.get("applied")} for d in recent]
    shadow = [d for d in store.decisions(SHADOW_WINDOW) if d.get("shadow")]
    doc["shadow"] = compare(shadow, dep.kubernetes.gpus_per_worker if dep and dep.worker_backend == "kubernetes"
                            else 1, poll, dep.slo_s if dep else None) if shadow else None
    return doc


def _last_rescale(store, generation: str | None) -> dict | None:
    """The current generation's rescale record (``warm`` or ``restart``, its pauses) and the
    recent pauses with their kinds, as the workers recorded them."""
    from kale_airflow.runtime.elastic import PAUSES_KEY, RESCALE_KEY, RESTART_KEY

    last = store.get_value(RESCALE_KEY.format(generation=generation)) if generation else None
    restart = store.get_value(RESTART_KEY.format(generation=generation)) if generation else None
    pauses = store.get_value(PAUSES_KEY) or {}
    if last is None and restart is None and not pauses:
        return None
    kinds = list(pauses.get("kinds", []))
    kinds += [None] * (len(pauses.get("pauses", [])) - len(kinds))
    return {"last": last, "restart_within": restart,
            "recent": [{"pause_s": p, "kind": k} for p, k in zip(pauses.get("pauses", []), kinds)]}


def _rescale_lines(r: dict | None) -> list[str]:
    if not r:
        return []
    out = []
    last = r["last"]
    if last:
        how = last["kind"] + (f" ({last['reason']})" if last.get("reason") else "")
        out.append(f"last rescale: {last['from_world']} -> {last['to_world']} rank(s), {how}: first step "
                   f"{last['pause_s']} s after the decision, {last['gap_s']} s after the last step")
    if r["restart_within"]:
        x = r["restart_within"]
        out.append(f"restarted from the checkpoint within the generation ({x.get('reason')}): "
                   f"{x.get('gap_s')} s without training")
    if r["recent"]:
        out.append("recent rescale pauses: " + ", ".join(f"{x['pause_s']:g} s {x['kind'] or '?'}" for x in r["recent"]))
    return out


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def format_status(doc: dict) -> str:
    """``kale status``'s text from :func:`status`'s dict."""
    lines = [f"Kale home {doc['kale_home']}" + ("" if doc.get("kale_home_exists", True) else " (does not exist)")]
    if doc.get("control_plane_error"):
        lines.append(f"control plane: {doc['control_plane_error']}")
    if "jobs" not in doc:
        _format_job(doc, doc, lines)
        return "\n".join(lines)
    f = doc["fleet"]
    budget = f" of a budget of {f['gpus']}" if f["gpus"] else ""
    lines.append(f"fleet: {f['jobs']} jobs, {f['workers']} worker(s) in their current generations{budget}")
    for name, job in doc["jobs"].items():
        sub_lines: list[str] = []
        _format_job(job, doc, sub_lines)
        lines.append(f"job {name}:")
        lines += ["  " + line for line in sub_lines]
    return "\n".join(lines)


def _format_job(job: dict, doc: dict, lines: list[str]) -> None:
    cfg = job["config"]
    if cfg:
        lines.append(f"config: {cfg['backend']} workers {cfg['min_workers']}-{cfg['max_workers']}, "
                     f"SLO {cfg['slo_s']:g} s, priority {cfg['priority']:g}, "
                     f"shadow {'ON (decide and record, never apply)' if cfg['shadow'] else 'off'}")
    else:
        lines.append(f"config: INVALID: {doc['config_error']}")
    if not doc.get("control_plane_error"):
        _format_control_plane(job, lines)
    m = job["models"]
    if isinstance(m, str):
        lines.append(f"models: {m}")
    elif not m:
        lines.append("models: none registered (run kale_forecaster_retrain; kale profile, then kale_throughput_refit)")
    else:
        lines.append("models: " + ", ".join(f"{x['model']}@{x['alias']}=v{x['version']}"
                                            + (f" ({x['review']})" if x["review"] else "") for x in m))


def _format_control_plane(doc: dict, lines: list[str]) -> None:
    g = doc["generation"]
    lines.append("generation: none started" if not g else
                 f"generation: {g['generation']} with {g['workers']} worker(s) since {_when(g['since'])}"
                 f"{'' if g['rebalanced'] else ' (not yet rebalanced)'}")
    w = doc["workers"]
    lines.append(f"workers: {w['running']} running (heartbeat within {w['heartbeat_fresh_s']:g} s), "
                 f"{w['running_in_generation']} of the current generation, {w['pending']} pending"
                 + (f", {w['stale_heartbeats']} stale heartbeat(s)" if w["stale_heartbeats"] else ""))
    lines += _rescale_lines(doc.get("rescale"))
    if doc.get("pin"):
        p = doc["pin"]
        lines.append(f"pinned to {p['workers']} worker(s) until {_when(p['until'])}"
                     + (f" ({p['note']})" if p.get("note") else "") + ": `kale release` ends it")
    lines.append("last decisions:" if doc["decisions"] else "last decisions: none recorded")
    for d in reversed(doc["decisions"]):
        applied = " [shadow, not applied]" if d["applied"] is False else ""
        lines.append(f"  {_when(d['ts'])}  {d['workers']} -> {d['target']}  {d['reason']}{applied}  "
                     f"{d['message'][:100]}")
    s = doc["shadow"]
    if s and s.get("ran"):
        lines.append(f"shadow comparison over {s['decisions']} decisions, {s['hours']:.2f} h "
                     f"(agreement {s['agreement']:.0%}):")
        for who, side in (("ran", s["ran"]), ("kale", s["kale"])):
            lag = side.get("max_lag_s")
            viol = side.get("slo_violation_rate")
            lines.append(f"  {who:>4}: {side['gpu_hours']:.3f} GPU-hours, mean {side['mean_workers']:.2f} workers, "
                         f"{side['worker_changes']} change(s)"
                         + (f", est. max freshness lag {lag:.0f} s" if lag is not None else "")
                         + (f", est. SLO violations {viol:.1%}" if viol is not None else ""))


def cmd_status(args: argparse.Namespace) -> int:
    doc = status(decisions=args.decisions, models=not args.no_models, job=args.job)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(format_status(doc))
    return 0


# -------------------------------------------------------------------- decide
def dry_run_autoscaler(job: str | None = None):
    """The autoscaler of ``$KALE_HOME`` for one dry-run decision, and what it found missing.

    It opens only what exists: without a control-plane database at this kale-airflow's schema
    there is nothing to decide on (:class:`~.readonly.MissingState`); a missing embedded stream
    or MLflow store stands in as unavailable (the decision holds and says why) instead of
    being created. Its registry never tags a version (no manual-approval bookkeeping)."""
    from kale_airflow.cli.readonly import Missing, MissingState, control_plane_problem, mlflow_problem, stream_problem
    from kale_airflow.config import load_config
    from kale_airflow.control.autoscaler import Autoscaler, MlflowChampions
    from kale_airflow.control.promotions import AnnouncedChampions
    from kale_airflow.store import StateStore
    from kale_airflow.stream import StreamError

    cfg = load_config(job)
    problem = control_plane_problem(cfg.settings.database_url)
    if problem:
        raise MissingState(f"nothing to decide on: {problem}. Nothing was created.")
    store = StateStore(cfg.settings.database_url, cfg.job)
    no_stream, no_mlflow = stream_problem(cfg.deployment.stream_url), mlflow_problem(cfg.settings.mlflow_uri)
    source = Missing(LookupError(no_mlflow)) if no_mlflow else MlflowChampions(cfg.settings.mlflow_uri, cfg.job)
    auto = Autoscaler(cfg, stream=Missing(StreamError(no_stream)) if no_stream else None, store=store,
                      registry=AnnouncedChampions(source, store))
    return auto, [m for m in (no_stream, no_mlflow) if m]


def cmd_decide(args: argparse.Namespace) -> int:
    """One observation and decision; nothing recorded, nothing applied, nothing created."""
    from kale_airflow.store.database import masked_values

    auto, missing = dry_run_autoscaler(args.job)
    decision, obs = auto.poke(record=False)
    doc = {"dry_run": True, "shadow": auto.shadow, "workers_source": auto.workers_source,
           "observation": {"workers": obs.workers, "arrival_rate": obs.arrival_rate, "backlog": obs.backlog,
                           "freshness_lag_s": obs.freshness_lag_s, "throughput": obs.throughput,
                           "rescaling": obs.rescaling},
           "decision": decision.to_dict(), "models": auto.versions, "model_error": auto.model_error,
           "missing": missing}
    doc = masked_values(doc)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return 0

    def num(v, fmt="{:,.1f}"):
        return "unknown" if v is None else fmt.format(v)

    for note in doc["missing"]:
        print(f"missing: {note}")
    print(f"observed: {obs.workers} worker(s) ({auto.workers_source}), arrivals {num(obs.arrival_rate)} samples/s, "
          f"backlog {num(obs.backlog, '{:,.0f}')}, freshness lag {num(obs.freshness_lag_s)} s")
    if doc["model_error"]:
        print(f"models: {doc['model_error']}")
    elif auto.versions:
        print(f"models: forecaster v{auto.versions[0]}, throughput model v{auto.versions[1]}")
    d = doc["decision"]
    print(f"decision: {obs.workers} -> {d['workers']} ({d['reason']}) {d['message']}")
    print("dry run: nothing recorded, nothing applied")
    return 0


# -------------------------------------------------------------------- pins
def _job_store(job: str):
    """The control-plane store of a job the deployment file names (refused otherwise)."""
    from kale_airflow.config import load_config
    from kale_airflow.store import StateStore

    cfg = load_config(job)
    return StateStore(cfg.settings.database_url, cfg.job)


def cmd_pin(args: argparse.Namespace) -> int:
    """``kale pin JOB N --until T | --for D``."""
    from kale_airflow.control.fleet import pin
    from kale_airflow.core.fleet import epoch_of, seconds_of

    now = time.time()
    try:
        until = epoch_of(args.until) if args.until else now + seconds_of(args.duration)
        rec = pin(_job_store(args.job), args.workers, until, args.note, now=now)
    except ValueError as exc:
        print(f"kale pin: {exc}", file=sys.stderr)
        return 2
    print(f"job {args.job} pinned to {rec['workers']} worker(s) until {_when(rec['until'])}"
          + (f" ({args.note})" if args.note else "") + "; its next decision applies it")
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    """``kale release JOB``."""
    from kale_airflow.control.fleet import release

    had = release(_job_store(args.job))
    print(f"job {args.job}: " + (f"pin to {had['workers']} worker(s) released" if had else "was not pinned"))
    return 0


# -------------------------------------------------------------------- parser
def add_ops(sub) -> None:
    """Register ``status``, ``config validate``, ``decide``, ``pin`` and ``release`` on the ``kale`` parser."""
    st = sub.add_parser("status", help="running generation, workers, last decisions, champions, shadow comparison",
                        description="What Kale is doing now, from the control-plane database and MLflow: the "
                                    "running generation, running and pending workers (their heartbeats), the last "
                                    "decisions, the champion/challenger models and, in shadow mode, Kale's "
                                    "decisions against the worker counts that actually ran.")
    st.add_argument("--json", action="store_true", help="print JSON instead of text")
    st.add_argument("--decisions", type=int, default=STATUS_DECISIONS, help="how many recent decisions to show")
    st.add_argument("--no-models", action="store_true", help="do not ask MLflow")
    st.add_argument("--job", help="one job of the deployment (default: every job, and the fleet's total)")
    st.set_defaults(func=cmd_status)

    cfg = sub.add_parser("config", help="deployment configuration tools").add_subparsers(dest="config_command",
                                                                                        required=True)
    va = cfg.add_parser("validate", help="check a deployment file (exit 2 naming the field, type and file)",
                        description="Parse the deployment file the way every Kale task does and report the first "
                                    "problems: unknown settings, wrong types, out-of-range values, conflicts. "
                                    "Default: $KALE_CONFIG, else $KALE_HOME/kale.yaml.")
    va.add_argument("file", nargs="?", help="the YAML file (default: $KALE_CONFIG or $KALE_HOME/kale.yaml)")
    va.set_defaults(func=cmd_config_validate)

    de = sub.add_parser("decide", help="one observation and decision, printed (--dry-run: nothing recorded)",
                        description="Observe the stream and metrics, load the champion models and ask the Kale "
                                    "policy once. Nothing is recorded (no decision, no policy state, no traffic "
                                    "history) and nothing is applied; the kale_autoscaler DAG does that.")
    de.add_argument("--dry-run", action="store_true", required=True,
                    help="required: decide without recording or applying")
    de.add_argument("--json", action="store_true", help="print JSON instead of text")
    de.add_argument("--job", help="the deployment's job to decide for (needed when it has several)")
    de.set_defaults(func=cmd_decide)

    pn = sub.add_parser("pin", help="hold a job at exactly N workers until a time (recorded in the control plane)",
                        description="Pin JOB to WORKERS workers until --until (a UTC date-time) or for --for (a "
                                    "duration): its decisions say `override` and name the pin, whatever the policy "
                                    "or the calendar says (the fleet budget's floors still apply). `kale release "
                                    "JOB` ends it early; `kale status` shows it.")
    pn.add_argument("job", help="the job (`default` for a single-job deployment)")
    pn.add_argument("workers", type=int, help="worker count to hold")
    when = pn.add_mutually_exclusive_group(required=True)
    when.add_argument("--until", help="UTC date-time the pin ends, e.g. 2026-12-24T23:00")
    when.add_argument("--for", dest="duration", help="how long the pin lasts, e.g. 90m or 4h")
    pn.add_argument("--note", default="", help="why (shown in decisions and kale status)")
    pn.set_defaults(func=cmd_pin)

    rl = sub.add_parser("release", help="end a job's pin", description="Remove JOB's pin (`kale pin`); its next "
                                                                       "decision is the policy's again.")
    rl.add_argument("job", help="the job (`default` for a single-job deployment)")
    rl.set_defaults(func=cmd_release)
