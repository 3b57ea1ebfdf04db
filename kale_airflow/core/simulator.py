"""Trace-driven simulator implementing the evaluation protocol of DESIGN.md.

- **Arrivals.** A trace value is a count per trace step, spread evenly over the step and
  scaled by one factor so that the trace's 99th-percentile rate equals the true
  throughput of ``ref_workers`` workers.
- **Cluster.** :class:`~kale_airflow.core.throughput.ClusterModel` with seeded per-tick
  noise, the same noise for every policy (common random numbers).
- **Rescale.** Any change of worker count pauses training for ``rescale_downtime_s``
  (a change during a pause restarts it); GPUs held meanwhile: max(old, new).
- **Backlog.** Per tick ``processed = min(B + arrivals, c(n) * available seconds)``.
- **Metrics.** Accumulated lag ``sum B * tick`` (sample-seconds), mean wait (lag /
  samples), FIFO freshness lag (age of the oldest unprocessed sample) and the share of
  ticks above ``slo_s``, downtime, GPU-hours, rescales; the offline optimum
  (:func:`offline_optimum`), the priced optimum (:func:`priced_optimum`: each policy's
  ``priced_cost_gpu_h`` is its cost at the same price) and the fluid bound.
- **Baselines at their settings**: ``VARIANTS`` pins a baseline's setting under its own
  name (``hpa@60s``); :func:`best_variant` picks the one a comparison should use.
- **References**: ``oracle`` is clairvoyant Kale (``LABELS``), Kale's logic on the truth.
- **Partitions** (optional, ``shard_skew``): see :mod:`kale_airflow.core.shards`.
- **No peeking.** At tick k a policy sees only metrics of ticks < k. The first
  ``history_days`` of the trace are past history given to forecasting policies; the
  evaluation starts after them. Throughput models start from profiling observations
  (noisy measurements at a few worker counts), never from the true curve.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from kale_airflow.core.errors import KaleError
from kale_airflow.core.forecast import get_forecaster
from kale_airflow.core.policies import (
    AutopilotConfig,
    AutopilotPolicy,
    HPAConfig,
    HPAPolicy,
    KEDAConfig,
    KEDAPolicy,
    Limits,
    Observation,
    RulesConfig,
    StaticPolicy,
    build_kale,
    make_online_rules,
)
from kale_airflow.core.capacity import KnownCapacity
from kale_airflow.core.planning import Prices, offline_schedule, priced_schedule
from kale_airflow.core.policies.kale import MIN_RATE, KaleConfig, KalePolicy
from kale_airflow.core.sources import OracleForecastSource
from kale_airflow.core.shards import ShardModel, zipf_shares
from kale_airflow.core.cluster import ClusterModel
from kale_airflow.core.fleet import Pin, bounded, bounds_at
from kale_airflow.core.traffic import Trace

ONLINE_POLICIES = ("kale", "hpa", "keda", "autopilot", "static")
# Named candidates run on request (not in ALL_POLICIES): today's planner against the rules it replaced.
CANDIDATES = ("kale-rules",)
ALL_POLICIES = ONLINE_POLICIES + ("oracle",)
# Display names: the oracle is Kale's own logic fed the truth, not a bound.
LABELS = {"oracle": "clairvoyant Kale", "oracle@10min": "clairvoyant Kale (10-min means)",
          "oracle@15min": "clairvoyant Kale (15-min means)", "oracle@1h": "clairvoyant Kale (hourly means)"}

# Baseline variants at their own realistic settings (name -> SimConfig overrides). The
# plain names run at the SimConfig's settings (the CLI's options); the others pin one.
VARIANTS: dict[str, dict] = {
    "hpa@60s": {"hpa_window_s": 60.0},
    "hpa@120s": {"hpa_window_s": 120.0},
    "keda@10s": {"keda_lag_threshold_s": 10.0},
    "keda@30s": {"keda_lag_threshold_s": 30.0},
    "autopilot@p95+0%": {"autopilot_percentile": 0.95, "autopilot_margin": 0.0},
    "autopilot@p90+5%": {"autopilot_percentile": 0.90, "autopilot_margin": 0.05},
    "autopilot@p99+20%": {"autopilot_percentile": 0.99, "autopilot_margin": 0.20},
    # Clairvoyant Kale that knows the future only at a coarser resolution (benchmarks/headroom.py).
    "oracle@10min": {"oracle_resolution_s": 600.0},
    "oracle@15min": {"oracle_resolution_s": 900.0},
    "oracle@1h": {"oracle_resolution_s": 3600.0},
}
# The grid the engine benchmark evaluates per baseline (the plain name at the defaults).
BASELINE_GRID = {
    "hpa": ("hpa", "hpa@60s", "hpa@120s"),
    "keda": ("keda@10s", "keda@30s", "keda"),
    "autopilot": ("autopilot", "autopilot@p95+0%", "autopilot@p90+5%", "autopilot@p99+20%"),
}


class SimulationError(KaleError, ValueError):
    """The simulation cannot run as configured; the message says what to change."""


@dataclass(frozen=True)
class SimConfig:
    """The evaluation protocol's knobs, with DESIGN.md's defaults."""

    tick_s: float = 15.0
    ref_workers: int = 32
    min_workers: int = 1
    max_workers: int = 64
    partitions: int = 64
    rescale_downtime_s: float = 90.0
    slo_s: float = 300.0
    history_days: float = 14.0
    days: float | None = None
    seed: int = 0
    cluster: ClusterModel = field(default_factory=ClusterModel)
    profile_workers: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    profile_samples: int = 20
    profile_noise_sd: float | None = None  # None: the cluster's per-tick noise
    hpa_window_s: float = 15.0
    keda_lag_threshold_s: float = 60.0
    autopilot_margin: float = 0.10
    autopilot_percentile: float = 0.95
    offline_step_s: float = 300.0
    shard_skew: float | None = None
    shard_partitions: int = 128
    shard_assignment: str = "rebalance"
    oracle_resolution_s: float | None = None  # None: the oracle knows every bin of the future
    # A deployment replayed as it runs (``kale demo``'s prediction): Kale's forecast bin, the
    # window scaled to a given peak rate (None: the 99th-percentile rule above), and the job
    # started at a given count (None: what the first tick's traffic needs plus 20 %), pinned
    # there for ``pinned_s`` (``kale pin``), as when Kale takes over a job that already runs.
    bin_s: float = 300.0
    peak_rate: float | None = None
    initial_workers: int | None = None
    pinned_s: float = 0.0

    def __post_init__(self) -> None:
        if self.tick_s <= 0:
            raise SimulationError(f"tick_s must be > 0, got {self.tick_s}")
        if not self.min_workers <= self.ref_workers <= self.max_workers:
            raise SimulationError(
                f"ref_workers ({self.ref_workers}) must lie within min_workers ({self.min_workers}) "
                f"and max_workers ({self.max_workers})"
            )
        if self.slo_s <= 0 or self.rescale_downtime_s < 0:
            raise SimulationError("slo_s must be > 0 and rescale_downtime_s >= 0")
        if self.bin_s <= 0 or self.pinned_s < 0 or (self.peak_rate is not None and self.peak_rate <= 0):
            raise SimulationError(f"bin_s ({self.bin_s}) and peak_rate ({self.peak_rate}) must be > 0 and "
                                  f"pinned_s ({self.pinned_s}) >= 0")

    @property
    def limits(self) -> Limits:
        """Bounds shared by every policy."""
        return Limits(self.min_workers, self.max_workers, self.partitions)

    def to_dict(self) -> dict:
        """JSON-friendly form."""
        d = asdict(self)
        d["profile_workers"] = list(self.profile_workers)
        return d


@dataclass
class Workload:
    """Arrivals per tick for the evaluation window plus the history before it."""

    start_s: float
    arrivals: np.ndarray          # samples per tick
    history: pd.Series            # samples/s per trace step, before start
    scale: float                  # samples per trace unit
    tick_s: float = 15.0

    @property
    def rates(self) -> np.ndarray:
        """Arrival rate per tick (samples/s)."""
        return self.arrivals / self.tick_s


def build_workload(trace: Trace, cfg: SimConfig) -> Workload:
    """Scale the trace and expand it to ticks (see the module docstring)."""
    ticks_per_step = trace.step_s / cfg.tick_s
    if abs(ticks_per_step - round(ticks_per_step)) > 1e-9 or ticks_per_step < 1:
        raise SimulationError(
            f"trace step {trace.step_s:g} s is not a whole multiple of the tick {cfg.tick_s:g} s; "
            "resample the trace or pick a tick that divides its step"
        )
    tps = int(round(ticks_per_step))
    hist_steps = int(round(cfg.history_days * 86400 / trace.step_s))
    if len(trace.series) - hist_steps < 1:
        raise SimulationError(
            f"trace {trace.name} covers {trace.duration_s / 86400:.1f} days; it needs history_days "
            f"({cfg.history_days}) plus something to evaluate: lower history_days"
        )
    eval_values = trace.values[hist_steps:]
    if cfg.days is not None:
        eval_values = eval_values[: int(round(cfg.days * 86400 / trace.step_s))]
    top = float(np.percentile(trace.rates, 99)) if cfg.peak_rate is None else float(eval_values.max()) / trace.step_s
    if top <= 0:
        raise SimulationError(f"trace {trace.name} has no traffic to scale: its "
                              f"{'99th-percentile' if cfg.peak_rate is None else 'peak'} rate is 0")
    # samples/s per trace rate unit
    scale = (cfg.cluster.capacity(cfg.ref_workers) if cfg.peak_rate is None else cfg.peak_rate) / top
    arrivals = np.repeat(eval_values * scale * cfg.tick_s / trace.step_s, tps)
    history = trace.series.iloc[:hist_steps] * scale / trace.step_s
    start = trace.series.index[hist_steps].value / 1e9
    return Workload(start, arrivals, history, scale, cfg.tick_s)


@dataclass
class PolicyRun:
    """One policy's metrics and per-tick series."""

    name: str
    metrics: dict
    workers: np.ndarray
    capacity: np.ndarray
    backlog: np.ndarray
    freshness: np.ndarray
    rescale_events: list[dict]
    reasons: dict[str, int]
    decide_ms: np.ndarray


def profile_observations(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    """Noisy throughput measurements at a few worker counts (the offline profiling run)."""
    rng = np.random.default_rng(cfg.seed + 1)
    n = np.repeat(np.asarray(cfg.profile_workers, dtype=float), cfg.profile_samples)
    n = n[n <= cfg.max_workers]
    sd = cfg.cluster.noise_sd if cfg.profile_noise_sd is None else cfg.profile_noise_sd
    r = cfg.cluster.capacity(n) * np.maximum(0.5, 1 + sd * rng.standard_normal(n.size))
    return n, r


def fluid_gpu_hours(arrivals: np.ndarray, cfg: SimConfig) -> float:
    """GPU-hours of exactly enough (fractional, >= min_workers) workers per tick, free rescales
    (traffic beyond the curve's peak gets the peak count)."""
    upper = cfg.limits.upper
    n = cfg.cluster.workers_for_fractional(arrivals / cfg.tick_s, upper)
    n = np.where(np.isfinite(n), n, cfg.cluster.peak_workers(upper))
    n = np.clip(n, cfg.min_workers, upper)
    return float(n.sum() * cfg.tick_s / 3600.0)


def offline_steps(arrivals: np.ndarray, cfg: SimConfig) -> tuple[np.ndarray, float]:
    """The arrivals summed per step of the optima (``cfg.offline_step_s``, a whole number of
    ticks, the last step padded), and that step in seconds."""
    parts, step = offline_parts(arrivals, cfg)
    return parts.sum(axis=1), step


def offline_parts(arrivals: np.ndarray, cfg: SimConfig) -> tuple[np.ndarray, float]:
    """The arrivals of each step of the optima per equal part of it, (step, part): the fewest
    parts within which the ticks' arrivals are steady (a 1-minute trace has five per 5-minute
    step, a 5-minute one a single part; at worst one per tick), and the step in seconds."""
    per = max(1, int(round(cfg.offline_step_s / cfg.tick_s)))
    pad = (-len(arrivals)) % per
    ticks = np.concatenate([arrivals, np.zeros(pad)]).reshape(-1, per)
    for parts in (n for n in range(1, per + 1) if per % n == 0):
        blocks = ticks.reshape(len(ticks), parts, per // parts)
        if (blocks == blocks[..., :1]).all():
            return blocks.sum(axis=2), per * cfg.tick_s
    raise AssertionError("one part per tick is always steady")  # pragma: no cover


def offline_optimum(arrivals: np.ndarray, cfg: SimConfig, initial_workers: int) -> dict:
    """The offline optimum: a dynamic program over the worker count of each coarse step
    (``cfg.offline_step_s``, 5 min = the default SLO) that knows the true arrivals and the
    true mean curve and pays the rescale downtime.

    A schedule is feasible when every step processes what arrives in it within the step
    (so, at the mean curve, no sample waits longer than the step: the SLO holds); a step
    that starts with a rescale loses ``rescale_downtime_s`` of capacity and holds
    ``max(old, new)`` GPUs meanwhile. Steps no count can serve (bursts past the curve's
    peak) must run the peak count. The DP minimises GPU-hours over these schedules, from
    the same initial count as the policies. It is Kale's planning problem
    (:func:`~kale_airflow.core.planning.offline_schedule`) with perfect information and no
    lag price.

    It is the optimum of this discretized problem, not a strict bound: a policy may beat
    it by carrying backlog across steps within the SLO or rescaling inside a step.
    """
    a, step = offline_steps(arrivals, cfg)
    cap = cfg.cluster.capacity_table(cfg.limits.upper)
    start = min(max(initial_workers, cfg.min_workers), cfg.limits.upper)
    gpu_s, rescales = offline_schedule(a, cap, step, Prices(cfg.rescale_downtime_s, 0.0, cfg.min_workers), start)
    return {"gpu_hours": gpu_s / 3600.0, "rescales": rescales, "step_s": step}


def lag_price(arrivals: np.ndarray, cfg: SimConfig, wait_cost: float) -> float:
    """GPU-seconds per sample-second of lag at ``wait_cost`` workers per second of mean wait:
    Kale's planner price (:class:`~kale_airflow.core.policies.kale.KaleConfig`) at the
    window's mean rate, so that a run's priced cost is GPU-hours plus ``wait_cost`` x its
    mean wait x the window's hours."""
    return wait_cost / max(MIN_RATE, float(np.sum(arrivals)) / (len(arrivals) * cfg.tick_s))


def priced_optimum(arrivals: np.ndarray, cfg: SimConfig, initial_workers: int, wait_cost: float) -> dict:
    """The clairvoyant optimum of what Kale minimises (:func:`~kale_airflow.core.planning.priced_schedule`):
    GPU-hours plus lag at :func:`lag_price`, the backlog carried across the
    ``cfg.offline_step_s`` steps, the SLO held at each step's end (or, in bursts past the
    curve's peak, kept to what the largest count leaves), the true arrivals and mean
    curve, the rescale downtime paid. ``cost_gpu_h`` is its schedule's cost and
    ``lower_bound_gpu_h`` one no schedule of the problem beats."""
    a, step = offline_parts(arrivals, cfg)
    price = lag_price(arrivals, cfg, wait_cost)
    start = min(max(initial_workers, cfg.min_workers), cfg.limits.upper)
    found = priced_schedule(a, cfg.cluster.capacity_table(cfg.limits.upper), step,
                            Prices(cfg.rescale_downtime_s, price, cfg.min_workers, cfg.slo_s), start)
    return {"wait_cost": wait_cost, "lag_price": price, "cost_gpu_h": found.cost / 3600.0,
            "lower_bound_gpu_h": found.lower_bound / 3600.0, "gpu_hours": found.gpu_s / 3600.0,
            "accumulated_lag": found.lag, "rescales": found.rescales, "over_slo_steps": found.over_slo_steps,
            "step_s": step}


def fifo_freshness(cum_arrivals: list[float], arrivals: list[float], cum_processed: float, t0: float,
                   tick: float, end: float) -> float:
    """Age at ``end`` of the oldest unprocessed sample, arrivals spread evenly over each tick
    and processed first in, first out. ``cum_arrivals[k]`` counts the samples that arrived
    up to the end of tick k (the last entry is the current tick's)."""
    j = bisect_right(cum_arrivals, cum_processed)
    prev = cum_arrivals[j - 1] if j else 0.0
    aj = arrivals[j]
    born = t0 + j * tick + ((cum_processed - prev) / aj * tick if aj > 0 else 0.0)
    return end - born


class _Replay:
    """One policy's replay: the cluster's state between ticks and the per-tick series.

    The protocol's tick loop is :meth:`decide` (at the policy's interval) then :meth:`step`;
    :meth:`result` turns the series into a :class:`PolicyRun`."""

    def __init__(self, workload: Workload, cfg: SimConfig, noise: np.ndarray, initial_workers: int, shards=None):
        self.cfg, self.shards, self.limits = cfg, shards, cfg.limits
        self.tick, self.t0 = cfg.tick_s, workload.start_s
        self.total_samples = float(workload.arrivals.sum())
        self.arrivals = workload.arrivals.tolist()
        self.noise = noise.tolist()
        self.cap_table = cfg.cluster.capacity_table(cfg.max_workers).tolist()
        self.n = self.held = initial_workers  # workers training; GPUs held (max(old, new) while rescaling)
        self.pins = (Pin(initial_workers, self.t0 + cfg.pinned_s, "the job Kale takes over"),) if cfg.pinned_s else ()
        self.down_rem = self.backlog = 0.0
        self.cum_arr: list[float] = []
        self.cum_a = self.cum_p = 0.0
        self.rate = self.util = self.tput = self.fresh = None  # what the next observation reports
        self.workers_l, self.cap_l, self.backlog_l, self.fresh_l = [], [], [], []
        self.events: list[dict] = []
        self.reasons: Counter = Counter()
        self.decide_ms: list[float] = []
        self.downtime = self.gpu_s = 0.0

    def decide(self, policy, k: int, now: float) -> None:
        """Ask the policy (it sees metrics of ticks < k only) and start any rescale it wants."""
        obs = self.observation(k, now)
        s = time.perf_counter()
        d = policy.decide(obs)
        self.decide_ms.append((time.perf_counter() - s) * 1e3)
        if self.pins:  # as the autoscaler bounds every decision by the job's pin
            d = bounded(d, bounds_at(self.limits, now, (), self.pins))
        self.apply(d, now)

    def observation(self, k: int, now: float) -> Observation:
        """What a policy deciding at tick k sees: the metrics of ticks < k."""
        return Observation(now, self.n, self.rate, self.backlog if k else 0.0, self.fresh if k else 0.0, self.util,
                           self.tput, self.down_rem > 0)

    @property
    def gpus(self) -> int:
        """GPUs held now: ``max(old, new)`` while a rescale pauses, the count otherwise."""
        return self.held if self.down_rem > 0 else self.n

    def apply(self, d, now: float) -> None:
        """Count the decision's reason and start the rescale it asks for, if any (a change
        during a pause restarts the pause)."""
        self.reasons[d.reason.value] += 1
        target = self.limits.clamp(d.workers)
        if target != self.n:
            self.events.append({"t": now, "from": self.n, "to": target, "reason": d.reason.value,
                                "message": d.message})
            self.held = max(self.n, target)
            self.n = target
            self.down_rem = self.cfg.rescale_downtime_s

    def step(self, k: int, now: float) -> None:
        """Run tick k: downtime, GPU time, capacity, processing, then the metrics it leaves."""
        tick = self.tick
        down = self.down_rem if self.down_rem < tick else tick
        self.down_rem -= down
        self.downtime += down
        avail = tick - down
        self.gpu_s += self.held * down + self.n * avail
        cap_rate = self.cap_table[self.n] * self.noise[k]
        cap = cap_rate * avail
        a = self.arrivals[k]
        proc = self._process(k, a, cap, now)
        self.rate = a / tick
        self.util = proc / cap if cap > 0 else None
        self.tput = cap_rate if avail > 0 else None
        self.workers_l.append(self.held if down > 0 else self.n)
        self.cap_l.append(cap_rate)
        self.backlog_l.append(self.backlog)
        self.fresh_l.append(self.fresh)

    def _process(self, k: int, a: float, cap: float, now: float) -> float:
        """Process up to ``cap`` samples of backlog plus arrivals ``a``; update backlog and
        freshness (per partition with shards, FIFO otherwise). Returns the samples processed."""
        if self.shards is not None:
            proc, self.backlog, self.fresh = self.shards.step(a, cap, self.n, self.tick)
        else:
            total = self.backlog + a
            proc = total if total < cap else cap
            self.backlog = total - proc
        self.cum_a += a
        self.cum_p += proc
        self.cum_arr.append(self.cum_a)
        if self.shards is None:
            if self.backlog > 1e-6:
                self.fresh = fifo_freshness(self.cum_arr, self.arrivals, self.cum_p, self.t0, self.tick,
                                            now + self.tick)
            else:
                self.fresh = 0.0
        return proc

    def metrics(self, backlog_a: np.ndarray, fresh_a: np.ndarray) -> dict:
        """The protocol's metrics (see the module docstring)."""
        decide_ms = self.decide_ms
        acc_lag = float(backlog_a.sum() * self.tick)
        return {
            "accumulated_lag": acc_lag,
            "mean_wait_s": acc_lag / self.total_samples if self.total_samples else 0.0,
            "downtime_s": self.downtime,
            "slo_violation_rate": float((fresh_a > self.cfg.slo_s).mean()),
            "gpu_hours": self.gpu_s / 3600.0,
            "rescales": len(self.events),
            "max_freshness_lag_s": float(fresh_a.max()),
            "p99_freshness_lag_s": float(np.percentile(fresh_a, 99)),
            "final_backlog": float(backlog_a[-1]),
            "decide_p99_ms": float(np.percentile(decide_ms, 99)) if decide_ms else 0.0,
        }

    def result(self, name: str) -> PolicyRun:
        """The replay as a :class:`PolicyRun`."""
        backlog_a = np.asarray(self.backlog_l)
        fresh_a = np.asarray(self.fresh_l)
        return PolicyRun(name, self.metrics(backlog_a, fresh_a), np.asarray(self.workers_l), np.asarray(self.cap_l),
                         backlog_a, fresh_a, self.events, dict(self.reasons), np.asarray(self.decide_ms))


def run_policy(policy, workload: Workload, cfg: SimConfig, noise: np.ndarray, initial_workers: int,
               progress=None, shards=None) -> PolicyRun:
    """Replay the workload through one policy (the protocol's tick loop).

    ``shards`` (a :class:`~kale_airflow.core.shards.ShardModel`) switches to per-partition
    backlog with per-worker capacity; freshness is then its estimate."""
    replay = _Replay(workload, cfg, noise, initial_workers, shards)
    t0, tick, interval = workload.start_s, cfg.tick_s, policy.interval_s
    T = len(replay.arrivals)
    next_decide = t0
    for k in range(T):
        now = t0 + k * tick
        if now >= next_decide - 1e-9:
            replay.decide(policy, k, now)
            next_decide = now + interval if interval != float("inf") else float("inf")
        replay.step(k, now)
        if progress is not None and k % 4096 == 4095:
            progress.update(4096)
    if progress is not None:
        progress.update(T % 4096)
    return replay.result(policy.name)


@dataclass
class SimulationResult:
    """Every policy's run on one trace, plus the limits."""

    trace: str
    config: SimConfig
    workload: Workload
    runs: dict[str, PolicyRun]
    fluid_gpu_hours: float
    forecaster: str
    wall_s: float
    offline: dict = field(default_factory=dict)
    priced: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON document of ``kale simulate --json``."""
        price = self.priced.get("lag_price")

        def priced(m: dict) -> dict:
            return {"priced_cost_gpu_h": m["gpu_hours"] + price * m["accumulated_lag"] / 3600.0} if price else {}

        return {
            "trace": self.trace,
            "forecaster": self.forecaster,
            "config": self.config.to_dict(),
            "evaluation": {
                "start": pd.Timestamp(self.workload.start_s, unit="s").isoformat(),
                "days": len(self.workload.arrivals) * self.config.tick_s / 86400,
                "total_samples": float(self.workload.arrivals.sum()),
                "scale_samples_per_unit": self.workload.scale,
            },
            "policies": {name: run.metrics | priced(run.metrics) | {"reasons": run.reasons}
                         for name, run in self.runs.items()},
            "limits": {"fluid_gpu_hours": self.fluid_gpu_hours,
                       "offline_optimal_gpu_hours": self.offline.get("gpu_hours"),
                       "offline_optimal_rescales": self.offline.get("rescales"),
                       "offline_step_s": self.offline.get("step_s"),
                       "priced_optimum": self.priced or None},
            "labels": {name: LABELS.get(name, name) for name in self.runs},
            "wall_s": self.wall_s,
        }


def build_policy(name: str, cfg: SimConfig, workload: Workload, forecaster: str = "seasonal",
                 forecaster_kwargs: dict | None = None, kale_config: KaleConfig | None = None):
    """Construct a policy by name with what it may know: past history and profiling only.

    ``static`` and ``oracle`` are references, not deployable policies: static is sized
    for the evaluation window's peak, the oracle reads the true future and cluster.
    """
    if name in VARIANTS:
        cfg = replace(cfg, **VARIANTS[name])
        name = name.split("@")[0]
    limits = cfg.limits
    profile = profile_observations(cfg)
    kcfg = replace(kale_config or KaleConfig(), slo_s=cfg.slo_s, rescale_downtime_s=cfg.rescale_downtime_s)
    if name in ("kale", "kale-rules"):
        model = get_forecaster(forecaster, **(forecaster_kwargs or {}))
        # Heavy forecasters (a separate forecast step, no array fast path) retrain daily and
        # re-forecast every 15 minutes, like the retrain DAG and the autoscaler would; cheap
        # ones refit each bin.
        heavy = model.supports_forecast and not model.supports_fit_values
        cadence = {"refresh_every_s": 900.0 if heavy else None, "retrain_every_s": 86400.0 if heavy else None}
        if name == "kale-rules":
            rcfg = RulesConfig(slo_s=cfg.slo_s, rescale_downtime_s=cfg.rescale_downtime_s)
            return make_online_rules(limits, model, profile, rcfg, history=workload.history, bin_s=cfg.bin_s,
                                     **cadence)
        return build_kale(limits, model, profile, kcfg, history=workload.history, bin_s=cfg.bin_s, **cadence)
    if name == "hpa":
        return HPAPolicy(limits, HPAConfig(metric_window_s=cfg.hpa_window_s))
    if name == "keda":
        per_worker = float(np.mean(profile[1][profile[0] == profile[0].min()]) / profile[0].min())
        return KEDAPolicy(limits, KEDAConfig(lag_threshold=per_worker * cfg.keda_lag_threshold_s))
    if name == "autopilot":
        return AutopilotPolicy(limits, AutopilotConfig(margin=cfg.autopilot_margin,
                                                       percentile=cfg.autopilot_percentile))
    if name == "static":
        peak = float(workload.arrivals.max()) / cfg.tick_s
        return StaticPolicy(limits.clamp(cfg.cluster.workers_for(peak, limits.upper)))
    if name == "oracle":
        source = OracleForecastSource(workload.start_s, cfg.tick_s, workload.arrivals / cfg.tick_s,
                                      bin_s=cfg.bin_s, resolution_s=cfg.oracle_resolution_s)
        capacity = KnownCapacity(cfg.cluster.capacity_table(limits.upper))
        return KalePolicy(limits, source, capacity, kcfg, name="oracle")
    raise SimulationError(f"unknown policy {name!r}; choose from {', '.join(ALL_POLICIES + CANDIDATES + tuple(VARIANTS))}")


def _replay_named(name: str, cfg: SimConfig, workload: Workload, noise: np.ndarray, initial: int, forecaster: str,
                  forecaster_kwargs: dict | None, kale_config: KaleConfig | None, progress=None) -> PolicyRun:
    """Build one policy by name and replay the workload through it (one job of :func:`simulate`)."""
    policy = build_policy(name, cfg, workload, forecaster, forecaster_kwargs, kale_config)
    policy.name = name
    shards = None
    if cfg.shard_skew is not None:
        shards = ShardModel(zipf_shares(cfg.shard_partitions, cfg.shard_skew, cfg.seed + 2), cfg.shard_assignment)
    return run_policy(policy, workload, cfg, noise, initial, progress, shards)


def _replay_all(names, jobs: int, bar, args: tuple, offline: bool) -> tuple[dict[str, PolicyRun], dict]:
    """Replay every policy, and solve the offline and the priced optimum if ``offline``
    (``{"offline": ..., "priced": ...}``), in ``jobs`` forked processes when there is more than
    one (the replays are independent and deterministic: the same runs, sooner on several cores)."""
    cfg, workload, _, initial = args[:4]
    wait_cost = (args[6] or KaleConfig()).wait_cost
    references = {"offline": (offline_optimum, (workload.arrivals, cfg, initial)),
                  "priced": (priced_optimum, (workload.arrivals, cfg, initial, wait_cost))} if offline else {}
    if jobs <= 1 or len(names) <= 1:
        runs = {name: _replay_named(name, *args, progress=bar) for name in names}
        return runs, {key: fn(*fargs) for key, (fn, fargs) in references.items()}
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(min(jobs, len(names)), mp_context=get_context("fork")) as pool:
        # Longest first: Kale's replays, then the optima, then the rest fill in beside them.
        slow = [n for n in names if n.split("@")[0] in ("kale", "oracle", "kale-rules")]
        futures = {name: pool.submit(_replay_named, name, *args) for name in slow}
        optima = {key: pool.submit(fn, *fargs) for key, (fn, fargs) in references.items()}
        futures |= {name: pool.submit(_replay_named, name, *args) for name in names if name not in futures}
        for future in futures.values():
            if bar is not None:
                future.add_done_callback(lambda f: bar.update(len(f.result().backlog)))
        return {name: futures[name].result() for name in names}, {key: f.result() for key, f in optima.items()}


def simulate(trace: Trace, policies=ALL_POLICIES, cfg: SimConfig | None = None, forecaster: str = "seasonal",
             forecaster_kwargs: dict | None = None, progress: bool = False,
             kale_config: KaleConfig | None = None, offline: bool = True, jobs: int = 1) -> SimulationResult:
    """Run the protocol for several policies (names of ``ALL_POLICIES`` or ``VARIANTS``) on
    one trace; ``offline`` adds the offline and the priced optimum to the limits (the latter at
    ``kale_config``'s ``wait_cost``); ``jobs`` > 1 replays the
    policies in that many forked processes (same results)."""
    cfg = cfg or SimConfig()
    started = time.perf_counter()
    workload = build_workload(trace, cfg)
    rng = np.random.default_rng(cfg.seed)
    noise = np.maximum(0.5, 1 + cfg.cluster.noise_sd * rng.standard_normal(len(workload.arrivals)))
    initial = cfg.limits.clamp(cfg.initial_workers if cfg.initial_workers is not None else
                               cfg.cluster.workers_for(workload.arrivals[0] / cfg.tick_s * 1.2, cfg.max_workers))
    bar = None
    if progress:
        from tqdm import tqdm  # progress bars are a UI concern; tqdm does no I/O beyond stderr

        bar = tqdm(total=len(workload.arrivals) * len(policies), unit="tick", unit_scale=True, desc=trace.name)
    args = (cfg, workload, noise, initial, forecaster, forecaster_kwargs, kale_config)
    # One BLAS thread: the replays' small matrix products gain nothing from more, and idle
    # OpenBLAS threads spin on the cores the other replays need (twice the CPU time).
    with threadpool_limits(limits=1, user_api="blas"):
        runs, optima = _replay_all(tuple(policies), jobs, bar, args, offline)
    if bar is not None:
        bar.close()
    return SimulationResult(trace.name, cfg, workload, runs, fluid_gpu_hours(workload.arrivals, cfg), forecaster,
                            time.perf_counter() - started, optima.get("offline", {}), optima.get("priced", {}))


def best_variant(policies: dict, base: str, slo_rate: float, slack: float = 0.01) -> str | None:
    """The best variant of baseline ``base`` among ``policies`` (name -> metrics): lowest
    GPU-hours among its variants whose SLO violation rate is within ``slack`` (1 point) of
    ``slo_rate``; with none that close, the one with the lowest violation rate."""
    names = [n for n in policies if n == base or n.startswith(base + "@")]
    if not names:
        return None
    close = [n for n in names if policies[n]["slo_violation_rate"] <= slo_rate + slack]
    if close:
        return min(close, key=lambda n: policies[n]["gpu_hours"])
    return min(names, key=lambda n: (policies[n]["slo_violation_rate"], policies[n]["gpu_hours"]))
