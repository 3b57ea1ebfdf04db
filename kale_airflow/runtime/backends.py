"""Worker backends: local processes (embedded default) and Kubernetes GPU pods.

Both start one worker per index of a generation with the same command line
(``python -m kale_airflow.runtime.worker ...``); the backend is configuration.
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

    def environment(self) -> dict[str, str]:
        """Environment variables every worker needs besides its command (``KALE_DATABASE_URL``)."""
        return {"KALE_DATABASE_URL": self.database_url} if self.database_url else {}

    def command(self, generation: str, worker_id: int, workers: int, assignment: dict | str) -> list[str]:
        """Container/process command for one worker."""
        doc = assignment if isinstance(assignment, str) else json.dumps(assignment)
        cmd = ["python", "-m", "kale_airflow.runtime.worker", "--stream", self.stream_url, "--group", self.group,
               "--assignment", doc, "--worker-id", str(worker_id), "--workers-total", str(workers),
               "--generation", generation, "--checkpoint-dir", self.checkpoint_dir,
               "--batch-size", str(self.batch_size)]
        return cmd + self.extra_args


class LocalWorkers:
    """Workers as local processes, each under :mod:`~kale_airflow.runtime.supervise` (a worker
    that dies is restarted from its checkpoint, like a pod's retries); ``stop`` sends SIGTERM
    and waits for the checkpoint."""

    def __init__(self, spec: WorkerSpec, log_dir: str | Path, max_restarts: int = 3):
        self.spec = spec
        self.max_restarts = max_restarts
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, generation: str, assignment: dict) -> list[int]:
        """Start one supervised process per worker of the assignment; returns the supervisors' pids."""
        workers = len(assignment.get("assignment", assignment))
        # Local workers share this machine's cores: split them instead of oversubscribing.
        threads = max(1, (os.cpu_count() or 1) // workers)
        env = os.environ | self.spec.environment() | {
            "KALE_WORKER_THREADS": os.environ.get("KALE_WORKER_THREADS", str(threads))}
        for w in range(workers):
            cmd = self.spec.command(generation, w, workers, assignment)
            cmd = [sys.executable, "-m", "kale_airflow.runtime.supervise", "--max-restarts", str(self.max_restarts),
                   "--", sys.executable, *cmd[1:]]
            out = open(self.log_dir / f"{generation}-worker-{w}.log", "ab")
            self.procs[w] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        return [p.pid for p in self.procs.values()]

    def wait(self, timeout: float | None = None) -> dict[int, int]:
        """Wait for every worker; returns exit codes."""
        return {w: p.wait(timeout=timeout) for w, p in self.procs.items()}

    def stop(self, timeout: float = 60.0) -> dict[int, int]:
        """SIGTERM every worker (they checkpoint and exit 0); SIGKILL after ``timeout``."""
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
