"""The fleet simulator: several jobs replayed at once on one GPU budget.

Every job has its own trace, cluster, forecaster, SLO, priority and bounds; they share the
tick and the budget (``FleetSpec.gpus``). The traces' calendars need not match: each job
runs from its own evaluation start (after ``history_days`` of its trace) on its own
clock, and the jobs are aligned by tick index; the run covers the length they have in
common. Each tick every job's policy decides (it sees only its own past), the decision
is bounded by the job's calendar windows and pins (:func:`~kale_airflow.core.fleet.bounds_at`),
then the budget applies (:func:`~kale_airflow.core.fleet.allocate`), then every job's
cluster runs the tick as in the single-job protocol (:mod:`kale_airflow.core.simulator`).

Policies compared in one run (``FLEET_POLICIES``):

- ``fleet-kale``: Kale per job, shared by the arbiter on the jobs' plan costs;
- ``kale-fcfs``: Kale per job, first come first served under the same cap (higher
  priority first, then the order of the fleet file: each takes what it asks for while the
  budget, less the later jobs' floors, lasts);
- ``hpa-fcfs``: HPA per job, the same first-come rule;
- ``static-split``: fixed counts splitting the budget by the jobs' peak needs (an offline
  reference: it knows each window's peak);
- ``kale-alone``: each job alone with its own ``max_workers`` and no budget (a reference);

plus the fleet's offline references (:func:`fleet_offline`). Reported per job and in
total: lag, SLO violations (rate, seconds, priority-weighted seconds), GPU-hours, the
budget's utilisation, and the checks that the budget is never exceeded and no job runs
below its floor.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from kale_airflow.core.cluster import cluster_preset
from kale_airflow.core.fleet import (
    VIOLATION_GPUS,
    Bounds,
    JobDemand,
    Override,
    Pin,
    allocate,
    best_split,
    bounded,
    bounds_at,
    check_floors,
)
from kale_airflow.core.planning import Prices, cheapest_moves, stage_costs
from kale_airflow.core.policies import Decision, Limits, Reason, StaticPolicy
from kale_airflow.core.simulator import SimConfig, SimulationError, Workload, _Replay, build_policy, build_workload
from kale_airflow.core.traffic import Trace

FLEET_POLICIES = ("fleet-kale", "kale-fcfs", "hpa-fcfs", "static-split", "kale-alone")
# Policy name -> (per-job policy, budget rule); kale-alone has no budget.
_RULES = {"fleet-kale": ("kale", "arbiter"), "kale-fcfs": ("kale", "fcfs"), "hpa-fcfs": ("hpa", "fcfs"),
          "static-split": ("static", "fcfs"), "kale-alone": ("kale", None)}
JOB_KEYS = {"name", "trace", "priority", "min_workers", "max_workers", "slo_s", "cluster", "forecaster",
            "schedule_overrides", "pins"}
FLEET_KEYS = {"gpus", "jobs", "tick_s", "ref_workers", "history_days", "days", "seed", "rescale_downtime_s",
              "violation_gpus"}


@dataclass(frozen=True)
class FleetJob:
    """One job of a fleet file: its trace (a path, as written), priority, bounds, SLO,
    true cluster (``amdahl``, ``saturating``, ``comm``), forecaster, calendar windows and pins."""

    name: str
    trace: str
    priority: float = 1.0
    min_workers: int = 1
    max_workers: int = 64
    slo_s: float = 300.0
    cluster: str = "amdahl"
    forecaster: str = "seasonal"
    overrides: tuple[Override, ...] = ()
    pins: tuple[Pin, ...] = ()

    @classmethod
    def from_dict(cls, doc: dict) -> "FleetJob":
        """From one entry of the fleet file's ``jobs``."""
        if not isinstance(doc, dict) or "name" not in doc or "trace" not in doc:
            raise SimulationError(f"every job needs a name and a trace, got {doc!r}")
        unknown = set(doc) - JOB_KEYS
        if unknown:
            raise SimulationError(f"job {doc['name']}: unknown key(s) {sorted(unknown)}; known: {sorted(JOB_KEYS)}")
        overrides = tuple(Override.from_dict(o) for o in doc.get("schedule_overrides") or ())
        pins = tuple(Pin.from_dict(p) for p in doc.get("pins") or ())
        kw = {k: doc[k] for k in ("priority", "min_workers", "max_workers", "slo_s", "cluster", "forecaster")
              if k in doc}
        job = cls(str(doc["name"]), str(doc["trace"]), overrides=overrides, pins=pins, **kw)
        cluster_preset(job.cluster)  # an unknown cluster fails here, naming the choices
        if not job.priority > 0 or job.min_workers < 1 or job.max_workers < job.min_workers:
            raise SimulationError(f"job {job.name}: priority must be > 0 and 1 <= min_workers <= max_workers")
        return job


@dataclass(frozen=True)
class FleetSpec:
    """A fleet: jobs sharing ``gpus``, the tick and the protocol's settings, and the
    arbiter's ``violation_gpus`` (:data:`~kale_airflow.core.fleet.VIOLATION_GPUS`)."""

    gpus: int
    jobs: tuple[FleetJob, ...]
    tick_s: float = 15.0
    ref_workers: int = 32
    history_days: float = 14.0
    days: float | None = None
    seed: int = 0
    rescale_downtime_s: float = 90.0
    violation_gpus: float = VIOLATION_GPUS

    def __post_init__(self) -> None:
        names = [j.name for j in self.jobs]
        if not names or len(set(names)) != len(names):
            raise SimulationError(f"a fleet needs jobs with unique names, got {names}")
        check_floors({j.name: j.min_workers for j in self.jobs}, self.gpus)

    @classmethod
    def from_dict(cls, doc: dict) -> "FleetSpec":
        """From a parsed fleet file (``gpus``, ``jobs``, and optionally the protocol's settings)."""
        if not isinstance(doc, dict) or "gpus" not in doc or not doc.get("jobs"):
            raise SimulationError("a fleet file needs 'gpus' (the budget) and a list of 'jobs'")
        unknown = set(doc) - FLEET_KEYS
        if unknown:
            raise SimulationError(f"fleet file: unknown key(s) {sorted(unknown)}; known: {sorted(FLEET_KEYS)}")
        kw = {k: doc[k] for k in FLEET_KEYS - {"gpus", "jobs"} if k in doc}
        return cls(int(doc["gpus"]), tuple(FleetJob.from_dict(j) for j in doc["jobs"]), **kw)

    def job_config(self, job: FleetJob) -> SimConfig:
        """The single-job protocol's settings for one job."""
        cluster, profile_workers, noise = cluster_preset(job.cluster)
        return SimConfig(tick_s=self.tick_s, ref_workers=self.ref_workers, min_workers=job.min_workers,
                         max_workers=job.max_workers, partitions=max(64, job.max_workers),
                         rescale_downtime_s=self.rescale_downtime_s, slo_s=job.slo_s, history_days=self.history_days,
                         days=self.days, seed=self.seed, cluster=cluster, profile_workers=profile_workers,
                         profile_noise_sd=noise)


@dataclass
class _Job:
    """One job's fixed inputs for every fleet policy: settings, aligned workload, noise, start."""

    spec: FleetJob
    cfg: SimConfig
    workload: Workload
    noise: np.ndarray
    initial: int


def prepare(spec: FleetSpec, traces: dict[str, Trace]) -> list[_Job]:
    """Every job's workload cut to the length the jobs have in common (aligned by tick index
    from each one's evaluation start), its noise (seeded per job, the same for every
    policy) and its initial count (the first tick's need plus 20 %, like the single-job
    protocol; reduced first come first served when together they exceed the budget)."""
    jobs = []
    for i, job in enumerate(spec.jobs):
        cfg = spec.job_config(job)
        jobs.append((job, cfg, build_workload(traces[job.name], cfg), i))
    ticks = min(len(w.arrivals) for _, _, w, _ in jobs)
    out = []
    for job, cfg, w, i in jobs:
        w = replace(w, arrivals=w.arrivals[:ticks])
        rng = np.random.default_rng(cfg.seed + 1000 * i)
        noise = np.maximum(0.5, 1 + cfg.cluster.noise_sd * rng.standard_normal(ticks))
        first = cfg.cluster.workers_for(w.arrivals[0] / cfg.tick_s * 1.2, cfg.max_workers)
        out.append(_Job(job, cfg, w, noise, cfg.limits.clamp(first)))
    demands = [JobDemand(j.spec.name, j.initial, 0, j.spec.min_workers, j.spec.max_workers, j.spec.priority)
               for j in out]
    start = allocate(demands, spec.gpus, rule="fcfs")
    for j in out:
        j.initial = start[j.spec.name].target
    return out


def static_split(peaks: list[int], floors: list[int], budget: int) -> list[int]:
    """Fixed counts by peak share: the budget split in proportion to each job's peak need,
    never past its peak but never below its floor, the rest by largest remainder (Hamilton)."""
    if sum(max(p, f) for p, f in zip(peaks, floors)) <= budget:
        return [max(p, f) for p, f in zip(peaks, floors)]
    share = np.asarray(peaks, dtype=float) * budget / sum(peaks)
    out = [max(min(int(math.floor(s)), p), f) for s, f, p in zip(share, floors, peaks)]
    while sum(out) > budget:  # floors raised some counts: take back from the largest
        i = int(np.argmax([o - f for o, f in zip(out, floors)]))
        out[i] -= 1
    for i in sorted(range(len(peaks)), key=lambda i: -(share[i] - math.floor(share[i]))):
        if sum(out) < budget and out[i] < peaks[i]:
            out[i] += 1
    return out


def _policies(name: str, jobs: list[_Job], spec: FleetSpec) -> list:
    """One policy per job for fleet policy ``name`` (see the module docstring)."""
    base = _RULES[name][0]
    if base != "static":
        return [build_policy(base, j.cfg, j.workload, j.spec.forecaster) for j in jobs]
    peaks = [j.cfg.cluster.workers_for(float(j.workload.arrivals.max()) / j.cfg.tick_s, j.cfg.limits.upper)
             for j in jobs]
    counts = static_split(peaks, [j.spec.min_workers for j in jobs], spec.gpus)
    return [StaticPolicy(n) for n in counts]


class _FleetReplay:
    """One fleet policy's replay: a :class:`~kale_airflow.core.simulator._Replay` per job,
    the budget between their decisions and their ticks, and the fleet's counters."""

    def __init__(self, name: str, jobs: list[_Job], spec: FleetSpec):
        self.name, self.jobs, self.spec = name, jobs, spec
        self.rule = _RULES[name][1]
        self.policies = _policies(name, jobs, spec)
        self.replays = [_Replay(j.workload, j.cfg, j.noise, j.initial) for j in jobs]
        self.next_decide = [j.workload.start_s for j in jobs]
        self._bounds: list[Bounds | None] = [None] * len(jobs)
        zeros = [0] * len(jobs)
        self.held_back, self.overridden, self.below_floor = list(zeros), list(zeros), list(zeros)
        self.usage: list[int] = []
        self.allocate_ms: list[float] = []

    def bounds(self, i: int, now: float) -> Bounds:
        """Job i's bounds at ``now``, recomputed only at a window edge or pin expiry."""
        b = self._bounds[i]
        if b is None or now >= b.until_s:
            job = self.jobs[i]
            b = bounds_at(job.cfg.limits, now, job.spec.overrides, job.spec.pins)
            self._bounds[i] = b
        return b

    def tick(self, k: int) -> None:
        """Decide, share the budget, then run tick k for every job."""
        now = [j.workload.start_s + k * self.spec.tick_s for j in self.jobs]
        asked = [self._decide(i, k, now[i]) for i in range(len(self.jobs))]
        demands = [self._demand(i, now[i], d) for i, (d, _) in enumerate(asked)]
        allocs = None
        if self.rule is not None:
            demands = self._with_plans(demands, asked, k, now)
            s = time.perf_counter()
            try:
                allocs = allocate(demands, self.spec.gpus, rule=self.rule, violation_gpus=self.spec.violation_gpus)
            except ValueError as exc:  # the windows and pins open at this tick raise the floors past the budget
                raise SimulationError(f"tick {k}: {exc}") from None
            self.allocate_ms.append((time.perf_counter() - s) * 1e3)
        for i, rep in enumerate(self.replays):
            self._apply(i, now[i], asked[i][0], allocs[demands[i].name] if allocs else None)
            if rep.n < self.bounds(i, now[i]).min_workers:
                self.below_floor[i] += 1
            rep.step(k, now[i])
        self.usage.append(sum(rep.workers_l[-1] for rep in self.replays))

    def _decide(self, i: int, k: int, now: float):
        """Job i's own decision when it is due (None otherwise) and the observation it saw."""
        if now < self.next_decide[i] - 1e-9:
            return None, None
        rep, policy = self.replays[i], self.policies[i]
        obs = rep.observation(k, now)
        s = time.perf_counter()
        d = policy.decide(obs)
        rep.decide_ms.append((time.perf_counter() - s) * 1e3)
        self.next_decide[i] = now + policy.interval_s
        return d, obs

    def _demand(self, i: int, now: float, d: Decision | None) -> JobDemand:
        """Job i's demand: its decision (or its count) within its bounds."""
        rep, job, b = self.replays[i], self.jobs[i], self.bounds(i, now)
        locked = rep.down_rem > 0
        want = rep.n if locked else b.clamp(d.workers if d is not None else rep.n)
        horizon = getattr(getattr(self.policies[i], "config", None), "horizon_s", 3600.0)
        return JobDemand(job.spec.name, want, rep.n, b.min_workers, b.max_workers, job.spec.priority,
                         horizon_s=horizon, held=rep.gpus, locked=locked)

    def _with_plans(self, demands: list[JobDemand], asked, k: int, now: list[float]) -> list[JobDemand]:
        """The arbiter prices counts by the jobs' plans: planned only when the asks exceed the
        budget, for the jobs whose count may change."""
        if self.rule != "arbiter":
            return demands
        asks = sum(d.current if d.locked else max(d.min_workers, min(d.want, d.max_workers)) for d in demands)
        if asks <= self.spec.gpus:
            return demands
        out = []
        for i, d in enumerate(demands):
            policy = self.policies[i]
            if d.locked or not hasattr(policy, "plan") or policy.capacity.table is None:
                out.append(d)
                continue
            obs = asked[i][1] or self.replays[i].observation(k, now[i])
            plan = policy.plan(obs)
            cfg = self.jobs[i].cfg
            out.append(JobDemand.from_plan(d.name, plan, d.want, d.current, capacity=policy.capacity.table,
                                           freshness_s=obs.freshness_lag_s or 0.0, arrival_rate=obs.arrival_rate,
                                           backlog=obs.backlog or 0.0,
                                           slo_s=cfg.slo_s,
                                           downtime_s=cfg.rescale_downtime_s, horizon_s=d.horizon_s,
                                           min_workers=d.min_workers, max_workers=d.max_workers,
                                           priority=d.priority, held=d.held, locked=d.locked))
        return out

    def _apply(self, i: int, now: float, d: Decision | None, alloc) -> None:
        """Start what job i may run now: its decision, bounded, unless the budget holds it back."""
        rep, b = self.replays[i], self.bounds(i, now)
        if b.reason is not None:
            self.overridden[i] += 1
        if alloc is not None and alloc.held_back:
            self.held_back[i] += 1
            rep.apply(Decision(alloc.workers, Reason.HOLD_BUDGET, alloc.message), now)
        elif d is not None:
            dec = bounded(d, b)
            if alloc is not None and alloc.workers != dec.workers:
                dec = Decision(alloc.workers, dec.reason, dec.message, dec.details)
            rep.apply(dec, now)
        elif b.clamp(rep.n) != rep.n:
            rep.apply(Decision(b.clamp(rep.n), Reason.OVERRIDE, b.message), now)

    def result(self) -> "FleetRun":
        """The replay's per-job and total metrics."""
        jobs = {}
        for i, (job, rep) in enumerate(zip(self.jobs, self.replays)):
            run = rep.result(self.name)
            m = run.metrics
            m["slo_violation_s"] = float((run.freshness > job.cfg.slo_s).sum() * job.cfg.tick_s)
            m["weighted_slo_violation_s"] = job.spec.priority * m["slo_violation_s"]
            m |= {"priority": job.spec.priority, "held_back_ticks": self.held_back[i],
                  "override_ticks": self.overridden[i], "below_floor_ticks": self.below_floor[i],
                  "min_workers_seen": int(run.workers.min()), "reasons": run.reasons}
            jobs[job.spec.name] = m
        usage = np.asarray(self.usage)
        return FleetRun(self.name, jobs, _totals(jobs, usage, self.spec, self.rule is not None, self.allocate_ms))


def _totals(jobs: dict, usage: np.ndarray, spec: FleetSpec, budgeted: bool, allocate_ms: list[float]) -> dict:
    """The fleet's totals and its budget checks."""
    gpu_h = sum(m["gpu_hours"] for m in jobs.values())
    ms = np.asarray(allocate_ms) if allocate_ms else np.zeros(1)
    return {
        "accumulated_lag": sum(m["accumulated_lag"] for m in jobs.values()),
        "slo_violation_s": sum(m["slo_violation_s"] for m in jobs.values()),
        "weighted_slo_violation_s": sum(m["weighted_slo_violation_s"] for m in jobs.values()),
        "slo_violation_rate": float(np.mean([m["slo_violation_rate"] for m in jobs.values()])),
        "gpu_hours": gpu_h,
        "rescales": sum(m["rescales"] for m in jobs.values()),
        "downtime_s": sum(m["downtime_s"] for m in jobs.values()),
        "held_back_ticks": sum(m["held_back_ticks"] for m in jobs.values()),
        "budget_utilisation": gpu_h * 3600.0 / (spec.gpus * len(usage) * spec.tick_s),
        "max_gpus_in_use": int(usage.max()),
        "budget_exceeded_ticks": int((usage > spec.gpus).sum()) if budgeted else None,
        "below_floor_ticks": sum(m["below_floor_ticks"] for m in jobs.values()),
        "allocate_p99_ms": float(np.percentile(ms, 99)),
        "allocate_max_ms": float(ms.max()),
    }


@dataclass
class FleetRun:
    """One fleet policy's metrics: per job and in total."""

    name: str
    jobs: dict[str, dict]
    total: dict


def run_fleet_policy(name: str, jobs: list[_Job], spec: FleetSpec, progress=None) -> FleetRun:
    """Replay every job through fleet policy ``name`` on one clock and one budget."""
    if name not in _RULES:
        raise SimulationError(f"unknown fleet policy {name!r}; choose from {', '.join(FLEET_POLICIES)}")
    fleet = _FleetReplay(name, jobs, spec)
    ticks = len(jobs[0].workload.arrivals)
    for k in range(ticks):
        fleet.tick(k)
        if progress is not None and k % 4096 == 4095:
            progress.update(4096)
    if progress is not None:
        progress.update(ticks % 4096)
    return fleet.result()


# ---------------------------------------------------------------- the fleet's offline references
OFFLINE_VIOLATION_GPUS = 100.0  # x the budget: violation time first, GPU-hours second


@dataclass
class _Stages:
    """One job's offline stage costs per step and count (see :func:`fleet_offline`)."""

    stay: np.ndarray
    move: np.ndarray
    stay_ok: np.ndarray
    move_ok: np.ndarray
    need: np.ndarray
    floor: int
    upper: int
    priority: float
    downtime_s: float
    initial: int


def _stages(j: _Job, steps: int, step_s: float, violation_gpus: float) -> _Stages:
    """The offline optimum's stage costs (:func:`~kale_airflow.core.planning.stage_costs`, true
    arrivals and curve, no lag price) with one more option: a step whose count cannot keep up
    is allowed at a price of ``violation_gpus x priority`` GPU-seconds per second of it."""
    cfg, per = j.cfg, int(round(step_s / j.cfg.tick_s))
    a = np.concatenate([j.workload.arrivals, np.zeros(steps * per - len(j.workload.arrivals))])
    a = a.reshape(steps, per).sum(axis=1)
    cap = cfg.cluster.capacity_table(cfg.limits.upper)
    prices = Prices(cfg.rescale_downtime_s, 0.0, cfg.min_workers)
    stay, move = stage_costs(cap, a / step_s, step_s, prices)
    stay_ok, move_ok = np.isfinite(stay), np.isfinite(move)
    n = np.arange(len(cap))
    gpu = np.where(n >= cfg.min_workers, n * step_s, math.inf)[None, :]
    short = gpu + violation_gpus * j.spec.priority * step_s
    need = np.argmax(stay_ok, axis=1)
    return _Stages(np.where(stay_ok, gpu, short), np.where(move_ok, gpu, short), stay_ok, move_ok, need,
                   cfg.min_workers, cfg.limits.upper, j.spec.priority, cfg.rescale_downtime_s,
                   min(max(j.initial, cfg.min_workers), cfg.limits.upper))


def _schedule(s: _Stages, caps: np.ndarray) -> np.ndarray:
    """The cheapest count per step under per-step caps: the forward dynamic program of
    :func:`~kale_airflow.core.planning.offline_schedule`, returning the path."""
    steps, counts = s.stay.shape
    n = np.arange(counts)
    value = np.full(counts, math.inf)
    value[s.initial] = 0.0
    back = np.empty((steps, counts), dtype=np.int16)
    for t in range(steps):
        moved, src = cheapest_moves(value, s.downtime_s)
        moved = moved + s.move[t]
        stayed = value + s.stay[t]
        take = moved < stayed
        back[t] = np.where(take, src, -1)
        value = np.where(n <= caps[t], np.where(take, moved, stayed), math.inf)
    path = np.empty(steps, dtype=np.int64)
    state = int(np.argmin(value))
    for t in range(steps - 1, -1, -1):
        path[t] = state
        k = back[t, state]
        state = int(k) if k >= 0 else state
    return path


def _evaluate(s: _Stages, path: np.ndarray, step_s: float) -> dict:
    """GPU-seconds, violated steps and rescales of a schedule."""
    prev = np.concatenate([[s.initial], path[:-1]])
    moved = path != prev
    steps = np.arange(len(path))
    ok = np.where(moved, s.move_ok[steps, path], s.stay_ok[steps, path])
    gpu = float(path.sum() * step_s + (np.maximum(prev - path, 0) * moved).sum() * s.downtime_s)
    return {"gpu_hours": gpu / 3600.0, "slo_violation_s": float((~ok).sum() * step_s),
            "weighted_slo_violation_s": float(s.priority * (~ok).sum() * step_s), "rescales": int(moved.sum())}


def _lower_bound(st: list[_Stages], budget: int, step_s: float) -> tuple[float, np.ndarray]:
    """Free rescales: per step, the fewest priority-weighted violated seconds the budget
    allows (a job kept up runs its need, a violated one its floor: an exact knapsack per
    congested step). Returns the bound and, per job and step, who is violated in it."""
    need = np.stack([s.need for s in st])
    floors = np.array([s.floor for s in st])[:, None]
    need = np.maximum(need, floors)
    losers = np.zeros(need.shape, dtype=bool)
    spare = budget - int(floors.sum())
    for t in np.flatnonzero(need.sum(axis=0) > budget):
        costs = []
        for i, s in enumerate(st):
            span = int(need[i, t] - s.floor)
            c = np.full(span + 1, s.priority * step_s)
            c[span] = 0.0
            costs.append(c + 1e-9 * np.arange(span + 1))
        x = best_split(costs, spare)
        losers[:, t] = [xi < need[i, t] - st[i].floor for i, xi in enumerate(x)]
    weights = np.array([s.priority for s in st])[:, None]
    return float((losers * weights).sum() * step_s), losers


def _tighten(st: list[_Stages], paths: list[np.ndarray], caps: np.ndarray, budget: int) -> set[int]:
    """Caps that take an over-budget step back within the budget: first the counts above a
    job's need (lowest priority first), then below it. Returns the jobs whose caps changed."""
    use = np.stack(paths)
    changed = set()
    for t in np.flatnonzero(use.sum(axis=0) > budget):
        excess = int(use[:, t].sum() - budget)
        order = sorted(range(len(st)), key=lambda i: (st[i].priority, -use[i, t]))
        for keep_need in (True, False):
            for i in order:
                low = max(st[i].need[t], st[i].floor) if keep_need else st[i].floor
                cut = min(excess, max(0, int(use[i, t] - low)))
                if cut:
                    caps[i, t] = use[i, t] - cut
                    use[i, t] -= cut
                    excess -= cut
                    changed.add(i)
    return changed


def fleet_offline(jobs: list[_Job], spec: FleetSpec, step_s: float = 300.0, rounds: int = 12) -> dict:
    """The fleet's offline references, with the true arrivals and curves, per 5-minute step.

    A joint dynamic program over every job's count is ``counts ** jobs`` states per step, too
    many; and a single price on GPU-seconds cannot make the per-job offline optima fit a
    budget that binds only at a few steps (with the SLO hard, every job already runs its
    fewest SLO-holding workers: a price moves nothing). So the optimum is bracketed:

    - ``lower_bound``: free rescales, per step the fewest priority-weighted violated seconds
      the budget allows (an exact knapsack per congested step);
    - a feasible schedule (``gpu_hours``, ``weighted_slo_violation_s``, per job): every job's
      offline dynamic program, rescale pauses and all, where a step that cannot keep up is
      allowed at ``OFFLINE_VIOLATION_GPUS x budget x priority`` GPU-seconds per second (so
      violation time comes first, GPU-hours second), under per-step caps: the bound's
      violated jobs are capped at their floor where the bound violates them, then caps
      tighten where the schedules still exceed the budget, until they fit.

    A violated step is counted whole and its backlog is not carried: the references are
    optimistic, and a policy carrying backlog within the SLO can beat them."""
    per = max(1, int(round(step_s / spec.tick_s)))
    step_s = per * spec.tick_s
    steps = -(-len(jobs[0].workload.arrivals) // per)
    st = [_stages(j, steps, step_s, OFFLINE_VIOLATION_GPUS * spec.gpus) for j in jobs]
    bound, losers = _lower_bound(st, spec.gpus, step_s)
    caps = np.stack([np.where(losers[i], s.floor, s.upper) for i, s in enumerate(st)])
    paths = [_schedule(s, caps[i]) for i, s in enumerate(st)]
    for _ in range(rounds):
        changed = _tighten(st, paths, caps, spec.gpus)
        if not changed:
            break
        for i in changed:
            paths[i] = _schedule(st[i], caps[i])
    use = np.stack(paths).sum(axis=0)
    per_job = {j.spec.name: _evaluate(s, p, step_s) for j, s, p in zip(jobs, st, paths)}
    return {"step_s": step_s, "lower_bound_weighted_slo_violation_s": bound,
            "gpu_hours": sum(m["gpu_hours"] for m in per_job.values()),
            "weighted_slo_violation_s": sum(m["weighted_slo_violation_s"] for m in per_job.values()),
            "slo_violation_s": sum(m["slo_violation_s"] for m in per_job.values()),
            "max_gpus_in_use": int(use.max()), "fits_budget": bool(use.max() <= spec.gpus), "jobs": per_job}


# ---------------------------------------------------------------- one run, every policy
@dataclass
class FleetResult:
    """Every fleet policy's run on one fleet, plus the offline references."""

    spec: FleetSpec
    runs: dict[str, FleetRun]
    ticks: int
    starts: dict[str, float]
    offline: dict = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        """The JSON document of ``kale simulate --fleet --json``."""
        import pandas as pd

        spec = self.spec
        return {
            "gpus": spec.gpus,
            "violation_gpus": spec.violation_gpus,
            "jobs": [{"name": j.name, "trace": j.trace, "priority": j.priority, "min_workers": j.min_workers,
                      "max_workers": j.max_workers, "slo_s": j.slo_s, "cluster": j.cluster, "forecaster": j.forecaster,
                      "evaluation_start": pd.Timestamp(self.starts[j.name], unit="s").isoformat(),
                      "schedule_overrides": [o.describe() for o in j.overrides], "pins": len(j.pins)}
                     for j in spec.jobs],
            "evaluation": {"ticks": self.ticks, "tick_s": spec.tick_s, "days": self.ticks * spec.tick_s / 86400,
                           "history_days": spec.history_days, "alignment": "by tick index from each job's "
                           "evaluation start; the common length"},
            "policies": {name: {"total": run.total, "jobs": run.jobs} for name, run in self.runs.items()},
            "offline": self.offline,
            "wall_s": self.wall_s,
        }


def _run_one(name: str, jobs: list[_Job], spec: FleetSpec) -> FleetRun:
    return run_fleet_policy(name, jobs, spec)


def simulate_fleet(spec: FleetSpec, traces: dict[str, Trace], policies=FLEET_POLICIES, offline: bool = True,
                   jobs: int = 1, progress: bool = False) -> FleetResult:
    """Replay the fleet through every policy in ``policies`` (names of ``FLEET_POLICIES``),
    ``jobs`` of them at a time in forked processes (the same results), and add the offline
    references (``offline``). ``traces`` maps job names to their traces."""
    started = time.perf_counter()
    missing = [j.name for j in spec.jobs if j.name not in traces]
    if missing:
        raise SimulationError(f"no trace given for job(s) {missing}")
    unknown = [p for p in policies if p not in _RULES]
    if unknown:
        raise SimulationError(f"unknown fleet policy {unknown}; choose from {', '.join(FLEET_POLICIES)}")
    prepared = prepare(spec, traces)
    ticks = len(prepared[0].workload.arrivals)
    if jobs <= 1 or len(policies) <= 1:
        bar = None
        if progress:
            from tqdm import tqdm  # progress bars are a UI concern; tqdm does no I/O beyond stderr

            bar = tqdm(total=ticks * len(policies), unit="tick", unit_scale=True, desc="fleet")
        runs = {p: run_fleet_policy(p, prepared, spec, bar) for p in policies}
        if bar is not None:
            bar.close()
    else:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(min(jobs, len(policies)), mp_context=get_context("fork")) as pool:
            futures = {p: pool.submit(_run_one, p, prepared, spec) for p in policies}
            runs = {p: futures[p].result() for p in policies}
    ref = fleet_offline(prepared, spec) if offline else {}
    return FleetResult(spec, runs, ticks, {j.spec.name: j.workload.start_s for j in prepared}, ref,
                       time.perf_counter() - started)


def fleet_table(doc: dict) -> str:
    """The table ``kale simulate --fleet`` prints: per policy its totals, then per job."""
    head = (f"{'policy':<14} {'job':<26} {'prio':>4} {'acc. lag (sample*s)':>20} {'SLO viol.':>9} {'viol. s':>9} "
            f"{'weighted s':>10} {'GPU-h':>8} {'rescales':>8} {'held back':>9}")
    lines = [head, "-" * len(head)]
    for name, run in doc["policies"].items():
        t = run["total"]
        lines.append(f"{name:<14} {'(fleet)':<26} {'':>4} {t['accumulated_lag']:>20.4g} {t['slo_violation_rate']:>9.2%} "
                     f"{t['slo_violation_s']:>9.0f} {t['weighted_slo_violation_s']:>10.0f} {t['gpu_hours']:>8.0f} "
                     f"{t['rescales']:>8d} {t['held_back_ticks']:>9d}")
        for job, m in run["jobs"].items():
            lines.append(f"{'':<14} {job[:26]:<26} {m['priority']:>4g} {m['accumulated_lag']:>20.4g} "
                         f"{m['slo_violation_rate']:>9.2%} {m['slo_violation_s']:>9.0f} "
                         f"{m['weighted_slo_violation_s']:>10.0f} {m['gpu_hours']:>8.0f} {m['rescales']:>8d} "
                         f"{m['held_back_ticks']:>9d}")
    lines.append("")
    for name, run in doc["policies"].items():
        t = run["total"]
        exceeded = "n/a (no budget)" if t["budget_exceeded_ticks"] is None else f"{t['budget_exceeded_ticks']} ticks"
        lines.append(f"{name:<14} budget {doc['gpus']} GPUs: utilisation {t['budget_utilisation']:.1%}, peak in use "
                     f"{t['max_gpus_in_use']}, exceeded {exceeded}, below a floor {t['below_floor_ticks']} ticks")
    off = doc.get("offline") or {}
    if off:
        lines.append(f"offline references ({off['step_s']:g}s steps, true arrivals and curves): a schedule within the "
                     f"budget ({'fits' if off['fits_budget'] else 'DOES NOT FIT'}, peak {off['max_gpus_in_use']}) "
                     f"with {off['weighted_slo_violation_s']:.0f} weighted violation s and {off['gpu_hours']:.0f} "
                     f"GPU-h; with free rescales no split has fewer than "
                     f"{off['lower_bound_weighted_slo_violation_s']:.0f} weighted violation s")
    return "\n".join(lines)
