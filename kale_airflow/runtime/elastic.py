"""Warm ranks: processes that outlive a generation, and what they hand each other in memory.

A rank process has a **slot** (its supervisor's or its pod's index), a
:class:`Replica` (its trainer, model and optimizer, built once) and, after it has trained,
the state of its last step. When a newer generation is named:

1. the generation stops at an agreed step (the step's all-reduce), rank 0 checkpoints and
   commits the slices' positions (a crash from here on loses nothing);
2. each rank tears its process group down and asks the control plane what comes next
   (:func:`next_action`): a slot the new generation has no room for **leaves** (exit 0:
   the scale-down stops only the removed ranks); the others report ``warm`` and **wait**
   until the new generation has its assignment (the handover moved the commits first);
3. the ranks **meet** again (:class:`Rendezvous`): slot 0 serves one ``TCPStore`` for its
   whole life and every generation meets under its own key prefix there. A rank takes the
   rank of its slot; a duplicate of a slot (a retried pod racing its predecessor) leaves;
   the meeting is settled by one compare-and-set (``go`` once every slot is there, or
   ``abandon`` when a newer generation was named meanwhile or the wait ran out), so either
   every rank initialises the process group or none does;
4. they agree who holds the newest state (:func:`choose_source`), and that rank
   broadcasts it (:func:`broadcast_state`: model, optimizer, step and the checkpointed
   positions, tensors in one buffer per dtype); the new slices start by the handover rule.
   A scale-up's added ranks receive the state the same way. The local pool keeps spares
   (``worker_standby``): processes for the slots just above the current generation's size
   (started for them, or removed by a scale-down), imported and built, waiting
   (:data:`STANDBY`) for a larger generation to name their slot, so a scale-up does not wait
   for a process to start; any other added rank is started as soon as the generation is
   named, and its import overlaps the handover.

When no rank holds state (the first start, a crash, a warm meeting that timed out, warm
ranks turned off), rank 0 reads the checkpoint instead: today's full restart. Either way
rank 0 records the pause (:func:`merge_pause`, :func:`pause_record`) in the control plane
with its kind, ``warm`` or ``restart``.

On CUDA a waiting rank moves its model and optimizer to host memory after
:data:`OFFLOAD_AFTER_S` and empties the allocator's cache (:meth:`Replica.offload`), so a
rank that waits without a generation holds no GPU memory beyond its CUDA context.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("kale.worker")
WARM, RESTART = "warm", "restart"
PAUSES_KEY = "rescale_pauses"  # the autoscaler's measured pauses: {"generation", "pauses", "kinds"}
PAUSES_KEPT = 5  # as many as the autoscaler keeps
RESCALE_KEY = "rescale/{generation}"  # one record per generation change (see pause_record)
RESTART_KEY = "restart/{generation}"  # the last restart from the checkpoint within a generation
RENDEZVOUS_KEY = "rendezvous/{generation}"
# The generation whose rebalance began last: {"generation", "since"} (see handover_due).
HANDOVER_KEY = "handover"
CONTROL_PLANE = "control-plane"
DEFAULT_PORT = 29500
OFFLOAD_AFTER_S = 2.0  # a rank waiting longer than this gives its GPU memory back
POLL_S = 0.05  # how often a waiting rank looks at the store, the control plane at most every CONTROL_POLL_S
CONTROL_POLL_S = 0.1
WARM_BEAT_S = 5.0  # a waiting rank's "warm" heartbeat, as often as a training rank's
JOIN, WAIT, LEAVE, STANDBY = "join", "wait", "leave", "standby"
STANDBY_POLL_S = 0.2  # how often a spare (STANDBY) looks for its slot in the current generation
GO, ABANDON, TIMEOUT = "go", "abandon", "timeout"


class RendezvousTimeout(RuntimeError):
    """The generation's ranks did not all meet within the wait: fall back to a full restart."""


class DuplicateSlot(RuntimeError):
    """Another process holds this slot in the generation (a retried pod racing its predecessor)."""


# ------------------------------------------------------------------ decisions (pure)
def next_action(slot: int, after: str | None, current: dict | None, standby: int = 0) -> str:
    """What a waiting rank does next, from the control plane's current generation
    (``{"generation", "workers", "assignment"}`` or None): :data:`LEAVE` when the generation
    has no room for ``slot``, :data:`JOIN` once it is assigned, else :data:`WAIT`. ``after``:
    the generation this rank trained last (it never joins that one again). ``standby``: the
    local pool's spares; a rank whose slot is within that many above the generation's size is
    a spare (:data:`STANDBY`: imported and built, it waits for a larger generation to name its
    slot) instead of leaving; a stopped deployment keeps none."""
    if not current or current.get("generation") is None or current["generation"] == after:
        return WAIT
    workers = current.get("workers")
    assignment = current.get("assignment")
    size = int(workers) if workers is not None else None if assignment is None else len(assignment)
    if size is not None and slot >= size:
        return STANDBY if 0 < size and slot < size + standby else LEAVE
    if assignment is None:
        return WAIT
    return JOIN if slot < len(assignment) else LEAVE


def added_ready(world: int, current: dict | None, seen: dict[int, dict] | None, waited_s: float,
                limit_s: float) -> bool:
    """Whether a generation of ``world`` ranks stops now for the ``current`` one: at once when
    that one is no larger (or its size is unknown), else once every slot it adds reports
    ``ready`` (or runs) in ``seen`` (its heartbeats), or after ``limit_s``. The local pool starts
    the added slots when the generation is named: training goes on while they import."""
    workers = (current or {}).get("workers")
    if workers is None or waited_s >= limit_s:
        return True  # (no larger: it adds no slot to wait for)
    states = {w: (rec or {}).get("state") for w, rec in (seen or {}).items()}
    return all(states.get(s) in ("ready", "running") for s in range(world, int(workers)))


def handover_due(mine: str, current: dict | None, handover: dict | None) -> bool:
    """Whether generation ``mine``, superseded by ``current``, stops now: once the rebalance of
    a generation other than ``mine`` has begun (``handover``, :data:`HANDOVER_KEY`; it waits
    for ``mine`` to checkpoint and stop). Until then it trains on: between the decision that
    names a generation and its rebalance, Airflow runs the training DAG, which takes seconds.
    At once when ``current`` has no workers (a stop), or is unknown, or no rebalance ever
    began (generations named by hand, or the database unreachable)."""
    if not current or not current.get("workers") or not handover:
        return True
    return handover.get("generation") != mine


def choose_source(members: list[tuple[bool, int]]) -> int | None:
    """The rank whose state every rank takes: of the ranks holding state, ``(has_state,
    step)`` per rank, the one at the highest step (the lowest rank among equals); None when
    no rank holds any (rank 0 then reads the checkpoint)."""
    best = None
    for rank, (has, step) in enumerate(members):
        if has and (best is None or step > members[best][1]):
            best = rank
    return best


def settle(present: bool, superseded: bool, expired: bool) -> str | None:
    """The verdict a rank proposes for a meeting: :data:`GO` when every slot is there,
    :data:`ABANDON` when a newer generation was named, :data:`TIMEOUT` when the wait ran out;
    None: keep waiting. The first proposal written wins for every rank."""
    if present:
        return GO
    if superseded:
        return ABANDON
    return TIMEOUT if expired else None


def merge_pause(rec: dict | None, generation: str, seconds: float, kind: str, kept: int = PAUSES_KEPT) -> dict:
    """The ``rescale_pauses`` record with this generation's pause: appended (the oldest
    dropped past ``kept``) with its kind in the parallel ``kinds`` list, or, when the record
    already names the generation (the autoscaler estimated it first, from the decision to
    every worker's start), replaced by this measurement with its kind. Pauses appended
    without a kind (by a writer that does not know kinds) get None."""
    rec = dict(rec or {"generation": None, "pauses": []})
    pauses = list(rec.get("pauses", []))
    kinds = list(rec.get("kinds", []))[:len(pauses)]
    kinds += [None] * (len(pauses) - len(kinds))
    if rec.get("generation") == generation and pauses:
        pauses[-1], kinds[-1] = round(float(seconds), 3), kind
    else:
        pauses, kinds = pauses + [round(float(seconds), 3)], kinds + [kind]
    return {**rec, "generation": generation, "pauses": pauses[-kept:], "kinds": kinds[-kept:]}


def pause_record(generation: str, kind: str, decided: float | None, last_step: float | None, first_step: float,
                 from_world: int | None, to_world: int, source: int | None, reason: str | None = None) -> dict:
    """One generation change as the control plane keeps it: ``pause_s`` from the decision
    naming the generation to the end of its first step, ``gap_s`` from the last step of the
    previous generation to it (None when not known)."""
    return {"generation": generation, "kind": kind, "reason": reason, "from_world": from_world,
            "to_world": to_world, "source_rank": source, "decided": decided, "last_step": last_step,
            "first_step": first_step,
            "pause_s": None if decided is None else round(first_step - decided, 3),
            "gap_s": None if last_step is None else round(first_step - last_step, 3)}


def threads_for(cores: int | None, world: int) -> int | None:
    """Threads per local rank: the machine's cores split between the generation's ranks."""
    return None if not cores else max(1, cores // max(1, world))


# ---------------------------------------------------------------- state in memory
@dataclass(frozen=True)
class TensorRef:
    """Where a tensor was in a state: its index in the flat list, shape and dtype name."""

    index: int
    shape: tuple
    dtype: str


def split_state(obj) -> tuple[Any, list]:
    """``obj`` with every tensor replaced by a :class:`TensorRef`, and the tensors in order
    (dicts keep their key order, so the split is deterministic)."""
    tensors: list = []

    def walk(x):
        if hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "detach"):
            tensors.append(x)
            return TensorRef(len(tensors) - 1, tuple(x.shape), str(x.dtype).removeprefix("torch."))
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return type(x)(walk(v) for v in x)
        return x

    return walk(obj), tensors


def join_state(skeleton, tensors: list):
    """Inverse of :func:`split_state`."""
    if isinstance(skeleton, TensorRef):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return {k: join_state(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list | tuple):
        return type(skeleton)(join_state(v, tensors) for v in skeleton)
    return skeleton


def refs(skeleton) -> list[TensorRef]:
    """The :class:`TensorRef` of a skeleton, by index."""
    out: list[TensorRef] = []

    def walk(x):
        if isinstance(x, TensorRef):
            out.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)

    walk(skeleton)
    return sorted(out, key=lambda r: r.index)


def broadcast_state(obj, src: int, rank: int, device=None):
    """Collective: every rank returns ``obj`` as rank ``src`` holds it (other ranks pass
    None). The structure travels as one pickled object, the tensors as one flat buffer per
    dtype (on ``device``: the process group's, CUDA for NCCL)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return obj
    skeleton, tensors = split_state(obj) if rank == src else (None, [])
    box = [skeleton]
    dist.broadcast_object_list(box, src=src)
    skeleton = box[0]
    wanted = refs(skeleton)
    out: list = [None] * len(wanted)
    comm = device if device is not None else torch.device("cpu")
    for dtype in sorted({r.dtype for r in wanted}):
        group = [r for r in wanted if r.dtype == dtype]
        sizes = [int(torch.Size(r.shape).numel()) for r in group]
        if rank == src:
            flat = torch.cat([tensors[r.index].detach().reshape(-1).to(comm) for r in group])
        else:
            flat = torch.empty(sum(sizes), dtype=getattr(torch, dtype), device=comm)
        dist.broadcast(flat, src=src)
        for r, part in zip(group, torch.split(flat, sizes)):
            out[r.index] = part.reshape(r.shape).clone()
    return join_state(skeleton, out)


@dataclass
class Replica:
    """This process's copy of the model, kept across generations: the trainer with its
    module and optimizer, and (once it trained) the step, the positions of the last
    checkpoint and when the last step ended."""

    trainer: Any
    module: Any
    optimizer: Any
    device: Any
    steps: int = 0
    slices: list | None = None  # None: no trained state in memory (a new process)
    last_step_t: float | None = None
    generation: str | None = None
    world: int | None = None
    newest_good: bool = False  # rank 0 wrote (or read) model.pt itself: safe to keep as the previous one
    offloaded: bool = False

    @classmethod
    def build(cls, trainer, device, amp: bool = False, seed: int = 0) -> Replica:
        """Build the trainer's model on ``device`` (seeded: every rank starts from the same model)."""
        import torch

        torch.manual_seed(seed)
        module, optimizer = trainer.build(device, amp)
        return cls(trainer, module, optimizer, device)

    @property
    def has_state(self) -> bool:
        """Holds the state of a step it trained (or restored) in an earlier generation."""
        return self.slices is not None

    def offload(self) -> None:  # pragma: no mutate block
        """On CUDA: model and optimizer to host memory, and the allocator's cache emptied."""
        if self.device.type != "cuda" or self.offloaded:
            return
        import torch

        _move(self.module, self.optimizer, torch.device("cpu"))
        torch.cuda.empty_cache()
        self.offloaded = True

    def reload(self) -> None:  # pragma: no mutate block
        """Back onto the device after :meth:`offload`."""
        if self.offloaded:
            _move(self.module, self.optimizer, self.device)
            self.offloaded = False


def _move(module, optimizer, device) -> None:  # pragma: no mutate block
    module.to(device)
    for state in optimizer.state.values():
        for k, v in list(state.items()):
            if hasattr(v, "to") and hasattr(v, "dtype") and not (k == "step" and v.device.type == "cpu"):
                state[k] = v.to(device)


# ---------------------------------------------------------------------- meeting
@dataclass
class Rendezvous:
    """The process's side of every generation's meeting (see the module docstring).

    ``address``: ``HOST:PORT`` of slot 0's store (local: the supervisor's port for this
    attempt), or ``control-plane:PORT`` (Kubernetes: slot 0 publishes its pod IP and port in
    the control-plane database under ``rendezvous/<generation>``, the others read it).
    ``control``: the worker's :class:`~kale_airflow.runtime.control_plane.ControlPlane`."""

    address: str
    slot: int
    control: Any = None
    signalled: Callable[[], bool] = lambda: False
    member: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    _base: Any = None
    _target: tuple | None = None

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2] or DEFAULT_PORT)

    def store(self, generation: str, deadline: float):
        """This generation's prefix of slot 0's store (slot 0 serves it; the others connect)."""
        import torch.distributed as dist

        if self.slot == 0:
            if self._base is None:
                self._base = dist.TCPStore(self.host if self.host != CONTROL_PLANE else "0.0.0.0", self.port, None,
                                           True, datetime.timedelta(seconds=60), wait_for_workers=False)
            if self.host == CONTROL_PLANE:
                self._publish(generation)
        else:
            self._connect(generation, deadline)
        return dist.PrefixStore(f"kale/{generation}/", self._base)

    def _publish(self, generation: str) -> None:  # pragma: no mutate block
        own = os.environ.get("KALE_POD_IP") or socket.gethostbyname(socket.gethostname())
        rec = {"host": own, "port": self._base.port, "member": self.member, "t": time.time()}
        key = RENDEZVOUS_KEY.format(generation=generation)
        self._need_control().required(lambda st, _m: st.set_value(key, rec), "publish the rendezvous address")

    def _need_control(self):
        if self.control is None:
            raise SystemExit("--rendezvous control-plane needs the control-plane database (KALE_DATABASE_URL)")
        return self.control

    def _connect(self, generation: str, deadline: float) -> None:  # pragma: no mutate block
        import torch.distributed as dist

        while True:
            target = self._where(generation)
            if target is not None and target == self._target and self._base is not None:
                return
            if target is not None:
                try:
                    self._base = dist.TCPStore(target[0], target[1], None, False, datetime.timedelta(seconds=15))
                    self._target = target
                    return
                except Exception as exc:  # noqa: BLE001 - slot 0 not up yet, or a stale address: retry
                    log.info("rendezvous at %s:%d not ready (%s); retrying", target[0], target[1], exc)
            if time.monotonic() > deadline or self.signalled():
                raise RendezvousTimeout(f"slot {self.slot}: no rendezvous address for generation {generation}")
            time.sleep(0.2)

    def _where(self, generation: str) -> tuple[str, int] | None:  # pragma: no mutate block
        if self.host != CONTROL_PLANE:
            return self.host, self.port
        key = RENDEZVOUS_KEY.format(generation=generation)
        rec = self._need_control().required(lambda st, _m: st.get_value(key), "read the rendezvous address")
        return (rec["host"], int(rec["port"])) if rec else None

    def meet(self, generation: str, world: int, deadline: float, superseded: Callable[[], bool]) -> str:
        """Claim this slot in the generation and wait for every slot; returns the settled
        verdict (:data:`GO`, :data:`ABANDON` or :data:`TIMEOUT`); raises
        :class:`DuplicateSlot` when another process holds the slot."""
        st = self.store(generation, deadline)
        holder = st.compare_set(f"slot/{self.slot}", "", self.member)
        if _text(holder) != self.member:
            raise DuplicateSlot(f"slot {self.slot} of generation {generation} is held by member {_text(holder)}")
        st.set(f"member/{self.slot}", self.member)
        keys = [f"member/{r}" for r in range(world)]
        checked = -1.0
        while True:
            if st.check(["verdict"]):
                return _text(st.get("verdict"))
            newer = False
            if time.monotonic() - checked >= CONTROL_POLL_S:
                newer, checked = superseded(), time.monotonic()
            verdict = settle(st.check(keys), newer, time.monotonic() > deadline or self.signalled())
            if verdict is not None:
                return _text(st.compare_set("verdict", "", verdict))
            time.sleep(POLL_S)

    def join(self, generation: str, world: int, backend: str, deadline: float, superseded: Callable[[], bool],
             timeout_s: float = 120.0) -> str:
        """:meth:`meet`, then the process group at rank = slot when every slot came
        (:data:`GO`); returns the verdict without a group otherwise."""
        import torch.distributed as dist

        verdict = self.meet(generation, world, deadline, superseded)
        if verdict == GO:
            st = dist.PrefixStore(f"kale/{generation}/pg/", self._base)
            dist.init_process_group(backend, store=st, rank=self.slot, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        return verdict

    @staticmethod
    def leave() -> None:
        """Tear the generation's process group down (the store stays for the next one)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

