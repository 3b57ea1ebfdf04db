"""Operations commands: ``kale status``, ``kale config validate``, ``kale decide --dry-run``.

They read the same environment as the Airflow tasks (``KALE_HOME``, ``KALE_CONFIG``,
``KALE_DATABASE_URL``, ``KALE_MLFLOW_URI`` or ``KALE_MLFLOW_CONN_ID``) and never change
anything: ``status`` reads the control plane and MLflow, ``config validate`` parses the
deployment file, ``decide --dry-run`` makes one observation and decision without
recording or applying it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

STATUS_DECISIONS = 5


# ------------------------------------------------------------------ validate
def cmd_config_validate(args: argparse.Namespace) -> int:
    """Exit 0 with a one-line summary, or raise ConfigError (exit 2) naming file, field, expected type."""
    from kale_airflow.config import ConfigError, load_deployment, settings

    env = settings()
    if args.file:
        path = Path(args.file).expanduser()
        if not path.exists():
            raise ConfigError(f"{path}: no such file")
        env = dataclasses.replace(env, config_file=path)
    else:
        path = env.config_file or env.home / "kale.yaml"
        if not path.exists() and env.config_file is None:
            print(f"no deployment file at {path}: the embedded defaults apply (valid)")
            return 0
    dep = load_deployment(env)
    if dep.alerts.notifier:
        from kale_airflow.control.alerts import Alerter

        try:
            Alerter(dep.alerts).notifier()
        except Exception as exc:  # noqa: BLE001 - import error or bad notifier_kwargs: a config error here
            raise ConfigError(f"{path}: invalid configuration:\n  alerts.notifier: {exc}") from None
    print(f"{path}: valid ({dep.worker_backend} workers {dep.min_workers}-{dep.max_workers}, stream "
          f"{dep.stream_url.split('://')[0]}, SLO {dep.slo_s:g} s, poll {dep.poll_interval_s:g} s, "
          f"shadow {'on' if dep.shadow else 'off'}, alerts {dep.alerts.notifier or 'log only'})")
    return 0


# -------------------------------------------------------------------- status
def _champions(uri: str) -> list[dict] | str:
    """Champion and challenger versions of both models, or why MLflow could not be asked."""
    try:
        from kale_airflow.registry.mlflow_registry import (
            CHALLENGER,
            CHAMPION,
            FORECASTER_MODEL,
            THROUGHPUT_MODEL,
            alias_version,
            registry_client,
        )

        client = registry_client(uri)
        out = []
        for name in (FORECASTER_MODEL, THROUGHPUT_MODEL):
            for alias in (CHAMPION, CHALLENGER):
                mv = alias_version(client, name, alias)
                if mv is not None:
                    out.append({"model": name, "alias": alias, "version": str(mv.version),
                                "review": mv.tags.get("kale.review", "")})
        return out
    except Exception as exc:  # noqa: BLE001 - status reports what it cannot reach, it does not fail
        from kale_airflow.store.database import masked

        return f"MLflow unreachable: {masked(str(exc).splitlines()[0][:300]) if str(exc) else type(exc).__name__}"


def status(now: float | None = None, decisions: int = STATUS_DECISIONS, models: bool = True) -> dict:
    """Everything ``kale status`` prints, as a dict, with every credential in it masked."""
    from kale_airflow.config import ConfigError, load_config, settings
    from kale_airflow.control.shadow import SHADOW_WINDOW, compare
    from kale_airflow.store import StateStore
    from kale_airflow.store.database import masked_values

    now = time.time() if now is None else now
    env = settings()
    doc: dict = {"kale_home": str(env.home), "config": None, "config_error": None}
    dep = None
    try:
        dep = load_config().deployment
        doc["config"] = {"backend": dep.worker_backend, "min_workers": dep.min_workers,
                         "max_workers": dep.max_workers, "shadow": dep.shadow, "slo_s": dep.slo_s}
    except ConfigError as exc:
        doc["config_error"] = str(exc)
    poll = dep.poll_interval_s if dep else 15.0
    fresh_s = max(120.0, 4 * poll)
    store = StateStore(env.database_url)
    cur = store.current()
    doc["generation"] = cur and {"generation": cur["generation"], "workers": cur["workers"],
                                 "rebalanced": cur["assignment"] is not None, "since": cur["created"]}
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
    recent = store.decisions(decisions)
    doc["decisions"] = [{"ts": d["ts"], "workers": d["workers"], "target": d["target"], "reason": d["reason"],
                         "message": d["message"], "applied": d.get("applied")} for d in recent]
    shadow = [d for d in store.decisions(SHADOW_WINDOW) if d.get("shadow")]
    doc["shadow"] = compare(shadow, dep.kubernetes.gpus_per_worker if dep and dep.worker_backend == "kubernetes"
                            else 1, poll, dep.slo_s if dep else None) if shadow else None
    doc["models"] = _champions(env.mlflow_uri) if models else "not asked"
    return masked_values(doc)  # recorded messages come from other processes and versions: mask them here too


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def format_status(doc: dict) -> str:
    lines = [f"Kale home {doc['kale_home']}"]
    cfg = doc["config"]
    if cfg:
        lines.append(f"config: {cfg['backend']} workers {cfg['min_workers']}-{cfg['max_workers']}, "
                     f"SLO {cfg['slo_s']:g} s, shadow {'ON (decide and record, never apply)' if cfg['shadow'] else 'off'}")
    else:
        lines.append(f"config: INVALID: {doc['config_error']}")
    g = doc["generation"]
    lines.append("generation: none started" if not g else
                 f"generation: {g['generation']} with {g['workers']} worker(s) since {_when(g['since'])}"
                 f"{'' if g['rebalanced'] else ' (not yet rebalanced)'}")
    w = doc["workers"]
    lines.append(f"workers: {w['running']} running (heartbeat within {w['heartbeat_fresh_s']:g} s), "
                 f"{w['running_in_generation']} of the current generation, {w['pending']} pending"
                 + (f", {w['stale_heartbeats']} stale heartbeat(s)" if w["stale_heartbeats"] else ""))
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
    m = doc["models"]
    if isinstance(m, str):
        lines.append(f"models: {m}")
    elif not m:
        lines.append("models: none registered (run kale_forecaster_retrain; kale profile, then kale_throughput_refit)")
    else:
        lines.append("models: " + ", ".join(f"{x['model']}@{x['alias']}=v{x['version']}"
                                            + (f" ({x['review']})" if x["review"] else "") for x in m))
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    doc = status(decisions=args.decisions, models=not args.no_models)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(format_status(doc))
    return 0


# -------------------------------------------------------------------- decide
def cmd_decide(args: argparse.Namespace) -> int:
    """One observation and decision; nothing recorded, nothing applied."""
    from kale_airflow.control.autoscaler import Autoscaler
    from kale_airflow.store.database import masked_values

    auto = Autoscaler.from_environment()
    decision, obs = auto.poke(record=False)
    doc = {"dry_run": True, "shadow": auto.shadow, "workers_source": auto.workers_source,
           "observation": {"workers": obs.workers, "arrival_rate": obs.arrival_rate, "backlog": obs.backlog,
                           "freshness_lag_s": obs.freshness_lag_s, "throughput": obs.throughput,
                           "rescaling": obs.rescaling},
           "decision": decision.to_dict(), "models": auto.versions, "model_error": auto.model_error}
    doc = masked_values(doc)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return 0

    def num(v, fmt="{:,.1f}"):
        return "unknown" if v is None else fmt.format(v)

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


# -------------------------------------------------------------------- parser
def add_ops(sub) -> None:
    """Register ``status``, ``config validate`` and ``decide`` on the ``kale`` parser."""
    st = sub.add_parser("status", help="running generation, workers, last decisions, champions, shadow comparison",
                        description="What Kale is doing now, from the control-plane database and MLflow: the "
                                    "running generation, running and pending workers (their heartbeats), the last "
                                    "decisions, the champion/challenger models and, in shadow mode, Kale's "
                                    "decisions against the worker counts that actually ran.")
    st.add_argument("--json", action="store_true", help="print JSON instead of text")
    st.add_argument("--decisions", type=int, default=STATUS_DECISIONS, help="how many recent decisions to show")
    st.add_argument("--no-models", action="store_true", help="do not ask MLflow")
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
    de.set_defaults(func=cmd_decide)
