"""The Kale policy: plan the cheapest schedule of worker counts, apply its first move.

Every decision solves the planning problem of :mod:`kale_airflow.core.planning` over
``horizon_s``: GPU-seconds, where a rescale holds ``max(old, new)`` GPUs for the measured
pause and loses that capacity, plus a price on accumulated lag, subject to keeping up
with the forecast quantile it plans for and to the freshness SLO. The first step starts
from what is measured (count, backlog, age of the oldest sample); the later ones follow
the forecast bins. Only the plan's first move is applied, and a change must stay the
plan's first move for ``persist_s`` first (a noise filter; a move the SLO needs now goes
at once).

The reason of every decision names the binding term: the SLO at risk, the forecast
(a count that cannot keep up), a backlog to drain, or the cost of a rescale (a smaller
count would do for a while, but the move does not pay); ``details`` carries the plan's
cost figures. The holds that are not economics stay: missing metrics never scale down,
Pending workers block scale-ups, nothing changes while a rescale is in progress, an
unavailable forecast falls back to the recent peak plus a margin, and the limits clamp.

Inputs are abstract: a :class:`~kale_airflow.core.sources.ForecastSource` (online
forecaster, or the true future for clairvoyant Kale) and a capacity source with a
``table`` (samples/s per count; see :mod:`kale_airflow.core.capacity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kale_airflow.core.planning import Prices, Spread, Start, first_step, values_to_go
from kale_airflow.core.policies.base import Decision, Limits, Observation, Reason, duration
from kale_airflow.core.sources import ForecastSource

FALLBACK_MARGIN = 0.20  # while the forecast is unavailable: plan for the recent peak plus this
MIN_RATE = 1.0          # samples/s below which the lag price stops growing (an idle stream)
MIN_WAIT_COST = 0.1     # below it the plan thrashes at the SLO's edge (KaleConfig refuses it)


@dataclass(frozen=True)
class KaleConfig:
    """Kale's settings. Four tunables, each with a plain meaning:

    - ``forecast_quantile``: the forecast quantile the plan must keep up with;
    - ``horizon_s``: how far ahead the plan looks (it must cover two restarts);
    - ``wait_cost``: workers worth one second of mean wait: the plan pays one worker over
      the horizon to cut the mean wait of the samples in it by ``1 / wait_cost`` seconds
      (at least 0.1: priced lower, the plan thrashes at the SLO's edge);
    - ``persist_s``: how long a change must stay the plan's first move before it is applied.

    The rest are inputs: ``slo_s`` (the freshness SLO), ``rescale_downtime_s`` (the pause a
    rescale costs, raised to what is measured: :func:`planned_downtime`) and ``interval_s``
    (seconds between decisions). The defaults were chosen on the first halves of the shared
    traces' evaluation windows (``benchmarks/engine.py``; docs/decisions/).
    """

    forecast_quantile: float = 0.5
    horizon_s: float = 3600.0
    wait_cost: float = 1.5
    persist_s: float = 60.0
    slo_s: float = 300.0
    rescale_downtime_s: float = 90.0
    interval_s: float = 15.0

    def __post_init__(self) -> None:
        if self.slo_s <= 0 or self.interval_s <= 0:
            raise ValueError("slo_s and interval_s must be > 0")  # pragma: no mutate
        if self.horizon_s < 2 * self.rescale_downtime_s:
            raise ValueError(
                f"horizon_s ({self.horizon_s}) must cover two restarts (2 x rescale_downtime_s = "  # pragma: no mutate
                f"{2 * self.rescale_downtime_s}): a plan shorter than that cannot price a rescale and its return"  # pragma: no mutate
            )
        if self.persist_s < 0:
            raise ValueError("persist_s must be >= 0")  # pragma: no mutate
        if self.wait_cost < MIN_WAIT_COST:
            raise ValueError(
                f"wait_cost ({self.wait_cost}) must be >= {MIN_WAIT_COST}: lag priced at almost nothing "  # pragma: no mutate
                "lets the plan hold the backlog at the SLO's edge, where every forecast wiggle is a rescale "  # pragma: no mutate
                "(at 0: several times the rescales, and more SLO violations). Set 0.25 or more (default 2.0; "  # pragma: no mutate
                "higher trades GPU-hours for less lag)"  # pragma: no mutate
            )
        if not 0 < self.forecast_quantile < 1:
            raise ValueError(f"forecast_quantile must be in (0, 1), got {self.forecast_quantile}")


def planned_downtime(configured_s: float, pauses_s: list[float], cap_s: float) -> float:
    """The rescale downtime the plan prices: the configured value, raised to the median of
    recently measured pauses when rescales take longer (a slow image pull, a long
    rendezvous), never above ``cap_s``. The configured value is a floor: a few fast restarts
    do not make the policy rescale more eagerly."""
    if not pauses_s:
        return configured_s
    return min(max(configured_s, float(np.median(pauses_s))), cap_s)


@dataclass(frozen=True)
class Plan:
    """One tick's planning result: the cheapest first move and what it was weighed against."""

    target: int
    cost: np.ndarray        # per count: GPU-seconds plus priced lag over the horizon
    slo_ok: np.ndarray      # per count: the first step holds the SLO
    freshness_s: np.ndarray
    rate: float             # samples/s the first step plans for
    peak: float             # the largest planned rate over the horizon
    source: str

    def details(self, current: int) -> dict:
        """The plan's figures every decision carries (GPU-hours; ``stay`` is the plan's cost
        if the count is kept, ``plan`` that of the move it chose)."""
        stay = self.cost[current] if current < len(self.cost) else math.inf
        return {"plan_workers": self.target, "plan_gpu_h": round(float(self.cost[self.target]) / 3600, 4),
                "stay_gpu_h": round(float(stay) / 3600, 4) if math.isfinite(stay) else None,
                "planned_rate": round(self.rate, 3), "forecast_peak": round(self.peak, 3), "source": self.source}


class KalePolicy:
    """Forecast-driven scaling by a receding-horizon plan."""

    name = "kale"

    def __init__(self, limits: Limits, forecast: ForecastSource, capacity, config: KaleConfig | None = None,
                 name: str | None = None):
        self.limits = limits
        self.config = config or KaleConfig()
        self.forecast = forecast
        self.capacity = capacity
        self.interval_s = self.config.interval_s
        if name:
            self.name = name
        self._want: tuple[int, float] | None = None  # (direction, since) of the first move wanted
        self._tail: tuple | None = None              # (key, rates, values) of the steps after the first
        self._last: tuple | None = None              # (key, plan, why) of a plan made with nothing queued

    def state_dict(self) -> dict:
        """The persistence state (and the forecast source's, when it has one), JSON-friendly,
        so a policy can be rebuilt between sensor pokes and DAG runs."""
        state = {"want": list(self._want) if self._want else None}
        if self.forecast.stateful:
            state["forecast"] = self.forecast.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        want = state.get("want")
        self._want = (int(want[0]), float(want[1])) if want else None
        if "forecast" in state and self.forecast.stateful:
            self.forecast.load_state_dict(state["forecast"])

    # ------------------------------------------------------------------ inputs
    def _table(self) -> np.ndarray:
        """Capacity per count up to the useful limit (index = workers)."""
        table = self.capacity.table
        return np.asarray(table[: self.limits.upper + 1], dtype=float)

    def _rates(self, now: float, bins: int) -> tuple[np.ndarray, str]:
        """The planned rate per bin from the bin containing ``now``; the documented fallback
        (the recent peak plus ``FALLBACK_MARGIN``, flat) while the forecast is unavailable."""
        rates, source = self.forecast.path(now, bins)
        if rates is None:
            recent = self.forecast.recent_max(now, self.config.horizon_s / 2) or 0.0
            return np.full(bins, recent * (1 + FALLBACK_MARGIN)), f"fallback ({source})"
        return np.asarray(rates, dtype=float), source

    def _values(self, key: tuple, table: np.ndarray, rates: np.ndarray, step: float, prices: Prices,
                spread: Spread | None) -> np.ndarray:
        """Values of the steps after the first, recomputed only when their inputs change
        (a new bin, a refitted table, a refreshed forecast, a new price or spread)."""
        if self._tail is not None and self._tail[0] == key and np.array_equal(self._tail[1], rates):
            return self._tail[2]
        values = values_to_go(table, rates, step, prices, spread)
        self._tail = (key, rates.copy(), values)
        return values

    # ------------------------------------------------------------------ planning
    def plan(self, obs: Observation) -> Plan:
        """Solve this tick's planning problem from the observation (no state changes but caches)."""
        cfg, now = self.config, obs.now_s
        step = self.forecast.bin_s
        bins = max(3, int(math.ceil(cfg.horizon_s / step)) + 1)
        rates, source = self._rates(now, bins)
        table = self._table()
        b = int(now // step)
        left = (b + 1) * step - now  # what is left of the bin in progress
        now_rate = max(float(rates[0]), obs.arrival_rate or 0.0)
        first_rate = (now_rate * left + float(rates[1]) * step) / (left + step)
        tail = rates[2:]
        lag_price = cfg.wait_cost / max(MIN_RATE, float(np.mean(rates)))
        prices = Prices(cfg.rescale_downtime_s, lag_price, self.limits.min_workers, cfg.slo_s)
        spread = self.forecast.spread
        values = self._values((b, id(self.capacity.table), prices, spread), table, tail, step, prices, spread)
        start = Start(obs.workers, obs.backlog or 0.0, obs.freshness_lag_s or 0.0, first_rate)
        length = (b + 2) * step - now  # the rest of this bin and the next: room for a pause
        fs = first_step(table, start, length, float(tail[0]), step * len(tail), values, prices, cfg.slo_s, spread)
        ok = fs.slo_ok & np.isfinite(fs.cost)
        if ok.any():
            target = int(np.argmin(np.where(ok, fs.cost, math.inf)))
        else:  # the SLO is broken whatever the count: recover soonest, else the most capacity, then the cheapest
            target = int(np.lexsort((fs.cost, -table, fs.recover_s))[0])
        return Plan(target, fs.cost, fs.slo_ok, fs.freshness_s, first_rate, float(rates.max()), source)

    def _planned(self, obs: Observation) -> tuple[Plan, tuple[Reason, str], dict]:
        """This tick's plan and its reason. With nothing queued, a plan stands until one of
        its inputs changes (a new bin, count, planned rate, forecast or capacity table): the
        plan is re-solved on events, not on every tick of an unchanged situation."""
        quiet = not obs.backlog and not obs.freshness_lag_s
        key = (int(obs.now_s // self.forecast.bin_s), obs.workers, obs.arrival_rate, id(self.capacity.table),
               self.config.rescale_downtime_s, self.forecast.version)
        if quiet and self._last is not None and self._last[0] == key:
            return self._last[1:]
        plan = self.plan(obs)
        why = self._reason(obs, plan)
        details = plan.details(min(obs.workers, len(plan.cost) - 1))
        self._last = (key, plan, why, details) if quiet else None
        return plan, why, details

    def decide(self, obs: Observation) -> Decision:
        """Observe, plan, and apply the plan's first move under the holds."""
        now, current = obs.now_s, obs.workers
        self.forecast.observe(now, obs.arrival_rate)
        if not obs.rescaling:
            self.capacity.observe(now, current, obs.throughput)
        if obs.rescaling:
            return Decision(current, Reason.HOLD_RESCALING, "rescale in progress; waiting for workers to restore")
        if self.capacity.table is None:
            return Decision(current, Reason.HOLD_MISSING_METRICS,
                            f"no throughput measured yet ({self.capacity.error}): holding at {current}")
        return self._apply(obs, *self._planned(obs))

    def _reason(self, obs: Observation, plan: Plan) -> tuple[Reason, str]:
        """The binding term of the plan's first move, and a sentence for humans."""
        current, target, cost = obs.workers, plan.target, plan.cost
        table = self._table()
        here = min(current, len(table) - 1)
        saved = (cost[here] - cost[target]) / 3600
        if target > current:
            if not plan.slo_ok[here]:
                return Reason.SCALE_UP_SLO_RISK, (
                    f"staying at {current} lets the oldest sample reach {plan.freshness_s[here]:.0f} s "  # pragma: no mutate
                    f"(SLO {self.config.slo_s:.0f} s): scale up now {current} -> {target}")  # pragma: no mutate
            if table[here] >= plan.rate and obs.backlog:
                return Reason.SCALE_UP_BACKLOG, (
                    f"a backlog of {obs.backlog:.0f} samples drains sooner at {target} workers; the plan "  # pragma: no mutate
                    f"saves {saved:.2f} GPU-h of cost (lag priced) over staying")  # pragma: no mutate
            return Reason.SCALE_UP_FORECAST, (
                f"{plan.source} peaks at {plan.peak:.0f} samples/s within {duration(self.config.horizon_s)}; "  # pragma: no mutate
                f"{current} workers cannot keep up: scale to {target}")  # pragma: no mutate
        if target < current:
            return Reason.SCALE_DOWN_FORECAST, (
                f"{target} workers carry {plan.source} (peak {plan.peak:.0f} samples/s) for the next "  # pragma: no mutate
                f"{duration(self.config.horizon_s)}; the move saves {saved:.2f} GPU-h over staying")  # pragma: no mutate
        smaller = np.flatnonzero(table[:here] >= plan.rate)
        smaller = smaller[smaller >= self.limits.min_workers]
        if smaller.size:  # a smaller count would keep up now: the rescale is what does not pay
            alt = int(smaller[np.argmin(cost[smaller])])
            return Reason.HOLD_NOT_WORTH_DOWNTIME, (
                f"{alt} workers would keep up now, but the rescale and its way back cost "  # pragma: no mutate
                f"{(cost[alt] - cost[here]) / 3600:.2f} GPU-h more than staying at {current}")  # pragma: no mutate
        return Reason.HOLD, f"{current} workers are the cheapest plan for {plan.source} (peak {plan.peak:.0f}/s)"

    def _apply(self, obs: Observation, plan: Plan, why: tuple[Reason, str], details: dict) -> Decision:
        """The holds that are not economics, then the persistence filter."""
        current, now = obs.workers, obs.now_s
        reason, message = why
        if self.capacity.assumption:
            message = f"{message}; {self.capacity.assumption}"
        target = self.limits.clamp(plan.target)
        if target == current:
            self._want = None
            return Decision(current, reason, message, details)
        if target < current and (obs.arrival_rate is None or obs.backlog is None):
            return Decision(current, Reason.HOLD_MISSING_METRICS,
                            "arrival rate or backlog missing: never scale down on missing data", details)
        if target > current and obs.ready_workers is not None and obs.ready_workers < current:
            return Decision(current, Reason.HOLD_PENDING,
                            f"{current - obs.ready_workers} of {current} workers are Pending for lack of capacity; "  # pragma: no mutate
                            f"holding at {current} instead of asking for {target}", details)
        direction = 1 if target > current else -1
        if self._want is None or self._want[0] != direction:
            self._want = (direction, now)
        if reason != Reason.SCALE_UP_SLO_RISK and now - self._want[1] < self.config.persist_s - 1e-9:
            return Decision(current, Reason.HOLD_STABILIZING,
                            f"{message}; waiting until the plan holds {duration(self.config.persist_s)}", details)
        self._want = None
        return Decision(target, reason, message, details)

    def first_start(self, obs: Observation) -> Decision:
        """Decision when no training generation runs (``obs.workers == 0``): the plan from
        nothing running (every count is a start, paying the pause), applied at once,
        never below ``min_workers``. The reason is always ``SCALE_UP_FORECAST``."""
        self.forecast.observe(obs.now_s, obs.arrival_rate)
        if self.capacity.table is None:
            n = self.limits.min_workers
            return Decision(n, Reason.SCALE_UP_FORECAST,
                            f"no training generation is running and no throughput is measured yet; starting {n}")
        plan = self.plan(Observation(obs.now_s, 0, obs.arrival_rate, 0.0, 0.0, None, None, False))
        n = self.limits.clamp(max(plan.target, self.limits.min_workers))
        return Decision(n, Reason.SCALE_UP_FORECAST, f"no training generation is running; starting {n} worker(s)",
                        plan.details(0))


def build_kale(limits: Limits, forecaster, observations: tuple, config: KaleConfig | None = None, *,
               history=None, bin_s: float = 300.0, model=None, pretrained: bool = False,
               refresh_every_s: float | None = None, retrain_every_s: float | None = None,
               name: str = "kale") -> KalePolicy:  # pragma: no mutate block
    """Kale as deployed, the one assembly point of the simulator, the autoscaler, ``kale
    decide --dry-run`` and shadow mode: an online forecast of the observed rates
    (``forecaster``; ``pretrained`` for a registered champion, which is only asked to
    forecast; ``history`` preloads past rates) and a capacity table refitted from the
    throughput the workers measure (``observations``: ``(workers, samples/s)`` sequences;
    ``model`` the first fit, e.g. the champion fitted on them)."""
    from kale_airflow.core.capacity import OnlineThroughput
    from kale_airflow.core.sources import OnlineForecastSource

    cfg = config or KaleConfig()
    source = OnlineForecastSource(forecaster, bin_s=bin_s, quantile=cfg.forecast_quantile,
                                  max_horizon_s=cfg.horizon_s + 2 * bin_s, refresh_every_s=refresh_every_s,
                                  retrain_every_s=retrain_every_s, pretrained=pretrained)
    if history is not None and len(history):
        source.preload(history)
    capacity = OnlineThroughput(*observations, max_workers=limits.upper, model=model)
    return KalePolicy(limits, source, capacity, cfg, name=name)
