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
  replayed (trained at most twice, never skipped). The checkpoint before the newest is kept
  (``model.prev.pt``): a newest that cannot be read (truncated, zero length, foreign) falls
  back to it, its earlier positions winning over the stream's commits (one more interval
  retrained). When no checkpoint can be read but the stream's commits show the job has
  trained, the worker **refuses to start** (exit code 78, the message names the files and
  the fix) rather than silently train a new model; ``--allow-fresh-model`` does that on
  purpose.
- **positions outside the stream's log** (a broker restarted with empty storage, a log
  recreated, records deleted by retention) fail the worker loudly (exit code 78), at start
  and when a slice reads nothing, naming partition, position and the log's range: training
  on would skip records silently.
- stops (checkpoint, exit 0) on SIGTERM or when rank 0 sees a newer generation in the
  control store: the stop is agreed in the step's all-reduce, so every rank stops at the
  same step. A rank that dies makes its peers' collectives fail: the whole generation
  fails and restarts from the checkpoint (the local supervisor restarts every rank; on
  Kubernetes every pod's task retries).
- rank 0 records the job's samples/s (global samples over wall time, reads, all-reduce and
  checkpoints included) to the metrics store, for windows in which no rank ran dry;
  heartbeats and throughput are best-effort (:mod:`~kale_airflow.runtime.control_plane`): an
  outage of the control-plane database never stops training; at start the worker waits up to
  ``--database-wait`` for it, then exits with code 75 (a dependency outage to its supervisor);
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
from kale_airflow.runtime.control_plane import ControlPlane, ControlPlaneUnavailable
from kale_airflow.runtime.supervise import EXIT_DEPENDENCY, EXIT_REFUSED
from kale_airflow.stream.base import StreamPositionError

log = logging.getLogger("kale.worker")
_signalled: list[int] = []  # set by the signal handler, which is installed before torch loads
CHECKPOINT = "model.pt"
PREVIOUS = "model.prev.pt"  # the checkpoint before the newest: the fallback when the newest cannot be read
CHECKPOINT_KEYS = ("model", "optim", "steps")
POSITION_CHECK_S = 5.0  # at most this often, a slice that reads nothing checks its position against the log
STOPPED_WAIT_S = 60.0  # how long the final "stopped" heartbeat (a handover waits on it) is retried
RENDEZVOUS_KEY = "rendezvous/{generation}"
CONTROL_PLANE = "control-plane"
DEFAULT_PORT = 29500


def start_positions(slices: list[Slice], committed: dict[Slice, int], checkpointed: list[tuple],
                    trust_commits: bool = True) -> dict[Slice, int]:
    """Where each slice starts: the later of its stream commit and the lowest checkpointed
    position of the checkpoint's slices that overlap it (the handover rule of
    ``control.generations.handover``, applied to the positions the model has seen).

    ``checkpointed``: ``(partition, lo, hi, position)`` of the job that wrote the checkpoint.
    ``trust_commits=False`` (restored from the previous checkpoint, the newest being damaged):
    the commits followed a checkpoint the model no longer holds, so an overlapped slice starts
    at the checkpointed position even below its commit (samples since are trained again,
    none is skipped)."""
    out = {}
    for s in slices:
        overlapping = [pos for p, lo, hi, pos in checkpointed if p == s.partition and lo < s.hi and s.lo < hi]
        if not overlapping:
            out[s] = committed[s]
        else:
            out[s] = max(committed[s], min(overlapping)) if trust_commits else min(overlapping)
    return out


def fsync_dir(path: Path) -> None:  # pragma: no mutate block
    """Make a rename in ``path`` durable (no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def parameter_hash(model) -> str:  # pragma: no mutate block
    """SHA-1 of every parameter's bytes (identical across ranks of a synchronized job)."""
    h = hashlib.sha1()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class DeviceError(KaleError, RuntimeError):
    """The configured training device is not there; the message says which setting and what to do."""


class CheckpointError(KaleError, RuntimeError):
    """The job has trained (its slices' commits are past 0) but no checkpoint can be read: the
    message names the files tried and the fix (restore them, or ``--allow-fresh-model``)."""


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
                 device: str = "auto", amp: bool = False, allow_fresh_model: bool = False):  # pragma: no mutate block
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
        # ``control``: a ControlPlane (the worker command's), or a StateStore and/or metrics to wrap in one,
        # so no control-plane write ever stops training.
        self.link = control if isinstance(control, ControlPlane) else (
            ControlPlane.of(control, metrics) if control is not None or metrics is not None else None)
        self.allow_fresh_model = allow_fresh_model
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
        self.fallback = False  # restored from the previous checkpoint: the newest could not be read
        self._newest_good = False  # model.pt read back (or written) here: safe to keep as the previous one
        self._checked_at = -math.inf
        committed = {s: stream.committed(self._group(s), s.partition) for s in slices}
        checkpointed = self.restore(committed)
        self.positions = start_positions(slices, committed, checkpointed, trust_commits=not self.fallback)
        self.check_positions(committed, collective=True)
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
        """The job's newest checkpoint (written by rank 0)."""
        return self.ckpt_dir / CHECKPOINT

    @property
    def previous_path(self) -> Path:
        """The checkpoint before the newest, kept for when the newest cannot be read."""
        return self.ckpt_dir / PREVIOUS

    def checkpoint(self) -> Path:
        """Collective: rank 0 writes model, optimizer, step and every rank's slice positions
        atomically, then commits those positions to the stream (commits follow the checkpoint)."""
        mine = [(s.partition, s.lo, s.hi, int(o)) for s, o in self.positions.items()]
        everyone = [row for rows in self._gather(mine) for row in rows]
        if self.rank == 0:
            self.write_checkpoint({"model": self.module.state_dict(), "optim": self.optim.state_dict(),
                                   "steps": self.steps, "generation": self.generation, "world_size": self.world,
                                   "group": self.group, "slices": everyone})
            commits: dict[str, dict[int, int]] = {}
            for p, lo, hi, pos in everyone:
                commits[self._group(Slice(p, lo, hi))] = {p: pos}
            if commits:
                self.stream.commit_many(commits)
        return self.checkpoint_path

    def write_checkpoint(self, state: dict) -> None:
        """Write ``state`` as the newest checkpoint, atomically: a temporary file in the same
        folder, fsynced, renamed over ``model.pt``, the folder fsynced. The newest one, when it
        was read back or written here, first becomes ``model.prev.pt`` (a damaged newest is
        replaced instead, so it never pushes out the good previous one)."""
        import torch

        tmp = self.ckpt_dir / (CHECKPOINT + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                torch.save(state, fh)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)  # a crash mid-write leaves the checkpoints as they were
            raise
        if self._newest_good and self.checkpoint_path.exists():
            os.replace(self.checkpoint_path, self.previous_path)
        os.replace(tmp, self.checkpoint_path)
        fsync_dir(self.ckpt_dir)
        self._newest_good = True

    def restore(self, committed: dict[Slice, int]) -> list[tuple]:
        """Collective: rank 0 loads the newest readable checkpoint (``model.pt``, else
        ``model.prev.pt``) and broadcasts it; returns its slice positions. When none can be read
        and the stream's commits show the job has trained (any rank's slice past 0), raises
        :class:`CheckpointError` unless ``allow_fresh_model``."""
        found = self._load_checkpoint() if self.rank == 0 else None
        state, used, tried = self._broadcast(found)
        trained = self._all_sum([float(any(v > 0 for v in committed.values()))])[0] > 0
        if state is None:
            self._no_checkpoint(tried, trained, committed)
            return []
        self.module.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])
        self.steps = self.restored_step = state["steps"]
        self.restored_from = used
        self.fallback = used != str(self.checkpoint_path)
        # pragma: no mutate start
        log.info("restored %s (step %d, generation %s, world size %s)", Path(used).name, self.steps,
                 state.get("generation"), state.get("world_size"))
        if self.fallback:
            log.warning("checkpoint %s cannot be used (%s); restored the previous one, %s (step %d): its positions "
                        "are earlier than the stream's commits, so the samples since are trained again (none is "
                        "skipped); the next checkpoint replaces %s", tried[0][0], tried[0][1], used, self.steps,
                        CHECKPOINT)
        # pragma: no mutate end
        if state.get("group", self.group) != self.group:  # positions of another consumer group: not ours
            return []
        return [tuple(row) for row in state.get("slices", [])]

    def _load_checkpoint(self) -> tuple[dict | None, str | None, list[tuple[str, str]]]:
        """Rank 0: (state, path, [(path, why not)] of the files passed over), the newest
        readable of ``model.pt`` and ``model.prev.pt``; (None, None, tried) when neither is."""
        import torch

        tried = []
        for path in (self.checkpoint_path, self.previous_path):
            if not path.exists():
                tried.append((str(path), "missing"))
                continue
            if path.stat().st_size == 0:
                tried.append((str(path), "zero length"))
                continue
            try:
                state = torch.load(path, map_location="cpu", weights_only=False)
            except Exception as exc:  # noqa: BLE001 - truncated, random bytes, another format
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                tried.append((str(path), f"unreadable: {type(exc).__name__}: {first}"))
                continue
            problem = self._state_problem(state)
            if problem:
                tried.append((str(path), problem))
                continue
            self._newest_good = path == self.checkpoint_path
            return state, str(path), tried
        return None, None, tried

    def _state_problem(self, state) -> str | None:
        """Why a loaded file is not a checkpoint of this model (None when it is)."""
        if not isinstance(state, dict) or any(k not in state for k in CHECKPOINT_KEYS):
            keys = sorted(map(str, state))[:6] if isinstance(state, dict) else type(state).__name__
            return f"not a kale-airflow checkpoint (needs {', '.join(CHECKPOINT_KEYS)}; found {keys})"
        mine, theirs = self.module.state_dict(), state["model"]
        if not isinstance(theirs, dict) or set(theirs) != set(mine) or any(
                tuple(getattr(theirs[k], "shape", ())) != tuple(v.shape) for k, v in mine.items()):
            return "a checkpoint of another model (its parameter names or shapes differ)"
        return None

    def _no_checkpoint(self, tried: list, trained: bool, committed: dict[Slice, int]) -> None:  # pragma: no mutate block
        """No checkpoint could be read: refuse when the job has trained, else start a new model."""
        files = "; ".join(f"{p} ({why})" for p, why in tried) or f"{self.checkpoint_path} (missing)"
        if trained and not self.allow_fresh_model:
            ahead = [s for s in self.slices if committed[s] > 0]
            where = (f"slice {ahead[0].group_suffix} of consumer group {self.group!r} is committed at "
                     f"{committed[ahead[0]]}" if ahead else "another rank's slices are committed past 0")
            raise CheckpointError(
                f"refusing to start a new model: the stream's commits show this job has trained ({where}), but no "
                f"checkpoint can be read: {files}. A new model would silently throw that training away. Restore the "
                f"checkpoint into {self.ckpt_dir} (from a backup or a volume snapshot), or start a new model on "
                "purpose from the committed offsets with --allow-fresh-model (KALE_ALLOW_FRESH_MODEL=1)")
        if trained:
            log.warning("no checkpoint can be read (%s): starting a NEW model from the committed offsets, as "
                        "--allow-fresh-model asks", files)
        elif any(why != "missing" for _, why in tried):
            log.warning("cannot read checkpoint(s) %s; nothing is committed yet: starting a new model", files)

    # ---------------------------------------------------------------- positions
    def check_positions(self, committed: dict[Slice, int] | None = None, slices: list[Slice] | None = None,
                        collective: bool = False) -> None:
        """Raise :class:`StreamPositionError` when a slice's position lies past its partition's
        log end or below its log start (an emptied or recreated log, records deleted before they
        were trained): training on would skip records silently. ``collective``: every rank
        raises, with every rank's findings."""
        wanted = self.slices if slices is None else slices
        problems = self._position_problems(wanted, committed) if wanted else []
        if collective:
            problems = [p for rows in self._gather(problems) for p in rows]
        if problems:
            raise StreamPositionError(
                f"the stream does not hold the job's positions: {'; '.join(problems)}. Training on would skip "
                "records the model never saw (a broker restarted with empty storage, a topic deleted and recreated, "
                "records deleted by retention?). Restore the stream's data; or, if the log was replaced on purpose, "
                "run the job under a new consumer group (the deployment's group: the model is kept and the new "
                "group's slices start at their own commits)")

    def _position_problems(self, slices: list[Slice], committed: dict[Slice, int] | None) -> list[str]:
        marks = self.stream.watermarks()
        bad = [s for s in slices if not self._in_log(marks, s)]
        if bad:  # a fetch settles what a metadata answer can get wrong (Tansu's ListOffsets after a batch)
            for s in bad:
                self.stream.read_payloads(s.partition, self.positions[s], 1)
            marks = self.stream.watermarks()
            bad = [s for s in bad if not self._in_log(marks, s)]
        out = []
        for s in bad:
            low, high = marks.get(s.partition, (0, 0))
            pos = self.positions[s]
            where = f"beyond the log end {high}" if pos > high else f"below the log start {low}"
            known = f"; stream commit {committed[s]}" if committed is not None else ""
            out.append(f"partition {s.partition} (slice {s.group_suffix}): position {pos}{known} is {where} "
                       f"(log start {low}, end {high})")
        return out

    def _in_log(self, marks: dict[int, tuple[int, int]], s: Slice) -> bool:
        low, high = marks.get(s.partition, (0, 0))
        return low <= self.positions[s] <= high

    # ---------------------------------------------------------------- training
    def _read(self) -> tuple[list, dict, list, int]:
        """This rank's share of the next global batch: (sample arrays, new positions, audit rows, records read)."""
        from kale_airflow.runtime.samples import unpack

        per = max(1, self.batch_size // max(1, len(self.slices)))
        parts, new_pos, audit, read, dry = [], {}, [], 0, []
        for s in self.slices:
            pos = self.positions[s]
            want = int(math.ceil(per / max(s.hi - s.lo, 1e-3)))
            offsets, payloads = self.stream.read_payloads(s.partition, pos, want)  # no object per sample
            if not payloads:
                dry.append(s)
                continue
            read += len(payloads)
            samples, bad = unpack(payloads, s.mask(offsets))
            self.malformed += bad
            parts.append(samples)
            new_pos[s] = int(offsets[-1]) + 1
            audit.append((s, pos, int(offsets[-1]) + 1, len(samples)))
        # A slice with nothing to read may be past the end of a log that was emptied under it.
        if dry and time.monotonic() - self._checked_at >= POSITION_CHECK_S:
            self._checked_at = time.monotonic()
            self.check_positions(slices=dry)
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
        if self.link is None or self.rank != 0 or dry or start is None or n < self.batch_size:
            return
        rate = n / (time.perf_counter() - start)
        self.link.record_throughput(time.time(), self.world, rate)  # best-effort: never stops training

    def _seen(self, state: str, wait_s: float | None = None) -> bool:  # pragma: no mutate block
        """This rank's heartbeat (best-effort; with ``wait_s``, retried that long): whether it was written."""
        if self.link is None:
            return True
        return self.link.heartbeat(self.generation, self.worker_id, state, wait_s=wait_s)

    def superseded(self, required: bool = False) -> bool:  # pragma: no mutate block
        """True when the control store names another generation as current (during an outage:
        the last one read; ``required``: retried up to the link's deadline, for the start)."""
        if self.link is None:
            return False
        current = self.link.current_generation(required=required)
        return current is not None and current != self.generation

    def run(self, max_steps: int | None = None, idle_sleep: float = 0.2, report_every_s: float = 5.0,
            exit_when_idle: bool = False) -> dict:  # pragma: no mutate block
        """Train until stopped (SIGTERM on any rank, superseded, ``max_steps`` more steps, or idle when asked);
        every decision to stop is agreed in a step's all-reduce, so all ranks stop together."""
        last_report = time.monotonic()
        stop_next = False
        first = self.steps
        # A job that joined late (slow start, rendezvous) may already be superseded: train nothing.
        stop_next = self.rank == 0 and self.superseded(required=True)
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
        # After the checkpoint: the next generation may take over these slices. Retried: a handover waits on it.
        if not self._seen("stopped", wait_s=STOPPED_WAIT_S):
            log.error("cannot record this worker's 'stopped' heartbeat (control-plane database unreachable): "  # pragma: no mutate
                      "the next generation's handover waits until its last heartbeat is stale")
        if self.link is not None:
            self.link.close(timeout_s=0.0)  # the heartbeat's wait above flushed everything, or the outage goes on
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
            if rank == 0:  # ``control``: the worker's ControlPlane (retried up to its deadline)
                own = os.environ.get("KALE_POD_IP") or socket.gethostbyname(socket.gethostname())
                rec = {"host": own, "port": port, "t": time.time()}
                control.required(lambda st, _m, rec=rec: st.set_value(key, rec), "publish the rendezvous address")
                target = own
            else:
                rec = control.required(lambda st, _m: st.get_value(key), "read the rendezvous address")
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
    ap.add_argument("--allow-fresh-model", action="store_true",
                    default=os.environ.get("KALE_ALLOW_FRESH_MODEL", "").lower() in ("1", "true", "yes"),
                    help="when no checkpoint can be read although the stream's commits show the job has trained, "
                    "start a NEW model from the committed offsets instead of refusing to start (a deliberate "
                    "reset; default $KALE_ALLOW_FRESH_MODEL)")
    ap.add_argument("--database-wait", type=float, default=float(os.environ.get("KALE_DATABASE_WAIT_S", "300")),
                    help="seconds to retry the control-plane database at start (opening it, the current "
                    "generation, the rendezvous address) before exiting with code 75, a dependency outage to the "
                    "supervisor (default $KALE_DATABASE_WAIT_S, else 300); once training, an outage never stops it")
    ap.add_argument("--max-steps", type=int, help="stop after this many steps of this process (tests, batch jobs)")
    ap.add_argument("--exit-when-idle", action="store_true", help="stop when no rank has data (batch jobs, tests)")
    return ap


def main(argv: list[str] | None = None) -> int:  # pragma: no mutate block
    """Entry point; exits 0 after a clean stop, :data:`EXIT_REFUSED` (78) when the job must not
    start or go on (no readable checkpoint after training, positions outside the stream's log),
    :data:`EXIT_DEPENDENCY` (75) when the control-plane database stayed unreachable at start."""
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {args.worker_id} %(message)s")

    def on_term(signum, frame):
        log.info("signal %d: finishing the current step, then checkpointing", signum)
        _signalled.append(signum)

    # First thing: a SIGTERM that arrives while torch is still importing must not kill us.
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        return _run_job(args)
    except (CheckpointError, StreamPositionError) as exc:
        log.error("%s", exc)
        log.error("not starting (exit code %d): restarting cannot fix this", EXIT_REFUSED)
        return EXIT_REFUSED
    except ControlPlaneUnavailable as exc:
        log.error("%s", exc)
        return EXIT_DEPENDENCY


def _run_job(args) -> int:  # pragma: no mutate block
    """Open the control plane and the stream, join the job, train until stopped."""
    if os.environ.get("KALE_WORKER_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["KALE_WORKER_THREADS"]))
    from kale_airflow.stream import open_stream

    text = args.assignment
    assignment = json.loads(Path(text).read_text() if not text.lstrip().startswith("{") else text)
    slices = slices_for(assignment, args.worker_id)
    total = args.workers_total or len(assignment.get("assignment", assignment))
    link = None
    url = args.database_url or os.environ.get("KALE_DATABASE_URL")
    if url:  # without one the job trains, but records nothing and never sees a newer generation
        # A profiling job is no generation: no heartbeats (status and shadow mode count the
        # deployment's workers), and no stopping when the deployment's generation changes.
        link = ControlPlane.for_url(url, heartbeats=not args.profiling, deadline_s=args.database_wait)
        link.open()
    backend = rendezvous(args.rendezvous, args.worker_id, total, args.generation, link, device=args.device)
    worker = Worker(open_stream(args.stream), args.group, slices, args.checkpoint_dir, args.worker_id,
                    args.generation, total, args.batch_size, checkpoint_every=args.checkpoint_every,
                    control=link, audit=args.audit, step_time_s=args.step_time, step_log=args.step_log,
                    device=args.device, amp=args.amp, allow_fresh_model=args.allow_fresh_model)
    try:  # /metrics on $KALE_METRICS_PORT, when set
        exposition.serve(None, worker=args.worker_id, generation=args.generation, workers=total,
                         restored=worker.restored_from is not None)
    except OSError as exc:  # metrics are not worth stopping the training job for
        log.warning("cannot serve /metrics on port %s (%s); training without it",
                    os.environ.get("KALE_METRICS_PORT"), exc)
    log.info("joined a job of %d rank(s) (%s) on %s%s, generation %s, %d slice(s), restored from %s at step %d",
             total, backend or "no process group", worker.device, " (bf16 autocast)" if worker.amp else "",
             args.generation, len(slices), worker.restored_from, worker.steps)
    try:
        worker.run(max_steps=args.max_steps, exit_when_idle=args.exit_when_idle, report_every_s=args.report_every)
    except Exception:
        if link is not None:  # a pod has no supervisor to say so: no dead worker keeps saying "running"
            link.heartbeat(args.generation, args.worker_id, "failed", wait_s=5.0)
        raise
    if backend:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
