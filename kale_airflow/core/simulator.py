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
  ticks above ``slo_s``, downtime, GPU-hours, rescales; the fluid bound.
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

from kale_airflow.core.errors import KaleError
from kale_airflow.core.forecast import get_forecaster
from kale_airflow.core.policies import (
    AutopilotPolicy,
    HPAPolicy,
    KEDAConfig,
    KEDAPolicy,
    Limits,
    Observation,
    StaticPolicy,
    make_online_kale,
)
from kale_airflow.core.policies.kale import KaleConfig, KalePolicy, KnownCapacity, OracleForecastSource
from kale_airflow.core.shards import ShardModel, zipf_shares
from kale_airflow.core.throughput import ClusterModel
from kale_airflow.core.traffic import Trace

ONLINE_POLICIES = ("kale", "hpa", "keda", "autopilot", "static")
ALL_POLICIES = ONLINE_POLICIES + ("oracle",)


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
    keda_lag_threshold_s: float = 60.0
    shard_skew: float | None = None
    shard_partitions: int = 128
    shard_assignment: str = "rebalance"

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
    p99 = float(np.percentile(trace.rates, 99))
    if p99 <= 0:
        raise SimulationError(f"trace {trace.name} has a zero 99th-percentile rate; nothing to scale to")
    scale = cfg.cluster.capacity(cfg.ref_workers) / p99  # samples/s per trace rate unit
    hist_steps = int(round(cfg.history_days * 86400 / trace.step_s))
    if len(trace.series) - hist_steps < 1:
        raise SimulationError(
            f"trace {trace.name} covers {trace.duration_s / 86400:.1f} days; it needs history_days "
            f"({cfg.history_days}) plus something to evaluate: lower history_days"
        )
    eval_values = trace.values[hist_steps:]
    if cfg.days is not None:
        eval_values = eval_values[: int(round(cfg.days * 86400 / trace.step_s))]
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
    r = cfg.cluster.capacity(n) * np.maximum(0.5, 1 + cfg.cluster.noise_sd * rng.standard_normal(n.size))
    return n, r


def fluid_gpu_hours(arrivals: np.ndarray, cfg: SimConfig) -> float:
    """GPU-hours of exactly enough (fractional, >= min_workers) workers per tick, free rescales."""
    n = cfg.cluster.workers_for_fractional(arrivals / cfg.tick_s)
    n = np.clip(n, cfg.min_workers, cfg.max_workers)
    return float(n.sum() * cfg.tick_s / 3600.0)


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
        obs = Observation(now, self.n, self.rate, self.backlog if k else 0.0, self.fresh if k else 0.0, self.util,
                          self.tput, self.down_rem > 0)
        s = time.perf_counter()
        d = policy.decide(obs)
        self.decide_ms.append((time.perf_counter() - s) * 1e3)
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

    def to_dict(self) -> dict:
        """The JSON document of ``kale simulate --json``."""
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
            "policies": {name: run.metrics | {"reasons": run.reasons} for name, run in self.runs.items()},
            "limits": {"fluid_gpu_hours": self.fluid_gpu_hours},
            "wall_s": self.wall_s,
        }


def build_policy(name: str, cfg: SimConfig, workload: Workload, forecaster: str = "seasonal",
                 forecaster_kwargs: dict | None = None, kale_config: KaleConfig | None = None):
    """Construct a policy by name with what it may know: past history and profiling only.

    ``static`` and ``oracle`` are references, not deployable policies: static is sized
    for the evaluation window's peak, the oracle reads the true future and cluster.
    """
    limits = cfg.limits
    profile = profile_observations(cfg)
    kcfg = replace(kale_config or KaleConfig(), slo_s=cfg.slo_s, rescale_downtime_s=cfg.rescale_downtime_s)
    if name == "kale":
        model = get_forecaster(forecaster, **(forecaster_kwargs or {}))
        # Heavy forecasters (a separate forecast step, no array fast path) retrain daily and
        # re-forecast every 15 minutes, like the retrain DAG and the autoscaler would; cheap
        # ones refit each bin.
        heavy = model.supports_forecast and not model.supports_fit_values
        return make_online_kale(limits, model, profile, kcfg, history=workload.history,
                                refresh_every_s=900.0 if heavy else None, retrain_every_s=86400.0 if heavy else None)
    if name == "hpa":
        return HPAPolicy(limits)
    if name == "keda":
        per_worker = float(np.mean(profile[1][profile[0] == profile[0].min()]) / profile[0].min())
        return KEDAPolicy(limits, KEDAConfig(lag_threshold=per_worker * cfg.keda_lag_threshold_s))
    if name == "autopilot":
        return AutopilotPolicy(limits)
    if name == "static":
        peak = float(workload.arrivals.max()) / cfg.tick_s
        return StaticPolicy(limits.clamp(cfg.cluster.workers_for(peak, limits.upper)))
    if name == "oracle":
        source = OracleForecastSource(workload.start_s, cfg.tick_s, workload.arrivals / cfg.tick_s)
        capacity = KnownCapacity(cfg.cluster.capacity_table(limits.upper))
        return KalePolicy(limits, source, capacity, kcfg, name="oracle")
    raise SimulationError(f"unknown policy {name!r}; choose from {', '.join(ALL_POLICIES)}")


def simulate(trace: Trace, policies=ALL_POLICIES, cfg: SimConfig | None = None, forecaster: str = "seasonal",
             forecaster_kwargs: dict | None = None, progress: bool = False,
             kale_config: KaleConfig | None = None) -> SimulationResult:
    """Run the protocol for several policies on one trace."""
    cfg = cfg or SimConfig()
    started = time.perf_counter()
    workload = build_workload(trace, cfg)
    rng = np.random.default_rng(cfg.seed)
    noise = np.maximum(0.5, 1 + cfg.cluster.noise_sd * rng.standard_normal(len(workload.arrivals)))
    initial = cfg.limits.clamp(cfg.cluster.workers_for(workload.arrivals[0] / cfg.tick_s * 1.2, cfg.max_workers))
    bar = None
    if progress:
        from tqdm import tqdm  # progress bars are a UI concern; tqdm does no I/O beyond stderr

        bar = tqdm(total=len(workload.arrivals) * len(policies), unit="tick", unit_scale=True, desc=trace.name)
    runs = {}
    for name in policies:
        policy = build_policy(name, cfg, workload, forecaster, forecaster_kwargs, kale_config)
        shards = None
        if cfg.shard_skew is not None:
            shards = ShardModel(zipf_shares(cfg.shard_partitions, cfg.shard_skew, cfg.seed + 2), cfg.shard_assignment)
        runs[name] = run_policy(policy, workload, cfg, noise, initial, bar, shards)
    if bar is not None:
        bar.close()
    return SimulationResult(trace.name, cfg, workload, runs, fluid_gpu_hours(workload.arrivals, cfg), forecaster,
                            time.perf_counter() - started)
