"""Kale as a pile of rules (``kale-rules``): scale ahead of forecast traffic, stabilized
against rescale cost by hand-set exchange rates.

Kept as a named candidate beside the planner (:mod:`kale_airflow.core.policies.kale`),
which replaces these stages with one cost model.

Stages (each a small pure function, tested on its own):

1. **required capacity** - the forecast's quantile, maximised over a look-ahead that
   covers the rescale latency (``lookahead_s``, 15 min), never below the peak rate of the
   last ``recent_window_s`` (15 min: traffic the forecast missed in the last quarter hour
   may come back in the next), plus ``headroom`` (0 by default: the restart floor of
   stage 5 drains what a restart leaves);
   inverted through the conservative throughput model to workers. Two levels:
   ``need`` over ``lookahead_s`` and ``level`` over ``2 * lookahead_s``. A scale-up goes
   to ``level``, so the next one is at least a look-ahead away;
2. **SLO risk** - freshness lag above ``slo_risk_fraction * slo_s``: add the rate that
   clears the backlog before the SLO breaks (after the restart) and scale up now;
3. **scale-up stabilization** - ``need`` must exceed the current count for the whole
   ``up_window_s`` (filters a single noisy tick), unless it is a burst: a need of at least
   ``burst_ratio`` times the count while a backlog builds scales up at once;
4. **scale-down stabilization** - the largest ``level`` of the last ``down_window_s``
   must be at least ``down_tolerance`` below the current count, the count must have run
   for ``down_window_s``, *and* the GPU time saved over the look-ahead must beat the
   downtime cost (``current * downtime_s * downtime_cost_factor``). After a burst (a count
   sized to drain a backlog: an SLO-risk scale-up, or one the restart floor of stage 5
   raised) the shorter ``burst_down_window_s`` applies once the backlog is drained: fast
   return, with the same tolerance and cost checks. Missing metrics never scale down;
5. **restart floor** - a rescale pauses training for the downtime, so it leaves the
   backlog plus a downtime of arrivals; the new count must keep up with the arrivals and
   drain that before the oldest sample breaks the SLO (:func:`restart_floor`). A
   scale-up goes at least there; a scale-down stops there, or holds when it cannot go
   below the current count (this halved the lag on the bursty shared traces, with fewer
   rescales). And a scale-up while a backlog waits holds when the running count drains
   that backlog sooner than the restart would (:func:`staying_drains_sooner`): without
   it, a burst set off a cascade of SLO-risk scale-ups, each restart leaving more backlog
   than the last, with no training in between;
6. **clamp** to min/max workers and the partition count.

Workers Pending for lack of capacity (``Observation.ready_workers`` below the count) block
further scale-ups (``HOLD_PENDING``): more pods would only queue behind them.

With no generation running, :meth:`RulesPolicy.first_start` runs the stages as if
``min_workers`` ran and starts directly at ``level`` (no stabilization).

Inputs are abstract: a :class:`ForecastSource` (online forecaster, or the oracle's true
future) and a capacity table (a fitted :class:`ThroughputModel`, or the oracle's true
cluster model). Both are cut at the count where throughput stops rising
(:func:`~kale_airflow.core.throughput.peak_cut`), so Kale never asks for workers past a
throughput peak it has fitted or measured.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from kale_airflow.core.capacity import OnlineThroughput
from kale_airflow.core.forecast import Forecaster
from kale_airflow.core.policies.base import Decision, Limits, Observation, Reason, duration
from kale_airflow.core.sources import ForecastSource, OnlineForecastSource
from kale_airflow.core.throughput import workers_for_rate


@dataclass(frozen=True)
class RulesConfig:
    """Kale policy settings (none is tuned per trace). ``lookahead_s``,
    ``forecast_quantile``, ``headroom``, ``burst_ratio``, ``down_window_s``,
    ``burst_down_window_s``, ``downtime_cost_factor`` and ``recent_window_s`` were chosen
    on the first halves of the shared traces, on every cluster (``benchmarks/engine.py``)."""

    slo_s: float = 300.0
    rescale_downtime_s: float = 90.0
    lookahead_s: float = 900.0
    forecast_quantile: float = 0.5
    headroom: float = 0.0
    min_drain_s: float = 60.0
    slo_risk_fraction: float = 0.5
    up_window_s: float = 60.0
    burst_ratio: float = 2.0
    down_window_s: float = 720.0
    burst_down_window_s: float = 180.0
    down_tolerance: float = 0.10
    downtime_cost_factor: float = 2.0  # over a 15-min look-ahead: the economics of 4 over 30 min
    fallback_margin: float = 0.20
    recent_window_s: float = 900.0
    interval_s: float = 15.0

    def __post_init__(self) -> None:
        if self.lookahead_s < self.rescale_downtime_s:
            raise ValueError(
                f"lookahead_s ({self.lookahead_s}) must cover rescale_downtime_s ({self.rescale_downtime_s}): "  # pragma: no mutate
                "a forecast shorter than the restart cannot scale ahead of traffic"  # pragma: no mutate
            )
        if self.min_drain_s <= 0 or self.slo_s <= 0:
            raise ValueError("min_drain_s and slo_s must be > 0")  # pragma: no mutate
        if self.burst_down_window_s < 0:
            raise ValueError(f"burst_down_window_s must be >= 0, got {self.burst_down_window_s}")
        if self.burst_ratio <= 1:
            raise ValueError(f"burst_ratio must be > 1 (math.inf turns the burst exception off), got {self.burst_ratio}")
        if not 0 <= self.down_tolerance < 1:
            raise ValueError(f"down_tolerance must be in [0, 1), got {self.down_tolerance}")


# ---------------------------------------------------------------------------- stages
def required_rate(forecast_upper: float, recent_rate: float, cfg: RulesConfig) -> float:
    """Stage 1: samples/s the workers must sustain (forecast, never below what is arriving now)."""
    return max(forecast_upper, recent_rate) * (1.0 + cfg.headroom)


def drain_rate(backlog: float, freshness_lag_s: float | None, cfg: RulesConfig) -> float:
    """Stage 2: extra samples/s that clear the backlog before the oldest sample breaks the SLO,
    allowing for the downtime of the rescale itself."""
    left = cfg.slo_s - (freshness_lag_s or 0.0) - cfg.rescale_downtime_s
    return backlog / max(left, cfg.min_drain_s)


def restart_floor(obs: Observation, cfg: RulesConfig, workers: Callable[[float], int]) -> int:
    """Stage 5: the fewest workers a rescale may go to. A rescale pauses training for the
    downtime, so it leaves the backlog now plus a downtime of arrivals; the new count must
    keep up with the arrival rate and drain that before the oldest sample breaks the SLO."""
    rate = obs.arrival_rate or 0.0
    left_behind = (obs.backlog or 0.0) + rate * cfg.rescale_downtime_s
    return workers(rate + drain_rate(left_behind, obs.freshness_lag_s, cfg))


def sized_for_restart(d: Decision, current: int, floor: int) -> Decision:
    """Stage 5 applied: a scale-up goes at least to the restart floor; a scale-down stops at
    it, or holds when the floor is the current count or more (the restart would leave more
    than the smaller count can drain in time)."""
    if d.workers > current and floor > d.workers:
        return Decision(floor, d.reason, f"{d.message}; {floor} to drain what the restart leaves", d.details)
    if d.workers < current and floor >= current:
        return Decision(current, Reason.HOLD_NOT_WORTH_DOWNTIME,
                        f"{d.message}, but {floor} workers are needed to drain what the restart leaves before "  # pragma: no mutate
                        f"the SLO: holding at {current}", d.details)
    if d.workers < floor < current:
        return Decision(floor, d.reason, f"{d.message}; stopping at {floor} to drain what the restart leaves",
                        d.details)
    return d


def staying_drains_sooner(obs: Observation, target: int, cfg: RulesConfig,
                          capacity: Callable[[int], float]) -> tuple[bool, float, float]:
    """Stage 5, for a scale-up while a backlog waits: ``(hold, stay_s, move_s)``, the seconds
    the running count needs to drain the backlog against those of the restart to ``target``
    (the downtime, then the backlog plus a downtime of arrivals at the new spare capacity).
    Hold when staying is no slower. Never holds with an unknown arrival rate or a count that
    cannot keep up. ``capacity`` maps a worker count to samples/s."""
    backlog, rate = obs.backlog, obs.arrival_rate
    spare = None if rate is None else capacity(obs.workers) - rate
    if not backlog or spare is None or spare <= 0:
        return False, math.inf, 0.0
    spare_after = capacity(target) - rate
    move_s = (cfg.rescale_downtime_s + (backlog + rate * cfg.rescale_downtime_s) / spare_after
              if spare_after > 0 else math.inf)
    stay_s = backlog / spare
    return stay_s <= move_s, stay_s, move_s


def slo_at_risk(freshness_lag_s: float | None, cfg: RulesConfig) -> bool:
    """Stage 2: the oldest sample is already older than the risk threshold."""
    return freshness_lag_s is not None and freshness_lag_s > cfg.slo_risk_fraction * cfg.slo_s


def is_burst(obs: Observation, need: int, cfg: RulesConfig) -> bool:
    """Stage 3's exception: a need of at least ``burst_ratio`` times the running count while
    a backlog builds is a burst, not a noisy tick (on the first halves of the shared traces,
    skipping the up window for it cut the lag in excess of clairvoyant Kale's on the bursty
    FB trace by 17 % and left NASA's and NYC's decisions unchanged)."""
    return bool(obs.backlog) and need >= cfg.burst_ratio * obs.workers


def held_for(since: float | None, now: float, window_s: float) -> bool:
    """Stages 3-4: a condition that began at ``since`` has lasted the whole window."""
    return since is not None and now - since >= window_s - 1e-9


class WindowMax:
    """Largest value seen within a sliding time window (monotone deque, O(1) amortized).

    Stage 4 uses it for the largest level asked for within the down window (HPA-style
    scale-down stabilization)."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._q: deque[tuple[float, int]] = deque()

    def reset(self) -> None:
        """Forget everything (after a rescale)."""
        self._q.clear()

    def state_dict(self) -> list:
        """JSON-friendly state."""
        return [list(x) for x in self._q]

    def load_state_dict(self, state: list) -> None:
        """Inverse of :meth:`state_dict`."""
        self._q = deque((float(t), int(v)) for t, v in state)

    def push(self, t: float, value: int) -> int:
        """Add a value at time t; return the max within (t - window, t]."""
        q = self._q
        while q and q[-1][1] <= value:
            q.pop()
        q.append((t, value))
        while len(q) > 1 and q[0][0] <= t - self.window_s - 1e-9:  # the newest value always counts
            q.popleft()
        return q[0][1]


def scale_down_worth_it(current: int, target: int, cfg: RulesConfig) -> tuple[bool, float, float]:
    """Stage 4: GPU-seconds saved over the look-ahead vs the downtime cost of a rescale."""
    saved = (current - target) * cfg.lookahead_s
    cost = current * cfg.rescale_downtime_s * cfg.downtime_cost_factor
    return saved > cost, saved, cost


@dataclass(frozen=True)
class Sizing:
    """Stages 1-2 for one tick: workers needed over the look-ahead (``need``) and over
    twice it (``level``), whether the SLO is at risk, and the forecast they came from."""

    need: int
    level: int
    at_risk: bool
    forecast_upper: float
    source: str

    def details(self) -> dict:
        """The details every decision after the rescaling check carries."""
        return {"need": self.need, "level": self.level, "forecast_upper": round(self.forecast_upper, 3),
                "source": self.source}


def forecast_uppers(forecast: ForecastSource, now: float, cfg: RulesConfig) -> tuple[float, float, str]:
    """Stage 1 input: the forecast's upper bound over one and over two look-aheads, and its
    source. While the forecast is unavailable, the documented fallback: the recent peak
    (over one look-ahead) plus ``fallback_margin``, for both."""
    up1, source = forecast.peak(now, cfg.lookahead_s)
    up2, _ = forecast.peak(now, 2 * cfg.lookahead_s)
    if up1 is None or up2 is None:
        fb = (forecast.recent_max(now, cfg.lookahead_s) or 0.0) * (1 + cfg.fallback_margin)
        up1 = up2 = fb
        source = f"fallback ({source})"
    return up1, up2, source


def recent_rate(forecast: ForecastSource, now: float, arrival_rate: float | None, cfg: RulesConfig) -> float:
    """Stage 1 floor: the peak of the last ``recent_window_s``, never below the rate arriving now."""
    recent = forecast.recent_max(now, cfg.recent_window_s) or 0.0
    if arrival_rate is not None:
        recent = max(recent, arrival_rate)
    return recent


def size_workers(up1: float, up2: float, recent: float, obs: Observation, cfg: RulesConfig,
                 workers: Callable[[float], int]) -> tuple[int, int, bool]:
    """Stages 1-2: ``(need, level, at_risk)``. ``need`` covers the upper bound over one
    look-ahead (``up1``), ``level`` the one over two (``up2``) and at least ``need``; on SLO
    risk ``need`` adds the rate that drains the backlog in time. ``workers`` maps samples/s
    to a clamped worker count."""
    need = workers(required_rate(up1, recent, cfg))
    level = max(need, workers(required_rate(up2, recent, cfg)))
    at_risk = slo_at_risk(obs.freshness_lag_s, cfg)
    if at_risk:
        extra = drain_rate(obs.backlog or 0.0, obs.freshness_lag_s, cfg)
        need = workers(required_rate(up1, recent, cfg) + extra)
        level = max(level, need)
    return need, level, at_risk


def scale_up_decision(obs: Observation, sizing: Sizing, up_held: bool, cfg: RulesConfig, details: dict) -> Decision:
    """Stages 2-3, when ``need`` exceeds the current count: hold while workers are Pending;
    on SLO risk scale to ``level`` now; otherwise once the need has held for the up window
    (``up_held``) or at once on a burst (:func:`is_burst`), else wait."""
    current, need, level = obs.workers, sizing.need, sizing.level
    if obs.ready_workers is not None and obs.ready_workers < current:
        # More pods would queue behind the ones already waiting for GPUs: hold, do not oscillate.
        return Decision(current, Reason.HOLD_PENDING,
                        f"{current - obs.ready_workers} of {current} workers are Pending for lack of capacity; "  # pragma: no mutate
                        f"holding at {current} instead of asking for {level}", details)
    if sizing.at_risk:
        return Decision(level, Reason.SCALE_UP_SLO_RISK,
                        f"freshness lag {obs.freshness_lag_s:.0f}s > {cfg.slo_risk_fraction * cfg.slo_s:.0f}s: "  # pragma: no mutate
                        f"scale up now {current} -> {level}", details)
    if up_held:
        return Decision(level, Reason.SCALE_UP_FORECAST,
                        f"{sizing.source} needs {need} workers within {duration(cfg.lookahead_s)} "  # pragma: no mutate
                        f"(> {current}); scale to {level} for the next {duration(2 * cfg.lookahead_s)}",  # pragma: no mutate
                        details)
    if is_burst(obs, need, cfg):
        return Decision(level, Reason.SCALE_UP_FORECAST,
                        f"burst: need {need} >= {cfg.burst_ratio:g}x {current} while a backlog builds; "  # pragma: no mutate
                        f"scale up now {current} -> {level}", details)
    return Decision(current, Reason.HOLD_STABILIZING,
                    f"need {need} > {current}; waiting until it holds {cfg.up_window_s:.0f}s", details)


def scale_down_decision(obs: Observation, target: int, count_held: bool, cfg: RulesConfig, details: dict) -> Decision:
    """Stage 4, when ``need`` does not exceed the current count: scale down to ``target``
    (the largest level of the down window) only with complete metrics, below the
    tolerance band, after the count has run the down window (``count_held``) and when the
    GPU time saved beats the downtime cost; otherwise hold, saying which check failed."""
    current = obs.workers
    if obs.arrival_rate is None or obs.backlog is None:
        return Decision(current, Reason.HOLD_MISSING_METRICS,
                        "arrival rate or backlog missing: never scale down on missing data", details)
    if target >= current:
        return Decision(current, Reason.HOLD, f"{current} workers cover the forecast (level {target})", details)
    if target > current * (1 - cfg.down_tolerance):
        return Decision(current, Reason.HOLD_TOLERANCE,
                        f"level {target} is within {cfg.down_tolerance:.0%} of {current}", details)
    if not count_held:
        return Decision(current, Reason.HOLD_STABILIZING,
                        f"level {target} < {current}, but {current} has run < {duration(cfg.down_window_s)}",  # pragma: no mutate
                        details)
    worth, saved, cost = scale_down_worth_it(current, target, cfg)
    if not worth:
        return Decision(current, Reason.HOLD_NOT_WORTH_DOWNTIME,
                        f"saving {saved / 3600:.2f} GPU-h does not beat downtime cost {cost / 3600:.2f} GPU-h",  # pragma: no mutate
                        details)
    return Decision(target, Reason.SCALE_DOWN_FORECAST,
                    f"level {target} held for {duration(cfg.down_window_s)}; saves {saved / 3600:.2f} GPU-h "  # pragma: no mutate
                    f"over {cost / 3600:.2f} GPU-h downtime cost", details)


# -------------------------------------------------------------------------- policy
class RulesPolicy:
    """Forecast-driven, stabilized scaling."""

    name = "kale-rules"

    def __init__(self, limits: Limits, forecast: ForecastSource, capacity, config: RulesConfig | None = None,
                 name: str | None = None):
        self.limits = limits
        self.config = config or RulesConfig()
        self.forecast = forecast
        self.capacity = capacity
        self.interval_s = self.config.interval_s
        if name:
            self.name = name
        self._levels = WindowMax(self.config.down_window_s)  # levels asked for at the current count
        self._burst_levels = WindowMax(min(self.config.burst_down_window_s, self.config.down_window_s))
        self._burst = False         # the current count was sized to drain a backlog (fast return)
        self._to_drain = False      # the last rescale was sized to drain a backlog (see decide)
        self._count: int | None = None
        self._count_since: float | None = None
        self._up_since: float | None = None

    def state_dict(self) -> dict:
        """Stabilization state (and the forecast source's, when it has one), JSON-friendly,
        so a policy can be rebuilt between sensor pokes and DAG runs."""
        state = {"levels": self._levels.state_dict(), "count": self._count, "count_since": self._count_since,
                 "up_since": self._up_since, "burst_levels": self._burst_levels.state_dict(), "burst": self._burst,
                 "to_drain": self._to_drain}
        if self.forecast.stateful:
            state["forecast"] = self.forecast.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self._levels.load_state_dict(state.get("levels", []))
        self._burst_levels.load_state_dict(state.get("burst_levels", []))
        self._burst = bool(state.get("burst", False))
        # "changed_by" (the last rescale's reason) is what states saved before "to_drain" carry.
        self._to_drain = bool(state.get("to_drain", state.get("changed_by") == Reason.SCALE_UP_SLO_RISK.value))
        self._count, self._count_since, self._up_since = state.get("count"), state.get("count_since"), \
            state.get("up_since")
        if "forecast" in state and self.forecast.stateful:
            self.forecast.load_state_dict(state["forecast"])

    def _workers_for(self, rate: float) -> int:
        table = self.capacity.table
        if table is None:
            return self.limits.upper
        return workers_for_rate(table, rate)

    def capacity_of(self, workers: int) -> float:
        """Samples/s that ``workers`` sustain by the capacity table; counts past its end (the
        peak it was cut at) sustain its last entry. Only once the table exists."""
        table = self.capacity.table
        return float(table[min(workers, len(table) - 1)])

    def _clamped_workers_for(self, rate: float) -> int:
        """Workers for ``rate`` samples/s, clamped to the limits (stage 6)."""
        return self.limits.clamp(self._workers_for(rate))

    def _size(self, obs: Observation) -> Sizing:
        """Stages 1-2 for this tick, from the forecast source and the observation."""
        cfg, now = self.config, obs.now_s
        up1, up2, source = forecast_uppers(self.forecast, now, cfg)
        recent = recent_rate(self.forecast, now, obs.arrival_rate, cfg)
        need, level, at_risk = size_workers(up1, up2, recent, obs, cfg, self._clamped_workers_for)
        return Sizing(need, level, at_risk, up1, source)

    def _stabilize(self, now: float, current: int, sizing: Sizing) -> int:
        """Stages 3-4 bookkeeping: start the windows over after a rescale, record this tick's
        level and since when ``need`` exceeds the count. Returns the largest level of the
        down window (the scale-down target)."""
        if self._count != current:  # a rescale happened: stabilization starts over
            self._count, self._count_since, self._up_since = current, now, None
            self._burst = self._to_drain
            self._levels.reset()
            self._burst_levels.reset()
        target = self._levels.push(now, sizing.level)
        burst_target = self._burst_levels.push(now, sizing.level)
        if self._burst:
            # Fast return after a burst: a count sized to drain a backlog is not a level the
            # forecast asked for, so the shorter window applies (once the backlog is gone, see decide).
            target = burst_target
        self._up_since = (self._up_since if self._up_since is not None else now) if sizing.need > current else None
        return target

    def decide(self, obs: Observation) -> Decision:
        """Observe, then run the stages."""
        cfg, now, current = self.config, obs.now_s, obs.workers
        self.forecast.observe(now, obs.arrival_rate)
        if not obs.rescaling:
            self.capacity.observe(now, current, obs.throughput)
        if obs.rescaling:
            return Decision(current, Reason.HOLD_RESCALING, "rescale in progress; waiting for workers to restore")
        sizing = self._size(obs)
        target = self._stabilize(now, current, sizing)
        details = sizing.details()
        if sizing.need > current:
            d = scale_up_decision(obs, sizing, held_for(self._up_since, now, cfg.up_window_s), cfg, details)
        else:
            drained = not obs.backlog and not obs.freshness_lag_s
            window = min(cfg.burst_down_window_s, cfg.down_window_s) if self._burst and drained else cfg.down_window_s
            d = scale_down_decision(obs, target, held_for(self._count_since, now, window), cfg, details)
        if d.workers != current:
            floor = restart_floor(obs, cfg, self._clamped_workers_for)
            raised = d.workers > current and floor > d.workers
            d = sized_for_restart(d, current, floor)
            if d.workers > current:
                d = self._unless_staying_drains_sooner(obs, d)
            if d.workers != current:
                # A count set by SLO risk, or raised by the floor, is sized for a backlog: it returns fast.
                self._to_drain = raised or d.reason == Reason.SCALE_UP_SLO_RISK
        return d

    def _unless_staying_drains_sooner(self, obs: Observation, d: Decision) -> Decision:
        """Stage 5 for a scale-up: hold when the running count drains the backlog no slower
        than the restart to ``d.workers`` would (:func:`staying_drains_sooner`)."""
        if self.capacity.table is None:  # nothing fitted yet: no way to tell
            return d
        hold, stay_s, move_s = staying_drains_sooner(obs, d.workers, self.config, self.capacity_of)
        if not hold:
            return d
        return Decision(obs.workers, Reason.HOLD_NOT_WORTH_DOWNTIME,
                        f"{d.message}, but {obs.workers} workers drain the backlog in {duration(stay_s)}, no slower "  # pragma: no mutate
                        f"than the restart to {d.workers} ({duration(move_s)}): holding at {obs.workers}", d.details)  # pragma: no mutate

    def first_start(self, obs: Observation) -> Decision:
        """Decision when no training generation runs (``obs.workers == 0``).

        The stages run as if ``min_workers`` were running with no backlog (the observed
        arrival rate still counts); the generation then starts directly at the level they
        ask for, without stabilization, clamped to the limits and never below
        ``min_workers`` (so never 0). The reason is always ``SCALE_UP_FORECAST``.
        """
        limits = self.limits
        d = self.decide(Observation(obs.now_s, limits.min_workers, obs.arrival_rate, 0.0, 0.0, None, None, False))
        n = limits.clamp(max(d.details.get("level", d.workers), limits.min_workers))
        return Decision(n, Reason.SCALE_UP_FORECAST, f"no training generation is running; starting {n} worker(s)",
                        d.details)


def make_online_rules(limits: Limits, forecaster: Forecaster, profile: tuple, config: RulesConfig | None = None,
                     history: pd.Series | None = None, bin_s: float = 300.0, name: str = "kale-rules",
                     refresh_every_s: float | None = None, retrain_every_s: float | None = None) -> RulesPolicy:  # pragma: no mutate block
    """Kale as deployed: online forecaster plus a throughput model fitted from observations."""
    cfg = config or RulesConfig()
    source = OnlineForecastSource(forecaster, bin_s=bin_s, quantile=cfg.forecast_quantile,
                                  max_horizon_s=2 * cfg.lookahead_s, refresh_every_s=refresh_every_s,
                                  retrain_every_s=retrain_every_s, adaptive=False)
    if history is not None and len(history):
        source.preload(history)
    capacity = OnlineThroughput(*profile, max_workers=limits.upper)
    return RulesPolicy(limits, source, capacity, cfg, name=name)

