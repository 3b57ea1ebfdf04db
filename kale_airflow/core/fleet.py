"""Many jobs, one GPU budget: the arbiter, calendar overrides and manual pins.

Each job's policy decides on its own (Kale: its plan). When the counts they ask for
together exceed the budget, the budget is shared in three stages, one function each:

1. **Bounds** (:func:`bounds_at`): a job's limits, narrowed by the calendar windows open
   now (:class:`Override`: a floor for a known busy period, a cap that leaves GPUs to
   others) and by a manual pin (:class:`Pin`: exactly N workers until T).
2. **Targets**: the count each job gets, never below its floor and never past what it
   asks for. :func:`arbitrate` minimises the jobs' priority-weighted costs: each job's
   plan prices every count over its horizon in GPU-seconds with its lag priced in
   (``Plan.cost``), and every count also pays the SLO-violation time it risks
   (:func:`violation_risk`) at ``violation_gpus`` GPU-seconds per second; no count is
   priced below the job's ask, so a job loses workers only to another job that values
   them more. The costs are not convex (staying pays no rescale pause, every other count
   does), so the split is an exact dynamic program over jobs x spare GPUs
   (:func:`best_split`), not a greedy on marginal costs. :func:`first_come` is the
   baseline: jobs in a fixed order take what they ask for until the budget is used.
3. **Admission** (:func:`admit`): a scale-down holds its old GPUs through its rescale
   pause, so a scale-up starts only when the GPUs it needs are free, whole (a partial
   start would pay a second pause once the rest frees), and waits otherwise.

:func:`allocate` runs stages 2 and 3 and says, for every job held back, who holds the
GPUs and why (``Reason.HOLD_BUDGET``). Everything here is pure: time comes in as epoch
seconds (UTC) and nothing is read or written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from croniter import croniter  # pure date arithmetic; apache-airflow-core requires it
from numpy.lib.stride_tricks import sliding_window_view

from kale_airflow.core.policies.base import Decision, Limits, Reason, duration

VIOLATION_GPUS = 256.0  # GPU-seconds a second of risked SLO violation costs (benchmarks/fleet.py chose it)
RULES = ("arbiter", "fcfs")


@dataclass(frozen=True)
class JobDemand:
    """What one job asks of the budget at a decision.

    - ``want``: the count its policy asks for now (its own holds applied);
    - ``current``: the count running; ``held``: GPUs it holds now (more than ``current``
      while a scale-down pauses; None: ``current``); ``locked``: a rescale is in progress,
      its count cannot change now;
    - ``min_workers``, ``max_workers``: its bounds now (overrides and pins applied);
    - ``cost``: per count (index = workers), the plan's cost over its horizon (GPU-seconds
      plus priced lag; inf where a count is not allowed). None: every worker short of
      ``want`` costs one GPU-hour (a job without a plan);
    - ``risk_s``: per count, the seconds of SLO violation it risks over the plan's horizon
      (:func:`violation_risk`), or ``slo_ok`` alone: the counts whose plan breaks the SLO
      risk the whole ``horizon_s``; neither: no risk priced.
    """

    name: str
    want: int
    current: int
    min_workers: int = 1
    max_workers: int = 64
    priority: float = 1.0
    cost: np.ndarray | None = None
    risk_s: np.ndarray | None = None
    slo_ok: np.ndarray | None = None
    horizon_s: float = 3600.0
    held: int | None = None
    locked: bool = False

    def __post_init__(self) -> None:
        if not self.priority > 0:
            raise ValueError(f"job {self.name}: priority must be > 0, got {self.priority}")
        if self.min_workers < 0 or self.max_workers < self.min_workers:
            raise ValueError(f"job {self.name}: max_workers ({self.max_workers}) is below min_workers "
                             f"({self.min_workers}); raise max_workers")
        if self.current < 0 or self.want < 0 or (self.held is not None and self.held < self.current):
            raise ValueError(f"job {self.name}: counts must be >= 0 and held >= current")

    @property
    def gpus(self) -> int:
        """GPUs the job holds now."""
        return self.current if self.held is None else self.held

    def to_dict(self) -> dict:
        """JSON-friendly form (infinite costs as null), for the control plane where the jobs of
        a fleet read each other's demands."""
        def arr(a):
            return None if a is None else [None if not np.isfinite(v) else float(v) for v in np.asarray(a, float)]

        return {"name": self.name, "want": self.want, "current": self.current, "min_workers": self.min_workers,
                "max_workers": self.max_workers, "priority": self.priority, "cost": arr(self.cost),
                "risk_s": arr(self.risk_s), "slo_ok": None if self.slo_ok is None else [bool(v) for v in self.slo_ok],
                "horizon_s": self.horizon_s, "held": self.held, "locked": self.locked}

    @classmethod
    def from_dict(cls, doc: dict) -> "JobDemand":
        """Inverse of :meth:`to_dict`."""
        def arr(a, fill):
            return None if a is None else np.asarray([fill if v is None else v for v in a], dtype=float)

        slo_ok = doc.get("slo_ok")
        return cls(doc["name"], int(doc["want"]), int(doc["current"]), int(doc["min_workers"]),
                   int(doc["max_workers"]), float(doc["priority"]), arr(doc.get("cost"), math.inf),
                   arr(doc.get("risk_s"), math.inf), None if slo_ok is None else np.asarray(slo_ok, dtype=bool),
                   float(doc.get("horizon_s", 3600.0)), doc.get("held"), bool(doc.get("locked")))

    def idle(self) -> "JobDemand":
        """The demand of a job whose autoscaler stopped asking: it keeps what it runs, and
        nothing it does not run is priced for it."""
        n = self.current
        return JobDemand(self.name, n, n, min(self.min_workers, n), max(n, self.min_workers), self.priority,
                         held=self.held, locked=True)

    @classmethod
    def from_plan(cls, name: str, plan, want: int, current: int, *, capacity, freshness_s: float, slo_s: float,
                  downtime_s: float, horizon_s: float, arrival_rate: float | None = None, backlog: float = 0.0,
                  **kwargs) -> "JobDemand":
        """A Kale job's demand from its :class:`~kale_airflow.core.policies.kale.Plan`, the
        capacity table it plans with, and what is measured now: the backlog, the age of its
        oldest unprocessed sample and the arrival rate. The risk is priced at the higher of the
        plan's first-step rate and the measured one: a burst the forecast has not caught up
        with yet is never a reason to take a job's workers."""
        rate = max(plan.rate, arrival_rate or 0.0)
        risk = violation_risk(np.asarray(capacity)[: len(plan.cost)], rate, freshness_s, current,
                              slo_s, downtime_s, horizon_s, backlog)
        return cls(name, want, current, cost=plan.cost, risk_s=risk, slo_ok=plan.slo_ok, horizon_s=horizon_s,
                   **kwargs)


@dataclass(frozen=True)
class Allocation:
    """The budget's answer for one job: the count to run now (``workers``), the count it is
    given (``target``: ``workers`` reaches it once GPUs being released are free), whether
    it gets less than it asked for (``held_back``, reason ``HOLD_BUDGET``; None otherwise:
    the job's own reason stands), a sentence naming who holds the GPUs and why, and the
    holders as ``(job, GPUs)``, largest first."""

    workers: int
    target: int
    want: int
    held_back: bool
    reason: Reason | None
    message: str
    holders: tuple[tuple[str, int], ...] = ()

    def to_dict(self) -> dict:
        """JSON-friendly form for logs, XCom and the UI."""
        return {"workers": self.workers, "target": self.target, "want": self.want, "held_back": self.held_back,
                "reason": self.reason.value if self.reason else None, "message": self.message,
                "holders": [list(h) for h in self.holders]}


def check_floors(floors: dict[str, int], budget: int) -> None:
    """Refuse a budget below the sum of the jobs' floors (``ValueError`` naming them): no
    split could keep every job at its ``min_workers``."""
    total = sum(floors.values())
    if budget < 0 or total > budget:
        listed = ", ".join(f"{name} {n}" for name, n in floors.items())
        raise ValueError(f"the fleet's floors need {total} GPUs ({listed}) but the budget is {budget}: raise gpus "
                         f"to at least {total} or lower the jobs' min_workers")


# ---------------------------------------------------------------- stage 2: targets
def _range(d: JobDemand) -> tuple[int, int]:
    """The counts a job may be given: its current one while it rescales, otherwise from its
    floor up to what it asks for (within its cap)."""
    if d.locked:
        return d.current, d.current
    return d.min_workers, max(d.min_workers, min(d.want, d.max_workers))


def violation_risk(capacity: np.ndarray, rate: float, freshness_s: float, current: int, slo_s: float,
                   downtime_s: float, horizon_s: float, backlog: float = 0.0) -> np.ndarray:
    """Seconds of SLO violation each count (index = workers) risks over ``horizon_s`` if it
    ran from now, with ``backlog`` samples queued, the oldest ``freshness_s`` old, arriving
    at ``rate`` samples/s. A rescale pauses training (every count but ``current`` pays
    ``downtime_s``): the oldest sample ages one second per second and the queue grows.
    Then, first in, first out, the queue is served at ``c``: it arrived over the oldest
    sample's age, at ``queue / age`` samples/s on average, so the oldest sample ages
    ``1 - c / (queue / age)`` seconds per second until the queue is drained (never, where
    ``c`` is below the rate). Its time above ``slo_s`` is the risk: a count a little short
    risks nothing for a long while, a count far short almost the whole horizon, so the
    arbiter can spread a shortage where it hurts least."""
    c = np.asarray(capacity, dtype=float)
    n = np.arange(len(c))
    pause = np.where(n != current, min(downtime_s, horizon_s), 0.0)
    age = freshness_s + pause                       # the oldest sample's age when training resumes
    over_pause = np.maximum(age - max(slo_s, freshness_s), 0.0)  # at most the pause: age - freshness_s
    queue = backlog + rate * pause
    served = np.full(len(c), float(rate))            # the rate the queue arrived at
    np.divide(queue, age, out=served, where=(queue > 0) & (age > 0))
    slope = np.ones(len(c))
    np.divide(c, served, out=slope, where=served > 0)
    slope = 1.0 - np.where(served > 0, slope, np.inf)
    spare = c - rate
    drained = np.full(len(c), math.inf)
    np.divide(queue, spare, out=drained, where=spare > 0)
    # Nothing queued (the current count, no backlog): the next sample to arrive is the oldest,
    # aged 0, and a count short of the rate queues from now on.
    start = np.where(queue > 0, age, 0.0)
    return over_pause + _time_above(start, slope, np.minimum(drained, horizon_s - pause), slo_s)


def _time_above(age: np.ndarray, slope: np.ndarray, span: np.ndarray, slo_s: float) -> np.ndarray:
    """Seconds within ``[0, span]`` that ``age + slope * t`` spends above ``slo_s``."""
    out = np.where(age > slo_s, span, 0.0)           # a flat age
    grow, fall = slope > 1e-12, slope < -1e-12
    cross = np.zeros(len(age))
    np.divide(slo_s - age, slope, out=cross, where=grow | fall)
    out = np.where(grow, np.clip(span - np.maximum(cross, 0.0), 0.0, None), out)
    return np.where(fall, np.clip(np.minimum(cross, span), 0.0, None), out)


def _slice(values, lo: int, hi: int, fill: float = math.inf) -> np.ndarray:
    """``values[lo..hi]`` as floats, ``fill`` past the end."""
    a = np.asarray(values, dtype=float)[lo: hi + 1]
    return np.concatenate([a, np.full(hi - lo + 1 - len(a), fill)])


def _risk(d: JobDemand, lo: int, hi: int) -> np.ndarray:
    """The demand's risked violation seconds of counts ``lo..hi`` (see :class:`JobDemand`)."""
    if d.risk_s is not None:
        return _slice(d.risk_s, lo, hi, d.horizon_s)
    if d.slo_ok is not None:
        return np.where(_slice(d.slo_ok, lo, hi, 0.0) > 0, 0.0, d.horizon_s)
    return np.zeros(hi - lo + 1)


def weighted_costs(d: JobDemand, lo: int, hi: int, violation_gpus: float = VIOLATION_GPUS) -> np.ndarray:
    """Priority x (plan cost + ``violation_gpus`` x risked violation seconds) of counts
    ``lo..hi`` (``hi``: what the job asks for). No count is priced below the ask: the
    arbiter takes GPUs from a job only to give them to another, never to overrule the job's
    own decision (its persistence, its holds). Counts the plan rules out (inf) rank after
    every allowed one, more workers first."""
    counts = np.arange(lo, hi + 1)
    base = (hi - counts) * 3600.0 if d.cost is None else _slice(d.cost, lo, hi)
    w = d.priority * (base + violation_gpus * _risk(d, lo, hi))
    finite = np.isfinite(w)
    if not finite.all():
        top = float(np.abs(w[finite]).max()) if finite.any() else 0.0
        w = np.where(finite, w, (top + 1.0) * 1e6 + (hi - counts))
    return np.maximum(w, w[-1])


def best_split(costs: list[np.ndarray], spare: int) -> list[int]:
    """Exact: the extra workers ``x_i`` (``0 <= x_i < len(costs[i])``, together at most
    ``spare``) minimising ``sum costs[i][x_i]``. A dynamic program over jobs x spare GPUs,
    ``O(jobs x spare x counts)`` in numpy. On equal totals an earlier job gets the worker
    (the last job takes the fewest that reach the minimum), and a worker is never left
    idle where it lowers a cost."""
    f = np.zeros(spare + 1)  # f[r]: the cheapest cost of the jobs so far with at most r extra workers
    backs = []
    for c in costs:
        k = min(len(c) - 1, spare)
        # window[q, x] = f[spare - q - x] (inf below 0): reversed rows give f[r - x] at [r, x]
        window = sliding_window_view(np.concatenate([f[::-1], np.full(k, math.inf)]), k + 1)[::-1]
        m = window + c[None, : k + 1]
        arg = np.argmin(m, axis=1)  # the first minimum: the smallest x on ties, the earlier jobs keep the worker
        f = np.take_along_axis(m, arg[:, None], axis=1)[:, 0]
        backs.append(arg)
    out, left = [], spare
    for arg in reversed(backs):
        out.append(int(arg[left]))
        left -= out[-1]
    return out[::-1]


def arbitrate(demands: list[JobDemand], budget: int, violation_gpus: float = VIOLATION_GPUS) -> list[int]:
    """Targets minimising the priority-weighted costs under the budget (everyone gets what
    it asks for when that fits)."""
    return _arbitrate(demands, budget, violation_gpus)[0]


def _arbitrate(demands: list[JobDemand], budget: int, violation_gpus: float) -> tuple[list[int], list | None]:
    """:func:`arbitrate`'s targets and the weighted costs it split (None when all fit)."""
    ranges = [_range(d) for d in demands]
    if sum(hi for _, hi in ranges) <= budget:
        return [hi for _, hi in ranges], None
    spare = max(0, budget - sum(lo for lo, _ in ranges))
    costs = [weighted_costs(d, lo, hi, violation_gpus) for d, (lo, hi) in zip(demands, ranges)]
    # A tiny reward per worker: of two splits with equal costs, the one using more GPUs.
    scale = 1e-9 * max(1.0, max(float(np.abs(c).max()) for c in costs))
    split = best_split([c - scale * np.arange(len(c)) for c in costs], spare)
    return [lo + x for (lo, _), x in zip(ranges, split)], costs


def _order(demands: list[JobDemand]) -> list[int]:
    """Higher priority first, then the order the jobs are listed in."""
    return sorted(range(len(demands)), key=lambda i: (-demands[i].priority, i))


def first_come(demands: list[JobDemand], budget: int) -> list[int]:
    """The first-come-first-served baseline: in a fixed order (:func:`_order`) each job takes
    what it asks for while the budget, less the later jobs' floors, lasts."""
    ranges = [_range(d) for d in demands]
    targets = [lo for lo, _ in ranges]
    spare = budget - sum(targets)
    for i in _order(demands):
        extra = max(0, min(ranges[i][1] - ranges[i][0], spare))
        targets[i] += extra
        spare -= extra
    return targets


# ---------------------------------------------------------------- stage 3: admission
def admit(demands: list[JobDemand], targets: list[int], budget: int) -> list[int]:
    """The counts that start now: scale-downs and holds at once (a scale-down keeps its old
    GPUs through its pause), scale-ups in :func:`_order` while the GPUs free now cover them,
    whole; the others keep their count and wait, except that a job below its floor takes the
    GPUs free now towards its target (its floor is owed before a second pause is saved)."""
    free = budget - sum(d.gpus for d in demands)
    now = [min(t, d.current) for d, t in zip(demands, targets)]
    for i in _order(demands):
        d = demands[i]
        extra = targets[i] - d.gpus
        if targets[i] > d.current and extra <= free:
            now[i] = targets[i]
            free -= max(0, extra)
        elif d.current < d.min_workers and free > 0 and not d.locked:  # below its floor: what is free, now
            now[i] = min(targets[i], d.current + free)
            free -= max(0, now[i] - d.gpus)
    return now


# ---------------------------------------------------------------- both, with the why
def allocate(demands: list[JobDemand], budget: int, *, rule: str = "arbiter",
             violation_gpus: float = VIOLATION_GPUS) -> dict[str, Allocation]:
    """Share ``budget`` GPUs among the jobs' demands by ``rule`` (``arbiter``: the
    priority-weighted cost split; ``fcfs``: the fixed-order baseline), then admit what can
    start now. Raises ``ValueError`` when the floors alone exceed the budget."""
    names = [d.name for d in demands]
    if len(set(names)) != len(names):
        raise ValueError(f"job names must be unique, got {names}")
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; choose from {', '.join(RULES)}")
    check_floors({d.name: d.min_workers for d in demands}, budget)
    targets, costs = (_arbitrate(demands, budget, violation_gpus) if rule == "arbiter"
                      else (first_come(demands, budget), None))
    now = admit(demands, targets, budget)
    use = [max(d.gpus, n) for d, n in zip(demands, now)]  # what each holds now (a pause keeps its old GPUs)
    ranked = sorted(((d.name, u) for d, u in zip(demands, use) if u > 0), key=lambda h: (-h[1], h[0]))
    out = {}
    for i, d in enumerate(demands):
        want = max(d.min_workers, min(d.want, d.max_workers))
        if d.locked or now[i] >= want:
            out[d.name] = Allocation(now[i], targets[i], want, False, None, "")
            continue
        holders = tuple(h for h in ranked if h[0] != d.name)
        why = _why(i, demands, targets, now, costs[i] if costs else None)
        held = ", ".join(f"{name} {n}" for name, n in holders) or "nobody"
        out[d.name] = Allocation(now[i], targets[i], want, True, Reason.HOLD_BUDGET,
                                 f"{why} (budget {budget} GPUs: {held})", holders)
    return out


def _why(i: int, demands: list[JobDemand], targets: list[int], now: list[int], costs) -> str:
    """Why job i runs fewer workers than it asks for, in the rule's terms: the arbiter gave
    the GPUs where they save more, the first-come order gave them to earlier jobs, or its
    scale-up waits for GPUs that others are releasing (their targets are below what they hold)."""
    d, target, workers = demands[i], targets[i], now[i]
    lo, hi = _range(d)
    if workers < target:
        releasing = [e.name for e, t in zip(demands, targets) if e is not d and t < e.gpus]
        return (f"{d.name} waits at {workers} for the {target - max(workers, d.gpus)} GPUs its scale-up to {target} "
                f"needs, being released by {', '.join(releasing)}")
    head = f"{d.name} gets {target} of the {hi} workers it asks for"
    if costs is None:  # the first-come rule (the arbiter splits costs whenever a job is held back)
        return f"{head}: jobs before it in the first-come order took the rest"
    gain = (costs[target - lo] - costs[hi - lo]) / 3600.0
    return (f"{head}: the {hi - target} more would save it {gain:.2f} GPU-h (priority {d.priority:g} x its plan's "
            f"cost and risked SLO time), less than they save where they are")


# ---------------------------------------------------------------- stage 1: bounds
def epoch_of(value) -> float:
    """Epoch seconds of a date, date-time or number (naive values are UTC)."""
    if isinstance(value, (int, float)):
        return float(value)
    return pd.Timestamp(value).value / 1e9  # the UTC epoch of an aware value, a naive one read as UTC


def seconds_of(value) -> float:
    """Seconds of a duration: a number, or text such as ``8h`` or ``90min``."""
    if isinstance(value, (int, float)):
        return float(value)
    return pd.Timedelta(str(value)).total_seconds()


def _stamp(epoch_s: float) -> str:
    return pd.Timestamp(epoch_s, unit="s").strftime("%Y-%m-%d %H:%M")


@dataclass(frozen=True)
class Override:
    """A calendar window that bounds a job's workers: a floor (``min_workers``) for a known
    busy period, a cap (``max_workers``) that leaves GPUs to other jobs. Either ``cron``
    with ``duration_s`` (a window opens at every cron time, UTC, and lasts that long) or
    ``start_s`` and ``end_s`` (one dated window, end excluded)."""

    min_workers: int | None = None
    max_workers: int | None = None
    cron: str | None = None
    duration_s: float | None = None
    start_s: float | None = None
    end_s: float | None = None
    name: str = ""

    def __post_init__(self) -> None:
        what = f"schedule override {self.name or self.cron or ''}".rstrip()
        if self.min_workers is None and self.max_workers is None:
            raise ValueError(f"{what}: give min_workers, max_workers or both")
        if self.min_workers is not None and self.max_workers is not None and self.max_workers < self.min_workers:
            raise ValueError(f"{what}: max_workers ({self.max_workers}) is below min_workers ({self.min_workers})")
        if (self.cron is None) == (self.start_s is None):
            raise ValueError(f"{what}: give either cron (with duration) or start and end")
        if self.cron is not None and (not croniter.is_valid(self.cron) or not (self.duration_s or 0) > 0):
            raise ValueError(f"{what}: cron {self.cron!r} needs five valid fields and a positive duration, e.g. "
                       "cron: '0 8 * * 1-5' with duration: 10h")
        if self.start_s is not None and not (self.end_s is not None and self.end_s > self.start_s):
            raise ValueError(f"{what}: end must come after start")

    @classmethod
    def from_dict(cls, doc: dict) -> "Override":
        """From a config mapping: ``cron`` + ``duration`` (``10h``) or ``start`` + ``end``
        (dates or date-times, UTC), ``min_workers``, ``max_workers``, ``name``."""
        unknown = set(doc) - {"cron", "duration", "start", "end", "min_workers", "max_workers", "name"}
        if unknown:
            raise ValueError(f"schedule override: unknown key(s) {sorted(unknown)}")
        get = doc.get
        return cls(get("min_workers"), get("max_workers"), get("cron"),
                   seconds_of(get("duration")) if get("duration") is not None else None,
                   epoch_of(get("start")) if get("start") is not None else None,
                   epoch_of(get("end")) if get("end") is not None else None, str(get("name", "")))

    def window(self, now_s: float) -> tuple[bool, float]:
        """``(open, until)``: whether the window is open at ``now_s``, and when that may change."""
        if self.cron is None:
            if now_s < self.start_s:
                return False, self.start_s
            return (True, self.end_s) if now_s < self.end_s else (False, math.inf)
        it = croniter(self.cron, now_s + 1.0)
        last = it.get_prev(float)
        if last > now_s:
            last = it.get_prev(float)
        if now_s < last + self.duration_s:
            return True, last + self.duration_s
        return False, croniter(self.cron, now_s).get_next(float)

    def describe(self) -> str:
        """The window in words, for decision messages."""
        bounds = ", ".join(f"{k} {v}" for k, v in (("min", self.min_workers), ("max", self.max_workers))
                           if v is not None)
        when = (f"cron '{self.cron}' for {duration(self.duration_s)}" if self.cron is not None
                else f"{_stamp(self.start_s)} to {_stamp(self.end_s)}")
        return f"{self.name + ': ' if self.name else ''}{when} ({bounds})"


@dataclass(frozen=True)
class Pin:
    """A manual pin: exactly ``workers`` until ``until_s`` (epoch seconds), whatever the
    policy or the windows say (the budget's floors still apply: a pin is a floor too)."""

    workers: int
    until_s: float
    note: str = ""

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"a pin needs workers >= 0, got {self.workers}")

    @classmethod
    def from_dict(cls, doc: dict) -> "Pin":
        """From a config mapping: ``workers``, ``until`` (a date-time, UTC), ``note``."""
        return cls(int(doc["workers"]), epoch_of(doc["until"]), str(doc.get("note", "")))


@dataclass(frozen=True)
class Bounds:
    """A job's worker bounds at a moment: ``reason`` ``OVERRIDE`` when a window or a pin set
    them (None: the job's own limits), a sentence saying which, and ``until_s``: they hold
    until then (the next window edge or pin expiry)."""

    min_workers: int
    max_workers: int
    reason: Reason | None = None
    message: str = ""
    until_s: float = math.inf

    def clamp(self, n: int) -> int:
        """``n`` within the bounds."""
        return min(max(n, self.min_workers), self.max_workers)


def bounds_at(limits: Limits, now_s: float, overrides=(), pins=()) -> Bounds:
    """The bounds at ``now_s``: a pin that has not expired sets both (the last one listed
    wins); otherwise the open windows narrow the limits (the highest floor, the lowest cap;
    where a floor exceeds a cap the floor wins: it protects a known busy period), all within
    ``[limits.min_workers, limits.upper]``."""
    lo, hi = limits.min_workers, limits.upper
    live = [p for p in pins if now_s < p.until_s]
    if live:
        pin = live[-1]
        n = min(max(pin.workers, lo), hi)
        note = f" ({pin.note})" if pin.note else ""
        return Bounds(n, n, Reason.OVERRIDE, f"pinned to {n} workers until {_stamp(pin.until_s)}{note}", pin.until_s)
    until = min((p.until_s for p in pins if p.until_s > now_s), default=math.inf)
    floors, caps, names = [], [], []
    for o in overrides:
        is_open, edge = o.window(now_s)
        until = min(until, edge)
        if is_open:
            floors += [o.min_workers] if o.min_workers is not None else []
            caps += [o.max_workers] if o.max_workers is not None else []
            names.append(o.describe())
    if not names:
        return Bounds(lo, hi, None, "", until)
    cap = min([hi] + [min(max(c, lo), hi) for c in caps])
    floor = min(max([lo] + floors), hi)
    return Bounds(floor, max(floor, cap), Reason.OVERRIDE, f"schedule override {'; '.join(names)}", until)


def bounded(decision: Decision, bounds: Bounds) -> Decision:
    """The decision moved inside the bounds; when it had to move, reason ``OVERRIDE`` and a
    sentence naming the window or pin (the policy's own sentence kept after it)."""
    n = bounds.clamp(decision.workers)
    if n == decision.workers:
        return decision
    message = f"{bounds.message}: {n} workers instead of {decision.workers} ({decision.message})"
    return Decision(n, Reason.OVERRIDE, message, decision.details)
