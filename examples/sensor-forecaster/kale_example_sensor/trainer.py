"""The model and its :class:`~kale_airflow.runtime.trainer.Trainer`: the runtime hands the
trainer a rank's payloads, the trainer decodes them and takes one optimizer step.

Select it in ``kale.yaml`` with ``trainer: kale_example_sensor.trainer:SensorTrainer``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from kale_airflow.runtime.trainer import Decoded, TorchTrainer
from kale_example_sensor.wire import SENSORS, WINDOW, decode

DAY_S = 86_400


class SensorForecaster(nn.Module):
    """Next reading = last reading + an MLP's correction, from the window relative to its
    last reading, the time of day and a learned embedding of the sensor."""

    def __init__(self, dim: int = 8, hidden: int = 64):
        super().__init__()
        self.sensor = nn.Embedding(SENSORS, dim)
        self.mlp = nn.Sequential(nn.Linear(WINDOW + 2 + dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, sensor, time, readings):
        last = readings[:, -1:]
        angle = (time % DAY_S).float().unsqueeze(1) * (2 * math.pi / DAY_S)
        x = torch.cat([readings - last, angle.sin(), angle.cos(), self.sensor(sensor)], dim=1)
        return (last + self.mlp(x)).squeeze(1)


class SensorTrainer(TorchTrainer):
    """The forecaster with AdamW and the Huber loss. ``TorchTrainer`` keeps the module and the
    optimizer and gives the state (``{"model": ..., "optim": ...}``)."""

    def __init__(self, lr: float = 3e-3):
        self.lr = lr
        self.amp = False

    def make(self, device, amp: bool):
        """The model on the rank's device and its optimizer (the runtime seeds torch first)."""
        self.amp = amp and device.type == "cuda"
        module = SensorForecaster().to(device)
        return module, torch.optim.AdamW(module.parameters(), lr=self.lr, weight_decay=1e-4)

    def decode(self, payloads) -> Decoded:
        """The valid payloads as one batch of arrays; malformed ones are skipped and counted."""
        batch, malformed = decode(payloads)
        return Decoded(batch, len(batch["target"]), malformed)

    def padding(self) -> dict[str, np.ndarray]:
        """One all-zero sample (a rank without data trains it with weight 0)."""
        return {"sensor": np.zeros(1, np.int64), "time": np.zeros(1, np.int64),
                "readings": np.zeros((1, WINDOW), np.float32), "target": np.zeros(1, np.float32)}

    def train_step(self, model, optimizer, batch, scale: float):
        """Backpropagate ``sum of per-sample losses * scale`` and step; the batch's mean loss."""
        t = {k: torch.from_numpy(v).to(self.device) for k, v in batch.items()}
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.amp):
            forecast = model(t["sensor"], t["time"], t["readings"])
        losses = F.huber_loss(forecast.float(), t["target"], reduction="none")
        (losses.sum() * scale).backward()
        optimizer.step()
        return losses.detach().mean()
