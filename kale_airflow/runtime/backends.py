"""Worker backends: local processes (embedded default) and Kubernetes GPU pods.

Both backends start ranks with the same command line (``python -m kale_airflow.runtime.worker
... --worker-id SLOT --rendezvous ...``); the backend is configuration. With warm ranks
(``worker_warm_wait_s`` > 0, the default) a rank process outlives its generation: locally
one pool supervisor per deployment (:class:`LocalPool`) keeps a process per slot of the
current generation and starts only the slots a scale-up adds; on Kubernetes each slot is a
pod that re-joins every generation in place, and a scale-up launches pods for the added
slots only (``Generations.pod_arguments``). Without warm ranks a generation is one job
(:class:`LocalWorkers`: one supervisor runs every rank of it, 127.0.0.1 rendezvous on a free
port); on Kubernetes rank 0 publishes its pod IP in the control-plane database
(``--rendezvous control-plane:29500``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kale_airflow.core.jobs import DEFAULT_JOB

AWAIT_ADDED_S = 60.0  # how long a local generation trains on while a larger one's added slots start


@dataclass
class WorkerSpec:
    """What every worker of a generation gets."""

    stream_url: str
    checkpoint_dir: str
    group: str = "kale"
    # The control-plane database; it reaches workers through the environment (see :meth:`environment`),
    # never the command line, which process listings and pod specs show.
    database_url: str | None = field(default=None, repr=False)
    batch_size: int = 512
    extra_args: list[str] = field(default_factory=list)
    device: str = "auto"  # the worker's --device: auto, cpu or cuda
    amp: bool = False     # the worker's --amp: bf16 autocast on CUDA
    # The worker's --allow-fresh-model: a deliberate reset, starting a new model from the committed
    # offsets when no checkpoint can be read (without it such a worker refuses to start).
    allow_fresh_model: bool = False
    trainer: str | None = None  # the worker's --trainer (module:attr); None: the reference CTR model
    # The worker's --warm-wait: seconds a rank waits for the next generation after its own stops
    # (0: every generation is a new job).
    warm_wait_s: float = 0.0
    job: str = DEFAULT_JOB  # the worker's --job: the deployment's job whose control-plane rows it uses
    # The local pool's spares (--standby): slots above the current generation's size kept started, at
    # most up to max_slots (the deployment's max_workers).
    standby: int = 0
    max_slots: int | None = None

    def environment(self) -> dict[str, str]:
        """Environment variables every worker needs besides its command (``KALE_DATABASE_URL``)."""
        return {"KALE_DATABASE_URL": self.database_url} if self.database_url else {}

    def command(self, generation: str, worker_id: int, workers: int, assignment: dict | str,
                rendezvous: str | None = None) -> list[str]:
        """Container/process command for one rank (``rendezvous``: rank 0's HOST:PORT, or
        ``control-plane:PORT``)."""
        cmd = self.job_command(generation, assignment) + ["--worker-id", str(worker_id), "--workers-total", str(workers)]
        return cmd + (["--rendezvous", rendezvous] if rendezvous else [])

    def job_command(self, generation: str, assignment: dict | str) -> list[str]:
        """The command every rank runs, without its rank (the local job supervisor appends it)."""
        doc = assignment if isinstance(assignment, str) else json.dumps(assignment)
        cmd = ["python", "-m", "kale_airflow.runtime.worker", "--stream", self.stream_url, "--group", self.group,
               "--assignment", doc, "--generation", generation, "--checkpoint-dir", self.checkpoint_dir,
               "--batch-size", str(self.batch_size)]
        cmd += (["--device", self.device] if self.device != "auto" else []) + (["--amp"] if self.amp else [])
        cmd += ["--allow-fresh-model"] if self.allow_fresh_model else []
        return cmd + self._options() + self.extra_args

    def _options(self) -> list[str]:
        return ((["--job", self.job] if self.job != DEFAULT_JOB else []) +
                (["--trainer", self.trainer] if self.trainer else []) +
                (["--warm-wait", f"{self.warm_wait_s:g}"] if self.warm_wait_s > 0 else []))

    def pool_command(self) -> list[str]:
        """The command of every warm rank process of a local pool, without its slot (the pool
        supervisor appends ``--worker-id`` and ``--rendezvous``): no generation, no assignment,
        since warm ranks read both from the control plane."""
        cmd = ["python", "-m", "kale_airflow.runtime.worker", "--stream", self.stream_url, "--group", self.group,
               "--checkpoint-dir", self.checkpoint_dir, "--batch-size", str(self.batch_size)]
        cmd += (["--device", self.device] if self.device != "auto" else []) + (["--amp"] if self.amp else [])
        cmd += ["--allow-fresh-model"] if self.allow_fresh_model else []
        # The pool starts a scale-up's added slots when the generation is named: the old ranks
        # train on while those import, so the pause does not include a process start.
        cmd += ["--await-added", f"{min(AWAIT_ADDED_S, self.warm_wait_s):g}"]
        cmd += ["--standby", str(self.standby)] if self.standby else []
        return cmd + self._options() + self.extra_args


class LocalWorkers:
    """A generation's job as local processes: one :mod:`~kale_airflow.runtime.supervise` job
    supervisor runs every rank (a rank that dies fails the job, and all ranks restart from the
    job's checkpoint, like a pod's retries); ``stop`` sends SIGTERM and waits for the checkpoint.
    Logs: ``{generation}-worker-{rank}.log`` per rank, ``{generation}-job.log`` for the supervisor."""

    def __init__(self, spec: WorkerSpec, log_dir: str | Path, max_restarts: int = 3):
        self.spec = spec
        self.max_restarts = max_restarts
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, generation: str, assignment: dict) -> list[int]:
        """Start the generation's job (one rank per worker of the assignment) under one
        supervisor; returns the supervisor's pid (its children are the ranks)."""
        workers = len(assignment.get("assignment", assignment))
        # Local ranks share this machine's cores: split them instead of oversubscribing.
        threads = max(1, (os.cpu_count() or 1) // workers)
        env = os.environ | self.spec.environment() | {
            "KALE_WORKER_THREADS": os.environ.get("KALE_WORKER_THREADS", str(threads))}
        cmd = [sys.executable, "-m", "kale_airflow.runtime.supervise", "--max-restarts", str(self.max_restarts),
               "--ranks", str(workers), "--log-dir", str(self.log_dir), "--log-name", f"{generation}-worker-{{rank}}.log",
               "--", sys.executable, *self.spec.job_command(generation, assignment)[1:]]
        with open(self.log_dir / f"{generation}-job.log", "ab") as out:
            self.procs[len(self.procs)] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        return [p.pid for p in self.procs.values()]

    def wait(self, timeout: float | None = None) -> dict[int, int]:
        """Wait for the job (its supervisor); returns exit codes."""
        return {w: p.wait(timeout=timeout) for w, p in self.procs.items()}

    def stop(self, timeout: float = 60.0) -> dict[int, int]:
        """SIGTERM the job (every rank stops at the same step, rank 0 checkpoints, all exit 0);
        SIGKILL after ``timeout``."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        for w, p in self.procs.items():
            try:
                codes[w] = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[w] = p.wait()
        self.procs.clear()
        return codes


class LocalPool:
    """The deployment's warm ranks on this machine: one
    :class:`~kale_airflow.runtime.supervise.PoolSupervisor` (``supervise --pool``) keeps one
    process per slot of the control plane's current generation, across generations, and up to
    ``spec.standby`` spares above it (at most ``spec.max_slots`` slots in all).
    :meth:`ensure` starts it unless it runs (its ``pool.lock`` in ``log_dir`` says); a new
    generation reaches it through the control plane, where it and the ranks read the current
    generation and its assignment. Logs: ``worker-<slot>.log`` per slot, ``pool.log`` for the
    supervisor."""

    def __init__(self, spec: WorkerSpec, log_dir: str | Path, max_restarts: int = 3, backoff_s: float = 2.0):
        if not spec.database_url or spec.warm_wait_s <= 0:
            raise ValueError("a local pool needs the control-plane database (database_url) and warm_wait_s > 0")
        self.spec, self.max_restarts, self.backoff_s = spec, max_restarts, backoff_s
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None

    @property
    def lock_path(self) -> Path:
        return self.log_dir / "pool.lock"

    def running(self) -> int | None:
        """The pid of the pool supervisor that holds the lock, or None when none runs."""
        import fcntl

        self.lock_path.touch()
        with open(self.lock_path) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                text = fh.read().strip()
                return int(text) if text.isdigit() else -1
            fcntl.flock(fh, fcntl.LOCK_UN)
        return None

    def ensure(self) -> list[int]:
        """Start the pool supervisor unless one runs; returns its pid."""
        pid = self.running()
        if pid is not None:
            return [pid]
        env = os.environ | self.spec.environment()
        if not os.environ.get("KALE_WORKER_THREADS"):  # each rank takes its share of the cores per generation
            env["KALE_WORKER_CORES"] = str(os.cpu_count() or 1)
        cmd = [sys.executable, "-m", "kale_airflow.runtime.supervise", "--pool", "--max-restarts",
               str(self.max_restarts), "--backoff", f"{self.backoff_s:g}", "--standby", str(self.spec.standby),
               *(["--max-slots", str(self.spec.max_slots)] if self.spec.max_slots is not None else []),
               "--log-dir", str(self.log_dir),
               "--log-name", "worker-{rank}.log", "--", sys.executable, *self.spec.pool_command()[1:]]
        with open(self.log_dir / "pool.log", "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        return [self.proc.pid]

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the supervisor this object started (it ends when no generation wants workers)."""
        return None if self.proc is None else self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM the pool (every rank checkpoints at an agreed step and exits 0); SIGKILL after
        ``timeout``. Works on a pool another process started (by its pid)."""
        pid = self.proc.pid if self.proc is not None else self.running()
        if pid is None or pid < 0:
            return None
        os.kill(pid, signal.SIGTERM)
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
