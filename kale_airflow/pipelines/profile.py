"""Profile the training job: run it at a few world sizes and let it record its own throughput.

A new deployment has no throughput observations, and the throughput model is fitted only on
measured ones (the refit refuses otherwise). ``kale profile`` (and ``kale demo``) start the
reference training job at each world size the way a local generation is started: one job
supervisor (:class:`~kale_airflow.runtime.backends.LocalWorkers`), one process per rank, the
deployment's batch size, step time and device. The job's rank 0 records its samples/s in the
control plane as every running job does; nothing here writes a number.

Each size's job

- reads the stream from its start under a consumer group of its own
  (``<group>-profile-<stamp>-<n>w``): it trains on the backlog at full speed and moves no
  commit the deployment's workers read;
- checkpoints into a folder that is removed afterwards (a profile's model is thrown away);
- runs with ``--profiling``: no heartbeats, and the deployment's generations never stop it.

A job records only windows in which no rank ran dry (a starved job measures traffic, not
capacity), so a stream without enough backlog yields fewer observations, or none; the
profile says so and how much to produce, and never records a zero. A rank also reads an
equal share of its batch from each of its slices, so once its smallest slice is used up its
batches shrink and its records fall below the job's capacity without any rank running dry:
each size is measured only while every slice still holds data (:func:`full_batch_s`).
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from kale_airflow.config import Config
from kale_airflow.core.errors import KaleError
from kale_airflow.core.rebalance import assign
from kale_airflow.core.slices import slices_for
from kale_airflow.store.database import masked

JOINED = "joined a job of"  # rank 0 logs this line once its process group is up (runtime/worker.py)
FRESH_HEARTBEAT_S = 120.0
BUNDLED_SAMPLES_PER_STEP = 15_500  # mean samples per step of the bundled trace at --scale 1


class ProfileError(KaleError, ValueError):
    """Profiling cannot start or cannot measure; the message says what to do."""


@dataclass(frozen=True)
class ProfileOptions:
    """What a profile runs: the world sizes, how long each is measured after its job's first
    record, how often the job records, and how long a job may take to start."""

    workers: tuple[int, ...] = (1, 2, 4)
    seconds_per_size: float = 30.0
    report_every_s: float = 5.0
    startup_timeout_s: float = 300.0
    stream_url: str | None = None  # None: the deployment's stream

    def __post_init__(self):
        if not self.workers or any(int(n) != n or n < 1 for n in self.workers):
            raise ProfileError(f"world sizes must be whole numbers >= 1, got {list(self.workers)}")
        if len(set(self.workers)) < len(self.workers):
            raise ProfileError(f"world size listed twice in {list(self.workers)}")
        for name in ("seconds_per_size", "report_every_s", "startup_timeout_s"):
            if not getattr(self, name) > 0:
                raise ProfileError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass
class SizeResult:
    """What the job recorded at one world size (``samples_per_s``: the median of its records)."""

    workers: int
    observations: int
    samples_per_s: float | None
    startup_s: float | None  # from the start of the processes to rank 0's process group
    measured_s: float
    note: str = ""

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return asdict(self)


def stream_backlog(stream) -> dict[int, int]:
    """Samples stored per partition (end offsets: what a consumer group new to it can read)."""
    return {int(p): int(n) for p, n in stream.end_offsets().items()}


def full_batch_s(assignment: dict, backlog: dict[int, int], rate: float) -> float:
    """Seconds a job training ``rate`` samples/s keeps full batches on this backlog: rank r
    reads rate / (n * |its slices|) samples/s from each slice, so the slice that runs out
    first holds the least per share read."""
    n = len(assignment["assignment"])
    out = math.inf
    for rank in range(n):
        mine = slices_for(assignment, rank)
        for sl in mine:
            out = min(out, (sl.hi - sl.lo) * backlog.get(sl.partition, 0) * n * len(mine) / max(rate, 1e-9))
    return out


def producer_hint(stream_url: str, samples: int | None = None) -> str:
    """How to fill a stream with enough samples: the embedded producer for an embedded stream."""
    if not stream_url.startswith("sqlite:///"):
        return ("profile when the topic holds more backlog (the job reads it from the start and must not run dry), "
                "or with fewer --seconds-per-size")
    steps = 48 if samples is None else max(48, math.ceil(samples / BUNDLED_SAMPLES_PER_STEP))
    return (f"fill it with the embedded producer (synthetic samples replayed from the bundled trace): "
            f"python -m kale_airflow.runtime.producer --stream {stream_url} --steps {steps} --skew 0 --no-sleep "
            "(--skew 0: the same backlog in every partition, so no slice runs out first)")


def check_no_workers_running(store, now: float) -> None:
    """Refuse to profile while the deployment's workers train: their records and the profile's
    would mix at the same world sizes (the autoscaler reads the newest at its worker count)."""
    fresh = sorted({g for g, _, rec in store.running_workers() if now - float(rec.get("heartbeat", 0)) <= FRESH_HEARTBEAT_S})
    if fresh:
        raise ProfileError(f"workers of generation(s) {', '.join(fresh)} are training (heartbeat within "
                           f"{FRESH_HEARTBEAT_S:g} s): profiling now would mix their throughput records with the "
                           "profile's; profile before the first generation starts, or while none runs")


def profile_job(config: Config, options: ProfileOptions, say: Callable[[str], None] = print) -> list[SizeResult]:
    """Run the training job at each world size of ``options`` and return what it recorded."""
    from kale_airflow.metrics.embedded import EmbeddedMetrics
    from kale_airflow.store import StateStore
    from kale_airflow.stream import open_stream

    env, dep = config.settings, config.deployment
    url = options.stream_url or dep.stream_url
    check_no_workers_running(StateStore(env.database_url, config.job), time.time())
    backlog = stream_backlog(open_stream(url))
    if not sum(backlog.values()):
        raise ProfileError(f"the stream {url} holds no samples ({len(backlog)} partition(s)): the job would train on "
                           f"nothing and record no throughput; {producer_hint(url)}, then run kale profile again")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    say(f"profiling the training job at world size(s) {', '.join(map(str, options.workers))} on {url} "
        f"({sum(backlog.values()):,} samples in {len(backlog)} partition(s)); records go to "
        f"{masked(env.database_url)}; logs in {env.worker_logs}")
    run = _SizeRun(config, options, url, backlog, stamp, EmbeddedMetrics(env.database_url, config.job), say)
    results = []
    for i, n in enumerate(options.workers):
        prefix = f"[{i + 1}/{len(options.workers)}] {n} worker(s):"
        say(f"{prefix} starting the job")
        r = run(n, prefix)
        results.append(r)
        rate = "no record" if r.samples_per_s is None else f"{r.samples_per_s:,.0f} samples/s (median)"
        say(f"{prefix} {rate}, {r.observations} observation(s) over {r.measured_s:.0f} s"
            + (f"; {r.note}" if r.note else ""))
    return results


class _SizeRun:
    """Runs the job at one world size at a time, with what every size shares."""

    def __init__(self, config: Config, options: ProfileOptions, url: str, backlog: dict[int, int], stamp: str,
                 metrics, say: Callable[[str], None]):
        self.config, self.options, self.url, self.backlog = config, options, url, backlog
        self.stamp, self.metrics, self.say = stamp, metrics, say

    def __call__(self, n: int, prefix: str) -> SizeResult:
        from kale_airflow.runtime.backends import LocalWorkers, WorkerSpec

        env, dep, opt = self.config.settings, self.config.deployment, self.options
        generation = f"profile-{self.stamp}-{n}w"
        checkpoints = env.home / "profile" / generation
        extra = ["--profiling", "--report-every", f"{opt.report_every_s:g}"]
        extra += ["--step-time", str(dep.worker_step_time_s)] if dep.worker_step_time_s else []
        spec = WorkerSpec(self.url, str(checkpoints), f"{dep.group}-{generation}", env.database_url,
                          dep.worker_batch_size, extra, device=dep.worker_device, amp=dep.worker_amp,
                          trainer=dep.trainer)
        # Slices sized by the samples each partition holds, so every rank's share lasts as long.
        doc = assign({str(p): float(max(1, k)) for p, k in self.backlog.items()}, n).to_dict()
        workers = LocalWorkers(spec, env.worker_logs)
        t0 = time.time()
        workers.start(generation, doc)
        try:
            startup, measured, note = self._measure(n, workers, env.worker_logs / f"{generation}-worker-0.log", t0,
                                                    doc, prefix)
        finally:
            workers.stop()
            shutil.rmtree(checkpoints, ignore_errors=True)
        recs = self._records(n, t0)  # after the stop: the job may record once more while it stops
        rate = float(recs["rate"].median()) if len(recs) else None
        return SizeResult(n, len(recs), rate, startup, measured, note)

    def _records(self, n: int, t0: float):
        obs = self.metrics.throughput_observations(since=t0)
        return obs[obs["workers"] == n]

    def _measure(self, n: int, workers, log: Path, t0: float, doc: dict,
                 prefix: str) -> tuple[float | None, float, str]:
        """Poll the job's records until the size is measured, the job ended, starved or never
        started; returns (startup seconds, seconds measured, note)."""
        opt = self.options
        quiet_s = max(4 * opt.report_every_s, 15.0)  # a job with data records every report_every_s
        startup = first = None
        note, deadline = "", t0 + opt.startup_timeout_s
        while True:
            time.sleep(0.5)
            now, recs = time.time(), self._records(n, t0)
            if startup is None and log.exists() and JOINED in log.read_text(errors="replace"):
                startup = now - t0
                deadline = now + quiet_s if first is None else deadline  # it trains: a record is due
            if len(recs):
                if first is None:
                    first = float(recs["ts"].min())
                    self.say(f"{prefix} training ({recs['rate'].iloc[0]:,.0f} samples/s in the first record); "
                             f"measuring for {opt.seconds_per_size:g} s")
                deadline, note = self._horizon(first, float(recs["rate"].max()), doc)
            code = workers.procs[0].poll() if workers.procs else None
            if code is not None:
                note = f"the job ended with exit code {code}; see {log.parent / log.name.replace('-0.log', '-*.log')}"
                break
            if first is not None and now - float(recs["ts"].max()) > quiet_s:
                note = self._starved(float(recs["rate"].median()))
                break
            if now >= deadline:
                if first is None:
                    note = (self._starved(None) if startup is not None else
                            f"the job did not start within {opt.startup_timeout_s:g} s; see {log}")
                break
        return startup, 0.0 if first is None else max(0.0, min(time.time(), deadline) - first), note

    def _horizon(self, first: float, rate: float, doc: dict) -> tuple[float, str]:
        """When to stop measuring: after ``seconds_per_size``, or earlier while every slice still
        holds data (the first record closes the window that began with the job's first step)."""
        opt = self.options
        full_until = first - opt.report_every_s + 0.9 * full_batch_s(doc, self.backlog, rate)
        if full_until >= first + opt.seconds_per_size:
            return first + opt.seconds_per_size, ""
        return full_until, (f"measured {max(0.0, full_until - first):.0f} s only: at this rate the stream's smallest "
                            f"slice runs out after that; {producer_hint(self.url, self._need(rate))}")

    def _need(self, rate: float) -> int:
        """Samples a full profile needs at ``rate`` (every size reads the stream from its start)."""
        return int(1.5 * rate * (self.options.seconds_per_size + self.options.report_every_s))

    def _starved(self, rate: float | None) -> str:
        """Why a job that trained stopped recording, and how much backlog a full profile needs."""
        held, opt = sum(self.backlog.values()), self.options
        if rate is None:  # it emptied the stream within one report window: faster than held / window
            when, need = "trained but recorded nothing: the backlog ran out within one report window", \
                self._need(held / opt.report_every_s)
        else:
            when, need = "stopped recording: the backlog ran out", self._need(rate)
        return (f"the job {when} ({held:,} samples in the stream; about {need:,} needed at this rate); "
                f"{producer_hint(self.url, need)}")
