"""Synthetic click-through samples, generated deterministically and packed as bytes.

A sample: user id, item id (categorical), 8 dense features and a 0/1 click label drawn
from a fixed logistic model, so a model trained on the stream can actually learn.
"""

from __future__ import annotations

from itertools import compress

import numpy as np

DENSE = 8
USERS, ITEMS = 10_000, 5_000
DTYPE = np.dtype([("user", "<u4"), ("item", "<u4"), ("dense", "<f4", DENSE), ("label", "u1")])
SIZE = DTYPE.itemsize  # 41 bytes, packed

_TRUE = np.random.default_rng(12345)
_W = _TRUE.normal(0, 1, DENSE)
_U = _TRUE.normal(0, 0.5, USERS)
_I = _TRUE.normal(0, 0.5, ITEMS)


def generate(n: int, seed: int) -> np.ndarray:
    """``n`` samples as a structured array (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    user = rng.zipf(1.3, n) % USERS
    item = rng.zipf(1.2, n) % ITEMS
    dense = rng.normal(0, 1, (n, DENSE)).astype(np.float32)
    logit = dense @ _W + _U[user] + _I[item] - 1.0
    label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.uint8)
    out = np.zeros(n, dtype=DTYPE)
    out["user"], out["item"], out["dense"], out["label"] = user, item, dense, label
    return out


def pack(samples: np.ndarray) -> list[bytes]:
    """One payload per sample."""
    raw = samples.tobytes()
    return [raw[i * SIZE:(i + 1) * SIZE] for i in range(len(samples))]


def unpack(payloads: list[bytes], keep: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """(structured array of valid samples, count of malformed payloads skipped); ``keep``
    (a bool mask over ``payloads``) selects the payloads to unpack first. One join for the
    whole batch, no Python work per payload when every payload has the sample size (the
    array is then a read-only view of the joined bytes)."""
    if keep is not None and not keep.all():
        payloads = list(compress(payloads, keep.tolist()))
    good = payloads if set(map(len, payloads)) <= {SIZE} else [p for p in payloads if len(p) == SIZE]
    bad = len(payloads) - len(good)
    arr = np.frombuffer(b"".join(good), dtype=DTYPE)
    ok = (arr["label"] <= 1) & np.isfinite(arr["dense"]).all(axis=1)
    if ok.all():
        return arr, bad
    return arr[ok], bad + int((~ok).sum())
