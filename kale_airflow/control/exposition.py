"""The autoscaler's decisions as Prometheus metrics (``prometheus_client``).

In Airflow the autoscaler runs inside a sensor or its trigger (a worker or the triggerer,
one run after another), so a ``/metrics`` port in that process would come and go. The
decisions are already recorded in the control-plane database with their observation;
the **decision exporter** the chart runs reads them from there::

    python -m kale_airflow.control.exposition --port 9401    # KALE_DATABASE_URL, KALE_CONFIG

and serves, at every scrape, the latest decision and counters of all decisions since it
started. A long-lived autoscaler process (or a test) can skip the database and call
:func:`record_decision` itself, then :func:`serve`.

==========================================================  =======  =========================================
``kale_autoscaler_desired_workers``                         gauge    workers the last decision asks for
``kale_autoscaler_running_workers``                         gauge    workers of the running generation
``kale_autoscaler_ready_workers``                           gauge    of those, Running pods (when known)
``kale_autoscaler_decisions_total{reason}``                 counter  decisions, holds included, by reason
``kale_autoscaler_decision_reason{reason}``                 gauge    1 for the last decision's reason, else 0
``kale_autoscaler_rescales_total{direction}``               counter  decisions that change the count (up/down/start)
``kale_autoscaler_plan_workers``                            gauge    the plan's first move (before persistence and holds)
``kale_autoscaler_plan_cost_gpu_seconds{plan}``             gauge    the plan's cost over its horizon: ``move``, ``stay``
``kale_autoscaler_forecast_samples_per_second{q}``          gauge    peak of the planned forecast quantile over the horizon
``kale_autoscaler_required_capacity_samples_per_second``    gauge    rate the first step of the plan must sustain
``kale_autoscaler_capacity_samples_per_second``             gauge    capacity of the running workers
``kale_autoscaler_arrival_rate_samples_per_second``         gauge    samples/s arriving
``kale_autoscaler_throughput_samples_per_second``           gauge    samples/s the workers achieve
``kale_autoscaler_backlog_samples``                         gauge    unprocessed samples
``kale_autoscaler_freshness_lag_seconds``                   gauge    age of the oldest unprocessed sample
``kale_autoscaler_freshness_slo_seconds``                   gauge    the freshness SLO
``kale_autoscaler_slo_at_risk``                             gauge    1 when the lag is past the risk threshold
``kale_autoscaler_last_decision_timestamp_seconds``         gauge    when the last decision was made
==========================================================  =======  =========================================

A metric the autoscaler could not observe is exported as NaN (a gap in graphs, not a false zero).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.core.policies import Decision, Observation, Reason

log = logging.getLogger(__name__)
PORT_ENV = "KALE_EXPORTER_PORT"
DEFAULT_PORT = 9401


def _finite(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


class DecisionMetrics:
    """The decision metric objects in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry if registry is not None else CollectorRegistry()

        def gauge(name, doc, labels=()):
            return Gauge(name, doc, labels, registry=r)

        self.desired = gauge("kale_autoscaler_desired_workers", "Workers the last decision asks for.")
        self.running = gauge("kale_autoscaler_running_workers", "Workers of the running generation.")
        self.ready = gauge("kale_autoscaler_ready_workers", "Running worker pods (Kubernetes backend).")
        self.decisions = Counter("kale_autoscaler_decisions", "Decisions, holds included, by reason.", ["reason"],
                                 registry=r)
        self.reason = gauge("kale_autoscaler_decision_reason", "1 for the last decision's reason, else 0.",
                            ["reason"])
        self.rescales = Counter("kale_autoscaler_rescales", "Decisions that change the worker count.",
                                ["direction"], registry=r)
        self.plan = gauge("kale_autoscaler_plan_workers", "The plan's first move (before persistence and holds).")
        self.cost = gauge("kale_autoscaler_plan_cost_gpu_seconds", "The plan's cost over its horizon (GPU-seconds, "
                          "lag priced): move = the plan chosen, stay = keeping the count.", ["plan"])
        self.forecast = gauge("kale_autoscaler_forecast_samples_per_second",
                              "Peak of the planned forecast quantile q over the plan's horizon.", ["q"])
        self.required = gauge("kale_autoscaler_required_capacity_samples_per_second",
                              "Samples/s the first step of the plan must sustain.")
        self.capacity = gauge("kale_autoscaler_capacity_samples_per_second", "Capacity of the running workers.")
        self.arrival = gauge("kale_autoscaler_arrival_rate_samples_per_second", "Samples/s arriving.")
        self.throughput = gauge("kale_autoscaler_throughput_samples_per_second", "Samples/s the workers achieve.")
        self.backlog = gauge("kale_autoscaler_backlog_samples", "Unprocessed samples (consumer lag).")
        self.freshness = gauge("kale_autoscaler_freshness_lag_seconds", "Age of the oldest unprocessed sample.")
        self.slo = gauge("kale_autoscaler_freshness_slo_seconds", "The freshness SLO.")
        self.at_risk = gauge("kale_autoscaler_slo_at_risk", "1 when the freshness lag is past the SLO risk threshold.")
        self.last = gauge("kale_autoscaler_last_decision_timestamp_seconds", "Unix time of the last decision.")
        for reason in Reason:  # every reason is a series from the start: rate() sees the first one
            self.decisions.labels(reason.value)
            self.reason.labels(reason.value).set(0)
        for direction in ("up", "down", "start"):
            self.rescales.labels(direction)
        self.server = None

    def _set(self, gauge, value) -> None:
        v = _finite(value)
        if v is None:
            gauge.set(math.nan)  # absent from dashboards' math rather than a false zero
        else:
            gauge.set(v)

    def record(self, decision: Decision, observation: Observation, *, capacity: float | None = None,
               required: float | None = None, quantiles: dict[float, float] | None = None,
               slo_s: float | None = None, slo_risk_fraction: float = 0.5,
               forecast_quantile: float | None = None) -> None:
        """One decision and the observation it was made from."""
        d, o = decision, observation
        reason = d.reason.value if isinstance(d.reason, Reason) else str(d.reason)
        self.desired.set(d.workers)
        self.running.set(o.workers)
        self._set(self.ready, o.ready_workers)
        self.decisions.labels(reason).inc()
        for r in list(self.reason._metrics):  # noqa: SLF001 - zero the others, including unknown reasons seen before
            self.reason.labels(*r).set(0)
        self.reason.labels(reason).set(1)
        if d.workers != o.workers:
            self.rescales.labels("start" if not o.workers else ("up" if d.workers > o.workers else "down")).inc()
        det = d.details or {}
        self._set(self.plan, det.get("plan_workers"))
        for plan, key in (("move", "plan_gpu_h"), ("stay", "stay_gpu_h")):
            hours = _finite(det.get(key))
            self._set(self.cost.labels(plan), None if hours is None else hours * 3600)
        peak = _finite(det.get("forecast_peak"))
        qs = dict(quantiles or {})
        if peak is not None and forecast_quantile is not None:
            qs.setdefault(forecast_quantile, peak)
        for q, v in qs.items():
            self._set(self.forecast.labels(f"{float(q):g}"), v)
        self._set(self.required, required if required is not None else det.get("planned_rate"))
        self._set(self.capacity, capacity)
        self._set(self.arrival, o.arrival_rate)
        self._set(self.throughput, o.throughput)
        self._set(self.backlog, o.backlog)
        self._set(self.freshness, o.freshness_lag_s)
        self._set(self.slo, slo_s)
        risk = d.reason == Reason.SCALE_UP_SLO_RISK or (
            slo_s is not None and o.freshness_lag_s is not None and o.freshness_lag_s > slo_risk_fraction * slo_s)
        self.at_risk.set(1 if risk else 0)
        self.last.set(o.now_s)

    def record_row(self, row: dict, **kw) -> None:
        """A decision as the control-plane store records it (``StateStore.decisions()`` rows)."""
        reason = row["reason"]
        try:
            reason = Reason(reason)
        except ValueError:
            pass
        known = {"ts", "workers", "target", "reason", "message", "arrival_rate", "backlog", "freshness_lag_s",
                 "capacity", "throughput", "ready_workers"}
        d = Decision(int(row["target"]), reason, row.get("message", ""),  # type: ignore[arg-type]
                     {k: v for k, v in row.items() if k not in known})
        o = Observation(float(row["ts"]), int(row.get("workers") or 0), _finite(row.get("arrival_rate")),
                        _finite(row.get("backlog")), _finite(row.get("freshness_lag_s")), None,
                        _finite(row.get("throughput")), False,
                        int(row["ready_workers"]) if row.get("ready_workers") is not None else None)
        self.record(d, o, capacity=_finite(row.get("capacity")), **kw)

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``port`` (0: any free port); returns the port."""
        self.server, _thread = start_http_server(int(port), addr=addr, registry=self.registry)
        return int(self.server.server_port)

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class StoreExporter:
    """Feeds :class:`DecisionMetrics` from the control-plane database's ``decisions`` table:
    every decision of job ``job`` recorded since the exporter started is counted once, in
    order (one exporter per job of a fleet)."""

    def __init__(self, url: str, metrics: DecisionMetrics | None = None, *, slo_s: float | None = None,
                 slo_risk_fraction: float = 0.5, forecast_quantile: float | None = None, job: str = DEFAULT_JOB):
        from kale_airflow.store.database import open_database

        self.db = open_database(url)
        self.job = job
        self.metrics = metrics or DecisionMetrics()
        self.kw = {"slo_s": slo_s, "slo_risk_fraction": slo_risk_fraction, "forecast_quantile": forecast_quantile}
        self.last_id: int | None = None
        self._lock = threading.Lock()

    def refresh(self) -> int:
        """Record the decisions added since the last call (at the first call: only the latest
        one, so counters start from the exporter's start). Returns how many were recorded."""
        from sqlalchemy import func, select

        from kale_airflow.store.schema import decisions

        d = decisions.c
        with self._lock:
            with self.db.connect() as c:
                if self.last_id is None:
                    top = c.execute(select(func.max(d.id)).where(d.job == self.job)).scalar()
                    if top is None:
                        self.last_id = 0
                        return 0
                    self.last_id = top - 1
                rows = c.execute(select(d.id, d.ts, d.workers, d.target, d.reason, d.message, d.details)
                                 .where(d.job == self.job, d.id > self.last_id).order_by(d.id)).all()
            for i, ts, w, tgt, reason, msg, details in rows:
                self.metrics.record_row({"ts": ts, "workers": w, "target": tgt, "reason": reason, "message": msg,
                                         **json.loads(details or "{}")}, **self.kw)
                self.last_id = i
            return len(rows)

    def run(self, port: int, interval_s: float = 5.0, addr: str = "0.0.0.0", stop: threading.Event | None = None):
        """Serve ``/metrics`` and refresh every ``interval_s`` until ``stop`` is set."""
        bound = self.metrics.serve(port, addr)
        log.info("decision exporter on :%d, reading %r every %.1fs", bound, self.db, interval_s)
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not stop the exporter
                log.warning("cannot read decisions (%s); retrying", exc)
            stop.wait(interval_s)


#: The process's decision metrics (for an autoscaler that runs in one long-lived process).
METRICS = DecisionMetrics()


def record_decision(decision: Decision, observation: Observation, **kw) -> None:
    """:meth:`DecisionMetrics.record` on the process's metrics."""
    METRICS.record(decision, observation, **kw)


def serve(port: int | None = None, addr: str = "0.0.0.0") -> int | None:
    """Serve the process's decision metrics on ``port`` (None: ``$KALE_EXPORTER_PORT``, else nothing)."""
    if port is None and os.environ.get(PORT_ENV):
        port = int(os.environ[PORT_ENV])
    return None if port is None else METRICS.serve(port, addr)


def main(argv: list[str] | None = None) -> int:
    """``python -m kale_airflow.control.exposition``: the decision exporter."""
    ap = argparse.ArgumentParser(prog="python -m kale_airflow.control.exposition",
                                 description="Export the kale autoscaler's decisions to Prometheus.")
    ap.add_argument("--port", type=int, default=int(os.environ.get(PORT_ENV, DEFAULT_PORT)))
    ap.add_argument("--addr", default="0.0.0.0")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between reads of the decisions table")
    ap.add_argument("--job", default=os.environ.get("KALE_JOB"),
                    help="the deployment's job whose decisions to export (default $KALE_JOB; needed when it has "
                         "several: run one exporter per job)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s exporter %(message)s")
    from kale_airflow.config import load_config

    config = load_config(args.job)
    dep = config.deployment
    exporter = StoreExporter(config.settings.database_url, slo_s=dep.slo_s,
                             slo_risk_fraction=dep.alerts.slo_risk_fraction,
                             forecast_quantile=dep.kale_config.forecast_quantile, job=config.job)
    exporter.run(args.port, args.interval, args.addr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
