"""The reference click-through model (embeddings for user and item, an MLP on top) and its
:class:`~kale_airflow.runtime.trainer.Trainer`: payloads are packed samples
(:mod:`~kale_airflow.runtime.samples`), the loss is binary cross-entropy with logits."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

from kale_airflow.runtime.samples import DENSE, DTYPE, ITEMS, USERS, unpack
from kale_airflow.runtime.trainer import Decoded, TorchTrainer


class CTRModel(nn.Module):
    """Embedding(user) + Embedding(item) + dense features -> MLP -> click logit."""

    def __init__(self, dim: int = 16, hidden: int = 64):
        super().__init__()
        self.user = nn.Embedding(USERS, dim)
        self.item = nn.Embedding(ITEMS, dim)
        self.mlp = nn.Sequential(nn.Linear(2 * dim + DENSE, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, user, item, dense):
        return self.mlp(torch.cat([self.user(user), self.item(item), dense], dim=1)).squeeze(1)


def to_tensors(samples: np.ndarray):
    """Structured sample array -> (user, item, dense, label) tensors."""
    # Fields of a packed structured array are strided views; copy each into its own buffer
    # (ascontiguousarray keeps a 1-row view, whose 41-byte stride torch refuses).
    return (torch.from_numpy(samples["user"].astype(np.int64)), torch.from_numpy(samples["item"].astype(np.int64)),
            torch.from_numpy(samples["dense"].astype(np.float32, copy=True)),
            torch.from_numpy(samples["label"].astype(np.float32)))


class CTRTrainer(TorchTrainer):
    """The CTR model with Adam. On CUDA a batch goes through pinned host memory with
    asynchronous copies, and the forward pass runs under bf16 autocast when ``amp`` is asked."""

    def __init__(self, lr: float = 0.01):
        self.lr = lr
        self.amp = False
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="none")

    def make(self, device, amp: bool):
        """The CTR model on ``device`` and its Adam optimizer."""
        self.amp = amp and device.type == "cuda"  # bf16 autocast on CUDA only: the CPU path stays float32
        module = CTRModel().to(device)
        return module, torch.optim.Adam(module.parameters(), lr=self.lr)

    def decode(self, payloads) -> Decoded:
        """Packed samples -> one structured array (malformed payloads skipped and counted)."""
        samples, bad = unpack(list(payloads))
        return Decoded(samples, len(samples), bad)

    def padding(self) -> np.ndarray:
        """One all-zero sample."""
        return np.zeros(1, dtype=DTYPE)

    def train_step(self, model, optimizer, batch: np.ndarray, scale: float):
        """Forward, backward of ``sum(losses) * scale``, optimizer step; the batch's mean loss."""
        tensors = to_tensors(batch)
        if self.device is not None and self.device.type == "cuda":
            tensors = tuple(t.pin_memory().to(self.device, non_blocking=True) for t in tensors)
        user, item, dense, label = tensors
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext():
            losses = self.loss_fn(model(user, item, dense), label)
        (losses.sum() * scale).backward()
        optimizer.step()
        return losses.detach().mean()
