"""A second trainer, unlike the CTR model in everything the runtime must not care about: its
payloads are JSON objects (``{"x": [4 floats], "y": float}``), its model a linear regression
with SGD and momentum, its loss the squared error, and its padding a zero row. Workers load it
with ``--trainer tests.runtime.trainers:JSONRegression``."""

from __future__ import annotations

import json

import numpy as np

from kale_airflow.runtime.trainer import Decoded, TorchTrainer

FEATURES = 4
TRUE_W = np.array([1.5, -2.0, 0.5, 3.0])
TRUE_B = 0.25


def make_payloads(n: int, seed: int) -> list[bytes]:
    """``n`` JSON samples of y = x . w + b + noise (this trainer's producer)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (n, FEATURES))
    y = x @ TRUE_W + TRUE_B + rng.normal(0, 0.1, n)
    return [json.dumps({"x": [round(float(v), 6) for v in row], "y": round(float(t), 6)}).encode()
            for row, t in zip(x, y)]


class JSONRegression(TorchTrainer):
    """Linear regression on JSON samples (see the module docstring)."""

    def make(self, device, amp: bool):
        import torch

        module = torch.nn.Linear(FEATURES, 1).to(device)
        return module, torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)

    def decode(self, payloads) -> Decoded:
        rows, bad = [], 0
        for p in payloads:
            try:
                doc = json.loads(p)
                x, y = [float(v) for v in doc["x"]], float(doc["y"])
            except (ValueError, KeyError, TypeError):
                bad += 1
                continue
            if len(x) != FEATURES:
                bad += 1
                continue
            rows.append((*x, y))
        return Decoded(np.array(rows, dtype=np.float32).reshape(-1, FEATURES + 1), len(rows), bad)

    def padding(self):
        return np.zeros((1, FEATURES + 1), dtype=np.float32)

    def train_step(self, model, optimizer, batch, scale: float):
        import torch

        t = torch.from_numpy(batch).to(self.device)
        optimizer.zero_grad()
        losses = (model(t[:, :FEATURES]).squeeze(1) - t[:, FEATURES]) ** 2
        (losses.sum() * scale).backward()
        optimizer.step()
        return losses.detach().mean()
