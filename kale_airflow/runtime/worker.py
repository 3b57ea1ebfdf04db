"""Reference online-training job: one rank of a data-parallel ``torch.distributed`` job.

    python -m kale_airflow.runtime.worker --stream sqlite:///S.db --group kale \\
        --assignment A.json --worker-id RANK --workers-total N --rendezvous HOST:PORT \\
        --generation G --checkpoint-dir DIR [...]

A generation is **one job** of N ranks (local processes, or pods on Kubernetes):

- **rendezvous**: ``--rendezvous HOST:PORT`` (rank 0 serves a ``TCPStore`` there, the others
  connect; locally the supervisor picks a free port on 127.0.0.1 for every attempt), or
  ``--rendezvous control-plane:PORT`` (Kubernetes: rank 0 publishes its pod IP,
  ``$KALE_POD_IP`` from the downward API, and the port in the control-plane database under
  ``rendezvous/<generation>``; the other ranks read it there). gloo on CPU, NCCL when CUDA is
  present. Without ``--rendezvous`` and with one worker the process trains alone (tests).
- **DistributedDataParallel** on the CTR model; every rank reads the slices the rebalancer
  assigned to it (a slice ``[lo, hi)`` of partition p takes the offsets o with
  ``frac(o * phi)`` in it) and every step is synchronized by one small all-reduce of
  control values (samples read, stop asked) followed by DDP's gradient all-reduce.
- **Uneven inputs: zero-weight padding.** A rank with fewer samples (or none) still runs
  forward/backward every step; each rank's loss is ``sum of its sample losses * N /
  global samples``, so DDP's gradient average is exactly the mean gradient over the
  global batch, however the samples are spread; a rank with no data forwards one dummy
  sample with weight 0. (DDP's ``join()`` also works with gloo, but it shadows the
  collectives of the ranks that ran dry and needs the control all-reduce anyway; padding
  keeps one code path for every rank.)
- **Offsets live in the checkpoint**: every ``--checkpoint-every`` steps and at stop rank 0
  gathers every rank's slice positions and writes one atomic checkpoint (model, optimizer,
  step, positions); only then does it commit those positions to the stream. A restart
  (or a new generation with another world size) restores that checkpoint on rank 0 and
  broadcasts it; each slice starts at the later of its stream commit and the lowest
  checkpointed position of the old slices that overlap it (the handover rule), so training
  resumes from exactly what the model has seen; the steps since the last checkpoint are
  replayed (trained at most twice, never skipped).
- stops (checkpoint, exit 0) on SIGTERM or when rank 0 sees a newer generation in the
  control store: the stop is agreed in the step's all-reduce, so every rank stops at the
  same step. A rank that dies makes its peers' collectives fail: the whole generation
  fails and restarts from the checkpoint (the local supervisor restarts every rank; on
  Kubernetes every pod's task retries).
- rank 0 records the job's samples/s (global samples over wall time, reads, all-reduce and
  checkpoints included) to the metrics store, for windows in which no rank ran dry;
- skips and counts malformed samples.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import signal
import socket
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from kale_airflow.core.errors import KaleError
from kale_airflow.core.slices import Slice, slices_for
from kale_airflow.runtime import exposition

log = logging.getLogger("kale.worker")
_signalled: list[int] = []  # set by the signal handler, which is installed before torch loads
CHECKPOINT = "model.pt"
RENDEZVOUS_KEY = "rendezvous/{generation}"
CONTROL_PLANE = "control-plane"
DEFAULT_PORT = 29500


def start_positions(slices: list[Slice], committed: dict[Slice, int], checkpointed: list[tuple]) -> dict[Slice, int]:
    """Where each slice starts: the later of its stream commit and the lowest checkpointed
    position of the checkpoint's slices that overlap it (the handover rule of
    ``control.generations.handover``, applied to the positions the model has seen).

    ``checkpointed``: ``(partition, lo, hi, position)`` of the job that wrote the checkpoint."""
    out = {}
    for s in slices:
        overlapping = [pos for p, lo, hi, pos in checkpointed if p == s.partition and lo < s.hi and s.lo < hi]
        out[s] = max(committed[s], min(overlapping)) if overlapping else committed[s]
    return out


def parameter_hash(model) -> str:  # pragma: no mutate block
    """SHA-1 of every parameter's bytes (identical across ranks of a synchronized job)."""
    h = hashlib.sha1()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class DeviceError(KaleError, RuntimeError):
    """The configured training device is not there; the message says which setting and what to do."""


DEVICES = ("auto", "cpu", "cuda")


def select_device(requested: str = "auto", rank: int = 0):  # pragma: no mutate block
    """The torch device a rank trains on. ``cpu``; ``cuda`` (a :class:`DeviceError` when torch
    sees no GPU: a job configured for GPUs must not crawl on a CPU unnoticed); ``auto``: CUDA
    when torch sees a GPU, else CPU. The GPU index is ``$LOCAL_RANK``, else the rank modulo the
    visible GPUs."""
    import torch

    if requested not in DEVICES:
        raise DeviceError(f"worker_device {requested!r} is not one of {', '.join(DEVICES)}")
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"worker_device is 'cuda' (the deployment's worker_device, the worker's --device or $KALE_WORKER_DEVICE) "
            f"but torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none'}) sees no GPU. Give the worker "
            "a GPU (kubernetes.gpus_per_worker, an image with a CUDA build of torch, the NVIDIA device plugin), or "
            "set worker_device: auto (CUDA when present, else CPU) or cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))


class Worker:
    """One rank of the training job (or a lone trainer when no process group is set up)."""

    def __init__(self, stream, group: str, slices: list[Slice], checkpoint_dir: str | Path, worker_id: int = 0,
                 generation: str = "0", workers_total: int = 1, batch_size: int = 512, lr: float = 0.01,
                 checkpoint_every: int = 50, metrics=None, control=None, audit: str | Path | None = None,
                 seed: int = 0, step_time_s: float = 0.0, step_log: str | Path | None = None,
                 device: str = "auto", amp: bool = False):  # pragma: no mutate block
        import torch
        import torch.distributed as dist

        from kale_airflow.runtime.model import CTRModel

        self.stream, self.group, self.slices = stream, group, slices
        self.ckpt_dir = Path(checkpoint_dir)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        if self.distributed and (self.rank, self.world) != (worker_id, workers_total):
            raise ValueError(f"rank {self.rank} of {self.world} started as worker {worker_id} of {workers_total}")
        if self.rank == 0:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.worker_id, self.generation, self.workers_total = worker_id, generation, workers_total
        self.batch_size, self.checkpoint_every = batch_size, checkpoint_every
        self.metrics, self.control = metrics, control
        self.audit = Path(audit) if audit else None
        self.step_log = Path(step_log) if step_log else None
        self.run_id = uuid.uuid4().hex[:8]  # one per process start: tells replayed steps apart in audits
        self.device = select_device(device, self.rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.amp = amp and self.device.type == "cuda"  # bf16 autocast on CUDA only: the CPU path stays float32
        torch.manual_seed(seed)
        self.module = CTRModel().to(self.device)
        self.optim = torch.optim.Adam(self.module.parameters(), lr=lr)
        self.loss_fn = torch.nn.BCEWithLogitsLoss(reduction="none")
        self.step_time_s = step_time_s
        self.steps = 0
        self.trained = 0  # samples this rank trained in this process (replays included)
        self.malformed = 0
        self.last_loss = float("nan")
        self.restored_from: str | None = None
        self.restored_step = 0
        checkpointed = self.restore()
        committed = {s: stream.committed(self._group(s), s.partition) for s in slices}
        self.positions = start_positions(slices, committed, checkpointed)
        # DDP after the restore: its constructor broadcasts rank 0's parameters (equal anyway).
        self.model = torch.nn.parallel.DistributedDataParallel(self.module) if self.distributed else self.module

    def _group(self, s: Slice) -> str:
        return f"{self.group}/{s.group_suffix}"

    # -------------------------------------------------------------- collectives
    def _broadcast(self, obj):  # pragma: no mutate block
        import torch.distributed as dist

        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _gather(self, obj) -> list:  # pragma: no mutate block
        import torch.distributed as dist

        if not self.distributed:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def _all_sum(self, values: list[float]) -> list[float]:  # pragma: no mutate block
        import torch
        import torch.distributed as dist

        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    # -------------------------------------------------------------- checkpoints
    @property
    def checkpoint_path(self) -> Path:
        """The job's one checkpoint (written by rank 0)."""
        return self.ckpt_dir / CHECKPOINT

    def checkpoint(self) -> Path:
        """Collective: rank 0 writes model, optimizer, step and every rank's slice positions
        atomically, then commits those positions to the stream (commits follow the checkpoint)."""
        import torch

        mine = [(s.partition, s.lo, s.hi, int(o)) for s, o in self.positions.items()]
        everyone = [row for rows in self._gather(mine) for row in rows]
        if self.rank == 0:
            tmp = self.checkpoint_path.with_suffix(".tmp")
            with open(tmp, "wb") as fh:
                torch.save({"model": self.module.state_dict(), "optim": self.optim.state_dict(), "steps": self.steps,
                            "generation": self.generation, "world_size": self.world, "group": self.group,
                            "slices": everyone}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.checkpoint_path)
            commits: dict[str, dict[int, int]] = {}
            for p, lo, hi, pos in everyone:
                commits[self._group(Slice(p, lo, hi))] = {p: pos}
            if commits:
                self.stream.commit_many(commits)
        return self.checkpoint_path

    def restore(self) -> list[tuple]:
        """Rank 0 loads the job's checkpoint and broadcasts it; returns its slice positions."""
        import torch

        state = None
        if self.rank == 0 and self.checkpoint_path.exists():
            try:
                state = torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
            except Exception as exc:  # noqa: BLE001 - a foreign or damaged file: start afresh, say so
                log.warning("cannot read checkpoint %s (%s); starting a new model", self.checkpoint_path, exc)  # pragma: no mutate
        state = self._broadcast(state)
        if state is None:
            return []
        self.module.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])
        self.steps = self.restored_step = state["steps"]
        self.restored_from = str(self.checkpoint_path)
        # pragma: no mutate start
        log.info("restored %s (step %d, generation %s, world size %s)", CHECKPOINT, self.steps,
                 state.get("generation"), state.get("world_size"))
        # pragma: no mutate end
        if state.get("group", self.group) != self.group:  # positions of another consumer group: not ours
            return []
        return [tuple(row) for row in state.get("slices", [])]

    # ---------------------------------------------------------------- training
    def _read(self) -> tuple[list, dict, list, int]:
        """This rank's share of the next global batch: (sample arrays, new positions, audit rows, records read)."""
        from kale_airflow.runtime.samples import unpack

        per = max(1, self.batch_size // max(1, len(self.slices)))
        parts, new_pos, audit, read = [], {}, [], 0
        for s in self.slices:
            pos = self.positions[s]
            want = int(math.ceil(per / max(s.hi - s.lo, 1e-3)))
            offsets, payloads = self.stream.read_payloads(s.partition, pos, want)  # no object per sample
            if not payloads:
                continue
            read += len(payloads)
            samples, bad = unpack(payloads, s.mask(offsets))
            self.malformed += bad
            parts.append(samples)
            new_pos[s] = int(offsets[-1]) + 1
            audit.append((s, pos, int(offsets[-1]) + 1, len(samples)))
        return parts, new_pos, audit, read

    def step(self, stop: bool = False) -> tuple[int, int, bool]:  # pragma: no mutate block
        """One synchronized step (collective: every rank calls it the same number of times).

        Returns (samples this rank trained, samples the job trained, stop agreed by any rank)."""
        from kale_airflow.runtime.samples import DTYPE

        t0 = time.perf_counter()
        malformed_before = self.malformed
        parts, new_pos, audit, read = ([], {}, [], 0) if stop else self._read()
        data = np.concatenate(parts) if parts else np.zeros(0, dtype=DTYPE)
        n = len(data)
        total, stops, dry, reads = self._all_sum([n, float(stop), float(n == 0), read])
        total = int(total)
        self._dry = self._dry or dry > 0
        self.idle = reads == 0  # no rank read anything
        if stops:
            return 0, 0, True  # nothing trained, positions unchanged: every rank stops here
        self.positions.update(new_pos)  # reads of malformed samples only still advance
        if not total:
            return 0, 0, False
        weight = 1.0
        if not n:  # this rank ran dry: one dummy sample with weight 0 keeps it in the all-reduce
            data, weight = np.zeros(1, dtype=DTYPE), 0.0
        losses = self.train_batch(data, weight, total)
        if n:
            self.last_loss = float(losses.mean().item())
        if self.step_time_s and n:  # demo emulation of an accelerator's step time on CPU (labelled as such)
            time.sleep(max(0.0, self.step_time_s * n / self.batch_size - (time.perf_counter() - t0)))
        self.steps += 1
        self.trained += n
        self._write_audit(audit, t0)
        exposition.observe_step(n, time.perf_counter() - t0, malformed=self.malformed - malformed_before)
        if self._window_start is None:
            self._window_start = t0
        self._window_samples += total
        return n, total, False

    def train_batch(self, data: np.ndarray, weight: float = 1.0, total: int | None = None):  # pragma: no mutate block
        """Forward, backward and optimizer step on this rank's samples; returns the per-sample losses.
        On CUDA the batch goes through pinned host memory with asynchronous copies, and the forward
        pass runs under bf16 autocast when ``amp`` is on."""
        import contextlib

        import torch

        from kale_airflow.runtime.model import to_tensors

        tensors = to_tensors(data)
        if self.device.type == "cuda":
            tensors = tuple(t.pin_memory().to(self.device, non_blocking=True) for t in tensors)
        user, item, dense, label = tensors
        self.optim.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext():
            losses = self.loss_fn(self.model(user, item, dense), label)
        # sum / global count * world: DDP's average of these gradients is the global batch's mean gradient
        (losses.sum() * (weight * self.world / (total or len(data)))).backward()
        self.optim.step()
        return losses

    _window_start: float | None = None
    _window_samples: int = 0
    _dry: bool = False
    idle: bool = False

    def _write_audit(self, audit: list, t0: float) -> None:  # pragma: no mutate block
        """Per step: what reached the model (slice, offset range, samples), and the parameters' hash."""
        if self.audit is None and self.step_log is None:
            return
        t_end = time.time()
        t_start = t_end - (time.perf_counter() - t0)
        if self.audit is not None:
            with self.audit.open("a") as fh:
                for s, a, b, k in audit:
                    fh.write(f"{s.partition},{s.lo:.6f},{s.hi:.6f},{a},{b},{self.generation},{t_start:.6f},"
                             f"{t_end:.6f},{self.steps},{k},{self.run_id},{self.rank}\n")
                fh.flush()
                os.fsync(fh.fileno())
        if self.step_log is not None:
            with self.step_log.open("a") as fh:
                fh.write(json.dumps({"rank": self.rank, "world": self.world, "step": self.steps, "run": self.run_id,
                                     "generation": self.generation, "loss": self.last_loss,
                                     "hash": parameter_hash(self.module)}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def _report(self) -> None:  # pragma: no mutate block
        """Rank 0 records the job's samples/s over the last window, but only for windows in
        which no rank ran dry: a starved job measures traffic, not capacity."""
        start, n, dry = self._window_start, self._window_samples, self._dry
        self._window_start, self._window_samples, self._dry = None, 0, False
        if self.metrics is None or self.rank != 0 or dry or start is None or n < self.batch_size:
            return
        rate = n / (time.perf_counter() - start)
        self.metrics.write_throughput([time.time()], [self.world], [rate])

    def _seen(self, state: str) -> None:  # pragma: no mutate block
        if self.control is not None:
            self.control.worker_seen(self.generation, self.worker_id, state)

    def superseded(self) -> bool:  # pragma: no mutate block
        """True when the control store names another generation as current."""
        if self.control is None:
            return False
        current = self.control.current_generation()
        return current is not None and current != self.generation

    def run(self, max_steps: int | None = None, idle_sleep: float = 0.2, report_every_s: float = 5.0,
            exit_when_idle: bool = False) -> dict:  # pragma: no mutate block
        """Train until stopped (SIGTERM on any rank, superseded, ``max_steps`` more steps, or idle when asked);
        every decision to stop is agreed in a step's all-reduce, so all ranks stop together."""
        last_report = time.monotonic()
        stop_next = False
        first = self.steps
        # A job that joined late (slow start, rendezvous) may already be superseded: train nothing.
        stop_next = self.rank == 0 and self.superseded()
        if stop_next:
            log.info("generation %s superseded: stopping every rank at the first step", self.generation)
        self._seen("running")
        while True:
            if max_steps is not None and self.steps - first >= max_steps:
                break  # the step counter is the same on every rank
            n, total, stop = self.step(stop=stop_next or bool(_signalled))
            if stop:
                break
            if total and self.steps % self.checkpoint_every == 0:
                self.checkpoint()
            if self.idle:
                if exit_when_idle:
                    break  # every rank saw the same all-reduced count
                time.sleep(idle_sleep)
            if time.monotonic() - last_report >= report_every_s:
                self._report()
                self._seen("running")
                last_report = time.monotonic()
                if self.rank == 0 and self.superseded():
                    log.info("generation %s superseded: stopping every rank at the next step", self.generation)
                    stop_next = True
        path = self.checkpoint()
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()  # nobody says "stopped" before rank 0's checkpoint and commits are written
        self._seen("stopped")  # after the checkpoint: the next generation may take over these slices
        summary = {"steps": self.steps, "trained": self.trained, "malformed": self.malformed,
                   "checkpoint": str(path), "restored_from": self.restored_from, "rank": self.rank,
                   "world_size": self.world}
        log.info("stopped: %s", summary)
        return summary


# ------------------------------------------------------------------ rendezvous
def rendezvous(address: str | None, rank: int, world: int, generation: str, control=None,
               timeout_s: float = 600.0, device: str = "auto"):  # pragma: no mutate block
    """Join the generation's process group (NCCL when this rank trains on CUDA, else gloo);
    returns the backend name (None: no group)."""
    import datetime

    import torch.distributed as dist

    if not address:
        if world > 1:
            raise SystemExit("a job of more than one worker needs --rendezvous HOST:PORT (or control-plane:PORT)")
        return None
    host, _, port_text = address.rpartition(":")
    port = int(port_text or DEFAULT_PORT)
    backend = "nccl" if select_device(device, rank).type == "cuda" else "gloo"
    deadline = time.monotonic() + timeout_s
    key = RENDEZVOUS_KEY.format(generation=generation)
    while True:
        if host == CONTROL_PLANE:  # Kubernetes: rank 0's pod IP, published in the control-plane database
            if control is None:
                raise SystemExit("--rendezvous control-plane needs the control-plane database (KALE_DATABASE_URL)")
            if rank == 0:
                own = os.environ.get("KALE_POD_IP") or socket.gethostbyname(socket.gethostname())
                control.set_value(key, {"host": own, "port": port, "t": time.time()})
                target = own
            else:
                rec = control.get_value(key)
                target = rec["host"] if rec else None
                port = rec["port"] if rec else port
        else:
            target = host
        if target is not None:
            try:
                store = dist.TCPStore(target, port, world, is_master=rank == 0,
                                      timeout=datetime.timedelta(seconds=60 if rank == 0 else 15),
                                      wait_for_workers=False)
                dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                        timeout=datetime.timedelta(seconds=120))
                return backend
            except Exception as exc:  # noqa: BLE001 - rank 0 not up yet, or a stale address: retry
                if time.monotonic() > deadline or _signalled:
                    raise
                log.info("rendezvous at %s:%d not ready (%s); retrying", target, port, exc)
        if time.monotonic() > deadline or _signalled:
            raise SystemExit(f"rank {rank}: no rendezvous for generation {generation} within {timeout_s:g} s")
        time.sleep(1.0)


def build_arg_parser() -> argparse.ArgumentParser:  # pragma: no mutate block
    """Arguments of the worker (rank) command."""
    ap = argparse.ArgumentParser(prog="python -m kale_airflow.runtime.worker",
                                 description="Reference online-training job (one rank) for kale-airflow.")
    ap.add_argument("--stream", required=True, help="stream URL, e.g. sqlite:///path/stream.db")
    ap.add_argument("--group", default="kale", help="consumer group prefix")
    ap.add_argument("--assignment", required=True, help="assignment JSON (file path or inline JSON)")
    ap.add_argument("--worker-id", type=int, required=True, help="this process's rank")
    ap.add_argument("--workers-total", type=int, default=None, help="world size (default: from the assignment)")
    ap.add_argument("--rendezvous", default=os.environ.get("KALE_RENDEZVOUS"),
                    help="HOST:PORT of rank 0's TCPStore, or control-plane:PORT (rank 0 publishes its address "
                    "in the control-plane database); default $KALE_RENDEZVOUS")
    ap.add_argument("--generation", default="0")
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--batch-size", type=int, default=512, help="samples per rank and step (at most)")
    ap.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (and commits)")
    ap.add_argument("--database-url", help="control-plane database to record throughput into and to read the "
                    "current generation from (local use; default: the KALE_DATABASE_URL environment variable, "
                    "which keeps a password out of process listings and pod specs)")
    ap.add_argument("--audit", help="append what each step trained (slice, offsets, samples) here (tests, audits)")
    ap.add_argument("--step-log", help="append one JSON line per step (rank, step, loss, parameter hash) here")
    ap.add_argument("--report-every", type=float, default=5.0, help="seconds between throughput records")
    ap.add_argument("--step-time", type=float, default=0.0,
                    help="EMULATION: minimum seconds per step of --batch-size samples, to stand in for a GPU's "
                    "step time on a CPU (demos); 0 (default) measures the real job")
    ap.add_argument("--device", choices=DEVICES, default=os.environ.get("KALE_WORKER_DEVICE", "auto"),
                    help="auto (CUDA when torch sees a GPU, else CPU), cpu, or cuda (fails without a GPU); "
                    "default $KALE_WORKER_DEVICE, else auto (the deployment's worker_device)")
    ap.add_argument("--amp", action="store_true",
                    default=os.environ.get("KALE_WORKER_AMP", "").lower() in ("1", "true", "yes"),
                    help="bf16 mixed precision (torch.autocast) on CUDA; ignored on CPU (default $KALE_WORKER_AMP)")
    ap.add_argument("--profiling", action="store_true",
                    help="a profiling job (kale profile): record throughput, but send no heartbeats and never stop "
                    "for the control plane's generations (stop it with SIGTERM)")
    ap.add_argument("--max-steps", type=int, help="stop after this many steps of this process (tests, batch jobs)")
    ap.add_argument("--exit-when-idle", action="store_true", help="stop when no rank has data (batch jobs, tests)")
    return ap


def main(argv: list[str] | None = None) -> int:  # pragma: no mutate block
    """Entry point; exits 0 after a clean stop."""
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {args.worker_id} %(message)s")

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
    if url:  # without one the job trains, but records nothing and never sees a newer generation
        from kale_airflow.metrics.embedded import EmbeddedMetrics
        from kale_airflow.store import StateStore

        metrics, control = EmbeddedMetrics(url), StateStore(url)
    backend = rendezvous(args.rendezvous, args.worker_id, total, args.generation, control, device=args.device)
    worker = Worker(open_stream(args.stream), args.group, slices, args.checkpoint_dir, args.worker_id,
                    args.generation, total, args.batch_size, checkpoint_every=args.checkpoint_every,
                    # A profiling job is no generation: no heartbeats (status and shadow mode count
                    # the deployment's workers), and no stopping when the deployment's generation changes.
                    metrics=metrics, control=None if args.profiling else control, audit=args.audit,
                    step_time_s=args.step_time, step_log=args.step_log, device=args.device, amp=args.amp)
    try:  # /metrics on $KALE_METRICS_PORT, when set
        exposition.serve(None, worker=args.worker_id, generation=args.generation, workers=total,
                         restored=worker.restored_from is not None)
    except OSError as exc:  # metrics are not worth stopping the training job for
        log.warning("cannot serve /metrics on port %s (%s); training without it",
                    os.environ.get("KALE_METRICS_PORT"), exc)
    log.info("joined a job of %d rank(s) (%s) on %s%s, generation %s, %d slice(s), restored from %s at step %d",
             total, backend or "no process group", worker.device, " (bf16 autocast)" if worker.amp else "",
             args.generation, len(slices), worker.restored_from, worker.steps)
    worker.run(max_steps=args.max_steps, exit_when_idle=args.exit_when_idle, report_every_s=args.report_every)
    if backend:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
