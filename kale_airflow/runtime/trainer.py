"""The boundary between the training runtime and a model: the :class:`Trainer` protocol.

The runtime (:mod:`~kale_airflow.runtime.worker`) owns everything that makes online
training elastic: the stream, the slices and their offsets, checkpoints, the rendezvous,
rescales, metrics and stopping. A trainer owns the model. It

- **builds** the model on the rank's device and its optimizer (once per process: a rank
  that survives a generation change keeps them),
- **decodes** a list of payloads (the stream's bytes, already restricted to the rank's
  slices) into one batch, skipping and counting malformed ones,
- makes a **padding** batch of one sample, which a rank with no data this step trains with
  weight 0 (so it still joins DDP's gradient all-reduce),
- runs **one training step** on a batch with the ``scale`` the runtime passes: the step's
  loss must be ``sum of the per-sample losses * scale``; the runtime chooses ``scale``
  (``weight * world size / global samples``) so that DDP's gradient *average* is the mean
  gradient over the global batch however unevenly the samples are spread,
- and gives its **state** (``state_dict``/``load_state_dict``): what a checkpoint holds
  and what a surviving rank broadcasts to a new one. It must be deterministic: the same
  keys in the same order on every rank and every call (tensors, numbers, strings, lists
  and dicts of them). Its top-level keys must not be the runtime's own (:data:`RUNTIME_KEYS`).

:class:`TorchTrainer` implements ``build``'s bookkeeping and the state for the common case
(a module and an optimizer). The reference click-through model,
:class:`~kale_airflow.runtime.model.CTRTrainer`, is one implementation;
``python -m kale_airflow.runtime.worker --trainer module:attr`` (``trainer:`` in
``kale.yaml``) selects another: ``attr`` is a trainer, or a class or function that makes
one when called without arguments.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kale_airflow.core.errors import KaleError

# What the runtime itself keeps in a checkpoint, beside the trainer's state.
RUNTIME_KEYS = frozenset({"steps", "generation", "world_size", "group", "slices", "trainer_class", "last_step_t"})
SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class TrainerError(KaleError, ValueError):
    """A trainer cannot be loaded or breaks the protocol; the message says which and how."""


@dataclass(frozen=True)
class Decoded:
    """A decoded batch: ``batch`` (whatever ``train_step`` takes), the samples in it, and the
    payloads skipped as malformed."""

    batch: Any
    samples: int
    malformed: int = 0


@runtime_checkable
class Trainer(Protocol):  # pragma: no mutate block - mutmut's trampolines would be members isinstance() checks
    """What the runtime needs from a model (see the module docstring)."""

    def build(self, device, amp: bool = False) -> tuple[Any, Any]:
        """Create the model on ``device`` and its optimizer; returns ``(module, optimizer)``.
        The runtime seeds torch first (every rank builds the same initial model) and wraps the
        module in DistributedDataParallel itself. ``amp``: bf16 mixed precision was asked for
        (honour it on CUDA, or ignore it)."""

    def decode(self, payloads: Sequence[bytes]) -> Decoded:
        """One batch of the valid payloads, counting the malformed ones."""

    def padding(self) -> Any:
        """A batch of one sample (any values): trained with weight 0 by a rank without data."""

    def train_step(self, model, optimizer, batch, scale: float):
        """Zero the gradients, backpropagate ``sum of per-sample losses * scale``, step the
        optimizer; return the batch's mean loss (a float or a 0-dim tensor)."""

    def state_dict(self) -> dict:
        """Everything to checkpoint and hand over to a new rank (deterministic)."""

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""


class TorchTrainer:
    """Base for trainers with one module and one optimizer: :meth:`build` keeps what
    :meth:`make` returns, and the state is ``{"model": ..., "optim": ...}``. Subclasses write
    ``make``, ``decode``, ``padding`` and ``train_step``."""

    module = None
    optimizer = None
    device = None

    def make(self, device, amp: bool):  # pragma: no cover - the subclass's
        """Return ``(module on device, optimizer)``."""
        raise NotImplementedError

    def build(self, device, amp: bool = False):
        """``make`` once; the module and optimizer are kept for the state."""
        self.device = device
        self.module, self.optimizer = self.make(device, amp)
        return self.module, self.optimizer

    def state_dict(self) -> dict:
        """The module's and the optimizer's state dicts."""
        return {"model": self.module.state_dict(), "optim": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Load both (tensors are moved to the module's device by torch)."""
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])


def load_trainer(spec: str | None, **defaults) -> Trainer:
    """The trainer ``module:attr`` names (``attr`` a trainer, or a class or function making one
    without arguments); None: the reference CTR trainer, made with ``defaults`` (``lr``)."""
    if not spec:
        from kale_airflow.runtime.model import CTRTrainer

        return CTRTrainer(**defaults)
    if not SPEC.match(spec):
        raise TrainerError(f"trainer {spec!r} is not 'module:attribute' (e.g. mypackage.models:MyTrainer)")
    module_name, _, attr = spec.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrainerError(f"trainer {spec!r}: cannot import {module_name} ({exc}); install it in the worker's "
                           "environment (the worker image on Kubernetes)") from None
    for part in attr.split("."):
        if not hasattr(found, part):
            raise TrainerError(f"trainer {spec!r}: {module_name} has no attribute {attr}")
        found = getattr(found, part)
    trainer = found
    if not _is_trainer(found) and callable(found):
        try:
            trainer = found()
        except TypeError as exc:  # a function that needs arguments: not a trainer factory
            raise TrainerError(f"trainer {spec!r} cannot be made without arguments ({exc}); name a Trainer, or a "
                               "class or function that makes one without arguments") from None
    if not _is_trainer(trainer):
        missing = [m for m in PROTOCOL_METHODS if not callable(getattr(trainer, m, None))]
        raise TrainerError(f"trainer {spec!r} is not a Trainer: it lacks {', '.join(missing)} "
                           "(kale_airflow.runtime.trainer.Trainer)")
    return trainer


PROTOCOL_METHODS = ("build", "decode", "padding", "train_step", "state_dict", "load_state_dict")


def _is_trainer(obj) -> bool:
    return not isinstance(obj, type) and all(callable(getattr(obj, m, None)) for m in PROTOCOL_METHODS)


def state_problem(mine: dict, theirs) -> str | None:
    """Why ``theirs`` (a loaded checkpoint) cannot restore a trainer whose state is ``mine``
    (None when it can): a key missing, or a module's tensors (a top-level dict of tensors)
    with other names or shapes."""
    needed = sorted({*mine, "steps"})
    if not isinstance(theirs, dict) or any(k not in theirs for k in needed):
        keys = sorted(map(str, theirs))[:6] if isinstance(theirs, dict) else type(theirs).__name__
        return f"not a kale-airflow checkpoint (needs {', '.join(needed)}; found {keys})"
    for key, value in mine.items():
        if not _is_tensor_dict(value):
            continue
        other = theirs[key]
        if not isinstance(other, dict) or set(other) != set(value) or any(
                tuple(getattr(other[k], "shape", ())) != tuple(t.shape) for k, t in value.items()):
            return "a checkpoint of another model (its parameter names or shapes differ)"
    return None


def _is_tensor_dict(value) -> bool:
    return isinstance(value, dict) and bool(value) and all(hasattr(v, "shape") and hasattr(v, "dtype")
                                                          for v in value.values())


def check_state_keys(state: dict) -> None:
    """Refuse a trainer state whose top-level keys collide with the runtime's own."""
    clash = sorted(set(state) & RUNTIME_KEYS)
    if clash:
        raise TrainerError(f"the trainer's state_dict uses {', '.join(clash)}, which the runtime keeps in every "
                           f"checkpoint itself ({', '.join(sorted(RUNTIME_KEYS))}): rename them")
