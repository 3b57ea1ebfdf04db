"""A job's decision within its calendar, its pin and the fleet's GPU budget.

The jobs of a deployment meet in the control-plane database: at each decision a job's
autoscaler records its demand (:class:`~kale_airflow.core.fleet.JobDemand`: the count it
asks for, the count it runs, its bounds, priority and plan costs) under ``fleet/demand``,
reads the other jobs' latest demands, and runs the pure arbiter
(:func:`~kale_airflow.core.fleet.allocate`) over all of them. A recorded demand counts the
GPUs its decision is about to take as held, so the next job to decide sees them taken; a
job held back decides ``hold_budget`` with a sentence naming who holds the GPUs, and takes
its share once the others release it. Two jobs deciding in the same instant each see the
other's previous demand: the arbiter's split is settled at their next decisions. A demand older than
``fleet.demand_ttl_s`` counts as a job that keeps what it runs (its autoscaler stopped).

Pins (``kale pin JOB N --until T``) are stored per job under ``fleet/pin`` and bound the
job's decisions as calendar overrides do (:func:`~kale_airflow.core.fleet.bounds_at`).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from kale_airflow.core.fleet import Bounds, JobDemand, Pin, allocate, bounded, bounds_at
from kale_airflow.core.policies import Decision, Observation, Reason

log = logging.getLogger(__name__)
DEMAND_KEY = "fleet/demand"
PIN_KEY = "fleet/pin"


def pin(store, workers: int, until_s: float, note: str = "", now: float | None = None) -> dict:
    """Pin a job (``store``: its state store) to ``workers`` until ``until_s``; returns the record."""
    now = time.time() if now is None else now
    if until_s <= now:
        raise ValueError("a pin must end in the future: give --until a later time (UTC) or a duration like 2h")
    p = Pin(int(workers), float(until_s), note)  # its own checks
    rec = {"workers": p.workers, "until": p.until_s, "note": p.note, "since": now}
    store.set_value(PIN_KEY, rec)
    return rec


def release(store) -> dict | None:
    """Remove a job's pin; returns the pin it had (None: none)."""
    had = store.get_value(PIN_KEY)
    store.set_value(PIN_KEY, {})
    return had or None


def active_pin(store, now: float | None = None) -> dict | None:
    """The job's pin record (``workers``, ``until``, ``note``, ``since``) while it holds, else None."""
    rec = store.get_value(PIN_KEY) or {}
    return rec if rec.get("workers") is not None and rec["until"] > (time.time() if now is None else now) else None


def pins_of(store) -> tuple[Pin, ...]:
    """The job's pin, if one is recorded (expired ones too: :func:`bounds_at` ignores them)."""
    rec = store.get_value(PIN_KEY) or {}
    return (Pin(int(rec["workers"]), float(rec["until"]), rec.get("note", "")),) if rec.get("workers") is not None \
        else ()


class FleetLimits:
    """Bounds and budget of one job's decisions (the autoscaler's, each poke)."""

    def __init__(self, deployment, store):
        self.dep, self.store = deployment, store
        self.overrides = tuple(o.override for o in deployment.schedule_overrides)

    def bounds(self, now: float) -> Bounds:
        """The job's bounds now: its limits, narrowed by its open windows and its pin."""
        return bounds_at(self.dep.limits, now, self.overrides, pins_of(self.store))

    def apply(self, d: Decision, obs: Observation, now: float, policy=None, *, record: bool = True) -> Decision:
        """``d`` within the bounds, then within the job's share of the budget (when a fleet is
        configured); ``record``: publish this job's demand for the others."""
        b = self.bounds(now)
        d = bounded(d, b)
        fleet = self.dep.fleet
        if fleet is None:
            return d
        mine = self.demand(d, obs, b, policy)
        demands = [mine, *self.others(now, fleet.demand_ttl_s)]
        share = allocate(demands, fleet.gpus, violation_gpus=fleet.violation_gpus)[mine.name]
        budget = share.to_dict() | {"jobs": len(demands)}
        if share.held_back:
            d = Decision(share.workers, Reason.HOLD_BUDGET, share.message, d.details | {"budget": budget})
        elif share.workers != d.workers:
            d = Decision(share.workers, d.reason, d.message, d.details | {"budget": budget})
        if record:  # the GPUs it holds include those this decision is about to take
            held = max(mine.gpus, d.workers)
            self.store.set_value(DEMAND_KEY, dataclasses.replace(mine, held=held).to_dict() | {"ts": now})
        return d

    def demand(self, d: Decision, obs: Observation, b: Bounds, policy=None) -> JobDemand:
        """This job's demand: its decision within its bounds, priced by its plan when it has one."""
        dep, current = self.dep, int(obs.workers or 0)
        want = current if obs.rescaling else b.clamp(d.workers)
        kw = dict(min_workers=b.min_workers, max_workers=b.max_workers, priority=dep.priority,
                  locked=bool(obs.rescaling))
        plan = getattr(policy, "plan", None)
        table = getattr(getattr(policy, "capacity", None), "table", None)
        if obs.rescaling or plan is None or table is None or obs.arrival_rate is None:
            return JobDemand(dep.job, want, current, horizon_s=dep.kale_config.horizon_s, **kw)
        planned = policy.config  # the measured rescale pause the autoscaler plans with, not the configured floor
        return JobDemand.from_plan(dep.job, plan(obs), want, current, capacity=table,
                                   freshness_s=obs.freshness_lag_s or 0.0, arrival_rate=obs.arrival_rate,
                                   backlog=obs.backlog or 0.0, slo_s=dep.slo_s, downtime_s=planned.rescale_downtime_s,
                                   horizon_s=planned.horizon_s, **kw)

    def others(self, now: float, ttl_s: float) -> list[JobDemand]:
        """The other jobs' latest demands; a stale one (its autoscaler stopped) keeps what it runs."""
        out = []
        for job, rec in sorted(self.store.values_of_every_job(DEMAND_KEY).items()):
            if job == self.dep.job or not rec:
                continue
            demand = JobDemand.from_dict(rec)
            out.append(demand if now - float(rec["ts"]) <= ttl_s else demand.idle())
        return out
