"""Generations of training workers: apply a decision, rebalance a generation, hand over offsets.

A *generation* is one set of workers with one shard assignment. Applying a scaling
decision names a new generation in the control store (the running workers see it,
checkpoint and exit); rebalancing assigns the stream's partitions to the new
generation's workers and commits each new slice's start offset where the previous
generation's slices stopped *before* publishing the assignment, so whoever reads the
assignment (workers, the autoscaler's backlog) finds its offsets in place.
"""

from __future__ import annotations

import logging
import time

from kale_airflow.config import Config
from kale_airflow.core.errors import KaleError
from kale_airflow.core.rebalance import RebalanceOptions, assign
from kale_airflow.core.slices import slices_for
from kale_airflow.store import StateStore

log = logging.getLogger(__name__)
ASSIGNMENT = "default"
STALE_HEARTBEAT_S = 30.0  # workers beat every report (5 s): silence this long means the process is gone


def handover(stream, group: str, previous: dict | None, assignment: dict) -> dict[str, int]:
    """Start positions for the slices of a new generation, committed before its workers start.

    Slice boundaries change between generations, and commits are kept per slice. A new
    slice starts at the lowest position reached by the previous slices *whose ranges
    overlap it* (only they held its offsets), so no sample is skipped and little is
    re-read. A slice whose range existed in an older generation (4 -> 6 -> 4 workers)
    still has that generation's stale commit; the later of the two positions wins (the
    offsets below either were trained), and a commit is never moved back, so running the
    handover again is harmless. Returns {group key: new offset} for the moved commits."""
    old: dict[int, list[tuple[float, float, int]]] = {}
    if previous:
        for w in previous.get("assignment", previous):
            for sl in slices_for(previous, int(w)):
                pos = stream.committed(f"{group}/{sl.group_suffix}", sl.partition)
                old.setdefault(sl.partition, []).append((sl.lo, sl.hi, pos))
    out = {}
    for w in assignment.get("assignment", assignment):
        for sl in slices_for(assignment, int(w)):
            key = f"{group}/{sl.group_suffix}"
            overlapping = [pos for lo, hi, pos in old.get(sl.partition, []) if lo < sl.hi and sl.lo < hi]
            current = stream.committed(key, sl.partition)
            if overlapping and min(overlapping) > current:
                out[key] = min(overlapping)
                stream.commit(key, {sl.partition: out[key]})
    return out


class GenerationError(KaleError, ValueError):
    """A generation cannot be (re)assigned or started as asked; the message says what to do."""


class Generations:
    """The manager of worker generations (operators call it; it holds the flows)."""

    def __init__(self, config: Config, store: StateStore | None = None, logger: logging.Logger | None = None):  # pragma: no mutate block
        self.config = config
        self.store = store or StateStore(config.settings.database_url)
        self.log = logger or log

    # -------------------------------------------------------------- decisions
    def apply(self, decision: dict, run_id: str, now: float | None = None) -> dict:  # pragma: no mutate block
        """Turn a sensor's decision into a new generation (idempotent per decision).

        Returns ``{"skip", "workers", "generation"}``: the conf of the training run to start."""
        cur = self.store.current()
        target = int(decision["workers"])
        key = f"{decision.get('current')}->{target}@{run_id}"
        applied = self.store.get_value("last_applied") or {}
        running = cur["workers"] if cur else 0
        if decision.get("status") != "scale" or running == target or applied.get("key") == key:
            self.log.info("nothing to apply (%s): %s workers running, decision %s", decision.get("status"), running,
                          target)
            return {"skip": True, "workers": target, "generation": cur["generation"] if cur else None}
        generation = f"g{int(time.time() if now is None else now)}-{target}w"
        self.log.info("scaling %s -> %d workers (%s): %s; new generation %s", running, target,
                      decision.get("reason"), decision.get("message"), generation)
        self.store.set_current_generation(generation, target)
        self.store.set_value("last_applied", {"key": key, "generation": generation})
        return {"skip": False, "workers": target, "generation": generation}

    # ------------------------------------------------------------- rebalancing
    def rebalance(self, generation: str, workers: int, split: bool = True, name: str = ASSIGNMENT) -> dict:
        """Assign the stream's partitions to ``workers`` workers for ``generation``; idempotent.

        Rates come from the stream (every partition, idle ones included) or, without one,
        the metrics source; the previous generation's assignment keeps moves small."""
        existing = self.store.get(name, generation)
        if existing is not None:
            if existing["workers"] != workers:
                raise GenerationError(
                    f"generation {generation} already has an assignment for {existing['workers']} workers, not "
                    f"{workers}; start a new generation (a new training DAG run) to change the worker count")
            self.log.info("generation %s already assigned (%d workers): nothing to do", generation, workers)  # pragma: no mutate
            return _summary(generation, existing, reused=True)
        from kale_airflow.metrics.embedded import open_metrics
        from kale_airflow.stream import open_stream

        dep, env = self.config.deployment, self.config.settings
        stream = open_stream(dep.stream_url)
        rates = self._stream_rates(stream) or open_metrics(env.metrics_source, env.database_url).partition_rates()
        prev = self.store.latest(name, before=generation)
        previous_doc = {"assignment": prev[1]["assignment"]} if prev else None
        if prev:  # its workers must have checkpointed and stopped: never two generations on one slice
            self.await_stopped(prev[0])
        result = assign(rates, workers, previous_doc, RebalanceOptions(split=split))
        doc = result.to_dict(split=split)
        self._log_moves(prev, doc, result)
        if previous_doc and stream.partitions():
            starts = handover(stream, dep.group, previous_doc, doc)
            # pragma: no mutate start
            self.log.info("handover: %d slice(s) start where the previous generation's slices stopped: %s",
                          len(starts), ", ".join(f"{k}@{v}" for k, v in sorted(starts.items())[:20]))
            # pragma: no mutate end
        if not self.store.put(name, generation, workers, doc):  # a concurrent run won: use its result
            doc = self.store.get(name, generation)
        return _summary(generation, doc, reused=False)

    def await_stopped(self, generation: str, poll_s: float = 0.5) -> None:
        """Wait until every worker of ``generation`` that ever ran has stopped (or is dead:
        no heartbeat for ``STALE_HEARTBEAT_S``); raise after ``handover_timeout_s``, so the
        task fails and retries rather than start workers on slices that are still trained."""
        deadline = time.monotonic() + self.config.deployment.handover_timeout_s
        while True:
            now = time.time()
            running = sorted(w for w, rec in self.store.workers_seen(generation).items()
                             if rec["state"] == "running" and now - rec["heartbeat"] < STALE_HEARTBEAT_S)
            if not running:
                return
            if time.monotonic() > deadline:
                raise GenerationError(
                    f"worker(s) {running} of generation {generation} are still training after "
                    f"{self.config.deployment.handover_timeout_s:g} s; they stop when they see the new generation "
                    "(check their logs, or raise handover_timeout_s)")
            self.log.info("waiting for worker(s) %s of generation %s to checkpoint and stop", running, generation)  # pragma: no mutate
            time.sleep(poll_s)

    def assignment(self, generation: str, name: str = ASSIGNMENT) -> dict:
        """The assignment document a generation was given (rebalance it first)."""
        doc = self.store.get(name, generation)
        if doc is None:
            raise GenerationError(f"generation {generation} has no assignment yet; run its rebalance task first")
        return doc

    # ------------------------------------------------------------------ workers
    def start_local(self, generation: str) -> list[int]:  # pragma: no mutate block
        """Start the generation's distributed job (one local process per rank, 127.0.0.1
        rendezvous, one supervisor restarting every rank when one dies); returns the
        supervisor's pid."""
        from kale_airflow.runtime.backends import LocalWorkers, WorkerSpec

        env, dep = self.config.settings, self.config.deployment
        step = ["--step-time", str(dep.worker_step_time_s)] if dep.worker_step_time_s else []
        spec = WorkerSpec(dep.stream_url, str(env.checkpoints), dep.group, env.database_url, dep.worker_batch_size,
                          step, device=dep.worker_device, amp=dep.worker_amp)
        return LocalWorkers(spec, env.worker_logs).start(generation, self.assignment(generation))

    def pod_arguments(self, generation: str) -> list[list[str]]:  # pragma: no mutate block
        """The rank command's arguments for each pod of the generation (the image runs ``python``).

        The pods rendezvous through the control-plane database: rank 0 publishes its pod IP
        (``KALE_POD_IP``, from the downward API) and ``RENDEZVOUS_PORT``; the others read it."""
        from kale_airflow.runtime.backends import WorkerSpec
        from kale_airflow.runtime.kubernetes import CHECKPOINT_MOUNT, RENDEZVOUS

        dep = self.config.deployment
        doc = self.assignment(generation)
        step = ["--step-time", str(dep.worker_step_time_s)] if dep.worker_step_time_s else []
        spec = WorkerSpec(dep.stream_url, CHECKPOINT_MOUNT, dep.group, batch_size=dep.worker_batch_size,
                          extra_args=step, device=dep.worker_device, amp=dep.worker_amp)
        n = len(doc["assignment"])
        return [spec.command(generation, w, n, {"assignment": doc["assignment"]}, rendezvous=RENDEZVOUS)[1:]
                for w in range(n)]

    def _stream_rates(self, stream, window_s: float = 300.0) -> dict[str, float] | None:
        """Samples/s per partition over the last ``window_s``; None when the stream has no partitions."""
        parts = stream.partitions()
        if not parts:
            return None
        now = time.time()
        counts = stream.arrivals(now - window_s, now)
        self.log.info("partition rates from the stream over the last %.0f s", window_s)  # pragma: no mutate
        return {str(p): counts.get(p, 0) / window_s for p in parts}

    def _log_moves(self, prev, doc: dict, result) -> None:  # pragma: no mutate block
        self.log.info("%d partitions over %d workers: imbalance %.4f (lower bound %.4f)", len(result.rates),
                      result.n_workers, doc["imbalance"], doc["imbalance_lower_bound"])
        if prev is None:
            self.log.info("first generation: nothing to move")
            return
        before = {p: int(w) for w, items in prev[1]["assignment"].items() for p, s in items}
        after = {p: int(w) for w, items in doc["assignment"].items() for p, s in items}
        moved = sorted(p for p in after if before.get(p) != after[p])
        self.log.info("from generation %s (%d workers): moved %.2f%% of the rate (minimum %.2f%%), %d partition(s) "
                      "changed owner: %s", prev[0], prev[1]["workers"], 100 * doc["moved_fraction"],
                      100 * doc["moved_fraction_lower_bound"], len(moved), ", ".join(moved[:20]) +
                      (" ..." if len(moved) > 20 else ""))
        for note in doc["notes"]:
            self.log.info("note: %s", note)


def _summary(generation: str, doc: dict, reused: bool) -> dict:
    return {"generation": generation, "workers": len(doc["assignment"]), "imbalance": doc["imbalance"],
            "moved_fraction": doc["moved_fraction"], "reused": reused}
