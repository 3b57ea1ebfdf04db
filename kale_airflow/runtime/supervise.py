"""Restart a local worker that dies, the way Kubernetes restarts a failed pod.

Usage (``LocalWorkers`` starts every local worker this way)::

    python -m kale_airflow.runtime.supervise [--max-restarts 3] [--backoff 2] -- \\
        python -m kale_airflow.runtime.worker ...

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
import subprocess
import sys
import time

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
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="the worker command, after --")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no worker command given: put it after --")
    if args.max_restarts < 0 or args.backoff < 0:
        ap.error("--max-restarts and --backoff must be >= 0")
    return Supervisor(cmd, args.max_restarts, args.backoff, args.healthy_after).run()


if __name__ == "__main__":
    sys.exit(main())
