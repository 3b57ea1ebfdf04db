"""The autoscaler's I/O around the pure Kale policy.

Each ``poke(now)`` observes the stream and metrics, makes sure the champion models are
loaded (cached; reloaded when the ``champion`` alias moves, which MLflow is asked about when a
promotion was announced or every 10 minutes: :mod:`.promotions`), asks the policy, records the
decision with its reason, and persists the policy's stabilization state so the next poke
(or the next DAG run) continues where this one stopped.

Shadow mode (``shadow: true`` in the deployment, or ``shadow=True``): the worker count is
read from what actually runs (pods, heartbeats, throughput observations; see
:mod:`kale_airflow.control.shadow`) and every decision is recorded with ``applied: false``;
nothing downstream starts workers. ``poke(record=False)`` (``kale decide --dry-run``)
observes and decides without writing anything.

Faults: an unreachable MLflow keeps the models already loaded, or (none loaded yet)
holds the current workers and says why; a failing stream read becomes missing metrics,
which never scale down.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Protocol

import numpy as np
import pandas as pd

from kale_airflow.config import Config, load_config
from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.control.fleet import FleetLimits
from kale_airflow.control.generations import ASSIGNMENT
from kale_airflow.control.promotions import AnnouncedChampions, ManualApprovals
from kale_airflow.core.policies import Decision, KalePolicy, Observation, Reason, build_kale
from kale_airflow.core.policies.kale import planned_downtime
from kale_airflow.core.appends import AppendClock
from kale_airflow.core.slices import all_slices
from kale_airflow.metrics.embedded import MetricsError
from kale_airflow.store import StateStore, masked

log = logging.getLogger(__name__)
STATE_KEY = "autoscaler_state"
PAUSES_KEY = "rescale_pauses"  # measured pauses of the last rescales (see Autoscaler.downtime_s)
PAUSES_KEPT = 5
RECORD_BACKFILL_BINS = 12  # bins of traffic history recovered after a restart of the autoscaler
HISTORY_DAYS = 14.0  # recorded traffic the forecast source starts from (as the simulator's history)


class Autoscaler:
    """Observe -> decide -> record, with models cached across pokes."""

    def __init__(self, config: Config, *, stream=None, metrics=None, store: StateStore | None = None,
                 registry: "ChampionSource | None" = None, pods: "Callable[[], list] | None" = None,
                 shadow: bool | None = None):
        """Sources default to what the configuration names; tests pass fakes. ``shadow``
        overrides the deployment's ``shadow`` switch (None: as configured)."""
        from kale_airflow.metrics.embedded import open_job_metrics
        from kale_airflow.stream import open_stream

        self.settings, self.dep = config.settings, config.deployment
        self.stream = stream if stream is not None else open_stream(self.dep.stream_url)
        self.job = config.job
        self.metrics = metrics if metrics is not None else open_job_metrics(self.settings, self.dep)
        self.state = store or StateStore(self.settings.database_url, self.job)
        # A champion moved by hand in the MLflow UI is tagged approved-manually at the next answer.
        champions = MlflowChampions(self.settings.mlflow_uri, self.job)
        self.registry = registry or AnnouncedChampions(champions, self.state, on_answer=ManualApprovals(
            self.settings.mlflow_uri, models=champions.models))
        self.list_pods = pods or self._list_worker_pods
        self.policy: KalePolicy | None = None
        self.versions: tuple[str, str] | None = None
        self.model_error: str | None = None
        self._recorded_until: int | None = None  # first bin not yet written to the traffic history
        # Where reading a record is a request to a server, the end offsets each poke reads date
        # the oldest unprocessed records (a fetch only for those older than the first poke)
        # and count the arrivals since the last poke.
        self.appends = AppendClock() if getattr(self.stream, "remote_records", False) else None
        self.shadow = bool(self.dep.shadow if shadow is None else shadow)
        self.workers_source = "generation"  # where the last observation's worker count came from
        self.planned_downtime_s = self.dep.rescale_downtime_s  # measured by observe()
        self._alerter = None
        # Calendar windows, a pin (`kale pin`) and the fleet's GPU budget bound every decision.
        self.limits = FleetLimits(self.dep, self.state)

    @classmethod
    def from_environment(cls, shadow: bool | None = None, job: str | None = None) -> "Autoscaler":
        """The autoscaler of job ``job`` (None: the only one) of ``$KALE_HOME``'s validated
        deployment configuration."""
        return cls(load_config(job), shadow=shadow)

    # ----------------------------------------------------------------- models
    def _champions(self):
        versions = self.registry.versions()
        if versions[0] is None:
            raise LookupError("no champion forecaster: run the forecaster retrain DAG and promote one")
        if versions != self.versions or self.policy is None:
            forecaster, throughput = self.registry.load()
            self._build(forecaster, throughput)
            log.info("loaded champions: forecaster v%s, throughput v%s", *versions)
            self.versions = versions

    def _build(self, forecaster, throughput) -> None:
        """Kale from the one factory the simulator uses: the champion forecaster, started from
        the recorded traffic, and a capacity table fitted and refitted from every throughput
        observation the workers recorded, exactly as in simulation. The champion throughput
        model (reviewed in MLflow) is the first fit only while the observations cannot
        identify a curve themselves (fewer than two measured counts, or none readable)."""
        dep = self.dep
        try:
            seen = self.metrics.throughput_observations()
        except MetricsError as exc:
            log.warning("throughput observations unavailable (%s)", exc)
            seen = pd.DataFrame({"workers": [], "rate": []})
        observations = (seen["workers"].to_numpy(dtype=int), seen["rate"].to_numpy(dtype=float))
        model = throughput if seen["workers"].nunique() < 2 else None
        self.policy = build_kale(dep.limits, forecaster, observations, dep.kale_config, bin_s=dep.bin_s,
                                 model=model, pretrained=True, history=self._history())
        saved = self.state.get_value(STATE_KEY)
        if saved:
            self.policy.load_state_dict(saved)

    def _history(self) -> pd.Series | None:
        """The recorded traffic (samples/s) the forecast source starts from, as the simulator's
        starts from the trace's history; None when less than a day (one daily cycle) was
        recorded: the live bins then serve as well (never the bundled trace: a deployment
        forecasts its own stream). A saved policy state's bins replace it."""
        try:
            counts = self.metrics.traffic_history(HISTORY_DAYS).dropna()
        except MetricsError as exc:
            log.info("no traffic history to start the forecast from (%s)", exc)
            return None
        if len(counts) < 2 or (counts.index[-1] - counts.index[0]).total_seconds() < 86400:
            return None
        step = float(np.median(np.diff(counts.index.asi8))) / 1e9  # samples per step -> samples/s
        return counts / step

    # ------------------------------------------------------------ observation
    def observe(self, now: float, *, record: bool = True) -> Observation:
        """Current metrics; any that cannot be read are None (never a scale-down). Also
        measures the last rescale's pause (stored unless ``record`` is False): see
        :meth:`downtime_s`."""
        cur = self.state.current()
        self.planned_downtime_s = self.downtime_s(cur, record=record)
        workers = cur["workers"] if cur and cur["workers"] else 0
        self.workers_source = "generation"
        if self.shadow:  # what actually runs, started by whoever is in charge
            workers = self._observed_workers(now, fallback=workers)
        rate = backlog = fresh = tput = None
        try:
            interval = self.dep.poll_interval_s
            ends = self.stream.end_offsets()  # once per poke: the arrivals and the backlog end here
            if self.appends is not None:
                self.appends.observe(now, ends)
            arrived = self.appends.arrived(now - interval, now) if self.appends is not None else None
            if arrived is None:  # the clock does not span the interval yet: the stream counts
                arrived = self.stream.arrivals(now - interval, now, ends=ends)
            rate = sum(arrived.values()) / interval
            held = self._held_slices(cur)
            if held:
                generation, assignment = held
                # Its ranks report how far they trained; one silent for a checkpoint interval (by
                # steps only: the SLO) may have crashed, and its slices replay from the commits.
                trust_s = self.dep.worker_checkpoint_every_s or self.dep.slo_s
                trained = self.state.trained_positions(generation, now - trust_s)
                backlog, fresh = stream_backlog(self.stream, self.dep.group, assignment, now, ends=ends,
                                                clock=self.appends, trained=trained)
        except Exception as exc:  # noqa: BLE001 - a metrics outage must not crash the sensor
            log.warning("stream metrics unavailable (%s): holding, never scaling down", exc)
        if workers:  # the hot path: read only the last two minutes, not the whole history
            try:
                recent = self.metrics.throughput_observations(since=now - 120)
            except MetricsError as exc:  # e.g. a missing or stale Prometheus series: unknown, never zero
                log.warning("worker throughput unavailable (%s)", exc)
            else:
                recent = recent[recent["workers"] == workers]
                if len(recent):
                    tput = float(recent["rate"].median())
        rescaling = bool(cur and cur["created"] and now - cur["created"] < self.planned_downtime_s)
        return Observation(now, workers, rate, backlog, fresh, None, tput, rescaling, self._ready(workers))

    def _held_slices(self, cur: dict | None) -> tuple[str, dict] | None:
        """(generation, assignment) whose slices the backlog is measured on: the running
        generation's, or, between a decision and its rebalance, the latest generation's that
        has one (its ranks train on until the handover, and its commits are where the decided
        one starts), so a rescale leaves no gap in the backlog, the freshness lag or their
        gauges; None before any rebalance."""
        if cur is None:
            return None
        if cur["assignment"]:
            return cur["generation"], cur["assignment"]
        latest = self.state.latest(ASSIGNMENT)
        return (latest[0], latest[1]["assignment"]) if latest else None

    def downtime_s(self, cur: dict | None, *, record: bool = True) -> float:
        """Seconds a rescale actually pauses training, as the policy should plan with it.

        A rescale's pause runs from the decision naming the new generation (the old one
        checkpoints and stops then) to the moment all of the new generation's workers began
        training (their first heartbeat); the first generation's start paused nothing and is
        not one. Each generation's pause is measured once, the last
        ``PAUSES_KEPT`` are kept in the control store, and :func:`planned_downtime` turns them
        into the value the policy uses (the configured ``rescale_downtime_s`` is the floor)."""
        dep = self.dep
        rec = self.state.get_value(PAUSES_KEY) or {"generation": None, "pauses": []}
        meta = self.state.get_value("generation_meta") or {}
        # The first generation (none before it) paused nothing: its start is not a rescale.
        first = "previous" in meta and meta["previous"] is None
        if cur and cur["generation"] != rec["generation"] and meta.get("since") and cur["workers"] and not first:
            seen = self.state.workers_seen(cur["generation"])
            started = [r["started"] for r in seen.values() if "started" in r]
            if len(started) >= cur["workers"]:
                pause = max(0.0, max(started) - meta["since"])
                rec = {"generation": cur["generation"], "pauses": (rec["pauses"] + [round(pause, 3)])[-PAUSES_KEPT:]}
                if record:
                    self.state.set_value(PAUSES_KEY, rec)
                log.info("generation %s began training %.1f s after it was decided (rescale pause)",
                         cur["generation"], pause)
        return planned_downtime(dep.rescale_downtime_s, rec["pauses"], dep.kale_config.horizon_s / 2)

    def _observed_workers(self, now: float, fallback: int) -> int:
        from kale_airflow.control.shadow import observed_workers

        pods = None
        if self.dep.worker_backend == "kubernetes":
            def pods() -> int | None:
                try:
                    return sum(1 for p in self.list_pods() if p.status and p.status.phase == "Running")
                except Exception as exc:  # noqa: BLE001 - no API access: try the next source
                    log.warning("shadow: cannot list worker pods (%s)", exc)
                    return None
        count, source = observed_workers(now, pods=pods, store=self.state, metrics=self.metrics,
                                         fresh_s=max(120.0, 4 * self.dep.poll_interval_s))
        if count is None:
            self.workers_source = "generation" if fallback else "unknown"
            return fallback
        self.workers_source = source
        return count

    def _ready(self, workers: int) -> int | None:
        """Running worker pods (Kubernetes backend); None when unknown. Pods still Pending
        for lack of GPUs make this smaller than the generation's size."""
        if self.dep.worker_backend != "kubernetes" or not workers:
            return None
        try:
            pods = self.list_pods()
        except Exception as exc:  # noqa: BLE001 - no API access: unknown, not zero
            log.warning("cannot list worker pods (%s); pending workers unknown", exc)
            return None
        return min(workers, sum(1 for p in pods if p.status and p.status.phase == "Running"))

    def _list_worker_pods(self) -> list:
        """This job's worker pods in its namespace (the Kubernetes API, through the provider's hook)."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        from kale_airflow.runtime.kubernetes import worker_selector

        kcfg = self.dep.kubernetes
        return KubernetesHook(kcfg.kubernetes_conn_id).core_v1_client.list_namespaced_pod(
            kcfg.namespace, label_selector=worker_selector(self.job)).items

    def record_traffic(self, now: float) -> int:
        """Write the stream's arrivals per completed ``bin_s`` bin to the traffic history the
        forecaster retrains on. Idempotent (a bin is rewritten with the same count); after a
        restart it backfills up to ``RECORD_BACKFILL_BINS`` bins. Returns the bins written."""
        bin_s = self.dep.bin_s
        done = int(now // bin_s)  # bins before this one have ended
        first = max(self._recorded_until if self._recorded_until is not None else done - RECORD_BACKFILL_BINS,
                    done - RECORD_BACKFILL_BINS)
        if first >= done:
            return 0
        try:
            counts = [float(sum(self.stream.arrivals(b * bin_s, (b + 1) * bin_s).values())) for b in range(first, done)]
            index = pd.to_datetime(np.arange(first, done) * bin_s, unit="s")
            self.metrics.write_traffic(pd.Series(counts, index=index))
        except Exception as exc:  # noqa: BLE001 - recording must not stop the autoscaler; the next poke retries
            log.warning("could not record traffic for bins %d..%d (%s); retrying at the next poke", first, done, exc)
            return 0
        self._recorded_until = done
        return done - first

    # ----------------------------------------------------------------- decide
    def poke(self, now: float | None = None, *, record: bool = True) -> tuple[Decision, Observation]:
        """One observation and decision, recorded with its reason. ``record=False`` (a dry
        run) writes nothing: no decision, no policy state, no traffic history, no alert."""
        now = time.time() if now is None else now
        obs = self.observe(now, record=record)
        if record:
            self.record_traffic(now)
        try:
            self._champions()
            self.model_error = None
        except Exception as exc:  # noqa: BLE001 - MLflow down or no champion: keep what we have
            self.model_error = masked(exc)  # stored and shown: any error may quote the tracking URI
            if self.policy is None:
                d = Decision(obs.workers, Reason.HOLD_MISSING_METRICS,
                             f"models unavailable, keeping the current {obs.workers} worker(s): {self.model_error}")
                if record:
                    self.state.record_decision(now, obs.workers, d.to_dict() | self._mode())
                return d, obs
            log.warning("model registry unavailable (%s); deciding with the cached champions", self.model_error)
        # The stages plan with the measured rescale pause (the policy reads its config each tick).
        downtime = self.planned_downtime_s
        if downtime != self.policy.config.rescale_downtime_s:
            log.info("planning with a rescale downtime of %.1f s (measured; configured %.1f s)", downtime,
                     self.dep.rescale_downtime_s)
            self.policy.config = dataclasses.replace(self.policy.config, rescale_downtime_s=downtime)
        d = self.policy.first_start(obs) if obs.workers == 0 else self.policy.decide(obs)
        d = self.limits.apply(d, obs, now, self.policy, record=record)
        if not record:
            log.info("dry run: %s -> %s (%s) %s", obs.workers, d.workers, d.reason.value, d.message)
            return d, obs
        self.state.set_value(STATE_KEY, self.policy.state_dict())
        table = self.policy.capacity.table
        capacity = table[min(obs.workers, len(table) - 1)] if table is not None else None
        kale_capacity = table[min(d.workers, len(table) - 1)] if table is not None else None
        self.state.record_decision(now, obs.workers, d.to_dict() | {"arrival_rate": obs.arrival_rate,
                                                                    "backlog": obs.backlog,
                                                                    "freshness_lag_s": obs.freshness_lag_s,
                                                                    "capacity": capacity,
                                                                    "kale_capacity": kale_capacity,
                                                                    "ready_workers": obs.ready_workers,
                                                                    "throughput": obs.throughput}
                                   | self._mode())
        log.info("%sdecision: %s -> %s (%s) %s", "shadow " if self.shadow else "", obs.workers, d.workers,
                 d.reason.value, d.message)
        self._watch_slo(now, obs)
        return d, obs

    def _mode(self) -> dict:
        """Shadow decisions say so: never applied, and where the running count came from."""
        return {"shadow": True, "applied": False, "workers_source": self.workers_source} if self.shadow else {}

    def _watch_slo(self, now: float, obs: Observation) -> None:
        """Alert once per episode when the freshness lag stays at risk too long."""
        from kale_airflow.control.alerts import SLO_STATE_KEY, Alerter, SloRiskWatch

        try:
            watch = SloRiskWatch(self.dep.alerts, self.dep.slo_s, self.state.get_value(SLO_STATE_KEY))
            message = watch.update(now, obs.freshness_lag_s)
            self.state.set_value(SLO_STATE_KEY, watch.state)
            if message:
                self._alerter = self._alerter or Alerter(self.dep.alerts, log)
                self._alerter.send("slo_risk", "Kale: freshness SLO at risk", message)
        except Exception as exc:  # noqa: BLE001 - alerting must never stop the autoscaler
            log.error("SLO-risk alert check failed: %s", exc)


def stream_backlog(stream, group: str, assignment: dict, now: float, *, ends: dict[int, int] | None = None,
                   clock: AppendClock | None = None, trained: dict[str, int] | None = None) -> tuple[float, float]:
    """(backlog, oldest age) of a job's slices: the samples between each slice's position
    and its partition's end, weighted by the slice's width, and ``now`` minus the append
    time of the oldest record at a position with samples pending (0 when none is). A slice's
    position is the furthest of its commit and what ``trained`` (by consumer-group suffix)
    says its rank has trained: commits follow checkpoints, so alone they count samples the
    model already has.

    ``ends``: the end offsets the caller has just read (else read here). A ``clock`` of the
    end offsets observed at earlier pokes dates the pending records it encloses; the others
    are read. At most three stream calls whatever the number of slices (end offsets, the
    slices' commits in one ``committed_many``, the undated positions' records in one
    ``timestamps_at``): on Kafka a constant number of broker requests per poke, not two per
    slice, and no Fetch at all while the backlog is younger than the clock's memory."""
    ends = stream.end_offsets() if ends is None else ends
    slices = [(f"{group}/{sl.group_suffix}", sl) for _, sl in all_slices(assignment)]
    positions = stream.committed_many([(key, sl.partition) for key, sl in slices])
    backlog, pending, dated = 0.0, [], [now]
    trained = trained or {}
    for key, sl in slices:
        pos = max(positions[(key, sl.partition)], trained.get(sl.group_suffix, 0))
        ahead = ends.get(sl.partition, 0) - pos
        if ahead > 0:
            backlog += ahead * (sl.hi - sl.lo)
            t = clock.time_of(sl.partition, pos) if clock is not None else None
            if t is None:
                pending.append((sl.partition, pos))
            else:
                dated.append(t)
    times = stream.timestamps_at(pending) if pending else {}
    oldest = min([*dated, *(t for t in times.values() if t is not None)])
    return backlog, max(0.0, now - oldest)


class ChampionSource(Protocol):
    """Where the champion models come from (MLflow's registry; tests pass a fake)."""

    def versions(self) -> tuple[str | None, str | None]:
        """The champion versions of (forecaster, throughput model); None where there is none."""
        ...

    def load(self) -> tuple:
        """The champion (forecaster, throughput model) objects; the throughput model is None
        until one is registered (Kale then fits its own from the recorded observations)."""
        ...


class MlflowChampions:
    """A job's champions registered in MLflow under the ``champion`` alias."""

    def __init__(self, uri: str, job: str = DEFAULT_JOB):
        from kale_airflow.registry.mlflow_registry import job_models

        self.uri = uri
        self.models = job_models(job)  # (forecaster, throughput model)
        self._seen: tuple[str | None, str | None] = (None, None)

    def versions(self) -> tuple[str | None, str | None]:
        from kale_airflow.registry.mlflow_registry import CHAMPION, current_version, registry_client

        # The cached client of this URI only: this runs in the triggerer, next to other
        # triggers, so no process-wide MLflow state or environment is changed.
        client = registry_client(self.uri)
        self._seen = tuple(current_version(client, name, CHAMPION) for name in self.models)
        return self._seen

    def load(self) -> tuple:
        """The versions :meth:`versions` last reported (so the recorded versions are the loaded
        ones even if the alias moves in between), else the current champions; no throughput
        champion yet is None."""
        from kale_airflow.registry.mlflow_registry import load_champion, load_version

        seen, (forecaster, throughput_model) = self._seen, self.models

        def one(name: str, version: str | None):
            return load_version(name, version, self.uri) if version else load_champion(name, self.uri)

        throughput = one(throughput_model, seen[1]).unwrap_python_model().model if seen[1] else None
        return one(forecaster, seen[0]).unwrap_python_model().forecaster, throughput
