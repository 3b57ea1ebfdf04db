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

from kale_airflow.core.forecast import get_forecaster
from kale_airflow.core.policies import (
    AutopilotPolicy, HPAPolicy, KEDAConfig, KEDAPolicy, Limits, Observation, StaticPolicy, make_online_kale,
)
from kale_airflow.core.policies.kale import KaleConfig, KalePolicy, KnownCapacity, OracleForecastSource
from kale_airflow.core.shards import ShardModel, zipf_shares
from kale_airflow.core.throughput import ClusterModel
from kale_airflow.core.traffic import Trace

ONLINE_POLICIES = ("kale", "hpa", "keda", "autopilot", "static")
ALL_POLICIES = ONLINE_POLICIES + ("oracle",)


class SimulationError(ValueError):
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


def run_policy(policy, workload: Workload, cfg: SimConfig, noise: np.ndarray, initial_workers: int,
               progress=None, shards=None) -> PolicyRun:
    """Replay the workload through one policy (the protocol's tick loop).

    ``shards`` (a :class:`~kale_airflow.core.shards.ShardModel`) switches to per-partition
    backlog with per-worker capacity; freshness is then its estimate."""
    tick = cfg.tick_s
    arrivals = workload.arrivals.tolist()
    noise_l = noise.tolist()
    cap_table = cfg.cluster.capacity_table(cfg.max_workers).tolist()
    limits = cfg.limits
    T = len(arrivals)
    t0 = workload.start_s
    eps = 1e-6

    n = initial_workers
    held = n
    down_rem = 0.0
    backlog = 0.0
    cum_arr: list[float] = []
    cum_a = 0.0
    cum_p = 0.0
    next_decide = t0
    interval = policy.interval_s
    rate = util = tput = fresh = None
    workers_l, cap_l, backlog_l, fresh_l = [], [], [], []
    events: list[dict] = []
    reasons: Counter = Counter()
    decide_ms: list[float] = []
    downtime = gpu_s = 0.0
    perf = time.perf_counter
    for k in range(T):
        now = t0 + k * tick
        if now >= next_decide - 1e-9:
            obs = Observation(now, n, rate, backlog if k else 0.0, fresh if k else 0.0, util, tput, down_rem > 0)
            s = perf()
            d = policy.decide(obs)
            decide_ms.append((perf() - s) * 1e3)
            reasons[d.reason.value] += 1
            target = limits.clamp(d.workers)
            if target != n:
                events.append({"t": now, "from": n, "to": target, "reason": d.reason.value, "message": d.message})
                held = max(n, target)
                n = target
                down_rem = cfg.rescale_downtime_s
            next_decide = now + interval if interval != float("inf") else float("inf")
        down = down_rem if down_rem < tick else tick
        down_rem -= down
        downtime += down
        avail = tick - down
        gpu_s += held * down + n * avail
        cap_rate = cap_table[n] * noise_l[k]
        cap = cap_rate * avail
        a = arrivals[k]
        if shards is not None:
            proc, backlog, fresh = shards.step(a, cap, n, tick)
        else:
            total = backlog + a
            proc = total if total < cap else cap
            backlog = total - proc
        cum_a += a
        cum_p += proc
        cum_arr.append(cum_a)
        if shards is None:
            if backlog > eps:
                j = bisect_right(cum_arr, cum_p)
                prev = cum_arr[j - 1] if j else 0.0
                aj = arrivals[j]
                born = t0 + j * tick + ((cum_p - prev) / aj * tick if aj > 0 else 0.0)
                fresh = now + tick - born
            else:
                fresh = 0.0
        rate = a / tick
        util = proc / cap if cap > 0 else None
        tput = cap_rate if avail > 0 else None
        workers_l.append(held if down > 0 else n)
        cap_l.append(cap_rate)
        backlog_l.append(backlog)
        fresh_l.append(fresh)
        if progress is not None and k % 4096 == 4095:
            progress.update(4096)
    if progress is not None:
        progress.update(T % 4096)

    backlog_a = np.asarray(backlog_l)
    fresh_a = np.asarray(fresh_l)
    total_samples = float(workload.arrivals.sum())
    acc_lag = float(backlog_a.sum() * tick)
    metrics = {
        "accumulated_lag": acc_lag,
        "mean_wait_s": acc_lag / total_samples if total_samples else 0.0,
        "downtime_s": downtime,
        "slo_violation_rate": float((fresh_a > cfg.slo_s).mean()),
        "gpu_hours": gpu_s / 3600.0,
        "rescales": len(events),
        "max_freshness_lag_s": float(fresh_a.max()),
        "p99_freshness_lag_s": float(np.percentile(fresh_a, 99)),
        "final_backlog": float(backlog_a[-1]),
        "decide_p99_ms": float(np.percentile(decide_ms, 99)) if decide_ms else 0.0,
    }
    return PolicyRun(policy.name, metrics, np.asarray(workers_l), np.asarray(cap_l), backlog_a, fresh_a, events,
                     dict(reasons), np.asarray(decide_ms))


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
        # Heavy forecasters (with a separate forecast step) retrain daily and re-forecast
        # every 15 minutes, like the retrain DAG and the autoscaler would; cheap ones refit each bin.
        heavy = hasattr(model, "forecast") and not hasattr(model, "fit_values")
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
