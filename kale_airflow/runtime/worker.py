"""Reference online-training job: one rank of a data-parallel ``torch.distributed`` job.

    python -m kale_airflow.runtime.worker --stream sqlite:///S.db --group kale \\
        --assignment A.json --worker-id RANK --workers-total N --rendezvous HOST:PORT \\
        --generation G --checkpoint-dir DIR [...]

A process is one **slot** of the deployment's job (its supervisor's or its pod's index) and
trains one generation after another when ``--warm-wait`` is set (the backends set it): see
:mod:`~kale_airflow.runtime.elastic` for how ranks survive a generation change, meet again at
the new world size and hand each other the model in memory. Without it a process trains one
generation and exits (a crash, or a timed-out warm meeting, is always that: a full restart).

- **the model** is a :class:`~kale_airflow.runtime.trainer.Trainer` (``--trainer module:attr``;
  default the reference CTR model, :class:`~kale_airflow.runtime.model.CTRTrainer`); the
  runtime owns the stream, slices, offsets, checkpoints, rendezvous, rescale, metrics and stop.
- **rendezvous**: ``--rendezvous HOST:PORT`` (slot 0 serves a ``TCPStore`` there for its whole
  life, the others connect; locally the supervisor picks a free port on 127.0.0.1 for every
  attempt), or ``--rendezvous control-plane:PORT`` (Kubernetes: slot 0 publishes its pod IP,
  ``$KALE_POD_IP`` from the downward API, and the port in the control-plane database under
  ``rendezvous/<generation>``; the other ranks read it there). Each generation meets under its
  own key prefix; a rank takes the rank of its slot. gloo on CPU, NCCL when CUDA is present.
  Without ``--rendezvous`` and with one worker the process trains alone (tests).
- **DistributedDataParallel** on the trainer's model; every rank reads the slices the rebalancer
  assigned to it (a slice ``[lo, hi)`` of partition p takes the offsets o with
  ``frac(o * phi)`` in it) and every step is synchronized by one small all-reduce of
  control values (samples read, stop asked) followed by DDP's gradient all-reduce.
- **Uneven inputs: zero-weight padding.** A rank with fewer samples (or none) still runs
  forward/backward every step; each rank's loss is ``sum of its sample losses * N /
  global samples`` (the ``scale`` the trainer's step gets), so DDP's gradient average is
  exactly the mean gradient over the global batch, however the samples are spread; a rank
  with no data trains the trainer's padding sample with weight 0. (DDP's ``join()`` also works with gloo, but it shadows the
  collectives of the ranks that ran dry and needs the control all-reduce anyway; padding
  keeps one code path for every rank.)
- **Offsets live in the checkpoint**: every ``--checkpoint-every`` steps and at stop rank 0
  gathers every rank's slice positions and writes one atomic checkpoint (model, optimizer,
  step, positions); only then does it commit those positions to the stream. A restart
  restores that checkpoint on rank 0 and broadcasts it (a warm generation change takes the
  same state from a surviving rank's memory instead); each slice starts at the later of its stream commit and the lowest
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
- stops (checkpoint) on SIGTERM (exit 0) or when rank 0 sees a newer generation in the
  control store (checked every ``--generation-poll`` seconds; then on to the next
  generation, or exit 0 without ``--warm-wait``): the stop is agreed in the step's
  all-reduce, so every rank stops at the same step. A rank that dies makes its peers'
  collectives fail: the whole generation fails and restarts from the checkpoint (the local
  supervisor restarts every rank; on Kubernetes every pod's task retries).
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
import sys
import threading
import time
import uuid
from itertools import compress
from pathlib import Path

from kale_airflow.core.errors import KaleError
from kale_airflow.core.slices import Slice, slices_for
from kale_airflow.runtime import exposition
from kale_airflow.runtime.control_plane import ControlPlane, ControlPlaneUnavailable
from kale_airflow.runtime.elastic import (
    CONTROL_PLANE,
    DEFAULT_PORT,
    GO,
    HANDOVER_KEY,
    JOIN,
    LEAVE,
    OFFLOAD_AFTER_S,
    STANDBY,
    STANDBY_POLL_S,
    PAUSES_KEY,
    RENDEZVOUS_KEY,
    RESCALE_KEY,
    RESTART,
    RESTART_KEY,
    TIMEOUT,
    WAIT,
    WARM,
    WARM_BEAT_S,
    DuplicateSlot,
    Rendezvous,
    RendezvousTimeout,
    Replica,
    added_ready,
    broadcast_state,
    choose_source,
    handover_due,
    merge_pause,
    next_action,
    pause_record,
    threads_for,
)
from kale_airflow.runtime.supervise import EXIT_DEPENDENCY, EXIT_REFUSED, EXIT_RENDEZVOUS
from kale_airflow.runtime.trainer import Decoded, check_state_keys, load_trainer, state_problem
from kale_airflow.stream.base import PatientStream, StreamPositionError

__all__ = ["CONTROL_PLANE", "DEFAULT_PORT", "RENDEZVOUS_KEY", "Worker", "main", "start_positions"]
log = logging.getLogger("kale.worker")
_signalled: list[int] = []  # set by the signal handler, which is installed before torch loads
CHECKPOINT = "model.pt"
PREVIOUS = "model.prev.pt"  # the checkpoint before the newest: the fallback when the newest cannot be read
POSITION_CHECK_S = 5.0  # at most this often, a slice that reads nothing checks its position against the log
STOPPED_WAIT_S = 60.0  # how long the final "stopped" heartbeat (a handover waits on it) is retried
# Seconds a rank waits out an unreachable stream: below the process group's 120 s collective
# timeout, so the ranks that still wait in an all-reduce do not fail first.
STREAM_OUTAGE_S = 90.0
GENERATION_POLL_S = 0.25  # how often rank 0 looks for a newer generation while training (one cheap read)
# How often a training rank's ``running`` heartbeat says how far it trained its slices: the
# autoscaler measures the backlog from these, not only from the commits (which follow
# checkpoints, up to ``checkpoint_every_s`` behind).
POSITIONS_EVERY_S = 1.0
START_REASON_ENV = "KALE_START_REASON"  # why the supervisor started this process (crash restart, scale-up, ...)


def step_scale(weight: float, world: int, total: int) -> float:
    """The factor of a rank's summed sample losses that makes DDP's gradient average (over
    ``world`` ranks) the mean gradient of the ``total`` samples of the global batch; ``weight``
    0 for a rank training padding."""
    return weight * world / max(1, total)


def stop_reason(signalled: bool, max_steps_reached: bool, idle_exit: bool) -> str:
    """Why a generation's training loop ended, as the job loop acts on it: ``signal`` (this
    process was asked to stop: it exits), ``max_steps`` and ``idle`` (batch jobs and tests:
    they exit), else ``stopped`` (a newer generation, or a peer's signal: look at the control
    plane for what is next)."""
    if signalled:
        return "signal"
    if max_steps_reached:
        return "max_steps"
    return "idle" if idle_exit else "stopped"


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
    """One rank of one generation of the training job (or a lone trainer when no process group
    is set up). ``replica``: the process's model, kept across generations (see
    :class:`~kale_airflow.runtime.elastic.Replica`); without one the worker builds the
    ``trainer`` (a :class:`~kale_airflow.runtime.trainer.Trainer`, or ``module:attr``; default
    the CTR model)."""

    def __init__(self, stream, group: str, slices: list[Slice], checkpoint_dir: str | Path, worker_id: int = 0,
                 generation: str = "0", workers_total: int = 1, batch_size: int = 512, lr: float = 0.01,
                 checkpoint_every: int = 50, metrics=None, control=None, audit: str | Path | None = None,
                 seed: int = 0, step_time_s: float = 0.0, step_log: str | Path | None = None,
                 device: str = "auto", amp: bool = False, allow_fresh_model: bool = False, trainer=None,
                 replica: Replica | None = None, checkpoint_every_s: float | None = None):  # pragma: no mutate block
        import torch.distributed as dist

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
        # At most this long between checkpoints (None: by steps only): the commits a checkpoint
        # carries are what the autoscaler measures the backlog from, and a crash replays from them.
        self.checkpoint_every_s = checkpoint_every_s
        self._checkpoint_t = time.monotonic()
        # ``control``: a ControlPlane (the worker command's), or a StateStore and/or metrics to wrap in one,
        # so no control-plane write ever stops training.
        self.link = control if isinstance(control, ControlPlane) else (
            ControlPlane.of(control, metrics) if control is not None or metrics is not None else None)
        self.allow_fresh_model = allow_fresh_model
        self.audit = Path(audit) if audit else None
        self.step_log = Path(step_log) if step_log else None
        self.run_id = uuid.uuid4().hex[:8]  # one per process start: tells replayed steps apart in audits
        self.replica = replica or build_replica(trainer, device, self.rank, amp, seed, lr)
        self._adopt_replica(amp)
        self.step_time_s = step_time_s
        self._init_counters()
        committed = {s: stream.committed(self._group(s), s.partition) for s in slices}
        checkpointed = self.restore(committed)
        self.positions = start_positions(slices, committed, checkpointed, trust_commits=not self.fallback)
        self.check_positions(committed, collective=True)
        # DDP after the restore: its constructor broadcasts rank 0's parameters (equal anyway).
        self.model = self._wrap()

    def _adopt_replica(self, amp: bool) -> None:  # pragma: no mutate block
        r = self.replica
        r.reload()
        self.trainer, self.module, self.optim, self.device = r.trainer, r.module, r.optimizer, r.device
        self.amp = bool(amp and self.device.type == "cuda")  # bf16 autocast on CUDA only: the CPU path stays float32
        check_state_keys(self.trainer.state_dict())
        self._newest_good = r.newest_good  # model.pt read back (or written) here: safe to keep as the previous one

    def _init_counters(self) -> None:
        self.steps = 0  # a warm replica's step comes with its state (restore)
        self.trained = 0  # samples this rank trained in this generation (replays included)
        self.malformed = 0
        self._last_loss = float("nan")
        self.restored_from: str | None = None
        self.restored_step = 0
        self.restored: dict = {}  # the runtime fields of the state taken: generation, world_size, last_step_t
        self.source: int | None = None  # the rank whose state this generation took (None: a new model)
        self.kind: str | None = None  # WARM (a rank's memory) or RESTART (the checkpoint file)
        self.fallback = False  # restored from the previous checkpoint: the newest could not be read
        self.last_step_t: float | None = None
        self._checkpointed: list[tuple] | None = None
        self._checked_at = -math.inf

    def _wrap(self):  # pragma: no mutate block
        import torch

        return torch.nn.parallel.DistributedDataParallel(self.module) if self.distributed else self.module

    @property
    def last_loss(self) -> float:
        """Mean loss of the last step that trained samples (NaN before one)."""
        return float(self._last_loss)

    def _group(self, s: Slice) -> str:
        return f"{self.group}/{s.group_suffix}"

    # -------------------------------------------------------------- collectives
    def _broadcast(self, obj, src: int = 0):  # pragma: no mutate block
        import torch.distributed as dist

        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
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
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t)
        return t.tolist()

    @property
    def _comm_device(self):
        """Where collectives' tensors live: the GPU for NCCL, else host memory."""
        import torch
        import torch.distributed as dist

        if self.distributed and dist.get_backend() == "nccl":
            return self.device
        return torch.device("cpu")

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
        """Collective: rank 0 writes the trainer's state, step and every rank's slice positions
        atomically, then commits those positions to the stream (commits follow the checkpoint)."""
        self._checkpoint_t = time.monotonic()
        mine = [(s.partition, s.lo, s.hi, int(o)) for s, o in self.positions.items()]
        everyone = [row for rows in self._gather(mine) for row in rows]
        self._checkpointed = everyone
        if self.rank == 0:
            self.write_checkpoint({**self.trainer.state_dict(), "steps": self.steps, "generation": self.generation,
                                   "world_size": self.world, "group": self.group, "slices": everyone,
                                   "last_step_t": self.last_step_t, "trainer_class": type(self.trainer).__qualname__})
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
        """Collective: take the newest state any rank holds in memory (a warm generation
        change: :func:`~kale_airflow.runtime.elastic.choose_source`), else the checkpoint
        rank 0 reads; returns the checkpointed slice positions of that state."""
        r = self.replica
        members = self._gather((r.has_state, r.steps))
        src = choose_source(members)
        if src is None:
            return self._restore_checkpoint(committed)
        mine = {"trainer": self.trainer.state_dict(), "steps": r.steps, "slices": r.slices,
                "generation": r.generation, "world_size": r.world, "last_step_t": r.last_step_t}
        state = broadcast_state(mine if self.rank == src else None, src, self.rank, self._comm_device)
        if self.rank != src:
            self.trainer.load_state_dict(state["trainer"])
        self._took(state, src, WARM, f"memory (rank {src})")
        log.info("took the state of step %d from rank %d's memory (warm: generation %s of %s rank(s) -> %s of %d)",  # pragma: no mutate
                 self.steps, src, state["generation"], state["world_size"], self.generation, self.world)  # pragma: no mutate
        return [tuple(row) for row in state["slices"]]

    def _took(self, state: dict, src: int, kind: str, where: str) -> None:
        self.steps = self.restored_step = int(state["steps"])
        self.restored = {k: state.get(k) for k in ("generation", "world_size", "last_step_t")}
        self.last_step_t = state.get("last_step_t")
        self.source, self.kind, self.restored_from = src, kind, where

    def _restore_checkpoint(self, committed: dict[Slice, int]) -> list[tuple]:
        """Collective: rank 0 loads the newest readable checkpoint (``model.pt``, else
        ``model.prev.pt``) and broadcasts it; returns its slice positions. When none can be read
        and the stream's commits show the job has trained (any rank's slice past 0), raises
        :class:`CheckpointError` unless ``allow_fresh_model``."""
        state, used, tried = self._load_checkpoint() if self.rank == 0 else (None, None, [])
        found, used, tried = self._broadcast((state is not None, used, tried))
        trained = self._all_sum([float(any(v > 0 for v in committed.values()))])[0] > 0
        if not found:
            self._no_checkpoint(tried, trained, committed)
            return []
        keys = list(self.trainer.state_dict())
        payload = None if state is None else {"trainer": {k: state[k] for k in keys},
                                              **{k: v for k, v in state.items() if k not in keys}}
        payload = broadcast_state(payload, 0, self.rank, self._comm_device)
        self.trainer.load_state_dict(payload["trainer"])
        self._took(payload, 0, RESTART, used)
        self.fallback = used != str(self.checkpoint_path)
        # pragma: no mutate start
        log.info("restored %s (step %d, generation %s, world size %s)", Path(used).name, self.steps,
                 payload.get("generation"), payload.get("world_size"))
        if self.fallback:
            log.warning("checkpoint %s cannot be used (%s); restored the previous one, %s (step %d): its positions "
                        "are earlier than the stream's commits, so the samples since are trained again (none is "
                        "skipped); the next checkpoint replaces %s", tried[0][0], tried[0][1], used, self.steps,
                        CHECKPOINT)
        # pragma: no mutate end
        if payload.get("group", self.group) != self.group:  # positions of another consumer group: not ours
            return []
        return [tuple(row) for row in payload.get("slices", [])]

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
        """Why a loaded file is not a checkpoint of this trainer's model (None when it is)."""
        return state_problem(self.trainer.state_dict(), state)

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
    def check_positions(self, committed: dict[Slice, int] | None = None, collective: bool = False) -> None:
        """Raise :class:`StreamPositionError` when a slice's position lies past its partition's
        log end or below its log start (an emptied or recreated log, records deleted before they
        were trained): training on would skip records silently. ``collective``: every rank
        raises, with every rank's findings."""
        problems = self._position_problems(self.slices, committed)
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
    def _read(self) -> tuple[list, dict, list]:
        """This rank's share of the next global batch: (payloads of its slices, new positions of
        the slices that read records, audit rows). Every slice is offered an equal part of the batch; what the
        slices with less queued leave is offered again to those that filled their part, until
        the batch is full or no slice holds more. A rank's slices carry unequal traffic, and an
        equal part alone would cap its busiest slice at ``batch_size / slices`` per step however
        much it has queued, with the rest of the batch empty."""
        payloads, new_pos, audit, dry = [], {}, [], []
        more = list(self.slices)
        per = max(1, self.batch_size // max(1, len(more)))  # the first offer: an equal part each
        while more:
            full = []
            for s in more:
                pos = new_pos.get(s, self.positions[s])
                want = int(math.ceil(per / max(s.hi - s.lo, 1e-3)))
                offsets, got = self.stream.read_payloads(s.partition, pos, want)  # no object per sample
                if not got:
                    if s not in new_pos:
                        dry.append(s)
                    continue
                keep = s.mask(offsets)
                mine = got if keep.all() else list(compress(got, keep.tolist()))
                payloads.extend(mine)
                new_pos[s] = int(offsets[-1]) + 1
                audit.append((s, pos, new_pos[s], len(mine)))
                if len(got) >= want:  # it had all it was asked for: it may hold more
                    full.append(s)
            room = self.batch_size - len(payloads)
            if room <= 0 or not full:
                break
            more = full[:room]  # never more slices than samples left to offer
            per = room // len(more)
        # A slice with nothing to read may be past the end of a log that was emptied under it.
        if dry and time.monotonic() - self._checked_at >= POSITION_CHECK_S:
            self._checked_at = time.monotonic()
            self.check_positions()
        return payloads, new_pos, audit

    def step(self, stop: bool = False) -> tuple[int, int, bool]:
        """One synchronized step (collective: every rank calls it the same number of times).

        Returns (samples this rank trained, samples the job trained, stop agreed by any rank)."""
        t0 = time.perf_counter()
        payloads, new_pos, audit = ([], {}, []) if stop else self._read()
        batch = self.trainer.decode(payloads) if payloads else Decoded(None, 0, 0)
        self.malformed += batch.malformed
        n = batch.samples
        total, stops, dry, reads, due = self._all_sum([n, float(stop), float(n == 0), float(bool(new_pos)),
                                                       float(self._time_due())])
        total = int(total)
        self.checkpoint_due = due > 0  # rank 0's clock decides for every rank
        self._dry = self._dry or dry > 0
        self.idle = reads == 0  # no rank read anything
        if stops:
            return 0, 0, True  # nothing trained, positions unchanged: every rank stops here
        self.positions.update(new_pos)  # reads of malformed samples only still advance
        if not total:
            return 0, 0, False
        loss = self.train_batch(batch.batch if n else self.trainer.padding(), 1.0 if n else 0.0, total)
        if n:
            self._last_loss = loss
        if self.step_time_s and n:  # demo emulation of an accelerator's step time on CPU (labelled as such)
            time.sleep(max(0.0, self.step_time_s * n / self.batch_size - (time.perf_counter() - t0)))
        self.steps += 1
        self.trained += n
        self.last_step_t = time.time()
        self._write_audit(audit, t0)
        exposition.observe_step(n, time.perf_counter() - t0, malformed=batch.malformed)
        if self._window_start is None:
            self._window_start = t0
        self._window_samples += total
        return n, total, False

    def _time_due(self) -> bool:
        """Rank 0: whether ``checkpoint_every_s`` has passed since the last checkpoint."""
        return (self.rank == 0 and self.checkpoint_every_s is not None
                and time.monotonic() - self._checkpoint_t >= self.checkpoint_every_s)

    def train_batch(self, batch, weight: float = 1.0, total: int | None = None):
        """The trainer's step on this rank's batch, scaled so DDP's gradient average is the
        global batch's mean gradient (``total``: the global batch's samples; default this
        batch's); returns the trainer's mean loss."""
        return self.trainer.train_step(self.model, self.optim, batch,
                                       step_scale(weight, self.world, total or len(batch)))

    _window_start: float | None = None
    _window_samples: int = 0
    checkpoint_due: bool = False
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
        """This rank's heartbeat (best-effort; with ``wait_s``, retried that long), a ``running``
        one with the positions its slices were trained to: whether it was written."""
        if self.link is None:
            return True
        trained = {s.group_suffix: int(pos) for s, pos in self.positions.items()} if state == "running" else None
        return self.link.heartbeat(self.generation, self.worker_id, state, wait_s=wait_s, positions=trained)

    def superseded(self, required: bool = False) -> bool:  # pragma: no mutate block
        """True when the control store names another generation as current (during an outage:
        the last one read; ``required``: retried up to the link's deadline, for the start)."""
        if self.link is None:
            return False
        current = self.link.current_generation(required=required)
        return current is not None and current != self.generation

    def run(self, max_steps: int | None = None, idle_sleep: float = 0.2, report_every_s: float = 5.0,
            exit_when_idle: bool = False, poll_s: float = GENERATION_POLL_S, final_state="stopped",
            close_link: bool = True, on_first_step=None, await_added_s: float = 0.0) -> dict:
        """Train until stopped (SIGTERM on any rank, superseded, ``max_steps`` more steps, or idle when asked);
        every decision to stop is agreed in a step's all-reduce, so all ranks stop together. Rank 0 looks
        for a newer generation every ``poll_s``. ``final_state``: the heartbeat written after the last
        checkpoint (or a function of the summary returning it); ``on_first_step(end time)``: called once,
        after this generation's first step; ``await_added_s``: for a larger generation, keep training up
        to this long until its added slots report ready (:func:`~kale_airflow.runtime.elastic.added_ready`)."""
        first = self.steps
        # A job that joined late (slow start, rendezvous) may already be superseded: train nothing.
        stop_next = self.rank == 0 and self.superseded(required=True)
        if stop_next:
            log.info("generation %s superseded: stopping every rank at the first step", self.generation)  # pragma: no mutate
        self._seen("running")
        last_report = last_poll = last_seen = time.monotonic()
        reached = idle_exit = False
        while True:
            if max_steps is not None and self.steps - first >= max_steps:
                reached = True
                break  # the step counter is the same on every rank
            n, total, stop = self.step(stop=stop_next or bool(_signalled))
            if on_first_step is not None:
                on_first_step(time.time())
                on_first_step = None
            if stop:
                break
            if total and (self.steps % self.checkpoint_every == 0 or self.checkpoint_due):
                self.checkpoint()
            if self.idle:
                if exit_when_idle:
                    idle_exit = True
                    break  # every rank saw the same all-reduced count
                time.sleep(idle_sleep)
            now = time.monotonic()
            if now - last_report >= report_every_s:
                self._report()
                last_report = now
            if now - last_seen >= POSITIONS_EVERY_S:
                self._seen("running")
                last_seen = now
            if self.rank == 0 and not stop_next and now - last_poll >= poll_s:
                last_poll = now
                stop_next = self._stop_for_newer(await_added_s)
        return self._finish(stop_reason(bool(_signalled), reached, idle_exit), final_state, close_link)

    def _stop_for_newer(self, await_added_s: float) -> bool:  # pragma: no mutate block
        """Rank 0: whether to stop at the next step for a newer generation (once its rebalance began
        and its added slots are ready)."""
        if not self.superseded():
            return False
        current = self.link.current()
        if not handover_due(self.generation, current, self.link.value(HANDOVER_KEY)):
            return False
        if await_added_s > 0:
            if self._superseded_at is None:
                self._superseded_at = time.monotonic()
            waited = time.monotonic() - self._superseded_at
            gen = (current or {}).get("generation")
            if not added_ready(self.world, current, self.link.seen(gen) if gen else None, waited, await_added_s):
                return False
        log.info("generation %s superseded: stopping every rank at the next step", self.generation)
        return True

    _superseded_at: float | None = None

    def _finish(self, reason: str, final_state, close_link: bool) -> dict:  # pragma: no mutate block
        """The generation's last checkpoint, the replica kept, the final heartbeat."""
        path = self.checkpoint()
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()  # nobody says "stopped" before rank 0's checkpoint and commits are written
        self._keep()
        summary = {"steps": self.steps, "trained": self.trained, "malformed": self.malformed,
                   "checkpoint": str(path), "restored_from": self.restored_from, "rank": self.rank,
                   "world_size": self.world, "reason": reason, "generation": self.generation}
        state = final_state(summary) if callable(final_state) else final_state
        # After the checkpoint: the next generation may take over these slices. Retried: a handover waits on it.
        if not self._seen(state, wait_s=STOPPED_WAIT_S):
            log.error("cannot record this worker's %r heartbeat (control-plane database unreachable): "  # pragma: no mutate
                      "the next generation's handover waits until its last heartbeat is stale", state)
        if self.link is not None and close_link:
            self.link.close(timeout_s=0.0)  # the heartbeat's wait above flushed everything, or the outage goes on
        log.info("stopped: %s", summary)
        return summary

    def _keep(self) -> None:
        """What the process keeps of this generation for the next one: the step, the positions
        of the checkpoint just written, when the last step ended."""
        r = self.replica
        r.steps, r.slices, r.last_step_t = self.steps, list(self._checkpointed or []), self.last_step_t
        r.generation, r.world, r.newest_good = self.generation, self.world, self._newest_good


def build_replica(trainer, device: str, rank: int, amp: bool = False, seed: int = 0, lr: float = 0.01) -> Replica:
    """A process's :class:`~kale_airflow.runtime.elastic.Replica`: the trainer (an object, a
    ``module:attr`` name, or None for the CTR model) built on the rank's device."""
    import torch

    dev = select_device(device, rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    made = trainer if trainer is not None and not isinstance(trainer, str) else load_trainer(trainer, lr=lr)
    return Replica.build(made, dev, amp=amp, seed=seed)


# ------------------------------------------------------------------ the process
class Job:
    """A rank process: one generation (without ``--warm-wait``), or one after another for as
    long as the deployment has room for its slot (see :mod:`~kale_airflow.runtime.elastic`)."""

    def __init__(self, args, link: ControlPlane | None):  # pragma: no mutate block
        from kale_airflow.stream import open_stream

        self.args, self.link, self.slot = args, link, args.worker_id
        self.parent = os.getppid()  # a spare (--standby) leaves when the pool supervisor that started it is gone
        self.warm = args.warm_wait > 0 and not args.profiling
        if self.warm and (link is None or not args.rendezvous):
            raise SystemExit("warm ranks (--warm-wait) read their generations from the control-plane database and "
                             "meet at a rendezvous: set KALE_DATABASE_URL and --rendezvous, or --warm-wait 0")
        # A broker outage shorter than the process group's collective timeout is waited out.
        self.stream = PatientStream(open_stream(args.stream), args.stream_outage, log)
        self.replica = build_replica(args.trainer, args.device, self.slot, args.amp)
        self.rdzv = (Rendezvous(args.rendezvous, self.slot, link, signalled=lambda: bool(_signalled))
                     if args.rendezvous else None)
        self.generation: str | None = None  # the generation this process is in (or trained last)
        self.next = LEAVE  # what the last stop decided: WAIT for the next generation, or LEAVE
        self.serving = False

    def serve(self) -> int:
        """Train generations until this slot leaves; the process's exit code."""
        target = self.first_target()
        while target is not None:
            summary = self.train(*target)
            if summary is None or summary["reason"] != "stopped" or self.next != WAIT:
                return 0
            target = self.await_target(after=target[0])
        return 0

    def first_target(self) -> tuple[str, dict] | None:  # pragma: no mutate block
        """Without ``--warm-wait``: the command's generation and assignment; else what the control plane names."""
        if not self.warm:
            text = self.args.assignment
            if text is None:
                raise SystemExit("--assignment is needed without --warm-wait (warm ranks read it from the "
                                 "control-plane database)")
            doc = json.loads(Path(text).read_text() if not text.lstrip().startswith("{") else text)
            return self.args.generation or "0", doc
        return self.await_target(after=None)

    def await_target(self, after: str | None) -> tuple[str, dict] | None:
        """Wait (up to ``--warm-wait``) until the control plane's current generation has an
        assignment with room for this slot: (generation, assignment); None when the slot is left
        out (scale-down), the wait runs out, or the process is signalled."""
        started = beat = time.monotonic()
        ready = spare = None
        while True:
            current = self.link.current()
            action = next_action(self.slot, after, current, self.args.standby)
            gen = (current or {}).get("generation")
            if action == STANDBY:  # a spare: its wait for an assignment starts when a generation names its slot
                if _signalled or os.getppid() != self.parent:
                    if not _signalled:
                        log.warning("slot %d is a spare whose pool supervisor is gone: leaving", self.slot)
                    if after is not None:
                        self.link.heartbeat(after, self.slot, "stopped", wait_s=STOPPED_WAIT_S)
                    return None
                if spare != gen:
                    log.info("slot %d is a spare of generation %s (%s worker(s)): built, waiting for a larger "
                             "generation to name it", self.slot, gen, current.get("workers"))
                    spare = gen
                self.replica.offload()
                started = time.monotonic()
                time.sleep(STANDBY_POLL_S)
                continue
            if (after is None or spare is not None) and action != LEAVE and gen not in (None, ready):
                self.link.heartbeat(gen, self.slot, "ready")  # the generation's old ranks train on until then
                ready = gen
            if action == JOIN:
                return current["generation"], {"assignment": current["assignment"]}
            if action == LEAVE or _signalled or time.monotonic() - started > self.args.warm_wait:
                self._leave(after, current, action)
                return None
            waited = time.monotonic() - started
            if waited > OFFLOAD_AFTER_S:
                self.replica.offload()  # a rank that waits holds no GPU memory (CUDA only)
            if after is not None and time.monotonic() - beat >= WARM_BEAT_S:
                self.link.heartbeat(after, self.slot, "warm")  # fresh: the next pods know this slot lives
                beat = time.monotonic()
            time.sleep(0.05)

    def _leave(self, after: str | None, current: dict | None, action: str) -> None:  # pragma: no mutate block
        gen = (current or {}).get("generation")
        if action == LEAVE:
            log.info("generation %s has no room for slot %d (%s worker(s)): leaving", gen, self.slot,
                     (current or {}).get("workers"))
        elif not _signalled:
            log.warning("no generation with room for slot %d within --warm-wait %g s (current: %s, assigned: %s): "
                        "leaving; the next generation starts it again from the checkpoint (a full restart)",
                        self.slot, self.args.warm_wait, gen, (current or {}).get("assignment") is not None)
        if after is not None:
            self.link.heartbeat(after, self.slot, "stopped", wait_s=STOPPED_WAIT_S)

    def final_state(self, summary: dict) -> str:
        """The heartbeat after a generation's last checkpoint: ``warm`` when this slot waits for
        the next generation, else ``stopped`` (decided here, so the next generation's pods know)."""
        self.next = LEAVE
        if self.warm and summary["reason"] == "stopped":
            action = next_action(self.slot, summary["generation"], self.link.current(), self.args.standby)
            current = self.link.current_generation()
            self.next = WAIT if action != LEAVE and current not in (None, summary["generation"]) else LEAVE
        return "warm" if self.next == WAIT else "stopped"

    def train(self, generation: str, assignment: dict) -> dict | None:
        """Meet the generation's other ranks, take the newest state, train until stopped; the
        run's summary (None: the meeting was abandoned for a newer generation, or this slot is
        another process's)."""
        args = self.args
        total = (args.workers_total if not self.warm and args.workers_total else
                 len(assignment.get("assignment", assignment)))
        decided = self._decided(generation)
        try:
            verdict = self._meet(generation, total)
        except DuplicateSlot as exc:
            log.warning("%s: leaving (the other process trains this slot)", exc)  # pragma: no mutate
            return None
        if verdict == TIMEOUT:
            raise RendezvousTimeout(f"the {total} rank(s) of generation {generation} did not all meet within "
                                    f"{self._wait_s():g} s")
        if verdict != GO:
            log.info("generation %s was superseded before its ranks met: on to the next one", generation)  # pragma: no mutate
            return {"reason": "stopped"}
        self.generation = generation
        try:
            summary = self._run_generation(generation, total, assignment, decided)
        finally:
            Rendezvous.leave()
        return summary

    def _wait_s(self) -> float:
        return self.args.warm_wait if self.warm else 600.0

    def _meet(self, generation: str, world: int) -> str:  # pragma: no mutate block
        if self.rdzv is None:
            if world > 1:
                raise SystemExit("a job of more than one worker needs --rendezvous HOST:PORT (or control-plane:PORT)")
            return GO
        self.next = WAIT  # abandoned: the serve loop waits for the newer generation
        backend = "nccl" if self.replica.device.type == "cuda" else "gloo"
        link = self.link

        def superseded() -> bool:
            return link is not None and link.current_generation() not in (None, generation)

        return self.rdzv.join(generation, world, backend, time.monotonic() + self._wait_s(), superseded)

    def _decided(self, generation: str) -> float | None:
        """When the decision naming ``generation`` was applied (None: unknown)."""
        if self.link is None or self.link.current_generation() != generation:
            return None
        return (self.link.value("generation_meta") or {}).get("since")

    def _run_generation(self, generation: str, total: int, assignment: dict, decided: float | None) -> dict:  # pragma: no mutate block
        import torch
        import torch.distributed

        args = self.args
        cores = threads_for(int(os.environ["KALE_WORKER_CORES"]), total) if os.environ.get("KALE_WORKER_CORES") else None
        if cores:
            torch.set_num_threads(cores)
        slices = slices_for(assignment, self.slot)
        worker = Worker(self.stream, args.group, slices, args.checkpoint_dir, self.slot, generation, total,
                        args.batch_size, checkpoint_every=args.checkpoint_every, control=self.link, audit=args.audit,
                        step_time_s=args.step_time, step_log=args.step_log, device=args.device, amp=args.amp,
                        allow_fresh_model=args.allow_fresh_model, replica=self.replica,
                        checkpoint_every_s=args.checkpoint_every_s or None)
        self._identify(worker, generation, total)
        log.info("joined a job of %d rank(s) (%s) on %s%s, generation %s as rank %d, %d slice(s), state from %s at "
                 "step %d", total, torch.distributed.get_backend() if worker.distributed else "no process group",
                 worker.device, " (bf16 autocast)" if worker.amp else "", generation, worker.rank, len(slices),
                 worker.restored_from, worker.steps)
        return worker.run(max_steps=args.max_steps, exit_when_idle=args.exit_when_idle,
                          report_every_s=args.report_every, poll_s=args.generation_poll,
                          final_state=self.final_state, close_link=False,
                          on_first_step=lambda t: self.record_pause(worker, t, decided),
                          await_added_s=args.await_added)

    def _identify(self, worker: Worker, generation: str, total: int) -> None:  # pragma: no mutate block
        if self.serving:
            exposition.METRICS.identify(worker=self.slot, generation=generation, workers=total, job=self.args.job)
            return
        self.serving = True
        try:  # /metrics on $KALE_METRICS_PORT, when set
            exposition.serve(None, worker=self.slot, generation=generation, workers=total,
                             restored=worker.kind == RESTART, job=self.args.job)
        except OSError as exc:  # metrics are not worth stopping the training job for
            log.warning("cannot serve /metrics on port %s (%s); training without it",
                        os.environ.get("KALE_METRICS_PORT"), exc)

    def record_pause(self, worker: Worker, first_step: float, decided: float | None) -> None:  # pragma: no mutate block
        """Rank 0, after the generation's first step: how long training paused and how it came
        back (``warm``: a rank's memory; ``restart``: the checkpoint), in the log and, in the
        background, in the control plane (``rescale/<generation>`` and ``rescale_pauses``, or
        ``restart/<generation>`` for a restart within a generation)."""
        previous = worker.restored.get("generation")
        if worker.rank != 0 or previous is None:
            return  # a new model: nothing paused
        reason = None if worker.kind == WARM else os.environ.get(START_REASON_ENV, "no rank held the state in memory")
        rec = pause_record(worker.generation, worker.kind, decided, worker.restored.get("last_step_t"), first_step,
                           worker.restored.get("world_size"), worker.world, worker.source, reason)
        within = previous == worker.generation
        log.info("%s %s: %s rank(s) -> %d, first step %s s after the decision, %s s after the last step (%s)",
                 "restarted" if within else "rescaled", worker.generation, rec["from_world"], worker.world,
                 rec["pause_s"], rec["gap_s"], worker.kind + (f": {reason}" if reason else ""))
        if self.link is not None:
            threading.Thread(target=self._write_pause, args=(rec, within), daemon=True).start()

    def _write_pause(self, rec: dict, within: bool) -> None:  # pragma: no mutate block
        def write(st, _metrics):
            if st is None:
                return
            if within:
                st.set_value(RESTART_KEY.format(generation=rec["generation"]), rec)
                return
            st.set_value(RESCALE_KEY.format(generation=rec["generation"]), rec)
            # What the planner prices is the time training stopped: from the old generation's
            # last step to the new one's first (the old one trains on while added ranks start).
            stopped = rec["gap_s"] if rec["gap_s"] is not None else rec["pause_s"]
            if stopped is not None:
                st.set_value(PAUSES_KEY, merge_pause(st.get_value(PAUSES_KEY), rec["generation"], stopped,
                                                     rec["kind"]))

        try:
            self.link.required(write, "record the rescale pause", deadline_s=30.0)
        except Exception as exc:  # noqa: BLE001 - a record is not worth the job
            log.warning("could not record the pause of generation %s (%s)", rec["generation"], exc)


def build_arg_parser() -> argparse.ArgumentParser:  # pragma: no mutate block
    """Arguments of the worker (rank) command."""
    ap = argparse.ArgumentParser(prog="python -m kale_airflow.runtime.worker",
                                 description="Reference online-training job (one rank) for kale-airflow.")
    ap.add_argument("--stream", required=True, help="stream URL, e.g. sqlite:///path/stream.db")
    ap.add_argument("--group", default="kale", help="consumer group prefix")
    ap.add_argument("--assignment", help="assignment JSON (file path or inline JSON); needed without --warm-wait")
    ap.add_argument("--worker-id", type=int, required=True, help="this process's slot: its rank in every generation it trains")
    ap.add_argument("--workers-total", type=int, default=None, help="world size (default: from the assignment)")
    ap.add_argument("--rendezvous", default=os.environ.get("KALE_RENDEZVOUS"),
                    help="HOST:PORT of rank 0's TCPStore, or control-plane:PORT (rank 0 publishes its address "
                    "in the control-plane database); default $KALE_RENDEZVOUS")
    ap.add_argument("--generation", default=None, help="the generation to train (default 0; with --warm-wait the "
                    "control plane's current one)")
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--batch-size", type=int, default=512, help="samples per rank and step (at most)")
    ap.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (and commits)")
    ap.add_argument("--checkpoint-every-s", type=float, default=float(os.environ.get("KALE_CHECKPOINT_EVERY_S", "60")),
                    help="at most this many seconds of training between checkpoints (and commits), whatever "
                    "--checkpoint-every says: a crash replays since the last one (the autoscaler measures the "
                    "backlog from the positions each rank reports about every second; default $KALE_CHECKPOINT_EVERY_S, else 60; 0: by steps only)")
    ap.add_argument("--database-url", help="control-plane database to record throughput into and to read the "
                    "current generation from (local use; default: the KALE_DATABASE_URL environment variable, "
                    "which keeps a password out of process listings and pod specs)")
    ap.add_argument("--job", default=os.environ.get("KALE_JOB", "default"),
                    help="the deployment's job whose control-plane rows (generations, heartbeats, throughput) this "
                    "rank reads and writes (default $KALE_JOB, else default)")
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
    return _elastic_arguments(ap)


def _elastic_arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:  # pragma: no mutate block
    """The model and the warm ranks' arguments."""
    ap.add_argument("--trainer", default=os.environ.get("KALE_TRAINER"),
                    help="the model: module:attribute of a kale_airflow.runtime.trainer.Trainer (or a class or "
                    "function making one); default $KALE_TRAINER, else the reference CTR model")
    ap.add_argument("--warm-wait", type=float, default=float(os.environ.get("KALE_WARM_WAIT_S", "0")),
                    help="keep this process across generations: after a generation stops, wait up to this many "
                    "seconds for the next one with room for this slot (and for its ranks to meet), then take the "
                    "model from a surviving rank's memory; the generation and assignment then come from the "
                    "control-plane database. 0 (default $KALE_WARM_WAIT_S, else 0): train one generation, exit")
    ap.add_argument("--await-added", type=float, default=0.0,
                    help="with --warm-wait, on rank 0: when a larger generation is named, keep training up to this "
                    "many seconds until its added slots report ready (the local pool starts them at once); 0: stop "
                    "at once")
    ap.add_argument("--standby", type=int, default=0,
                    help="with --warm-wait, in the local pool: a process whose slot is within this many above the "
                    "current generation's size waits as a spare (model built, no GPU memory) for a larger "
                    "generation to name its slot, instead of leaving (default 0)")
    ap.add_argument("--stream-outage", type=float, default=STREAM_OUTAGE_S,
                    help="seconds a rank retries a stream that cannot be reached (a broker restart) before it "
                    f"fails and the job restarts from its checkpoint (default {STREAM_OUTAGE_S:g}); 0: fail at once")
    ap.add_argument("--generation-poll", type=float, default=GENERATION_POLL_S,
                    help="seconds between rank 0's reads of the current generation while training")
    return ap


def main(argv: list[str] | None = None) -> int:  # pragma: no mutate block
    """Entry point; exits 0 after a clean stop, :data:`EXIT_REFUSED` (78) when the job must not
    start or go on (no readable checkpoint after training, positions outside the stream's log),
    :data:`EXIT_DEPENDENCY` (75) when the control-plane database stayed unreachable at start,
    :data:`EXIT_RENDEZVOUS` (69) when a generation's ranks did not all meet in time."""
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
    except RendezvousTimeout as exc:
        log.error("%s: falling back to a full restart from the checkpoint (exit code %d)", exc, EXIT_RENDEZVOUS)
        return EXIT_RENDEZVOUS


def _run_job(args) -> int:  # pragma: no mutate block
    """Open the control plane, then train generations (:class:`Job`)."""
    if os.environ.get("KALE_WORKER_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["KALE_WORKER_THREADS"]))
    link = None
    url = args.database_url or os.environ.get("KALE_DATABASE_URL")
    if url:  # without one the job trains, but records nothing and never sees a newer generation
        # A profiling job is no generation: no heartbeats (status and shadow mode count the
        # deployment's workers), and no stopping when the deployment's generation changes.
        link = ControlPlane.for_url(url, heartbeats=not args.profiling, deadline_s=args.database_wait, job=args.job)
        link.open()
    job = None
    try:
        job = Job(args, link)
        return job.serve()
    except Exception:
        gen = (job.generation if job is not None else None) or args.generation
        if link is not None and gen:  # a pod has no supervisor to say so: no dead worker keeps saying "running"
            link.heartbeat(gen, args.worker_id, "failed", wait_s=5.0)
        raise
    finally:
        if link is not None:
            link.close(timeout_s=2.0)


if __name__ == "__main__":
    sys.exit(main())
