"""Documentation generated from the code and the files it documents, so the two cannot drift.

- ``docs/configuration.md``: the settings reference, from the pydantic models of
  :mod:`kale_airflow.config.deployment` (name, type, default, ``description``) and the
  environment variables listed in :mod:`kale_airflow.config.environment`'s docstring;
- ``charts/kale-airflow/README.md``: the values table, from ``values.schema.json`` (types,
  descriptions) and ``values.yaml`` (defaults, and the comments above a key where the schema
  has no description);
- ``docs/testing.md``: the mutation-testing table, from ``benchmarks/results/mutation.json``.

Each generated part sits between ``<!-- BEGIN GENERATED name -->`` and
``<!-- END GENERATED name -->`` in its file; the rest of the file is written by hand. Run
from a checkout (the chart and the benchmark results are not part of the installed package)::

    python -m kale_airflow.reporting.docs           # rewrite the generated parts
    python -m kale_airflow.reporting.docs --check   # exit 1 naming the stale files
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from kale_airflow.config import deployment, environment
from kale_airflow.core.policies.kale import KaleConfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kale-airflow"
COMMAND = "python -m kale_airflow.reporting.docs"
_BULLET = re.compile(r"^- ``([A-Za-z_][A-Za-z0-9_]*)``: (.*)$")


class DocsError(ValueError):
    """The documentation cannot be generated; the message names what is missing."""


# ------------------------------------------------------------------ helpers
def docstring_bullets(text: str | None) -> dict[str, str]:
    """``{name: text}`` for every bullet ``- ``name``: text`` of a docstring (continuation
    lines indented), with reST literals turned into Markdown ones and the last ``;``/``.`` dropped."""
    out: dict[str, str] = {}
    name = None
    for line in inspect.cleandoc(text or "").splitlines():
        m = _BULLET.match(line)
        if m:
            name, out[m.group(1)] = m.group(1), m.group(2).strip()
        elif name and line.startswith("  ") and line.strip():
            out[name] += " " + line.strip()
        else:
            name = None
    return {k: _md(v.rstrip(";.")) for k, v in out.items()}


def _md(text: str) -> str:
    """reST inline markup to Markdown: ``x`` -> `x`, :mod:`x` -> `x`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _result(name: str) -> dict:
    """A benchmark's result file, ``benchmarks/results/<name>``."""
    return json.loads((ROOT / "benchmarks" / "results" / name).read_text())


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _value(value: Any) -> str:
    """A default as it would be written in YAML, in backticks."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (dict, list)):
        return f"`{json.dumps(value)}`"
    return f"`{json.dumps(value) if value == '' else value}`"


# ------------------------------------------------------------------ configuration reference
def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "mapping"
    if origin in (dict, list):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def _constraints(field) -> str:
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    out, length = [], {}
    for meta in field.metadata:
        out += [f"{word} {getattr(meta, attr)}" for attr, word in words.items() if getattr(meta, attr, None) is not None]
        length.update({k: getattr(meta, k) for k in ("min_length", "max_length") if getattr(meta, k, None) is not None})
        if getattr(meta, "pattern", None):
            out.append(f"pattern `{meta.pattern}`")
    if length:
        out.append(f"length {length.get('min_length', 0)}-{length.get('max_length', 'any')}")
    return ", ".join(out)


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    return "" if isinstance(value, BaseModel) else _value(value)


def model_rows(model: type[BaseModel], fallback: dict[str, str] | None = None) -> list[list[str]]:
    """Name, type, default and meaning of every field of ``model``; the meaning is the field's
    ``description``, else ``fallback[name]``. A field with neither raises :class:`DocsError`."""
    rows = []
    for name, field in model.model_fields.items():
        text = field.description or (fallback or {}).get(name)
        if not text:
            raise DocsError(f"{model.__name__}.{name} has no description: give it Field(description=...) in "
                            f"kale_airflow/config/deployment.py (or a docstring bullet), then run {COMMAND}")
        kind = _type_name(field.annotation)
        if kind == "mapping":
            kind = f"mapping, see [{name}](#{name})"
        limits = _constraints(field)
        rows.append([f"`{name}`", kind + (f" ({limits})" if limits else ""), _default(field), text])
    return rows


SECTIONS = (
    ("Top level", deployment.Deployment, None),
    ("kale", deployment.KalePolicySettings, KaleConfig.__doc__),
    ("kubernetes", deployment.KubernetesWorkerConfig, None),
    ("alerts", deployment.AlertsConfig, None),
    ("fleet", deployment.FleetConfig, None),
    ("schedule_overrides", deployment.ScheduleOverride, None),
)
_KALE_INTRO = ("The policy's tunables (`KaleConfig` in `kale_airflow/core/policies/kale.py`), under `kale:`; "
               "`slo_s`, `rescale_downtime_s` and `poll_interval_s` come from the top level.")


def configuration_reference() -> str:
    """The settings reference: one table per section of ``kale.yaml``, then the environment."""
    parts = []
    for title, model, doc in SECTIONS:
        intro = " ".join(inspect.cleandoc(model.__doc__ or "").split("\n\n")[0].split())
        intro = _KALE_INTRO if model is deployment.KalePolicySettings else _md(intro)
        if title != "Top level":
            intro = f"Under `{title}:`. {intro}" if model is not deployment.KalePolicySettings else intro
        rows = model_rows(model, docstring_bullets(doc))
        parts.append(f"### {title}\n\n{intro}\n\n" + _table(["setting", "type", "default", "meaning"], rows))
    env = docstring_bullets(environment.__doc__)
    if not env:
        raise DocsError("kale_airflow/config/environment.py's docstring lists no ``VARIABLE``: meaning bullets")
    parts.append("### Environment variables\n\nFrom the module docstring of `kale_airflow/config/environment.py`.\n\n"
                 + _table(["variable", "meaning"], [[f"`{k}`", v] for k, v in env.items()]))
    return "\n\n".join(parts) + "\n"


# ------------------------------------------------------------------ chart values
def values_comments(text: str) -> dict[str, str]:
    """``{dotted.key: comment}`` from a values file: the comment lines right above a key (no
    blank line between) and the comment at the end of its line."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"^(\s*)([A-Za-z0-9_.-]+):(.*)$", line)
        if not m:
            pending = []
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        inline = re.search(r"\s#\s(.*)$", m.group(3))
        words = pending + ([inline.group(1).strip()] if inline else [])
        if words:
            out[".".join(k for _, k in stack)] = " ".join(words)
        pending = []
    return out


def _resolve(schema: dict, root: dict) -> dict:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return {**root["definitions"][name], "ref": name, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _schema_type(schema: dict, root: dict) -> str:
    schema = _resolve(schema, root)
    if "enum" in schema:
        return " or ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return _value(schema["const"])
    if "anyOf" in schema:
        return " or ".join(_schema_type(s, root) for s in schema["anyOf"])
    kind = schema.get("type", "")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    ref = {"dnsLabel": " (DNS label)", "dnsName": " (DNS name)"}.get(schema.get("ref", ""), "")
    return kind + ref


_MISSING = object()
_YAML_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"))


def _config_field(path: list[str]):
    """The deployment model's field of a ``config.*`` key (the chart renders ``config`` as kale.yaml), or None."""
    models = {"kale": deployment.KalePolicySettings, "kubernetes": deployment.KubernetesWorkerConfig,
              "alerts": deployment.AlertsConfig, "fleet": deployment.FleetConfig}
    if path[0] != "config":
        return None
    if len(path) == 2:
        return deployment.Deployment.model_fields.get(path[1])
    if len(path) == 3 and path[1] in models:
        return models[path[1]].model_fields.get(path[2])
    return None


def _value_rows(schema: dict, values: Any, comments: dict, root: dict, path: list[str]) -> list[list[str]]:
    schema = _resolve(schema, root)
    props = schema.get("properties", {})
    given = values if isinstance(values, dict) else {}
    rows = []
    for key in list(given) + [k for k in props if k not in given]:
        sub, val, here = _resolve(props.get(key, {}), root), given.get(key, _MISSING), path + [key]
        dotted, field = ".".join(here), _config_field(here)
        text = sub.get("description") or comments.get(dotted) or (field.description if field else "") or ""
        kind = _schema_type(sub, root) or next((n for t, n in _YAML_TYPES if isinstance(val, t)), "")
        if sub.get("properties"):
            if text:
                rows.append([f"`{dotted}`", kind or "object", "", _md(text)])
            rows += _value_rows(sub, val, comments, root, here)
            continue
        default = _value(val) if val is not _MISSING else (_default(field) if field else "")
        rows.append([f"`{dotted}`", kind, default, _md(text)])
    return rows


def chart_values_table(schema: dict | None = None, values_text: str | None = None) -> str:
    """The chart's values, one row per key: type (schema), default (values.yaml), description
    (schema, else the values file's comment, else the deployment model's for ``config.*``)."""
    schema = schema if schema is not None else json.loads((CHART / "values.schema.json").read_text())
    values_text = values_text if values_text is not None else (CHART / "values.yaml").read_text()
    rows = _value_rows(schema, yaml.safe_load(values_text) or {}, values_comments(values_text), schema, [])
    return _table(["key", "type", "default", "description"], rows) + "\n"


# ------------------------------------------------------------------ mutation testing
def mutation_table(path: Path | None = None) -> str:
    """Per mutated module: mutants killed, surviving (of them explained), not run within the
    budget, the score and the commit it ran at, from the result file ``make mutation`` writes."""
    doc = json.loads(path.read_text()) if path else _result("mutation.json")
    rows = [[f"`{name}`", m["killed"], f"{m['survived']} ({m['explained']} explained)", m.get("not_run", 0),
             "-" if m["score"] is None else f"{m['score']:.2f}", m.get("commit") or "-"]
            for name, m in sorted(doc["modules"].items())]
    summary = (f"{doc['ran']:,} mutants run{'' if doc.get('finished', True) else ' (the time budget ran out)'}, "
               f"score {doc['score']}, {doc['unexplained']} survivor(s) not yet killed or explained (from "
               "`benchmarks/results/mutation.json`).")
    return summary + "\n\n" + _table(["module", "killed", "survived", "not run", "score", "run at"], rows) + "\n"


def fleet_poke() -> str:
    """docs/fleet.md's measured poke of a job in a fleet (``benchmarks/autoscaler.py --stream fleet``)."""
    d = _result("autoscaler_fleet.json")
    return (f"`benchmarks/autoscaler.py --stream fleet`: one poke of a job in a fleet of {d['jobs']} jobs on a "
            f"PostgreSQL control plane on loopback, with a budget of {d['gpus']} GPUs that binds "
            f"({d['held_by_budget']} of {d['pokes']} decisions held by it): p50 {d['p50_ms']:.0f} ms, p99 "
            f"{d['p99_ms']:.0f} ms (target p99 <= {d['target']['poke_p99_ms']} ms; "
            "`benchmarks/results/autoscaler_fleet.json`).\n")


def kafka_poke() -> str:
    """docs/runtime.md's measured poke at production size on Kafka (``benchmarks/autoscaler.py --stream kafka``)."""
    d = _result("autoscaler_kafka.json")
    poke, before = d["poke"], d["legacy_backlog"]["requests"]
    reqs, cpu = poke["requests_per_poke"], poke["cpu_ms_per_poke"]
    kinds = ", ".join(f"{k} {v:.2f}" for k, v in reqs["by_kind_mean"].items())
    ends = d["end_offsets_alone"]
    return (f"`benchmarks/autoscaler.py --stream kafka` (`benchmarks/results/autoscaler_kafka.json`): "
            f"{d['workers']} workers on a {d['partitions']}-partition Tansu topic, {poke['pokes']} pokes, each "
            f"finding samples pending on all {d['slices']} slices. A poke sends {reqs['total_min']}-"
            f"{reqs['total_max']} requests to the broker whatever the slices (mean per poke: {kinds}"
            f"{'' if 'Fetch' in reqs['by_kind_mean'] else '; no Fetch: every pending record dated by the clock'}); the "
            f"per-slice backlog alone used to send {before['total_mean']:.0f}. One poke takes p50 "
            f"{poke['p50_ms']:.0f} ms and p99 {poke['p99_ms']:.0f} ms (target p99 <= 100 ms) on the "
            f"{d['cpus']}-core development machine, the broker in the same machine: CPU per poke p99 "
            f"{cpu['autoscaler_p99']:.0f} ms in the autoscaler, p50 {cpu['broker_p50']:.0f} ms in the broker. "
            f"One `end_offsets` alone (Metadata and ListOffsets) took p50 {ends['before']['p50_ms']:.0f} ms "
            f"before the pokes and {ends['after']['p50_ms']:.0f} ms after them, as Tansu's in-memory log grew: "
            "the broker's answer, not the number of requests, bounds the poke here.\n")


def rescale_pauses() -> str:
    """docs/runtime.md's measured rescale pauses, warm against restart, and the exactly-once
    audit (``benchmarks/rescale.py``)."""
    d = _result("rescale.json")
    st, audit = d["settings"], d["audit"]
    names = {"emulated": "emulated GPU step", "real": "real CPU steps"}
    rows = []
    for mode, paths in d["summary"].items():
        warm, restart = paths["warm"]["all reported"], paths["restart"]["all reported"]
        rows.append([names.get(mode, mode), *(f"{x[k]['p50']:.2f}" for x in (warm, restart) for k in ("pause_s", "gap_s"))])
    steps = " -> ".join(map(str, st["sequence"]))
    slowest = max(((mode, change, rec["pause_s"]["p50"]) for mode, paths in d["summary"].items()
                   for change, rec in paths["warm"].items() if change != "all reported"), key=lambda x: x[2])
    return (f"`benchmarks/rescale.py` (`benchmarks/results/rescale.json`) rescales a local deployment through "
            f"{steps} ranks, the warm path {st['reps']} times and the restart path (`worker_warm_wait_s: 0`, every "
            f"generation a new job) {st['restart_reps']} times, with the demo's emulated GPU step and with real CPU "
            f"steps, on the {d['machine']['cpus']}-core development machine. Medians over the reported changes "
            f"({', '.join(st['reported_changes'])}), in seconds:\n\n"
            + _table(["steps", "warm: decision to first step", "warm: last old step to first new",
                      "restart: decision to first step", "restart: gap"], rows)
            + f"\n\nOver both step modes the warm medians are {d['measured']['warm_pause_p50_s']:.2f} s and "
              f"{d['measured']['warm_gap_p50_s']:.2f} s (targets {d['targets']['warm_pause_p50_s']:g} s and "
              f"{d['targets']['warm_gap_p50_s']:g} s), with {st.get('worker_standby', 0)} spares; the slowest "
              f"warm change is {slowest[1]} ({names.get(slowest[0], slowest[0])}) at {slowest[2]:.2f} s. "
              f"In the same run, {audit['rescales']} warm rescales with a "
              f"`kill -9` of a random rank during {len(audit['killed_during'])} of them trained all "
              f"{audit['samples']:,} samples at least once ({audit['never']} never) and "
              f"{audit['more_than_twice']} more than twice; the {audit['duplicates']:,} trained twice "
              f"{'all came' if not audit['duplicates_outside'] else 'did not all come'} within the "
              f"{audit['checkpoint_every']} steps before a crash (at most {audit['max_steps_before_crash']}).\n")


def demo_run() -> str:
    """docs/airflow.md's account of the ``make demo`` run behind docs/demo.png (``demo.json``)."""
    d = _result("demo.json")
    return (f"In the run behind [demo.png](demo.png) (`benchmarks/results/demo.json`) the job went "
            f"{' -> '.join(map(str, d['workers_path']))}: {d['rescales']} rescales, "
            f"{d['slo_violation_rate']:.1%} of the freshness readings over the {d['slo_s']} s SLO (the lag peaked at "
            f"{d['max_freshness_s']:.0f} s; no reading for {d['unobserved_s']:.0f} of {d['observed_s']:.0f} s), a mean "
            f"wait of {d['mean_wait_s']:.1f} s, and "
            f"{d['worker_hours']:.2f} worker-hours, {d['worker_hours'] / d['fixed_worker_hours']:.2f}x the "
            f"{d['fixed_worker_hours']:.2f} of the job left at its first {d['fixed_workers']} workers. The "
            f"simulator, given the same deployment and traffic, predicted {d['simulator']['kale']['rescales']} "
            f"rescales ({' -> '.join(map(str, d['simulator']['kale']['workers_path']))}) and "
            f"{d['simulator']['kale']['gpu_hours']:.2f} worker-hours.\n")


# ------------------------------------------------------------------ engine benchmark
PT = 100.0
NAMES = {"nyc_taxi_30min": "NYC taxi, 30 min", "nasa_http_jul1995_1min": "NASA HTTP, 1 min",
         "twitter_volume_AMZN_5min": "Twitter AMZN, 5 min", "twitter_volume_FB_5min": "Twitter FB, 5 min"}


def engine_table(report: dict | None = None) -> str:
    """The engine benchmark's table (one row per reported trace, cluster and window), from
    ``benchmarks/results/engine.json``."""
    report = report or _engine()
    head = ("| trace, cluster, window (days) | lag / best HPA | downtime / best HPA | Kale SLO viol. "
            "(clairvoyant) | GPU-h / best Autopilot (its SLO viol.) | GPU-h / clairvoyant | cost / priced opt. "
            "| GPU-h / offline opt. | rescales / day | targets met |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for key, doc in report["runs"].items():
        trace, cluster, window = key.split("|")
        p, best = doc["policies"], doc["best"]
        k, c = p["kale"], p["oracle"]
        h, a = p[best["hpa"]], p[best["autopilot"]]
        days = doc["evaluation"]["days"]
        checks = doc["checks"]
        lag = next(ch for ch in checks if "lag" in ch["name"])
        lag_txt = f"{k['accumulated_lag'] / h['accumulated_lag']:.3f}"
        if "excess" in lag["name"]:
            lag_txt += f" (excess {lag['value']:.2f})"
        lines.append(
            f"| {NAMES.get(trace, trace)}, {cluster}, {window.replace('_', ' ')} ({days:.1f}) "
            f"| {lag_txt} `{best['hpa']}` | {k['downtime_s'] / h['downtime_s']:.3f} "
            f"| {k['slo_violation_rate'] * PT:.2f} % ({c['slo_violation_rate'] * PT:.2f} %) "
            f"| {k['gpu_hours'] / a['gpu_hours']:.3f} `{best['autopilot']}` ({a['slo_violation_rate'] * PT:.2f} %) "
            f"| {k['gpu_hours'] / c['gpu_hours']:.3f} "
            f"| {k['priced_cost_gpu_h'] / doc['limits']['priced_optimum']['cost_gpu_h']:.3f} "
            f"| {k['gpu_hours'] / doc['limits']['offline_optimal_gpu_hours']:.3f} "
            f"| {k['rescales'] / days:.0f} | {sum(ch['pass'] for ch in checks)}/{len(checks)} |")
    return "\n".join(lines)


def downtime_table(report: dict | None = None) -> str:
    """The headline rows at each rescale downtime, side by side (``benchmarks/downtime.py``,
    ``benchmarks/results/downtime.json``): how much of Kale's gain rides on cheap rescales."""
    report = report or _result("downtime.json")
    head = ("| trace (days) | rescale downtime | lag / best HPA | downtime / best HPA | Kale SLO viol. "
            "| GPU-h / best Autopilot | GPU-h / offline opt. | rescales / day | targets met |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for key in sorted(report["runs"], key=lambda k: (k.split("|")[0], float(k.split("|")[1]))):
        doc, (trace, downtime) = report["runs"][key], key.split("|")
        p, best, days = doc["policies"], doc["best"], doc["evaluation"]["days"]
        k, h, a = p["kale"], p[best["hpa"]], p[best["autopilot"]]
        lines.append(
            f"| {NAMES.get(trace, trace)} ({days:.0f}) | {downtime} s "
            f"| {k['accumulated_lag'] / h['accumulated_lag']:.3f} `{best['hpa']}` "
            f"| {k['downtime_s'] / h['downtime_s']:.3f} | {k['slo_violation_rate'] * PT:.2f} % "
            f"| {k['gpu_hours'] / a['gpu_hours']:.3f} `{best['autopilot']}` "
            f"| {k['gpu_hours'] / doc['limits']['offline_optimal_gpu_hours']:.3f} | {k['rescales'] / days:.0f} "
            f"| {sum(c['pass'] for c in doc['checks'])}/{len(doc['checks'])} |")
    return "\n".join(lines) + "\n"


def headroom_table(report: dict | None = None) -> str:
    """Kale beside clairvoyant Kale at coarser resolutions of the future
    (``benchmarks/headroom.py``, ``benchmarks/results/headroom.json``): GPU-hours over the
    offline optimum, row by row."""
    report = report or _result("headroom.json")
    names = {"kale": "Kale", "oracle@1h": "hourly means", "oracle@15min": "15-min means",
             "oracle@10min": "10-min means", "oracle": "every 5-min bin"}
    order = [p for p in ("kale", "oracle@1h", "oracle@15min", "oracle@10min", "oracle") if p in report["policies"]]
    head = "| row | " + " | ".join(names[p] for p in order) + " |"
    lines = [head, "|" + " --- |" * (len(order) + 1)]
    for key, r in report["rows"].items():
        trace, cluster, window = key.split("|")
        lines.append(f"| {NAMES.get(trace, trace)}, {cluster}, {window.replace('_', ' ')} | "
                     + " | ".join(f"{r[p]['gpu_over_offline']:.3f}" for p in order) + " |")
    return "\n".join(lines) + "\n"


def rules_table(report: dict | None = None) -> str:
    """Kale's planner against the rules it replaced (``kale-rules``), row by row, from
    ``benchmarks/results/engine.json``."""
    report = report or _engine()
    head = ("| trace, cluster, window | GPU-h / offline opt. (rules) | lag / best HPA (rules) "
            "| SLO viol. (rules) | rescales / day (rules) |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for key, doc in report["runs"].items():
        trace, cluster, window = key.split("|")
        p, best = doc["policies"], doc["best"]
        k, r, h = p["kale"], p["kale-rules"], p[best["hpa"]]
        off, days = doc["limits"]["offline_optimal_gpu_hours"], doc["evaluation"]["days"]
        lines.append(
            f"| {NAMES.get(trace, trace)}, {cluster}, {window.replace('_', ' ')} "
            f"| {k['gpu_hours'] / off:.3f} ({r['gpu_hours'] / off:.3f}) "
            f"| {k['accumulated_lag'] / h['accumulated_lag']:.3f} ({r['accumulated_lag'] / h['accumulated_lag']:.3f}) "
            f"| {k['slo_violation_rate'] * PT:.2f} % ({r['slo_violation_rate'] * PT:.2f} %) "
            f"| {k['rescales'] / days:.0f} ({r['rescales'] / days:.0f}) |")
    return "\n".join(lines)


def _engine() -> dict:
    return _result("engine.json")


def _miss_kind(check: dict) -> str:
    """What a check of ``benchmarks/engine.py``'s ``judge`` compares, in words."""
    name = check["name"]
    if "offline optimum" in name:
        return "GPU-hours against the offline optimum"
    if "priced optimum" in name:
        return "cost (GPU-hours plus priced wait) against the priced optimum"
    if "clairvoyant Kale GPU-hours" in name:
        return "GPU-hours against clairvoyant Kale at the same tunables"
    if "(points)" in name:
        return "SLO violations above the best Autopilot's"
    if "GPU-hours" in name:
        return "GPU-hours against the best Autopilot"
    if "excess" in name:
        return "lag in excess of clairvoyant Kale's against the best HPA's"
    return next((f"{what} against the best HPA" for what in ("lag", "downtime") if what in name), "SLO violations")


def engine_summary(report: dict | None = None) -> str:
    """The README's results paragraph: targets met, the ranges that matter, and each miss."""
    report = report or _engine()
    runs = report["runs"]
    checks = [c for d in runs.values() for c in d["checks"]]
    off = [d["policies"]["kale"]["gpu_hours"] / d["limits"]["offline_optimal_gpu_hours"] for d in runs.values()]
    priced = [d["policies"]["kale"]["priced_cost_gpu_h"] / d["limits"]["priced_optimum"]["cost_gpu_h"]
              for d in runs.values()]
    rules = [d["policies"]["kale-rules"]["gpu_hours"] / d["limits"]["offline_optimal_gpu_hours"] for d in runs.values()]
    per_day = [d["policies"]["kale"]["rescales"] / d["evaluation"]["days"] for d in runs.values()]
    misses: dict[tuple[str, str], list] = {}
    for key, d in runs.items():
        for c in d["checks"]:
            if not c["pass"]:
                misses.setdefault((NAMES.get(key.split("|")[0], key.split("|")[0]), _miss_kind(c)), []).append(c)
    lines = [f"On the {len(runs)} reported rows (4 traces x 3 clusters x whole and second half) Kale met "
             f"{sum(c['pass'] for c in checks)} of {len(checks)} targets. Its cost (GPU-hours plus `wait_cost` x "
             f"mean wait x hours) was {min(priced):.2f}-{max(priced):.2f}x the priced optimum's; it used "
             f"{min(off):.2f}-{max(off):.2f}x the GPU-only offline optimum's GPU-hours (the rules it replaced: "
             f"{min(rules):.2f}-{max(rules):.2f}x) at {min(per_day):.0f}-{max(per_day):.0f} rescales a day."]
    for (trace, kind), cs in misses.items():
        values = [c["value"] for c in cs]
        lines.append(f"Missed on {trace}: {kind} on {len(cs)} row(s), {min(values):.3g}-{max(values):.3g} "
                     f"(target {cs[0]['target']}).")
    speed = report.get("speed", {})
    if speed:
        runs = len(speed.get("walls_s", [speed["wall_s"]]))
        lines.append(f"`kale simulate --days 30` with every policy: {speed['wall_s']:.2f} s here (the fastest of "
                     f"{runs} runs); one decision {speed['kale_decide_p99_ms']:.2f} ms at p99.")
    lines.append("Every row, and Kale beside the rules: [docs/policy.md](docs/policy.md#results).")
    return "\n".join(lines) + "\n"


def engine_tables() -> str:
    """docs/policy.md's results: the engine table, then Kale beside the rules."""
    report = _engine()
    return engine_table(report) + "\n\nKale beside the rules it replaced (`kale-rules`, in parentheses):\n\n" + \
        rules_table(report) + "\n"


# ------------------------------------------------------------------ files
GENERATED: list[tuple[str, str, Callable[[], str]]] = [
    ("docs/configuration.md", "configuration-reference", configuration_reference),
    ("charts/kale-airflow/README.md", "chart-values", chart_values_table),
    ("docs/testing.md", "mutation-table", mutation_table),
    ("docs/policy.md", "engine-tables", engine_tables),
    ("docs/simulation.md", "downtime-table", downtime_table),
    ("docs/policy.md", "headroom-table", headroom_table),
    ("README.md", "engine-summary", engine_summary),
    ("docs/fleet.md", "fleet-poke", fleet_poke),
    ("docs/runtime.md", "rescale-pauses", rescale_pauses),
    ("docs/runtime.md", "kafka-poke", kafka_poke),
    ("docs/airflow.md", "demo-run", demo_run),
]


def render(text: str, name: str, body: str, where: str = "") -> str:
    """``text`` with the part between the ``name`` markers replaced by ``body``."""
    begin, end = f"<!-- BEGIN GENERATED {name} ({COMMAND}) -->", f"<!-- END GENERATED {name} -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise DocsError(f"{where or 'the file'} has no {begin} ... {end} block")
    return pattern.sub(lambda _: f"{begin}\n{body.rstrip()}\n{end}", text, count=1)


def stale(root: Path = ROOT, write: bool = False) -> list[str]:
    """The generated files whose generated part differs from the code's (rewritten with ``write``)."""
    out = []
    for rel, name, make in GENERATED:
        path = root / rel
        text = path.read_text()
        fresh = render(text, name, make(), rel)
        if fresh != text:
            out.append(rel)
            if write:
                path.write_text(fresh)
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated documentation, or (``--check``) exit 1 naming the stale files."""
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a generated part is stale")
    args = ap.parse_args(argv)
    try:
        changed = stale(write=not args.check)
    except (DocsError, OSError) as exc:
        print(f"docs: {exc}", file=sys.stderr)
        return 2
    for rel in changed:
        print(f"{'stale' if args.check else 'rewrote'}: {rel}")
    if args.check and changed:
        print(f"run: {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
