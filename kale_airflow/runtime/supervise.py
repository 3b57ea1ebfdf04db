"""Restart a local training job that dies, the way Kubernetes restarts failed pods.

Usage (``LocalWorkers`` starts every local generation this way: one supervisor per job)::

    python -m kale_airflow.runtime.supervise --ranks N --log-dir DIR --log-name 'G-worker-{rank}.log' \\
        [--max-restarts 3] [--backoff 2] -- python -m kale_airflow.runtime.worker ...

With ``--pool`` it keeps a deployment's rank processes across generations instead
(:class:`PoolSupervisor`; ``LocalPool`` starts it when warm ranks are on). With ``--ranks N``
the supervisor runs the N ranks of one ``torch.distributed`` job: each
attempt picks a free port on 127.0.0.1 for the rendezvous and starts every rank with
``--worker-id R --workers-total N --rendezvous 127.0.0.1:PORT`` appended, each rank's output
in its own log. **A rank that dies fails the whole job**: its peers' collectives break, the
supervisor stops whatever is left of them (SIGKILL after a short grace), says in every
rank's log how each rank ended, and restarts all ranks together; they restore the job's one
checkpoint (model, optimizer, step and the positions of every slice), so the model resumes
from exactly what it had seen. Without ``--ranks`` it supervises one command as is.

- the worker exits 0 (stopped or superseded by a newer generation): the supervisor exits 0;
- exit code 75 (:data:`EXIT_DEPENDENCY`, sysexits' EX_TEMPFAIL: a dependency such as the
  control-plane database stayed unreachable past the worker's own deadline) is a
  **dependency outage**, not a crash: restarted with a backoff that doubles up to 60 s,
  not counted toward ``--max-restarts``; the supervisor gives up only when the outage has
  lasted ``--outage-deadline`` seconds;
- exit code 78 (:data:`EXIT_REFUSED`, EX_CONFIG: the worker refused to start or go on, e.g.
  no readable checkpoint after training, or positions past the stream's end) is not
  restarted at all: a restart cannot fix it, and the worker's log says what can;
- any other exit (a crash, the OOM killer, ``kill -9``): it is restarted after a backoff
  that doubles each time (capped at 60 s); the new process restores the worker's
  checkpoint and committed offsets, so no sample is lost. After ``--max-restarts``
  consecutive failures (a crash loop) the supervisor gives up with the worker's exit code
  and the worker's partitions wait for the next generation.
  A run that lasted ``--healthy-after`` seconds resets the count;
- when it gives up, it marks the job's heartbeats ``failed`` in the control-plane database
  (``KALE_DATABASE_URL``; best-effort), so no dead job keeps saying ``running``;
- SIGTERM or SIGINT to the supervisor is passed on to the worker, which checkpoints and
  exits; the supervisor then exits with the worker's code.

Standard library only: it must start in milliseconds, not import torch (the database
client is imported only by the pool, which reads the current generation, and to mark a job
it gives up on).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from kale_airflow.core.jobs import DEFAULT_JOB

MAX_BACKOFF_S = 60.0
EXIT_DEPENDENCY = 75  # sysexits EX_TEMPFAIL: a dependency is unreachable; try again later
EXIT_REFUSED = 78  # sysexits EX_CONFIG: the worker must not run as configured; a restart cannot help
EXIT_RENDEZVOUS = 69  # sysexits EX_UNAVAILABLE: a generation's ranks did not all meet; restart them all
OUTAGE_DEADLINE_S = 1800.0


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


def option(cmd: list[str], name: str) -> str | None:
    """The value after ``name`` in a command line (the last one), or None."""
    found = [cmd[k + 1] for k, a in enumerate(cmd[:-1]) if a == name]
    return found[-1] if found else None


def mark_failed(cmd: list[str], ranks: list[int]) -> None:
    """Best-effort: record ``failed`` as the last heartbeat of the job's ranks in the
    control-plane database (``KALE_DATABASE_URL``), so status, shadow mode and the next
    handover stop counting a job that is gone."""
    generation = option(cmd, "--generation")
    url = option(cmd, "--database-url") or os.environ.get("KALE_DATABASE_URL")
    if generation is None or not url:
        return
    try:
        from kale_airflow.store import StateStore

        store = StateStore(url, option(cmd, "--job") or os.environ.get("KALE_JOB", DEFAULT_JOB))
        for r in ranks:
            store.worker_seen(generation, r, "failed")
        say(f"marked generation {generation}'s rank(s) {', '.join(map(str, ranks))} failed in the control plane")
    except Exception as exc:  # noqa: BLE001 - the database may be what failed: its heartbeats go stale then
        say(f"could not mark generation {generation} failed in the control plane ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); its heartbeats go stale instead")


class Supervisor:
    """Runs ``cmd`` until it exits 0, we are stopped by a signal, it refuses to run, it fails
    ``max_restarts + 1`` times in a row, or a dependency outage outlasts ``outage_deadline_s``."""

    def __init__(self, cmd: list[str], max_restarts: int = 3, backoff_s: float = 2.0, healthy_after_s: float = 60.0,
                 outage_deadline_s: float = OUTAGE_DEADLINE_S):
        self.cmd, self.max_restarts, self.backoff_s, self.healthy_after_s = cmd, max_restarts, backoff_s, healthy_after_s
        self.outage_deadline_s = outage_deadline_s
        self.stopping = False
        self.proc: subprocess.Popen | None = None
        self.failures = 0  # crashes in a row
        self.outage_since: float | None = None  # first exit of the current dependency outage
        self.outage_restarts = 0

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

    def verdict(self, codes: list[int], ran_s: float, now: float | None = None) -> tuple[bool, float, str]:
        """After a failed run (the exit codes of its processes, how long it ran): (give up,
        delay before the restart, what happens next, in words for the logs)."""
        now = time.monotonic() if now is None else now
        if ran_s >= self.healthy_after_s:
            self.failures, self.outage_since, self.outage_restarts = 0, None, 0
        if EXIT_REFUSED in codes:
            return True, 0.0, ("the worker refused to run (its log says why and what to do): not restarting, "
                               "which cannot fix it")
        if EXIT_DEPENDENCY in codes:
            self.outage_since = now if self.outage_since is None else self.outage_since
            lasted = now - self.outage_since
            if lasted >= self.outage_deadline_s:
                return True, 0.0, (f"dependency outage for {lasted:.0f} s (exit code {EXIT_DEPENDENCY}: a dependency "
                                   f"such as the control-plane database is unreachable): giving up after "
                                   f"--outage-deadline {self.outage_deadline_s:g} s")
            self.outage_restarts += 1
            delay = min(MAX_BACKOFF_S, self.backoff_s * 2 ** (self.outage_restarts - 1))
            return False, delay, (f"dependency outage (exit code {EXIT_DEPENDENCY}: a dependency such as the "
                                  f"control-plane database is unreachable) for {lasted:.0f} s of at most "
                                  f"{self.outage_deadline_s:g} s; restart in {delay:g} s (outage restarts do not "
                                  "count toward --max-restarts)")
        self.outage_since, self.outage_restarts = None, 0
        self.failures += 1
        if self.failures > self.max_restarts:
            return True, 0.0, f"{self.failures} failures in a row: giving up"
        delay = min(MAX_BACKOFF_S, self.backoff_s * 2 ** (self.failures - 1))
        return False, delay, f"restart {self.failures}/{self.max_restarts} in {delay:g} s"

    def _pause(self, delay: float) -> None:
        until = time.monotonic() + delay
        while time.monotonic() < until and not self.stopping:
            time.sleep(0.1)

    def _loop(self) -> int:
        while True:
            started = time.monotonic()
            self.proc = subprocess.Popen(self.cmd)
            if self.stopping:  # the signal came while the process was being created
                self.proc.terminate()
            code = self.proc.wait()
            if code == 0 or self.stopping:
                return code
            give_up, delay, then = self.verdict([code], time.monotonic() - started)
            if give_up:
                say(f"worker pid {self.proc.pid} ended with {describe(code)}; {then}; its partitions wait for the "
                    "next generation (the lines above say why it failed)")
                mark_failed(self.cmd, [int(option(self.cmd, "--worker-id") or 0)])
                return code
            say(f"worker pid {self.proc.pid} ended with {describe(code)}; {then} (it restores its checkpoint and "
                "committed offsets)")
            self._pause(delay)
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

    def _wait(self) -> list[int | None]:
        """Poll until every rank ended, or one failed; their codes (None: still running)."""
        while True:
            codes = [p.poll() for p in self.procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                return codes
            time.sleep(0.1)

    def _reap(self) -> tuple[list[int], list[int]]:
        """After a rank failed: its peers usually fail on their own (a broken collective); what
        is left after a short grace is killed. Returns (every rank's code, the ranks killed)."""
        until = time.monotonic() + self.grace_s
        while time.monotonic() < until and any(p.poll() is None for p in self.procs):
            time.sleep(0.1)
        killed = []
        for r, p in enumerate(self.procs):
            if p.poll() is None:
                p.kill()
                killed.append(r)
        return [p.wait() for p in self.procs], killed

    def _loop(self) -> int:
        while True:
            started = time.monotonic()
            self._start()
            if self.stopping:
                for p in self.procs:
                    p.terminate()
            codes = self._wait()
            if self.stopping or all(c == 0 for c in codes):
                codes = [p.wait() for p in self.procs]
                return next((c for c in codes if c != 0), 0)
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            codes, killed = self._reap()
            give_up, delay, then = self.verdict(codes, time.monotonic() - started)
            then += ("; the job's slices wait for the next generation" if give_up else
                     " (every rank restores the job's checkpoint: model, optimizer, step and slice positions)")
            for r, p in enumerate(self.procs):
                how = (f"stopped by the supervisor after rank {failed[0]} failed" if r in killed
                       else f"ended with {describe(codes[r])}")
                line = f"rank {r} pid {p.pid} {how}; {then}"
                say(line)
                with open(self._log(r), "a") as fh:
                    fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervisor: {line}\n")
            if give_up:
                mark_failed(self.cmd, list(range(self.ranks)))
                return codes[failed[0]]
            self._pause(delay)
            if self.stopping:
                return codes[failed[0]]


def pool_plan(want: int | None, alive: set[int], exited: dict[int, int], standby: int = 0,
              most: int | None = None) -> tuple[list[int], bool, bool]:
    """What the pool supervisor does next: (slots to start, start a new attempt, a failure).

    ``want``: the current generation's size (None: unknown, keep what runs); ``alive``: the
    slots running; ``exited``: the slots that just ended, with their codes. A slot that ended
    with anything but 0 is a failure: every slot restarts (a new attempt, from the checkpoint).
    Slot 0 hosts the rendezvous store, so starting it while others live is a new attempt too.
    Slots below ``want`` that are not running are started, and while ``want`` is above 0 so
    are up to ``standby`` spares above it (never slot ``most`` or higher: the deployment's
    ``max_workers``); a scale-down's removed slots stay as spares within that window and leave
    on their own beyond it."""
    failed = any(code != 0 for code in exited.values())
    if failed:
        return [], True, True
    if want is None:
        return [], False, False
    spares = want + standby if most is None else min(want + standby, most)
    keep = max(want, spares) if want > 0 else 0
    start = [s for s in range(keep) if s not in alive]
    if 0 in start and alive:
        return [], True, False
    return start, False, False


def restart_reason(exited: dict[int, int]) -> str:
    """Why a pool restarts every slot, in words (the ranks record it with the pause)."""
    bad = {r: c for r, c in exited.items() if c != 0}
    if not bad:
        return "restart: slot 0 started again (it hosts the rendezvous)"
    r = min(bad)
    if bad[r] == EXIT_RENDEZVOUS:
        return f"restart: the ranks of a generation did not all meet in time (slot {r})"
    return f"restart after slot {r} ended with {describe(bad[r])}"


class PoolSupervisor(JobSupervisor):
    """The deployment's rank processes on this machine, kept across generations (``--pool``).

    It watches the control plane's current generation (``KALE_DATABASE_URL``) and keeps one
    process per slot of it: when a generation with more workers is named it starts the added
    slots it does not already run (their import overlaps the handover; they wait for the
    assignment and receive the model from a surviving rank). It also keeps up to ``standby``
    spares started above the generation's size (at most ``most`` slots in all), once the
    generation's ranks train: they import and build the model ahead of a scale-up; a
    scale-down's removed slots stay as spares within that window and exit 0 on their own
    beyond it, after the agreed step. A slot that fails (or a warm meeting that times out, exit
    code 69) restarts every slot from the checkpoint on a new rendezvous port, with the usual
    backoff; the failure count starts over with each new generation, as a new job's does.
    It holds ``pool.lock`` in its log folder (one pool per deployment) and exits when the
    current generation wants no worker (its ranks waiting for a next generation are told to
    stop: none will come) and none runs, or, with no slot running, when the control plane has
    been unreachable for ``outage_deadline_s`` (exit 75; the next training run starts a pool)."""

    def __init__(self, cmd: list[str], log_dir: str | Path, log_name: str, database_url: str, poll_s: float = 0.1,
                 standby: int = 0, most: int | None = None, **kwargs):
        super().__init__(cmd, 0, log_dir, log_name, **kwargs)
        self.url, self.poll_s, self.standby, self.most = database_url, poll_s, standby, most
        self.slots: dict[int, subprocess.Popen] = {}
        self.port: int | None = None
        self.generation: str | None = None
        self._store = None
        self._lock = None
        self._unreachable_since: float | None = None  # the control plane's outage, while it lasts
        self._told_to_stop: set[int] = set()  # slots sent SIGTERM because no generation wants them

    def _forward(self, signum, _frame) -> None:
        self.stopping = True
        for p in self.slots.values():
            if p.poll() is None:
                p.send_signal(signum)

    def _wanted(self) -> int | None:
        """The current generation's size; None when the control plane cannot say (keep what runs)."""
        try:
            if self._store is None:
                from kale_airflow.store import StateStore

                self._store = StateStore(self.url, option(self.cmd, "--job") or os.environ.get("KALE_JOB", DEFAULT_JOB))
            cur = self._store.current()
        except Exception as exc:  # noqa: BLE001 - an outage: keep what runs
            say(f"cannot read the current generation ({type(exc).__name__}); keeping the running slots")
            self._unreachable_since = self._unreachable_since or time.monotonic()
            return None
        self._unreachable_since = None
        if cur is None:
            return 0
        if cur["generation"] != self.generation:
            self.generation, self.failures = cur["generation"], 0  # a new generation is a new job
        if cur["workers"] is not None:
            return int(cur["workers"])
        return len(cur["assignment"]) if cur["assignment"] is not None else None

    def _members_train(self, want: int) -> bool:
        """Whether every slot of the current generation reports ``running``: the pool starts
        spares only then, so their imports never compete with a generation's start."""
        try:
            seen = self._store.workers_seen(self.generation) if self._store and self.generation else {}
        except Exception:  # noqa: BLE001 - an outage: no spare until it is over
            return False
        return all((seen.get(s) or {}).get("state") == "running" for s in range(want))

    def _start_slots(self, slots: list[int], reason: str) -> None:
        if self.port is None:
            self.port = free_port()
        self._told_to_stop -= set(slots)
        for r in slots:
            env = os.environ | {"KALE_START_REASON": reason}
            with open(self._log(r), "ab") as out:
                self.slots[r] = subprocess.Popen(
                    [*self.cmd, "--worker-id", str(r), "--rendezvous", f"127.0.0.1:{self.port}"],
                    stdout=out, stderr=subprocess.STDOUT, env=env)
        say(f"started slot(s) {', '.join(map(str, slots))} ({reason}; rendezvous 127.0.0.1:{self.port}; pids "
            f"{', '.join(str(self.slots[r].pid) for r in slots)})")

    def _reap_slots(self) -> dict[int, int]:
        """End every slot: a grace to fail on their own (a broken collective), SIGTERM (a waiting
        rank exits 0), then SIGKILL. Returns their codes."""
        for stage in ("wait", "term", "kill"):
            until = time.monotonic() + self.grace_s
            while time.monotonic() < until and any(p.poll() is None for p in self.slots.values()):
                time.sleep(0.05)
            for p in self.slots.values():
                if p.poll() is None and stage != "wait":
                    p.terminate() if stage == "term" else p.kill()
        codes = {r: p.wait() for r, p in self.slots.items()}
        self.slots.clear()
        return codes

    def _mark_dead(self, slots: list[int]) -> None:
        """Best-effort: the dead slots' ``running`` heartbeats become ``failed``, so a handover
        waiting for them goes on at once instead of after they go stale."""
        try:
            for gen, w, _rec in self._store.running_workers() if self._store is not None else []:
                if w in slots:
                    self._store.worker_seen(gen, w, "failed")
        except Exception as exc:  # noqa: BLE001 - they go stale instead
            say(f"could not mark the dead slots failed ({type(exc).__name__})")

    def run(self) -> int:
        """Hold the pool's lock (exit 0 when another supervisor has it), then supervise."""
        import fcntl

        self._lock = open(self.log_dir / "pool.lock", "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            say(f"another pool supervisor holds {self.log_dir / 'pool.lock'}: nothing to do")
            return 0
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        return super().run()

    def _loop(self) -> int:
        started, attempt_reason = time.monotonic(), "start"
        known = None  # the last size the control plane said (kept through an outage)
        while True:
            want = self._wanted()
            known = known if want is None else want
            exited = {r: p.poll() for r, p in self.slots.items() if p.poll() is not None}
            for r, code in exited.items():
                if code == 0:
                    say(f"slot {r} pid {self.slots.pop(r).pid} exited 0")
            if self.stopping:
                return max((p.wait() for p in self.slots.values()), default=0)
            start, new_attempt, failed = pool_plan(want, set(self.slots), exited, self.standby, self.most)
            if want and max(start, default=-1) >= want and not self._members_train(want):
                start = [s for s in start if s < want]  # spares after the generation's ranks, not beside their start
            if new_attempt:
                give_up, delay = self._end_attempt(exited, failed, time.monotonic() - started)
                if give_up:
                    return next((c for c in exited.values() if c), 1)
                self._pause(delay)
                started, attempt_reason, self.port = time.monotonic(), restart_reason(exited), None
                continue
            if start:
                reason = (attempt_reason if not self.slots else "scale-up" if min(start) < want else
                          "spare (it waits for a larger generation to name its slot)")
                self._start_slots(start, reason)
                attempt_reason = "rejoin"
            if known == 0 and not self.slots:  # an outage after the stop does not keep it waiting
                say("the current generation wants no worker and none runs: the pool ends")
                return 0
            if want == 0:  # the deployment stopped: no generation will take the ranks waiting for one
                for r in sorted(set(self.slots) - self._told_to_stop):
                    say(f"the current generation wants no worker: slot {r} is told to stop")
                    self.slots[r].terminate()  # a waiting rank exits 0; a training one checkpoints first
                    self._told_to_stop.add(r)
            if (want is None and not self.slots and self._unreachable_since is not None
                    and time.monotonic() - self._unreachable_since >= self.outage_deadline_s):
                say(f"the control plane has been unreachable for --outage-deadline {self.outage_deadline_s:g} s "
                    "and no slot runs: the pool ends (the next training run starts a new one)")
                return EXIT_DEPENDENCY
            time.sleep(self.poll_s)

    def _end_attempt(self, exited: dict[int, int], failed: bool, ran_s: float) -> tuple[bool, float]:
        """Stop every slot of the attempt; (give up, delay before the next one)."""
        bad = {r: c for r, c in exited.items() if c != 0}
        codes = {**self._reap_slots(), **exited}
        dead = sorted(codes)
        self._mark_dead(dead)
        if not failed:
            say(f"slot 0 must start again while slot(s) {dead} live: every slot restarts on a new rendezvous port")
            return False, 0.0
        give_up, delay, then = self.verdict(list(bad.values()), ran_s)
        first = min(bad)
        for r, code in sorted(codes.items()):
            how = f"ended with {describe(code)}" if r in bad else f"stopped by the supervisor after slot {first} failed"
            line = (f"slot {r} {how}; {then}" + ("; the job's slices wait for the next generation" if give_up else
                    " (every slot restores the job's checkpoint: model, optimizer, step and slice positions)"))
            say(line)
            with open(self._log(r), "a") as fh:
                fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervisor: {line}\n")
        return give_up, delay


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
    ap.add_argument("--outage-deadline", type=float, default=OUTAGE_DEADLINE_S,
                    help=f"give up after a dependency outage (the worker exits {EXIT_DEPENDENCY}) of this many "
                    f"seconds; such restarts do not count toward --max-restarts (default {OUTAGE_DEADLINE_S:g})")
    ap.add_argument("--ranks", type=int, default=0,
                    help="run the command as the N ranks of one distributed job (appends --worker-id, "
                    "--workers-total and --rendezvous 127.0.0.1:PORT); 0: one process as is")
    ap.add_argument("--pool", action="store_true",
                    help="keep the deployment's rank processes across generations: one per slot of the control "
                    "plane's current generation (KALE_DATABASE_URL), started as generations grow (appends "
                    "--worker-id and --rendezvous 127.0.0.1:PORT), restarted together when one fails")
    ap.add_argument("--standby", type=int, default=0,
                    help="with --pool: also keep this many spare slots above the current generation's size started "
                    "(they import and build the model, then wait for a larger generation; the rank command needs "
                    "the same --standby), so a scale-up does not wait for a process to start (default 0)")
    ap.add_argument("--max-slots", type=int, default=None,
                    help="with --pool: never start slot N or higher (the deployment's max_workers; default: no "
                    "limit besides --standby)")
    ap.add_argument("--log-dir", default=".", help="with --ranks: folder of the ranks' logs")
    ap.add_argument("--log-name", default="worker-{rank}.log", help="with --ranks: each rank's log file name")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="the worker command, after --")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no worker command given: put it after --")
    if args.max_restarts < 0 or args.backoff < 0 or args.standby < 0:
        ap.error("--max-restarts, --backoff and --standby must be >= 0")
    if args.pool:
        url = option(cmd, "--database-url") or os.environ.get("KALE_DATABASE_URL")
        if not url:
            ap.error("--pool reads the current generation from the control-plane database: set KALE_DATABASE_URL")
        return PoolSupervisor(cmd, args.log_dir, args.log_name, url, standby=args.standby, most=args.max_slots,
                              max_restarts=args.max_restarts,
                              backoff_s=args.backoff, healthy_after_s=args.healthy_after,
                              outage_deadline_s=args.outage_deadline).run()
    if args.ranks > 0:
        return JobSupervisor(cmd, args.ranks, args.log_dir, args.log_name, max_restarts=args.max_restarts,
                             backoff_s=args.backoff, healthy_after_s=args.healthy_after,
                             outage_deadline_s=args.outage_deadline).run()
    return Supervisor(cmd, args.max_restarts, args.backoff, args.healthy_after, args.outage_deadline).run()


if __name__ == "__main__":
    sys.exit(main())
