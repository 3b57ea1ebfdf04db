"""The reference click-through model: embeddings for user and item, an MLP on top."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from kale_airflow.runtime.samples import DENSE, ITEMS, USERS


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
