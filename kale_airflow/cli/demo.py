"""``kale demo``: the whole loop on one machine, on the embedded default.

Airflow (SQLite, ``dag.test()`` runs, triggers in-process), MLflow (SQLite), the
embedded stream fed by the bundled trace time-compressed, local workers training the
reference torch model, or ``--config``'s ``trainer`` on its ``producer``'s payloads (with an
emulated GPU step time so a 2-core machine can host several), the forecaster trained and registered, the throughput model fitted from the
workers' own throughput in a short profiling phase, the job started at a fixed size (as it
runs before Kale takes over), and the autoscaler scaling it up and down with rebalancing.
It ends with a summary, plots, and how to open both UIs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from kale_airflow.config import Settings
from kale_airflow.core.cluster import ClusterModel
from kale_airflow.core.policies.kale import KaleConfig, planned_downtime
from kale_airflow.core.simulator import SimConfig
from kale_airflow.core.traffic import Trace, TraceReport

DAGS = Path(__file__).resolve().parents[2] / "dags"
LOOKAHEAD_S = 60.0  # the demo's look-ahead: one minute of wall time, 90 minutes of trace time
# Freshness SLO of the demo (wall seconds). A warm rescale pauses training for a second or two
# here (the planner's downtime floor below; the measured pauses raise it); a crash restarts the
# distributed job from its checkpoint, 30-60 s on two cores.
SLO_S = 60
DOWNTIME_FLOOR_S = 2
# The traffic's peak, samples/s. On two cores the ranks' real work (forward and backward
# passes, the all-reduce) and the DAG runs' processes cap what 4-6 ranks train together well
# below the 320 samples/s each one's emulated step stands for (the decision log records what
# each count measured), so the peak stays well under that cap: a backlog can drain.
PEAK_RATE = 800.0
# The workers commit at every checkpoint, and the backlog and freshness are measured from the
# commits: at most 2 s apart, the measured lag is the real one within 2 s of the 60 s SLO.
CHECKPOINT_EVERY_S = 2
# The traffic bin (the forecaster's step; 45 minutes of trace time), and the forecaster's level
# window: one bin, so that on a ramp the level is the last bin's rate, not a staler mean.
BIN_S = 30
# How long the job stays pinned at its fixed size once its traffic flows: the forecast needs
# four complete bins of it (the first one may be partial); until then Kale would plan on the
# fallback (the recent peak plus a margin).
HANDOVER_S = 5 * BIN_S
# One process that runs DAGs with ``dag.test()``, one request (a JSON line ``[dag_id, conf]``
# on stdin) after another, answering ``KALE_STATE <state>`` for each: Airflow and the DAGs are
# imported and parsed once, not for every run.
RUN_DAGS = r"""
import json, sys, traceback
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.definitions import dag as sdk_dag
from kale_airflow.cli.demo import logged_where_the_ui_reads
sdk_dag._run_task = logged_where_the_ui_reads(sdk_dag._run_task)
bag = DagBag(dag_folder=sys.argv[1])
for line in sys.stdin:
    dag_id, conf = json.loads(line)
    try:
        state = str(bag.get_dag(dag_id).test(run_conf=conf).state)
    except Exception:
        traceback.print_exc()
        state = "crashed"
    print("KALE_STATE " + state, flush=True)
"""


class DagLane:
    """DAG runs one after another in one long-lived ``dag.test()`` process, as one slot of a
    scheduler runs them; what the runs print goes to ``log``. The demo runs the autoscaler in
    one lane and the training runs it starts in another, side by side, as Airflow's scheduler
    runs a ``@continuous`` autoscaler next to the training runs it triggers."""

    def __init__(self, env: dict, cwd: Path, log: Path, dags: Path = DAGS):
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "a")
        self.proc = subprocess.Popen([sys.executable, "-c", RUN_DAGS, str(dags)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
        self.lock = threading.Lock()

    def run(self, dag_id: str, conf: dict | None = None) -> str:
        """Run ``dag_id`` with ``conf`` to its end: its state (``crashed`` if the lane died)."""
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps([dag_id, conf or {}]) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                return "crashed"
            for line in self.proc.stdout:
                if line.startswith("KALE_STATE "):
                    self.log.flush()
                    return line.split()[1]
                self.log.write(line)
            return "crashed"

    def close(self) -> None:
        """End the lane's process once its last run is done."""
        with self.lock:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def logged_where_the_ui_reads(run_task):
    """``dag.test()``'s task runner, each task's output (its log, prints and child processes
    included) also written where Airflow's UI reads a task log: ``base_log_folder`` and the
    run's log filename template, one file per try. ``dag.test()`` runs the tasks in its own
    process and only prints their logs, so the UI would answer "Log file not found". Both file
    descriptors go to the file while the task runs (the UI shows a running task's log as it
    grows); what the task wrote is then copied to the real output too."""
    import functools

    from airflow.configuration import conf
    from airflow.utils.log.file_task_handler import FileTaskHandler

    handler = FileTaskHandler(conf.get("logging", "base_log_folder"))

    @functools.wraps(run_task)
    def run(*, ti, task, **kwargs):
        path = Path(handler.local_base) / handler._render_filename(ti, ti.try_number)
        path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush(), sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(path, "ab") as log:
            start = log.tell()
            os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
            try:
                return run_task(ti=ti, task=task, **kwargs)
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os.dup2(saved[0], 1), os.dup2(saved[1], 2)
                os.close(saved[1])
                with open(path, "rb") as written, os.fdopen(saved[0], "wb") as out:
                    written.seek(start)
                    shutil.copyfileobj(written, out)

    return run


class Demo:
    """Drives the loop and samples what a user would watch."""

    def __init__(self, out: Path, minutes: float, start: str, step_wall_s: float, peak_rate: float,
                 step_time_s: float, batch: int, max_workers: int, model: dict | None = None):
        self.out = out.resolve()
        self.model = model or {}  # ``trainer`` and ``producer`` of --config (none: the reference CTR model)
        self.minutes, self.start, self.step_wall_s = minutes, pd.Timestamp(start), step_wall_s
        self.peak_rate, self.step_time_s, self.batch, self.max_workers = peak_rate, step_time_s, batch, max_workers
        self.airflow_home = self.out / "airflow"
        self.kale_home = self.out / "kale"
        self.paths = Settings(self.kale_home, f"sqlite:///{self.kale_home}/mlflow.db")
        self.env = {**os.environ, "AIRFLOW_HOME": str(self.airflow_home), "KALE_HOME": str(self.kale_home),
                    "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.airflow_home}/airflow.db",
                    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "PYTHONWARNINGS": "ignore", "GIT_PYTHON_REFRESH": "quiet"}
        self.samples: list[dict] = []
        self.fixed = max_workers  # the job's size before Kale takes over (``run`` sets it from the profile)
        self.lanes: dict[str, DagLane] = {}
        self._training: threading.Thread | None = None  # the training run in progress, beside the autoscaler's
        self._started: str | None = None  # the last generation a training run was started for
        self._stop = threading.Event()

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    # ------------------------------------------------------------------ setup
    def prepare(self) -> None:
        if self.out.exists():
            shutil.rmtree(self.out)
        self.kale_home.mkdir(parents=True)
        self.airflow_home.mkdir(parents=True)
        self.say(f"Airflow home {self.airflow_home}; migrating its SQLite database")
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=self.env, check=True,
                       capture_output=True)
        per_worker = self.batch / self.step_time_s
        (self.kale_home / "kale.yaml").write_text(yaml.safe_dump({
            "min_workers": 1, "max_workers": self.max_workers, "partitions": 16, "poll_interval_s": 2,
            "bin_s": BIN_S, "slo_s": SLO_S, "rescale_downtime_s": DOWNTIME_FLOOR_S, "worker_batch_size": self.batch,
            "worker_step_time_s": self.step_time_s, "worker_checkpoint_every_s": CHECKPOINT_EVERY_S, **self.model,
            # Demo-sized windows: minutes of wall time stand for hours of trace time.
            "kale": {"horizon_s": 2 * LOOKAHEAD_S, "persist_s": 4, "wait_cost": 1.0},
        }))
        self.say(f"each generation is one torch.distributed job (gloo, one process per rank); the ranks stay warm "
                 f"across generations (a scale-up's added ranks, already started as spares, get the model from a "
                 f"surviving rank's memory); EMULATION: each rank sleeps to a GPU step of {self.step_time_s:g} s per "
                 f"{self.batch} samples (about {per_worker:,.0f} samples/s per rank)")

    def dag(self, dag_id: str, conf: dict | None = None, lane: str = "autoscaler") -> str:
        """Run a DAG to its end in one of the demo's lanes (:class:`DagLane`): its state."""
        if lane not in self.lanes:
            self.lanes[lane] = DagLane(self.env, self.out, self.out / "dag-logs" / f"{lane}.log")
        return self.lanes[lane].run(dag_id, conf)

    # --------------------------------------------------------------- profiling
    def profile(self) -> None:
        """The training job's throughput at world sizes 1, 2 and 3, recorded by the job itself
        (rank 0: the whole job's samples/s, all-reduce included), exactly as ``kale profile``
        measures a new deployment's job. The demo's store starts empty: no simulated row, the
        throughput model comes from these records only. Each rank EMULATES a GPU step
        (``worker_step_time_s``) so a 2-core machine can host several; the synchronization is
        real. The job trains on a stream of its own, filled evenly, because the demo's traffic
        only starts after the models are registered."""
        from kale_airflow.config import Config, load_deployment
        from kale_airflow.pipelines.profile import ProfileOptions, profile_job
        from kale_airflow.runtime.producer import load_payloads
        from kale_airflow.stream.embedded import EmbeddedStream

        os.environ["KALE_HOME"] = self.env["KALE_HOME"]
        path = self.kale_home / "profile-stream.db"
        s = EmbeddedStream(path, partitions=6)
        for p in range(6):
            for chunk in range(20):
                s.append(p, load_payloads(self.model.get("producer"))(1000, 100 * p + chunk))
        options = ProfileOptions(workers=(1, 2, 3), seconds_per_size=10, report_every_s=2,
                                 stream_url=f"sqlite:///{path}")
        results = profile_job(Config(self.paths, load_deployment(self.paths)), options, say=self.say)
        rates = ", ".join("no record" if r.samples_per_s is None else f"{r.samples_per_s:,.0f}" for r in results)
        self.say(f"profiling: jobs of 1, 2 and 3 ranks measured {rates} samples/s (emulated GPU step, real all-reduce)")

    # ---------------------------------------------------------------- traffic
    def produce(self) -> None:
        from kale_airflow.core.traffic import BUNDLED_TRACE, load_trace
        from kale_airflow.runtime.producer import Producer, load_payloads

        trace = load_trace(BUNDLED_TRACE)
        start = int(trace.series.index.get_indexer([self.start])[0])
        steps = int(np.ceil(self.minutes * 60 / self.step_wall_s))
        window = trace.values[start:start + steps]
        scale = self.peak_rate * self.step_wall_s / window.max()
        self.trace_window = trace.series.iloc[start:start + steps]
        stream = self.stream()
        producer = Producer(stream, trace, compression=trace.step_s / self.step_wall_s, scale=scale, skew=0.8,
                            start_step=start, payloads=load_payloads(self.model.get("producer")))
        self.say(f"producer: {self.trace_window.index[0]} .. {self.trace_window.index[-1]} of the NYC taxi trace, "
                 f"one 30-min step every {self.step_wall_s:g} s, peak {self.peak_rate:,.0f} samples/s, "
                 f"16 partitions with Zipf(0.8) rates")
        self.traffic_t0 = time.time()  # the simulator replays the same steps from the same instant
        producer.run(steps, stop=self._stop)
        self._stop.set()

    def stream(self):
        """The demo's stream: 16 partitions (made before the job starts, as a topic is)."""
        from kale_airflow.stream.embedded import EmbeddedStream

        return EmbeddedStream(self.kale_home / "stream.db", partitions=16)

    # --------------------------------------------------------------- watching
    def watch(self) -> None:
        from kale_airflow.control.autoscaler import Autoscaler

        os.environ["KALE_HOME"] = str(self.kale_home)
        auto = Autoscaler.from_environment()
        while not self._stop.is_set():
            now = time.time()
            obs = auto.observe(now, record=False)  # the DAG runs measure; this only watches
            self.samples.append({"t": now, "rate": obs.arrival_rate, "backlog": obs.backlog,
                                 "freshness": obs.freshness_lag_s, "workers": obs.workers})
            time.sleep(2)

    # -------------------------------------------------------------------- run
    def run(self) -> dict:
        t_start = time.time()
        self.prepare()
        self.say("training and registering the traffic forecaster (kale_forecaster_retrain)")
        # Its clock runs 90x faster than the trace's, so the forecaster's level (the mean it falls
        # back to before it has a day of bins) spans one bin (``BIN_S``), not a wall-clock hour.
        retrain = {"forecaster": "seasonal", "forecaster_options": {"level_window_s": BIN_S},
                   "history_days": 14, "auto_promote": True}
        self.say(f"  -> {self.dag('kale_forecaster_retrain', retrain)}")
        self.say("profiling the training job at world sizes 1, 2 and 3")
        self.profile()
        self.say("fitting and registering the throughput model from that (kale_throughput_refit)")
        self.say(f"  -> {self.dag('kale_throughput_refit', {'auto_promote': True})}")
        from kale_airflow.control.fleet import pin
        from kale_airflow.store import StateStore

        store = StateStore(self.paths.database_url)
        # As in production, Kale takes over a job that already runs at a fixed size: the
        # fewest ranks the profile says carry the traffic's peak, pinned there (``kale pin``)
        # until Kale's forecast has the first bins of the job's traffic. The summary compares
        # Kale's worker-hours with that job left at its size.
        self.fixed = fixed_workers(self.peak_rate, self.capacity(), self.max_workers)
        note = "the fixed-size job before Kale takes over"
        self.say(f"starting the training job at {self.fixed} worker(s), the fewest whose profiled throughput "
                 f"carries the peak of {self.peak_rate:,.0f} samples/s, pinned there (kale pin)")
        pin(store, self.fixed, time.time() + 3600, note=note)
        self.stream()
        self.autoscale(store)
        if self._training is not None:
            self._training.join()  # the fixed-size job runs before its traffic starts
        producer = threading.Thread(target=self.produce, daemon=True)
        watcher = threading.Thread(target=self.watch, daemon=True)
        producer.start()
        pin(store, self.fixed, time.time() + HANDOVER_S, note=note)
        self.say(f"the pin ends in {HANDOVER_S:g} s, once Kale's forecast has four complete {BIN_S} s bins of the "
                 f"job's traffic: from then on Kale sizes the job")
        time.sleep(3)
        watcher.start()
        while not self._stop.is_set():
            self.autoscale(store)
        producer.join()
        if self._training is not None:
            self._training.join()
        store.set_current_generation("demo-finished", 0)  # every worker sees it, checkpoints and exits
        for lane in self.lanes.values():
            lane.close()
        time.sleep(8)
        return self.summarize(time.time() - t_start)

    def autoscale(self, store) -> None:
        """One autoscaler DAG run (until its sensor's decision is due); the training DAG run of
        a generation it named starts beside the next one, as the scheduler runs them, once the
        training run before it has ended."""
        state = self.dag("kale_autoscaler", {"poll_interval_s": 2, "max_polls": 15})
        cur = store.current()
        last = store.decisions(1)
        if last:
            d = last[-1]
            self.say(f"autoscaler run {state}: {d['workers']} -> {d['target']} ({d['reason']}) {d['message'][:90]}")
        busy = self._training is not None and self._training.is_alive()
        if cur and cur["assignment"] is None and cur["generation"] != self._started and not busy:
            self._started = cur["generation"]
            self._training = threading.Thread(target=self.train, args=(cur["generation"], cur["workers"]), daemon=True)
            self._training.start()

    def train(self, generation: str, workers: int) -> None:
        """The training DAG run of one generation, in the training lane."""
        self.say(f"training generation {generation} with {workers} worker(s) (kale_training)")
        state = self.dag("kale_training", {"workers": workers, "generation": generation}, lane="training")
        self.say(f"  -> kale_training {generation}: {state}")

    # ---------------------------------------------------------------- summary
    def summarize(self, wall: float) -> dict:
        from kale_airflow.store import StateStore

        df = pd.DataFrame(self.samples).dropna(subset=["rate"])
        dt = df["t"].diff().fillna(2.0).clip(upper=10)
        decisions = StateStore(self.paths.database_url).decisions(100_000)
        path, rescales = workers_path(decisions, until=float(df["t"].max()))
        backlog = df["backlog"].fillna(0)
        summary = {
            "wall_s": wall,
            "workers_path": path,
            "observed_s": float(dt.sum()),
            "samples_arrived": float((df["rate"] * dt).sum()),
            "accumulated_lag": float((backlog * dt).sum()),
            "mean_wait_s": float((backlog * dt).sum() / max(1.0, (df["rate"] * dt).sum())),
            "slo_s": SLO_S,
            **freshness_figures(dt, df["freshness"], SLO_S),
            "rescales": rescales,
            "worker_hours": float((df["workers"] * dt).sum() / 3600),
            "fixed_workers": self.fixed,
            "fixed_worker_hours": self.fixed * float(dt.sum()) / 3600,
            "peak_workers": fixed_workers(self.peak_rate, self.capacity(), self.max_workers),
            "max_workers_used": int(df["workers"].max()),
            "decisions_recorded": len(decisions),
            "reasons": pd.Series([d["reason"] for d in decisions]).value_counts().to_dict(),
        }
        summary["simulator"] = self.simulated()
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        self.plot(df)
        return summary

    def capacity(self) -> list[float] | None:
        """Samples/s per count (index = ranks) as Kale plans with it at the end of the run:
        fitted on every throughput the job recorded (the profile's and the run's)."""
        from kale_airflow.core.capacity import OnlineThroughput
        from kale_airflow.metrics.embedded import EmbeddedMetrics

        seen = EmbeddedMetrics(self.paths.database_url).throughput_observations()
        return OnlineThroughput(seen["workers"], seen["rate"], max_workers=self.max_workers).table

    def simulated(self) -> dict:
        """What the simulator predicts for this deployment on the same traffic
        (:func:`demo_simulation`), Kale and HPA, in the demo's own units (wall seconds,
        worker-hours)."""
        from kale_airflow.config import load_deployment
        from kale_airflow.control.autoscaler import PAUSES_KEY
        from kale_airflow.core.simulator import simulate
        from kale_airflow.metrics.embedded import EmbeddedMetrics
        from kale_airflow.store import StateStore

        seen = EmbeddedMetrics(self.paths.database_url).throughput_observations()
        pauses = (StateStore(self.paths.database_url).get_value(PAUSES_KEY) or {}).get("pauses", [])
        trace, cfg, kale = demo_simulation(self.trace_window, self.traffic_t0, self.step_wall_s, self.peak_rate,
                                           load_deployment(self.paths), seen, pauses, self.fixed)
        res = simulate(trace, ("kale", "hpa"), cfg, forecaster_kwargs={"level_window_s": BIN_S}, kale_config=kale,
                       offline=False)
        out = {name: {k: run.metrics[k] for k in ("rescales", "slo_violation_rate", "mean_wait_s", "gpu_hours",
                                                  "max_freshness_lag_s")}
               | {"workers_path": [run.workers[0].item(), *(e["to"] for e in run.rescale_events)]}
               for name, run in res.runs.items()}
        return out | {"trace_hours": len(self.trace_window) * 0.5, "rescale_downtime_s": cfg.rescale_downtime_s,
                      "cluster": {"per_worker": cfg.cluster.per_worker, "serial_fraction": cfg.cluster.serial_fraction}}

    def plot(self, df: pd.DataFrame) -> None:
        from kale_airflow.reporting.plots import plot_demo

        plot_demo(df, SLO_S, self.out / "demo.png")


def demo_simulation(window: pd.Series, t0: float, step_wall_s: float, peak_rate: float, deployment,
                    throughput: pd.DataFrame, pauses: list[float], fixed: int) -> tuple[Trace, SimConfig, KaleConfig]:
    """The simulator's model of the demo's own deployment: the trace ``window`` replayed one
    step every ``step_wall_s`` from ``t0`` (the instant the producer started, so the bins fall
    where the autoscaler's fell) and scaled to ``peak_rate``, as the producer replays it; the
    deployment's limits, SLO, forecast bin, poll interval (the tick) and Kale settings; the
    rescale pause the autoscaler plans with (``pauses`` measured, the configured one the
    floor); the ranks' own recorded ``throughput`` as the cluster's truth
    (:meth:`~kale_airflow.core.cluster.ClusterModel.fitted`), profiled at the counts they
    were measured at; no history before the traffic; the job started at ``fixed`` workers and
    pinned there for ``HANDOVER_S``. Returns the trace, the protocol and Kale's settings."""
    compressed = pd.Series(window.to_numpy(dtype=float), name=window.name,
                           index=pd.date_range(pd.Timestamp(t0, unit="s"), periods=len(window),
                                               freq=pd.Timedelta(seconds=step_wall_s)))
    kale = deployment.kale_config
    downtime = planned_downtime(kale.rescale_downtime_s, list(pauses), kale.horizon_s / 2)
    limits = deployment.limits
    cfg = SimConfig(tick_s=deployment.poll_interval_s, ref_workers=limits.max_workers, min_workers=limits.min_workers,
                    max_workers=limits.max_workers, partitions=limits.partitions or limits.max_workers,
                    rescale_downtime_s=downtime, slo_s=deployment.slo_s, history_days=0.0,
                    cluster=ClusterModel.fitted(throughput["workers"], throughput["rate"]),
                    profile_workers=tuple(sorted({int(n) for n in throughput["workers"]})), bin_s=deployment.bin_s,
                    peak_rate=peak_rate, initial_workers=fixed, pinned_s=HANDOVER_S)
    trace = Trace(f"{window.name or 'trace'} at {step_wall_s:g} s per step", compressed, step_wall_s,
                  TraceReport(rows_in=len(window)))
    return trace, cfg, dataclasses.replace(kale, rescale_downtime_s=downtime)


def workers_path(decisions: list[dict], until: float = math.inf) -> tuple[list[int], int]:
    """The counts the job ran at, in order (from the count before its first change), and
    the rescales among those changes, from the decisions recorded (``ts``) up to ``until``,
    the end of the traffic the summary covers (``workers`` running, ``target`` decided).
    Starting the job (from 0 workers) is not a rescale."""
    changes = [d for d in decisions if d["target"] != d["workers"] and d["ts"] <= until]
    path = [changes[0]["workers"], *(d["target"] for d in changes)] if changes else []
    return path, sum(1 for d in changes if d["workers"])


def freshness_figures(dt: pd.Series, freshness: pd.Series, slo_s: float) -> dict:
    """The summary's freshness figures from the watcher's samples (``dt``: the seconds each
    sample stands for; ``freshness``: its lag, NaN without a reading): the share of read
    samples over the SLO, the largest lag read (None for both when nothing was read), and the
    seconds without a reading. A sample without a reading is unobserved, never a lag of 0."""
    read = freshness[freshness.notna()]
    return {"slo_violation_rate": float((read > slo_s).mean()) if len(read) else None,
            "max_freshness_s": float(read.max()) if len(read) else None,
            "unobserved_s": float(dt[freshness.isna()].sum())}


def fixed_workers(peak_rate: float, capacity: list[float] | None, max_workers: int) -> int:
    """The count a fixed-size run needs for this traffic (what the demo's scaling is compared
    with): the fewest ranks whose capacity (``capacity[n]``, samples/s of n ranks, the table
    Kale plans with) covers the traffic's peak rate; ``max_workers`` when none does."""
    if not capacity or not peak_rate > 0:
        return max_workers
    return next((n for n in range(1, min(max_workers, len(capacity) - 1) + 1) if capacity[n] >= peak_rate),
                max_workers)


def airflow_ui_env(airflow_home: Path, kale_home: Path, bin_dir: Path | None = None) -> dict[str, str]:
    """The environment the Airflow UI needs to serve a demo's state: the venv's ``bin`` first
    on PATH (``kale ui`` starts Airflow's components by name), the repository's ``dags/`` (an
    empty dags_folder marks every Kale DAG stale and hides it), no example DAGs, and the
    demo's Airflow database and Kale home."""
    bin_dir = Path(sys.executable).parent if bin_dir is None else bin_dir
    return {"PATH": f"{bin_dir}:$PATH", "AIRFLOW_HOME": str(airflow_home), "KALE_HOME": str(kale_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home}/airflow.db"}


def airflow_ui_command(airflow_home: Path, kale_home: Path, bin_dir: Path | None = None) -> str:
    """The one-line shell command ``kale demo`` prints to open the Airflow UI on its state
    (absolute paths: it works from any folder; ``$PATH`` is expanded by the user's shell)."""
    import shlex

    bin_dir = Path(sys.executable).parent if bin_dir is None else bin_dir
    env = airflow_ui_env(airflow_home, kale_home, bin_dir)
    in_double_quotes = "".join("\\" + ch if ch in '"$`\\' else ch for ch in str(bin_dir))
    words = [f'PATH="{in_double_quotes}:$PATH"']
    words += [f"{k}={shlex.quote(v)}" for k, v in env.items() if k != "PATH"]
    return " ".join(words + [shlex.quote(str(bin_dir / "kale")), "ui"])


# Airflow's components that only show state: no scheduler (it would start runs) and no
# triggerer (it would resume a demo's deferred sensors, which would decide and record again).
UI_COMPONENTS = ("dag-processor", "api-server")


def serve_ui(port: int, airflow: Path | None = None) -> int:
    """``kale ui``: Airflow's DAG processor and API server on this environment's Airflow home,
    until one of them ends or Ctrl-C; returns the first non-zero exit code (0 on Ctrl-C)."""
    import signal

    airflow = airflow or Path(sys.executable).parent / "airflow"
    commands = {"dag-processor": [str(airflow), "dag-processor"],
                "api-server": [str(airflow), "api-server", "--port", str(port)]}
    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)  # stopped like Ctrl-C: both components end with it
    procs = {name: subprocess.Popen(commands[name]) for name in UI_COMPONENTS}
    home = os.environ.get("AIRFLOW_HOME", "~/airflow")
    print(f"Airflow UI on http://localhost:{port} (read-only: {' and '.join(UI_COMPONENTS)}, no scheduler or "
          f"triggerer, so nothing runs or decides); sign in as admin with the password in "
          f"{home}/simple_auth_manager_passwords.json.generated; Ctrl-C stops it", flush=True)
    code = 0
    try:
        while all(p.poll() is None for p in procs.values()):
            time.sleep(0.5)
        code = next(p.returncode for p in procs.values() if p.poll() is not None)
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    return code


def model_settings(config: str | None) -> dict:
    """``trainer`` and ``producer`` of a ``kale.yaml`` (validated as a whole, and both loaded
    here so a missing package fails now): the model the demo trains and the payloads it feeds
    it. The rest of the demo's deployment is its own."""
    if config is None:
        return {}
    from kale_airflow.config import ConfigError, parse_deployment
    from kale_airflow.runtime.producer import load_payloads
    from kale_airflow.runtime.trainer import load_trainer

    path = Path(config)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping of settings, got a {type(data).__name__}")
    dep = parse_deployment({"stream_url": "sqlite:///unused", **data}, str(path))
    if dep.trainer and not dep.producer:
        raise ConfigError(f"{path} names a trainer but no producer: the demo would feed it click-through samples; "
                          "set producer: module:function making its payloads")
    load_trainer(dep.trainer)
    load_payloads(dep.producer)
    return {k: v for k in ("trainer", "producer") if (v := getattr(dep, k))}


def side_by_side(summary: dict, sim: dict) -> str:
    """The demo's figures next to the simulator's for Kale (and HPA) on the same deployment."""
    k, h = sim["kale"], sim["hpa"]
    rows = [("rescales", summary["rescales"], k["rescales"], h["rescales"]),
            ("worker-hours", f"{summary['worker_hours']:.3f}", f"{k['gpu_hours']:.3f}", f"{h['gpu_hours']:.3f}"),
            ("mean wait (s)", f"{summary['mean_wait_s']:.1f}", f"{k['mean_wait_s']:.1f}", f"{h['mean_wait_s']:.1f}"),
            (f"over the {summary['slo_s']} s SLO", _share(summary["slo_violation_rate"]),
             _share(k["slo_violation_rate"]), _share(h["slo_violation_rate"])),
            ("peak freshness lag (s)", "-" if summary["max_freshness_s"] is None else f"{summary['max_freshness_s']:.0f}",
             f"{k['max_freshness_lag_s']:.0f}", f"{h['max_freshness_lag_s']:.0f}"),
            ("workers", " -> ".join(map(str, summary["workers_path"])), " -> ".join(map(str, k["workers_path"])),
             " -> ".join(map(str, h["workers_path"])))]
    head = ("", "demo (Kale)", "simulated Kale", "simulated HPA")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(4)]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head, *rows])


def _share(rate: float | None) -> str:
    return "unknown" if rate is None else f"{rate:.1%}"


def run_demo(out: str, minutes: float, config: str | None = None) -> int:
    """Entry point of ``kale demo``."""
    demo = Demo(Path(out), minutes, start="2014-07-21 21:00", step_wall_s=20.0, peak_rate=PEAK_RATE,
                step_time_s=0.4, batch=128, max_workers=6, model=model_settings(config))
    summary = demo.run()
    sim = summary["simulator"]
    print("\n== demo summary")
    print(f"wall time {summary['wall_s'] / 60:.1f} min; {summary['samples_arrived']:,.0f} samples arrived")
    print(f"accumulated lag {summary['accumulated_lag']:,.0f} sample*s, mean wait {summary['mean_wait_s']:.1f} s, "
          f"SLO ({SLO_S} s) violations {_share(summary['slo_violation_rate'])} of the samples with a freshness "
          f"reading ({summary['unobserved_s']:.0f} s without one)")
    print(f"rescales {summary['rescales']}, worker-hours {summary['worker_hours']:.3f} "
          f"({summary['worker_hours'] / max(summary['fixed_worker_hours'], 1e-9):.2f}x the "
          f"{summary['fixed_worker_hours']:.3f} of the job left at its first {summary['fixed_workers']}; by the "
          f"final capacity table the peak needs {summary['peak_workers']}), "
          f"up to {summary['max_workers_used']} workers; decisions: {summary['reasons']}")
    print(f"\nthe simulator on the same {sim['trace_hours']:g} trace hours of this deployment (its settings, its "
          f"ranks' measured throughput, a {sim['rescale_downtime_s']:g} s rescale pause):")
    print(side_by_side(summary, sim))
    print(f"\nplot: {demo.out / 'demo.png'}   summary: {demo.out / 'summary.json'}")
    print(f"Airflow UI:  {airflow_ui_command(demo.airflow_home, demo.kale_home)}")
    print("             then http://localhost:8080 (user admin, password in "
          f"{demo.airflow_home / 'simple_auth_manager_passwords.json.generated'}) and the Kale page at /kale/")
    print(f"MLflow UI:   .venv/bin/mlflow ui --backend-store-uri {demo.paths.mlflow_uri}")
    return 0
