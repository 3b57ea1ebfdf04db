"""Worker backends: local processes (embedded default) and Kubernetes GPU pods.

A generation is one ``torch.distributed`` job; both backends start its ranks with the same
command line (``python -m kale_airflow.runtime.worker ... --worker-id RANK --rendezvous ...``);
the backend is configuration. Locally one supervisor runs every rank of the job (127.0.0.1
rendezvous on a free port); on Kubernetes each rank is a pod and rank 0 publishes its pod IP
in the control-plane database (``--rendezvous control-plane:29500``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


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
        return cmd + self.extra_args


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
