"""The worker's Prometheus metrics and its ``/metrics`` server (``prometheus_client``).

Two calls wire it into a worker process::

    exposition.serve(port, worker=worker_id, generation=generation, workers=total,
                     restored=restored_from is not None, job=job)  # once, at start
    exposition.observe_step(samples, seconds, lag=..., malformed=bad)  # after each step

``serve(None)`` (no ``--metrics-port`` / ``KALE_METRICS_PORT``) serves nothing but still
counts, so the calls are harmless everywhere. Series (every one labelled ``kale_job``,
``worker``, ``generation`` and ``workers``, the generation's size):

=====================================================  =========  ==========================================
``kale_worker_samples_trained_total``                  counter    samples trained
``kale_worker_steps_total``                            counter    training steps that trained samples
``kale_worker_step_duration_seconds``                  histogram  wall time of a step (read, train, commit)
``kale_worker_throughput_samples_per_second``          gauge      samples per second of step time, last ~10 s
``kale_worker_consumer_lag_samples``                   gauge      samples behind the stream end, per ``slice``
``kale_worker_restores_total``                         counter    starts that restored a checkpoint
``kale_worker_malformed_samples_total``                counter    malformed samples skipped
``kale_worker_generation_workers``                     gauge      workers in this worker's generation
``kale_worker_last_step_timestamp_seconds``            gauge      when the last step that trained ended
=====================================================  =========  ==========================================

Cluster throughput of a job (what the Prometheus metrics source reads):
``avg by (workers) (rate(kale_worker_samples_trained_total{kale_job="J"}[1m]) /
rate(kale_worker_step_duration_seconds_sum{kale_job="J"}[1m])) * max by (workers)
(kale_worker_generation_workers{kale_job="J"})``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kale_airflow.core.jobs import DEFAULT_JOB

PORT_ENV = "KALE_METRICS_PORT"
# ``kale_job``: the deployment's job (``job`` itself is the label Prometheus gives each scrape
# target's job, which would rename ours to ``exported_job``).
LABELS = ("kale_job", "worker", "generation", "workers")
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
THROUGHPUT_WINDOW_S = 10.0


class WorkerMetrics:
    """One worker's metric objects in their own registry (tests make several in one process)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.samples = Counter("kale_worker_samples_trained", "Samples trained.", LABELS, registry=r)
        self.steps = Counter("kale_worker_steps", "Training steps that trained samples.", LABELS, registry=r)
        self.step_seconds = Histogram("kale_worker_step_duration_seconds",
                                      "Wall time of one training step: read, train and commit.", LABELS,
                                      buckets=STEP_BUCKETS, registry=r)
        self.throughput = Gauge("kale_worker_throughput_samples_per_second",
                                f"Samples trained per second of step time over the last {THROUGHPUT_WINDOW_S:g} s.",
                                LABELS, registry=r)
        self.lag = Gauge("kale_worker_consumer_lag_samples",
                         "Samples between this worker's committed position and the stream end, per slice.",
                         (*LABELS, "slice"), registry=r)
        self.restores = Counter("kale_worker_restores", "Starts that restored a checkpoint.", LABELS, registry=r)
        self.malformed = Counter("kale_worker_malformed_samples", "Malformed samples skipped.", LABELS, registry=r)
        self.generation_workers = Gauge("kale_worker_generation_workers",
                                        "Workers in this worker's generation.", LABELS, registry=r)
        self.last_step = Gauge("kale_worker_last_step_timestamp_seconds",
                               "Unix time the last step that trained samples ended.", LABELS, registry=r)
        self.labels: dict[str, str] = {"kale_job": DEFAULT_JOB, "worker": "0", "generation": "0", "workers": "1"}
        self._recent: deque[tuple[float, int, float]] = deque()  # (end time, samples, seconds)
        self.server = None

    def identify(self, worker: int | str = 0, generation: str = "0", workers: int = 1, job: str = DEFAULT_JOB) -> None:
        """Set the labels every series carries (call before the first step, and again for every
        generation a warm rank joins: the old generation's size gauge is dropped, so
        ``max by (workers)`` sees only the current one)."""
        old = self.labels
        self.labels = {"kale_job": str(job), "worker": str(worker), "generation": str(generation),
                       "workers": str(int(workers))}
        if old != self.labels:
            try:
                self.generation_workers.remove(*(old[k] for k in LABELS))
            except KeyError:  # never set (the first call)
                pass
        self.generation_workers.labels(**self.labels).set(int(workers))
        for m in (self.samples, self.steps, self.restores, self.malformed):  # export zeros from the start
            m.labels(**self.labels)
        self.step_seconds.labels(**self.labels)

    def serve(self, port: int | None, *, addr: str = "0.0.0.0", worker: int | str = 0, generation: str = "0",
              workers: int = 1, restored: bool = False, job: str = DEFAULT_JOB) -> int | None:
        """Label this worker's series and serve ``/metrics`` on ``port`` (0: any free port;
        None: ``$KALE_METRICS_PORT``, and no server when that is unset). Returns the port."""
        self.identify(worker, generation, workers, job)
        if restored:
            self.restores.labels(**self.labels).inc()
        if port is None and os.environ.get(PORT_ENV):
            port = int(os.environ[PORT_ENV])
        if port is None:
            return None
        self.server, _thread = start_http_server(int(port), addr=addr, registry=self.registry)
        return int(self.server.server_port)

    def observe_step(self, samples: int, seconds: float, lag: float | Mapping[str, float] | None = None,
                     malformed: int = 0, now: float | None = None) -> None:
        """One step: ``samples`` trained in ``seconds`` of wall time; ``lag`` in samples behind
        the stream end (a number, or one per slice); ``malformed`` samples skipped in it."""
        lb = self.labels
        if malformed:
            self.malformed.labels(**lb).inc(malformed)
        if lag is not None:
            for name, value in (lag.items() if isinstance(lag, Mapping) else [("all", lag)]):
                self.lag.labels(**lb, slice=str(name)).set(max(0.0, float(value)))
        if samples <= 0:  # nothing trained: the step measured the stream, not the worker
            return
        now = time.time() if now is None else now
        self.samples.labels(**lb).inc(samples)
        self.steps.labels(**lb).inc()
        self.step_seconds.labels(**lb).observe(max(0.0, seconds))
        self.last_step.labels(**lb).set(now)
        recent = self._recent
        recent.append((now, samples, max(seconds, 1e-9)))
        while recent and recent[0][0] < now - THROUGHPUT_WINDOW_S:
            recent.popleft()
        self.throughput.labels(**lb).set(sum(n for _, n, _ in recent) / sum(s for _, _, s in recent))

    def stop(self) -> None:
        """Stop serving (tests)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


#: The process's metrics (a worker process is one worker).
METRICS = WorkerMetrics()


def serve(port: int | None = None, **identity) -> int | None:
    """:meth:`WorkerMetrics.serve` on the process's metrics."""
    return METRICS.serve(port, **identity)


def observe_step(samples: int, seconds: float, lag: float | Mapping[str, float] | None = None,
                 malformed: int = 0) -> None:
    """:meth:`WorkerMetrics.observe_step` on the process's metrics."""
    METRICS.observe_step(samples, seconds, lag, malformed)
