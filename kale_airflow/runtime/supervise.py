"""Restart a local training job that dies, the way Kubernetes restarts failed pods.

Usage (``LocalWorkers`` starts every local generation this way: one supervisor per job)::

    python -m kale_airflow.runtime.supervise --ranks N --log-dir DIR --log-name 'G-worker-{rank}.log' \\
        [--max-restarts 3] [--backoff 2] -- python -m kale_airflow.runtime.worker ...

With ``--ranks N`` the supervisor runs the N ranks of one ``torch.distributed`` job: each
attempt picks a free port on 127.0.0.1 for the rendezvous and starts every rank with
``--worker-id R --workers-total N --rendezvous 127.0.0.1:PORT`` appended, each rank's output
in its own log. **A rank that dies fails the whole job**: its peers' collectives break, the
supervisor stops whatever is left of them (SIGKILL after a short grace), says in every
rank's log how each rank ended, and restarts all ranks together; they restore the job's one
checkpoint (model, optimizer, step and the positions of every slice), so the model resumes
from exactly what it had seen. Without ``--ranks`` it supervises one command as is.

- the worker exits 0 (stopped or superseded by a newer generation): the supervisor exits 0;
- any other exit (a crash, the OOM killer, ``kill -9``): it is restarted after a backoff
  that doubles each time (capped at 60 s); the new process restores the worker's
  checkpoint and committed offsets, so no sample is lost. After ``--max-restarts``
  consecutive failures (a crash loop) the supervisor gives up with the worker's exit code
  and the worker's partitions wait for the next generation.
  A run that lasted ``--healthy-after`` seconds resets the count;
- SIGTERM or SIGINT to the supervisor is passed on to the worker, which checkpoints and
  exits; the supervisor then exits with the worker's code.

Standard library only: it must start in milliseconds, not import torch.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

MAX_BACKOFF_S = 60.0


def describe(code: int) -> str:
    """'exit code 3' or 'signal SIGKILL' for a Popen return code."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def say(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervisor: {message}", flush=True)


class Supervisor:
    """Runs ``cmd`` until it exits 0, we are stopped by a signal, or it fails
    ``max_restarts + 1`` times in a row."""

    def __init__(self, cmd: list[str], max_restarts: int = 3, backoff_s: float = 2.0, healthy_after_s: float = 60.0):
        self.cmd, self.max_restarts, self.backoff_s, self.healthy_after_s = cmd, max_restarts, backoff_s, healthy_after_s
        self.stopping = False
        self.proc: subprocess.Popen | None = None

    def _forward(self, signum, _frame) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def run(self) -> int:
        """The worker's last exit code."""
        previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _loop(self) -> int:
        failures = 0
        while True:
            started = time.monotonic()
            self.proc = subprocess.Popen(self.cmd)
            if self.stopping:  # the signal came while the process was being created
                self.proc.terminate()
            code = self.proc.wait()
            if code == 0 or self.stopping:
                return code
            failures = 1 if time.monotonic() - started >= self.healthy_after_s else failures + 1
            pid = self.proc.pid
            if failures > self.max_restarts:
                say(f"worker pid {pid} ended with {describe(code)}, {failures} failures in a row: giving up; "
                    "its partitions wait for the next generation (the lines above say why it failed)")
                return code
            delay = min(MAX_BACKOFF_S, self.backoff_s * 2 ** (failures - 1))
            say(f"worker pid {pid} ended with {describe(code)}; restart {failures}/{self.max_restarts} in {delay:g} s "
                "(it restores its checkpoint and committed offsets)")
            until = time.monotonic() + delay
            while time.monotonic() < until and not self.stopping:
                time.sleep(0.1)
            if self.stopping:
                return code


def free_port() -> int:
    """A TCP port nobody listens on right now (for one attempt's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JobSupervisor(Supervisor):
    """The ranks of one distributed job: all start together, one failure restarts them all."""

    def __init__(self, cmd: list[str], ranks: int, log_dir: str | Path, log_name: str, grace_s: float = 3.0,
                 **kwargs):
        super().__init__(cmd, **kwargs)
        self.ranks, self.log_dir, self.log_name, self.grace_s = ranks, Path(log_dir), log_name, grace_s
        self.procs: list[subprocess.Popen] = []
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def _log(self, rank: int) -> Path:
        return self.log_dir / self.log_name.format(rank=rank)

    def _forward(self, signum, _frame) -> None:
        self.stopping = True
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)

    def _start(self) -> None:
        port = free_port()
        self.procs = []
        for r in range(self.ranks):
            with open(self._log(r), "ab") as out:
                self.procs.append(subprocess.Popen(
                    [*self.cmd, "--worker-id", str(r), "--workers-total", str(self.ranks),
                     "--rendezvous", f"127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT))
        say(f"job of {self.ranks} rank(s) started (rendezvous 127.0.0.1:{port}; pids "
            f"{', '.join(str(p.pid) for p in self.procs)})")

    def _loop(self) -> int:
        failures = 0
        while True:
            started = time.monotonic()
            self._start()
            if self.stopping:
                for p in self.procs:
                    p.terminate()
            while True:  # until every rank ended, or one failed
                codes = [p.poll() for p in self.procs]
                if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                    break
                time.sleep(0.1)
            if self.stopping or all(c == 0 for c in codes):
                codes = [p.wait() for p in self.procs]
                return next((c for c in codes if c != 0), 0)
            # One rank failed: the job is broken. Its peers usually fail on their own (a broken
            # collective); what is left after a short grace is killed.
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            until = time.monotonic() + self.grace_s
            while time.monotonic() < until and any(p.poll() is None for p in self.procs):
                time.sleep(0.1)
            killed = []
            for r, p in enumerate(self.procs):
                if p.poll() is None:
                    p.kill()
                    killed.append(r)
            codes = [p.wait() for p in self.procs]
            failures = 1 if time.monotonic() - started >= self.healthy_after_s else failures + 1
            code = codes[failed[0]]
            give_up = failures > self.max_restarts
            delay = min(MAX_BACKOFF_S, self.backoff_s * 2 ** (failures - 1))
            then = (f"{failures} failures in a row: giving up; the job's slices wait for the next generation"
                    if give_up else f"restart {failures}/{self.max_restarts} in {delay:g} s (every rank restores "
                    "the job's checkpoint: model, optimizer, step and slice positions)")
            for r, p in enumerate(self.procs):
                how = (f"stopped by the supervisor after rank {failed[0]} failed" if r in killed
                       else f"ended with {describe(codes[r])}")
                line = f"rank {r} pid {p.pid} {how}; {then}"
                say(line)
                with open(self._log(r), "a") as fh:
                    fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervisor: {line}\n")
            if give_up:
                return code
            until = time.monotonic() + delay
            while time.monotonic() < until and not self.stopping:
                time.sleep(0.1)
            if self.stopping:
                return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kale_airflow.runtime.supervise",
        description="Run a worker command and restart it when it dies (not when it exits 0).",
        epilog="Example: python -m kale_airflow.runtime.supervise --max-restarts 3 -- "
               "python -m kale_airflow.runtime.worker --stream sqlite:///stream.db ...")
    ap.add_argument("--max-restarts", type=int, default=3, help="consecutive failures tolerated (default 3)")
    ap.add_argument("--backoff", type=float, default=2.0, help="first restart delay in s, doubled each time (default 2)")
    ap.add_argument("--healthy-after", type=float, default=60.0,
                    help="a run this long (s) resets the failure count (default 60)")
    ap.add_argument("--ranks", type=int, default=0,
                    help="run the command as the N ranks of one distributed job (appends --worker-id, "
                    "--workers-total and --rendezvous 127.0.0.1:PORT); 0: one process as is")
    ap.add_argument("--log-dir", default=".", help="with --ranks: folder of the ranks' logs")
    ap.add_argument("--log-name", default="worker-{rank}.log", help="with --ranks: each rank's log file name")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="the worker command, after --")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no worker command given: put it after --")
    if args.max_restarts < 0 or args.backoff < 0:
        ap.error("--max-restarts and --backoff must be >= 0")
    if args.ranks > 0:
        return JobSupervisor(cmd, args.ranks, args.log_dir, args.log_name, max_restarts=args.max_restarts,
                             backoff_s=args.backoff, healthy_after_s=args.healthy_after).run()
    return Supervisor(cmd, args.max_restarts, args.backoff, args.healthy_after).run()


if __name__ == "__main__":
    sys.exit(main())
