"""The payload format: one sample per stream record, packed little-endian with ``struct``::

    version u8 | sensor u16 | time u32 (unix seconds of the target) | WINDOW x f32 readings | f32 target

59 bytes. The readings are the sensor's last ``WINDOW`` values, one every ``STEP_S``
seconds; the target is the next one. The version byte lets a producer change the format
later without the trainer misreading old records.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

VERSION = 1
WINDOW = 12  # readings per sample: one hour at one reading every five minutes
STEP_S = 300
SENSORS = 64  # sensor ids are 0 .. SENSORS - 1
RECORD = struct.Struct(f"<BHI{WINDOW}ff")


def encode(sensor: int, time: int, readings: Sequence[float], target: float) -> bytes:
    """One payload."""
    return RECORD.pack(VERSION, sensor, time, *readings, target)


def decode(payloads: Sequence[bytes]) -> tuple[dict[str, np.ndarray], int]:
    """The valid payloads as arrays (``sensor``, ``time``, ``readings`` of shape (n, WINDOW),
    ``target``) and how many were malformed: wrong size, unknown version, unknown sensor or a
    value that is not finite."""
    rows, bad = [], 0
    for p in payloads:
        if len(p) != RECORD.size:
            bad += 1
            continue
        version, sensor, time, *values = RECORD.unpack(p)
        if version != VERSION or sensor >= SENSORS or not np.isfinite(values).all():
            bad += 1
            continue
        rows.append((sensor, time, values))
    return {
        "sensor": np.array([r[0] for r in rows], dtype=np.int64),
        "time": np.array([r[1] for r in rows], dtype=np.int64),
        "readings": np.array([r[2][:WINDOW] for r in rows], dtype=np.float32).reshape(-1, WINDOW),
        "target": np.array([r[2][WINDOW] for r in rows], dtype=np.float32),
    }, bad
