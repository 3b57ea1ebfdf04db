"""A local deployment driven the way the DAGs drive it, without Airflow: each rescale is the
autoscaler's apply, the training DAG's rebalance and its ``start_local``; a producer thread
feeds the stream; audits read what reached the model. Shared by the warm-rescale tests and
``benchmarks/rescale.py``."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import yaml

from kale_airflow.core.slices import Slice
from kale_airflow.runtime.elastic import RESCALE_KEY
from kale_airflow.runtime.samples import generate, pack


class Producer(threading.Thread):
    """Appends ``rate`` samples/s spread over the partitions until stopped (``payloads(n,
    seed)`` makes them; default the CTR samples)."""

    def __init__(self, stream, partitions: int, rate: float, payloads=None, chunk_s: float = 0.1):
        super().__init__(daemon=True)
        self.stream, self.partitions, self.rate, self.chunk_s = stream, partitions, rate, chunk_s
        self.payloads = payloads or (lambda n, seed: pack(generate(n, seed)))
        self.stop_event = threading.Event()
        self.seed = 0

    def run(self) -> None:
        per = max(1, int(self.rate * self.chunk_s / self.partitions))
        while not self.stop_event.is_set():
            for p in range(self.partitions):
                self.seed += 1
                self.stream.append(p, self.payloads(per, self.seed))
            time.sleep(self.chunk_s)

    def stop(self) -> None:
        self.stop_event.set()
        self.join()


class Deployment:
    """A Kale home with a local backend: its config, store, stream and the rescales of its job."""

    def __init__(self, home: Path, partitions: int = 6, max_workers: int = 6, batch: int = 64,
                 step_time_s: float = 0.05, warm_wait_s: float = 120.0, checkpoint_every: int = 10,
                 trainer: str | None = None, audit: bool = True, step_log: bool = True, extra: dict | None = None):
        from kale_airflow.stream.embedded import EmbeddedStream

        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.partitions, self.checkpoint_every = partitions, checkpoint_every
        self.stream = EmbeddedStream(self.home / "stream.db", partitions=partitions)
        self.audit = self.home / "audit.log" if audit else None
        self.steps = self.home / "steps.log"
        args = ["--checkpoint-every", str(checkpoint_every), "--report-every", "1"]
        args += ["--step-log", str(self.steps)] if step_log else []
        args += ["--audit", str(self.audit)] if audit else []
        cfg = {"stream_url": f"sqlite:///{self.home / 'stream.db'}", "worker_backend": "local",
               "max_workers": max_workers, "partitions": partitions, "worker_batch_size": batch,
               "worker_step_time_s": step_time_s, "handover_timeout_s": 120, "worker_warm_wait_s": warm_wait_s,
               **({"trainer": trainer} if trainer else {}), **(extra or {})}
        (self.home / "kale.yaml").write_text(yaml.safe_dump(cfg))
        self.env = {"KALE_HOME": str(self.home), "KALE_CONFIG": str(self.home / "kale.yaml")}
        self.extra_args = args
        self.history: list[dict] = []

    @contextmanager
    def environment(self):
        """The deployment's environment variables for the duration of a block."""
        before = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            yield self
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def generations(self):
        from kale_airflow.config import load_config
        from kale_airflow.control.generations import Generations

        gens = Generations(load_config())
        original = gens.worker_spec

        def spec(*a, **k):  # the tests' audit and step log on every rank
            s = original(*a, **k)
            s.extra_args = s.extra_args + self.extra_args
            return s

        gens.worker_spec = spec
        return gens

    @property
    def store(self):
        from kale_airflow.store import StateStore

        return StateStore(f"sqlite:///{self.home / 'kale.db'}")

    def scale(self, workers: int, during=None) -> dict:
        """One rescale as the DAGs make it: apply the decision (``during()`` runs right after
        it, e.g. a kill), rebalance (waits for the old generation to stop), start. Returns
        ``{generation, decided, from, to}``."""
        gens = self.generations()
        cur = gens.store.current()
        decision = {"status": "scale", "current": cur["workers"] if cur else 0, "workers": workers,
                    "current_generation": cur["generation"] if cur else None, "reason": "test", "message": "test"}
        done = gens.apply(decision, run_id=f"run{len(self.history)}")
        decided = (gens.store.get_value("generation_meta") or {}).get("since")
        if during is not None:
            during()
        gens.rebalance(done["generation"], workers)
        gens.start_local(done["generation"], f"train{len(self.history)}")
        rec = {"generation": done["generation"], "decided": decided, "from": decision["current"], "to": workers}
        self.history.append(rec)
        return rec

    def first_step(self, generation: str, timeout: float = 240.0) -> dict:
        """Rank 0's record of the generation's first step (see ``Job.record_pause``); for the
        first generation, which has nothing to record, its first line in the step log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rec = self.store.get_value(RESCALE_KEY.format(generation=generation))
            if rec is not None:
                return rec
            if len(self.history) == 1 and self._running(generation):
                return {"generation": generation, "kind": None}
            time.sleep(0.1)
        raise AssertionError(f"generation {generation} trained no step within {timeout} s; logs: "
                             f"{self.tail_logs()}")

    def _running(self, generation: str) -> bool:
        """The first generation trains: a step in the step log, or (without one) every rank's heartbeat."""
        if self.steps.exists():
            return f'"generation": "{generation}"' in self.steps.read_text()
        seen = self.store.workers_seen(generation)
        return len([r for r in seen.values() if r["state"] == "running"]) >= self.history[0]["to"]

    def tail_logs(self, n: int = 1500) -> str:
        out = []
        for p in sorted((self.home / "worker-logs").glob("*.log")):
            out.append(f"--- {p.name}\n{p.read_text()[-n:]}")
        return "\n".join(out)

    def slot_pids(self) -> dict[int, int]:
        """The pool's rank processes by slot."""
        from kale_airflow.config import load_config
        from kale_airflow.runtime.backends import LocalPool

        pid = LocalPool.__new__(LocalPool)
        pid.log_dir = Path(load_config().settings.worker_logs)
        sup = pid.running()
        if not sup or sup < 0:
            return {}
        out = {}
        for child in psutil.Process(sup).children():
            try:
                cmd = child.cmdline()
            except psutil.Error:
                continue
            if "--worker-id" in cmd:
                out[int(cmd[cmd.index("--worker-id") + 1])] = child.pid
        return out

    def kill(self, slot: int) -> None:
        """``kill -9`` of one rank process."""
        os.kill(self.slot_pids()[slot], signal.SIGKILL)

    def drain(self, timeout: float = 120.0) -> dict[int, int]:
        """Wait until every sample the stream holds has reached the model (the audit says so);
        returns the partitions' ends."""
        ends = self.stream.end_offsets()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if exactly_once_audit(audit_rows(self.audit), self.partitions, ends, self.checkpoint_every)["never"] == 0:
                return ends
            time.sleep(0.5)
        raise AssertionError(f"the stream was not trained to its end within {timeout} s")

    def finish(self, timeout: float = 120.0) -> None:
        """Name a generation of no workers: every rank checkpoints and exits, the pool ends."""
        self.store.set_current_generation("finished", 0)
        deadline = time.monotonic() + timeout
        while self.slot_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not self.slot_pids(), "ranks kept running after a generation of no workers"


# ------------------------------------------------------------------ audits
def audit_rows(path) -> list[tuple]:
    """(slice, start, end, generation, t_start, t_end, step, samples, run, rank) per audit line."""
    out = []
    for line in open(path):
        p, lo, hi, a, b, gen, t0, t1, step, k, run, rank = line.strip().split(",")
        out.append((Slice(int(p), float(lo), float(hi)), int(a), int(b), gen, float(t0), float(t1), int(step),
                    int(k), run, int(rank)))
    return out


def trainings(rows, partition: int) -> dict[int, list[tuple[int, str]]]:
    """offset -> (model step, process run id) of each time it reached the model, checking each
    row's sample count against its slice's offsets."""
    seen: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for sl, a, b, _g, _t0, _t1, step, k, run, _rank in rows:
        if sl.partition != partition:
            continue
        offs = np.arange(a, b)
        offs = offs[sl.mask(offs)]
        assert k == len(offs), f"{sl} [{a},{b}) holds {len(offs)} samples but the audit says {k}"
        for o in offs.tolist():
            seen[o].append((step, run))
    return seen


def exactly_once_audit(rows, partitions: int, ends: dict[int, int], checkpoint_every: int) -> dict:
    """Per sample of every partition below ``ends``: trained at least once, at most twice, and
    when twice, its first training was thrown away by a crash: it lies within
    ``checkpoint_every`` steps of the last step of the process that trained it (what a restart
    from the last checkpoint replays)."""
    last: dict[str, int] = {}
    for r in rows:
        last[r[8]] = max(last.get(r[8], 0), r[6])
    out = {"samples": 0, "never": 0, "more_than_twice": 0, "duplicates": 0, "duplicates_outside": 0,
           "max_steps_before_crash": 0}
    for p in range(partitions):
        seen = trainings(rows, p)
        for o in range(ends.get(p, 0)):
            got = seen.get(o, [])
            out["samples"] += 1
            out["never"] += not got
            out["more_than_twice"] += len(got) > 2
            if len(got) == 2:
                out["duplicates"] += 1
                step, run = got[0]  # the audit is appended in time order: the first training comes first
                before = last[run] - step
                out["max_steps_before_crash"] = max(out["max_steps_before_crash"], before)
                out["duplicates_outside"] += before >= checkpoint_every
    out["ok"] = not (out["never"] or out["more_than_twice"] or out["duplicates_outside"])
    return out
