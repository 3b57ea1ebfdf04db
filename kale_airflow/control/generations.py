"""Generations of training workers: apply a decision, rebalance a generation, hand over offsets.

A *generation* is one set of workers with one shard assignment. Applying a scaling
decision names a new generation in the control store (the running workers see it,
checkpoint and exit); rebalancing assigns the stream's partitions to the new
generation's workers and commits each new slice's start offset where the previous
generation's slices stopped *before* publishing the assignment, so whoever reads the
assignment (workers, the autoscaler's backlog) finds its offsets in place.

Applying is one compare-and-set transaction in the store
(:meth:`~kale_airflow.store.StateStore.apply_generation`): the decision carries the
generation it saw as current, and the new one replaces it only if it still is. Generations
are numbered by a database counter (``g000042-4w``), never the clock, and a decision makes
at most one (a unique key on its identity, :func:`decision_id`), however often its task is
retried or run at once. The training run that starts a generation's workers claims it, so
``apply`` can tell a retry whether its generation still has to be started, and a second
run of the same generation is refused.
"""

from __future__ import annotations

import logging
import time

from kale_airflow.config import Config
from kale_airflow.core.errors import KaleError
from kale_airflow.core.rebalance import RebalanceOptions, assign
from kale_airflow.core.slices import slices_for
from kale_airflow.runtime.elastic import HANDOVER_KEY
from kale_airflow.store import StateStore
from kale_airflow.store.state import AppliedGeneration

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


def slots_to_start(workers: int, seen: dict[int, dict], now: float, stale_s: float = STALE_HEARTBEAT_S) -> list[int]:
    """The slots of a ``workers``-rank generation that need a new pod: every slot except those
    whose rank process waits warm for it (its last heartbeat in the previous generation is a
    fresh ``warm``: it re-joins in place). ``seen``: the previous generation's heartbeats
    (:meth:`~kale_airflow.store.StateStore.workers_seen`)."""
    def warm(slot: int) -> bool:
        rec = seen.get(slot)
        return rec is not None and rec["state"] == "warm" and now - float(rec["heartbeat"]) < stale_s

    return [s for s in range(workers) if not warm(s)]


class GenerationError(KaleError, ValueError):
    """A generation cannot be (re)assigned or started as asked; the message says what to do."""


def decision_id(decision: dict, run_id: str) -> str:
    """A decision's identity, the same on every try of the task that applies it: the run, the
    generation it saw (``?``: the decision does not say), the count it saw, and its target."""
    seen = (decision["current_generation"] or "-") if "current_generation" in decision else "?"
    return f"{run_id}:{seen}:{decision.get('current')}->{int(decision['workers'])}"


def decision_event(autoscaler, now: float | None = None) -> tuple[bool, dict]:
    """One observation and decision of ``autoscaler`` (at ``now``; None: the clock) as the
    event the sensor and the trigger complete with, and whether it is a change (the decided
    count differs from the running one).

    ``current_generation`` is read *before* the observation: should another generation become
    current in between, the decision saw a newer state than it names, and the apply's
    compare-and-set makes it a no-op instead of replacing a generation it did not see."""
    seen = autoscaler.state.current_generation()
    decision, obs = autoscaler.poke(now)
    done = decision.workers != obs.workers
    return done, {"status": "scale" if done else "hold", "current": obs.workers, "current_generation": seen,
                  "shadow": autoscaler.shadow, **decision.to_dict()}


class Generations:
    """The manager of worker generations (operators call it; it holds the flows)."""

    def __init__(self, config: Config, store: StateStore | None = None, logger: logging.Logger | None = None):  # pragma: no mutate block
        self.config = config
        self.store = store or StateStore(config.settings.database_url, config.job)
        self.log = logger or log

    # -------------------------------------------------------------- decisions
    def apply(self, decision: dict, run_id: str, now: float | None = None) -> dict:
        """Turn a sensor's decision into a new generation: one compare-and-set transaction.

        The generation the decision saw (``current_generation``; a decision that does not
        say is compared with the one current now) is replaced only if it is still current;
        otherwise nothing changes. A retry of the same decision (:func:`decision_id`) finds
        the generation the first try made.

        Returns ``{"skip", "workers", "generation", "outcome", "started"}``, the conf of the
        training run to start: ``skip`` is false exactly when the decision's generation exists
        and no training run has started it yet, which includes a retry after the first try
        applied it and then failed."""
        target = int(decision["workers"])
        if decision.get("status") != "scale":
            cur = self.store.current()
            self._log_nothing(decision, cur)
            return {"skip": True, "workers": cur["workers"] if cur else target,
                    "generation": cur["generation"] if cur else None, "outcome": "hold", "started": None}
        expected = (decision["current_generation"] if "current_generation" in decision
                    else self.store.current_generation())
        done = self.store.apply_generation(decision_id(decision, run_id), run_id, expected, target, now)
        self._log_applied(decision, expected, done)
        return {"skip": not done.applied or bool(done.started), "workers": done.workers,
                "generation": done.generation, "outcome": done.outcome, "started": done.started}

    def _log_nothing(self, decision: dict, cur: dict | None) -> None:  # pragma: no mutate block
        self.log.info("nothing to apply (%s): %s workers running", decision.get("status"), cur["workers"] if cur else 0)

    def _log_applied(self, decision: dict, expected: str | None, done: AppliedGeneration) -> None:  # pragma: no mutate block
        if done.outcome == "applied":
            self.log.info("scaling %s -> %d workers (%s): %s; new generation %s replaces %s", decision.get("current"),
                          done.workers, decision.get("reason"), decision.get("message"), done.generation, expected)
        elif done.outcome == "retried":
            self.log.info("decision already applied as generation %s (%s by a training run)", done.generation,
                          "started" if done.started else "not yet started")
        elif done.outcome == "superseded":
            self.log.info("decision made against generation %s, but %s is current now: nothing applied",
                          expected, done.generation)
        else:
            self.log.info("generation %s already has %s workers: nothing to apply", done.generation, done.workers)

    def claim(self, generation: str, run_id: str | None) -> None:
        """Record that training run ``run_id`` starts ``generation``'s workers (what ``apply``
        reports as started); refuse when another run did (two jobs on the same slices)."""
        if run_id is None or self.store.claim_generation(generation, run_id) is not False:
            return
        owner = (self.store.generation(generation) or {}).get("started_by")
        raise GenerationError(
            f"generation {generation} was started by training run {owner}; another run would train its slices "
            "a second time: clear that run's tasks to restart its workers, or let the autoscaler start a new "
            "generation")

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
        from kale_airflow.metrics.embedded import open_job_metrics
        from kale_airflow.stream import open_stream

        dep = self.config.deployment
        stream = open_stream(dep.stream_url)
        rates = self._stream_rates(stream) or open_job_metrics(self.config.settings, dep).partition_rates()
        prev = self.store.latest(name, before=generation)
        previous_doc = {"assignment": prev[1]["assignment"]} if prev else None
        # The running generation trains on until this mark (handover_due), then checkpoints and
        # stops: its workers must have stopped, never two generations on one slice.
        self.store.set_value(HANDOVER_KEY, {"generation": generation, "since": time.time()})
        if prev:
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

    def await_stopped(self, generation: str, poll_s: float = 0.1) -> None:
        """Wait until every worker of ``generation`` that ever ran has stopped (or is dead:
        no heartbeat for ``STALE_HEARTBEAT_S``); raise after ``handover_timeout_s``, so the
        task fails and retries rather than start workers on slices that are still trained."""
        deadline = time.monotonic() + self.config.deployment.handover_timeout_s
        said = None
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
            if running != said:  # polled often (a warm rescale waits on it), said once per change
                self.log.info("waiting for worker(s) %s of generation %s to checkpoint and stop", running, generation)  # pragma: no mutate
                said = running
            time.sleep(poll_s)

    def assignment(self, generation: str, name: str = ASSIGNMENT) -> dict:
        """The assignment document a generation was given (rebalance it first)."""
        doc = self.store.get(name, generation)
        if doc is None:
            raise GenerationError(f"generation {generation} has no assignment yet; run its rebalance task first")
        return doc

    # ------------------------------------------------------------------ workers
    def start_local(self, generation: str, run_id: str | None = None) -> list[int]:  # pragma: no mutate block
        """Start the generation's ranks on this machine; returns the supervisor's pid.
        ``run_id``: the training run, which claims the generation first.

        With warm ranks (``worker_warm_wait_s`` > 0) the deployment has one pool supervisor
        (:class:`~kale_airflow.runtime.backends.LocalPool`): this starts it when none runs (the
        first generation, or after it gave up), and otherwise only hands it the generation,
        which it and its ranks read from the control plane (the current generation and its
        assignment, both written before this runs). Without, the generation is a new job (one
        process per rank, 127.0.0.1 rendezvous, one supervisor restarting every rank when one
        dies)."""
        from kale_airflow.runtime.backends import LocalPool, LocalWorkers

        self.claim(generation, run_id)
        env = self.config.settings
        doc = self.assignment(generation)  # refuses a generation that was not rebalanced
        spec = self.worker_spec(str(env.checkpoints), env.database_url)
        if spec.warm_wait_s > 0 and env.database_url:
            pids = LocalPool(spec, env.worker_logs).ensure()
            self.log.info("generation %s (%d workers) handed to the pool supervisor (pid %s) of %s",  # pragma: no mutate
                          generation, len(doc["assignment"]), pids[0], env.worker_logs)  # pragma: no mutate
            return pids
        spec.warm_wait_s = 0.0
        return LocalWorkers(spec, env.worker_logs).start(generation, doc)

    def worker_spec(self, checkpoint_dir: str, database_url: str | None = None):  # pragma: no mutate block
        """The :class:`~kale_airflow.runtime.backends.WorkerSpec` of this deployment's ranks."""
        from kale_airflow.runtime.backends import WorkerSpec

        dep = self.config.deployment
        step = ["--step-time", str(dep.worker_step_time_s)] if dep.worker_step_time_s else []
        step += ["--checkpoint-every-s", f"{dep.worker_checkpoint_every_s:g}"]
        return WorkerSpec(dep.stream_url, checkpoint_dir, dep.group, database_url, dep.worker_batch_size, step,
                          device=dep.worker_device, amp=dep.worker_amp, trainer=dep.trainer,
                          warm_wait_s=dep.worker_warm_wait_s, job=dep.job, standby=dep.worker_standby,
                          max_slots=dep.max_workers)

    def pod_arguments(self, generation: str, run_id: str | None = None) -> list[list[str]]:  # pragma: no mutate block
        """The rank command's arguments for each pod the generation needs started (the image
        runs ``python``): with warm ranks only the slots no pod of the previous generation keeps
        (:func:`slots_to_start`: a scale-up's added slots; none for a scale-down), else every slot.

        The pods rendezvous through the control-plane database: slot 0 publishes its pod IP
        (``KALE_POD_IP``, from the downward API) and ``RENDEZVOUS_PORT``; the others read it.
        ``run_id``: the training run, which claims the generation first."""
        from kale_airflow.runtime.kubernetes import CHECKPOINT_MOUNT, RENDEZVOUS

        self.claim(generation, run_id)

        doc = self.assignment(generation)
        spec = self.worker_spec(CHECKPOINT_MOUNT)
        n = len(doc["assignment"])
        slots = list(range(n))
        prev = self.store.latest(ASSIGNMENT, before=generation) if spec.warm_wait_s > 0 else None
        if prev is not None:
            slots = slots_to_start(n, self.store.workers_seen(prev[0]), time.time())
            self.log.info("generation %s: %d pod(s) to start (slots %s); the pods of generation %s's other slots "  # pragma: no mutate
                          "re-join in place", generation, len(slots), slots, prev[0])  # pragma: no mutate
        return [spec.command(generation, w, n, {"assignment": doc["assignment"]}, rendezvous=RENDEZVOUS)[1:]
                for w in slots]

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
