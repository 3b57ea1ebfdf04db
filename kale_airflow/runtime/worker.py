"""Reference online-training worker (the container command of a GPU worker pod).

    python -m kale_airflow.runtime.worker --stream sqlite:///S.db --group kale \\
        --assignment A.json --worker-id 0 --generation G --checkpoint-dir DIR [...]

- trains the reference CTR model on its partitions or partition slices (a slice
  ``[lo, hi)`` of partition p takes the offsets o with ``frac(o * phi)`` in it, so slices of
  one partition interleave samples and never overlap);
- commits each slice's next offset only after the step that consumed it, so a crash
  re-trains at most one batch per slice and never skips a sample;
- checkpoints model, optimizer and step count atomically every ``--checkpoint-every``
  steps and when it stops; on start it restores the newest checkpoint in the folder;
- stops (checkpoint, exit 0) on SIGTERM or when the control store names a newer
  generation;
- records its samples/s (wall time, reads and commits included) to the metrics store,
  for report windows in which it never ran out of data;
- skips and counts malformed samples.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from kale_airflow.core.slices import Slice, slices_for

log = logging.getLogger("kale.worker")
_signalled: list[int] = []  # set by the signal handler, which is installed before torch loads


class Worker:
    """One training process."""

    def __init__(self, stream, group: str, slices: list[Slice], checkpoint_dir: str | Path, worker_id: int = 0,
                 generation: str = "0", workers_total: int = 1, batch_size: int = 512, lr: float = 0.01,
                 checkpoint_every: int = 50, metrics=None, control=None, audit: str | Path | None = None,
                 seed: int = 0, step_time_s: float = 0.0):
        import torch

        from kale_airflow.runtime.model import CTRModel

        self.stream, self.group, self.slices = stream, group, slices
        self.ckpt_dir = Path(checkpoint_dir)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.worker_id, self.generation, self.workers_total = worker_id, generation, workers_total
        self.batch_size, self.checkpoint_every = batch_size, checkpoint_every
        self.metrics, self.control = metrics, control
        self.audit = Path(audit) if audit else None
        torch.manual_seed(seed)
        self.model = CTRModel()
        self.optim = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.loss_fn = torch.nn.BCEWithLogitsLoss()
        self.step_time_s = step_time_s
        self.steps = 0
        self.trained = 0
        self.malformed = 0
        self.positions = {s: stream.committed(self._group(s), s.partition) for s in slices}
        self.restored_from: str | None = self.restore()

    def _group(self, s: Slice) -> str:
        return f"{self.group}/{s.group_suffix}"

    # -------------------------------------------------------------- checkpoints
    @property
    def checkpoint_path(self) -> Path:
        """This worker's checkpoint file."""
        return self.ckpt_dir / f"worker-{self.worker_id}.pt"

    def checkpoint(self) -> Path:
        """Atomically write model, optimizer and counters."""
        import torch

        tmp = self.checkpoint_path.with_suffix(".tmp")
        torch.save({"model": self.model.state_dict(), "optim": self.optim.state_dict(), "steps": self.steps,
                    "trained": self.trained, "generation": self.generation,
                    "positions": {s.group_suffix: o for s, o in self.positions.items()}}, tmp)
        os.replace(tmp, self.checkpoint_path)
        return self.checkpoint_path

    def restore(self) -> str | None:
        """Load this worker's checkpoint, else the newest one in the folder (replicas of one model)."""
        import torch

        candidates = [self.checkpoint_path] if self.checkpoint_path.exists() else \
            sorted(self.ckpt_dir.glob("worker-*.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
        for path in candidates:
            try:
                state = torch.load(path, weights_only=False)
            except Exception as exc:  # noqa: BLE001 - a torn or foreign file: try the next
                log.warning("cannot read checkpoint %s (%s); trying another", path, exc)
                continue
            self.model.load_state_dict(state["model"])
            self.optim.load_state_dict(state["optim"])
            self.steps = state["steps"]
            log.info("restored %s (step %d, generation %s)", path.name, self.steps, state.get("generation"))
            return str(path)
        return None

    # ---------------------------------------------------------------- training
    def step(self) -> int:
        """Read, train one step, then commit. Returns samples trained (0: nothing to read)."""
        from kale_airflow.runtime.model import to_tensors
        from kale_airflow.runtime.samples import unpack

        t0 = time.perf_counter()
        per = max(1, self.batch_size // max(1, len(self.slices)))
        batches, new_pos, audit = [], {}, []
        for s in self.slices:
            pos = self.positions[s]
            want = int(math.ceil(per / max(s.hi - s.lo, 1e-3)))
            recs = self.stream.read(s.partition, pos, want)
            if not recs:
                continue
            offsets = np.fromiter((r.offset for r in recs), dtype=np.int64, count=len(recs))
            keep = s.mask(offsets)
            samples, bad = unpack([r.payload for r, k in zip(recs, keep) if k])
            self.malformed += bad
            batches.append(samples)
            new_pos[s] = int(offsets[-1]) + 1
            audit.append((s, pos, int(offsets[-1]) + 1))
        if not new_pos:
            return 0
        data = np.concatenate(batches) if batches else None
        n = 0 if data is None else len(data)
        if n:
            user, item, dense, label = to_tensors(data)
            self.optim.zero_grad()
            loss = self.loss_fn(self.model(user, item, dense), label)
            loss.backward()
            self.optim.step()
            self.last_loss = loss.item()
        if self.step_time_s and n:  # emulate an accelerator's step time on CPU (demos, capacity planning)
            time.sleep(max(0.0, self.step_time_s * n / self.batch_size - (time.perf_counter() - t0)))
        if self.audit is not None:  # what was trained, by whom and when (wall clock: comparable across processes)
            t_end = time.time()
            t_start = t_end - (time.perf_counter() - t0)
            with self.audit.open("a") as fh:
                for s, a, b in audit:
                    fh.write(f"{s.partition},{s.lo:.6f},{s.hi:.6f},{a},{b},{self.generation},{t_start:.6f},{t_end:.6f}\n")
                fh.flush()
                os.fsync(fh.fileno())
        # Commit only after the step that consumed them, every slice in one call.
        self.stream.commit_many({self._group(s): {s.partition: o} for s, o in new_pos.items()})
        self.positions.update(new_pos)
        self.steps += 1
        self.trained += n
        if self._window_start is None:
            self._window_start = t0
        self._window_samples += n
        return n

    _window_start: float | None = None
    _window_samples: int = 0

    def _report(self, starved: bool) -> None:
        """Record samples/s over the last window (read, train and commit included), but only
        for windows where data never ran out: a starved worker measures traffic, not capacity."""
        start, n = self._window_start, self._window_samples
        self._window_start, self._window_samples = None, 0
        if self.metrics is None or starved or start is None or n < self.batch_size:
            return
        rate = n / (time.perf_counter() - start)
        # Cluster throughput estimate: replicas are symmetric, so n workers ~ n times one.
        self.metrics.write_throughput([time.time()], [self.workers_total], [rate * self.workers_total])

    def _seen(self, state: str) -> None:
        if self.control is not None:
            self.control.worker_seen(self.generation, self.worker_id, state)

    def superseded(self) -> bool:
        """True when the control store names another generation as current."""
        if self.control is None:
            return False
        current = self.control.current_generation()
        return current is not None and current != self.generation

    def run(self, max_steps: int | None = None, idle_sleep: float = 0.2, report_every_s: float = 5.0,
            exit_when_idle: bool = False) -> dict:
        """Train until stopped (SIGTERM, superseded, ``max_steps``, or idle when asked)."""
        last_report = time.monotonic()
        starved = False
        self._seen("running")
        while not _signalled:
            n = self.step()
            if n == 0:
                starved = True
            if n == 0:
                if exit_when_idle:
                    break
                time.sleep(idle_sleep)
            if self.steps and self.steps % self.checkpoint_every == 0 and n:
                self.checkpoint()
            if time.monotonic() - last_report >= report_every_s:
                self._report(starved)
                self._seen("running")
                starved = False
                last_report = time.monotonic()
                if self.superseded():
                    log.info("generation %s superseded: stopping", self.generation)
                    break
            if max_steps is not None and self.steps >= max_steps:
                break
        path = self.checkpoint()
        self._seen("stopped")  # after the checkpoint: the next generation may take over these slices
        summary = {"steps": self.steps, "trained": self.trained, "malformed": self.malformed,
                   "checkpoint": str(path), "restored_from": self.restored_from}
        log.info("stopped: %s", summary)
        return summary


def build_arg_parser() -> argparse.ArgumentParser:
    """Arguments of the worker command."""
    ap = argparse.ArgumentParser(prog="python -m kale_airflow.runtime.worker",
                                 description="Reference online-training worker for kale-airflow.")
    ap.add_argument("--stream", required=True, help="stream URL, e.g. sqlite:///path/stream.db")
    ap.add_argument("--group", default="kale", help="consumer group prefix")
    ap.add_argument("--assignment", required=True, help="assignment JSON (file path or inline JSON)")
    ap.add_argument("--worker-id", type=int, required=True)
    ap.add_argument("--workers-total", type=int, default=None, help="size of the generation (default: from assignment)")
    ap.add_argument("--generation", default="0")
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    ap.add_argument("--database-url", help="control-plane database to record throughput into and to read the "
                    "current generation from (local use; default: the KALE_DATABASE_URL environment variable, "
                    "which keeps a password out of process listings and pod specs)")
    ap.add_argument("--audit", help="append trained offset ranges here (tests, audits)")
    ap.add_argument("--report-every", type=float, default=5.0, help="seconds between throughput records")
    ap.add_argument("--step-time", type=float, default=0.0,
                    help="minimum seconds per training step, to emulate a GPU's step time on a CPU")
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--exit-when-idle", action="store_true", help="stop when no data is left (batch jobs, tests)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; exits 0 after a clean stop."""
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(message)s")

    def on_term(signum, frame):
        log.info("signal %d: finishing the current step, then checkpointing", signum)
        _signalled.append(signum)

    # First thing: a SIGTERM that arrives while torch is still importing must not kill us.
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if os.environ.get("KALE_WORKER_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["KALE_WORKER_THREADS"]))
    from kale_airflow.stream import open_stream

    text = args.assignment
    assignment = json.loads(Path(text).read_text() if not text.lstrip().startswith("{") else text)
    slices = slices_for(assignment, args.worker_id)
    total = args.workers_total or len(assignment.get("assignment", assignment))
    metrics = control = None
    url = args.database_url or os.environ.get("KALE_DATABASE_URL")
    if url:  # without one the worker trains, but records nothing and never sees a newer generation
        from kale_airflow.metrics.embedded import EmbeddedMetrics
        from kale_airflow.store import StateStore

        metrics, control = EmbeddedMetrics(url, seed=False), StateStore(url)
    worker = Worker(open_stream(args.stream), args.group, slices, args.checkpoint_dir, args.worker_id,
                    args.generation, total, args.batch_size, checkpoint_every=args.checkpoint_every,
                    metrics=metrics, control=control, audit=args.audit, step_time_s=args.step_time)
    log.info("worker %d of %d, generation %s, %d slice(s), restored from %s", args.worker_id, total,
             args.generation, len(slices), worker.restored_from)
    worker.run(max_steps=args.max_steps, exit_when_idle=args.exit_when_idle, report_every_s=args.report_every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
