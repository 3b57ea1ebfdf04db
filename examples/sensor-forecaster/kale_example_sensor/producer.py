"""Synthetic sensor readings, and a command that writes them to the deployment's stream.

:func:`make_payloads` is the deployment's ``producer`` (``kale demo`` and tests call it as
``make_payloads(n, seed)``). Each of ``SENSORS`` sensors follows its own daily temperature
curve plus noise; a sample is one sensor's last hour of readings and the next reading.

    python -m kale_example_sensor.producer --config kale.yaml --samples 20000 --rate 500

appends to the stream that ``kale.yaml`` names (``stream_url``; by default the embedded
stream ``$KALE_HOME/stream.db``, whose partitions it creates when there are none). In
production your devices, not this command, write to the topic.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from kale_example_sensor.wire import SENSORS, STEP_S, WINDOW, encode

DAY_S = 86_400
START = 1_700_000_000  # the first target time (unix seconds)
NOISE = 0.2  # degrees of measurement noise per reading

_SITE = np.random.default_rng(2024)  # fixed: the same sensors for every producer
BASE = _SITE.uniform(15.0, 25.0, SENSORS)
SWING = _SITE.uniform(2.0, 6.0, SENSORS)
PHASE = _SITE.uniform(0.0, 2 * np.pi, SENSORS)


def temperature(sensor: np.ndarray, t: np.ndarray) -> np.ndarray:
    """A sensor's noise-free temperature at unix time ``t``."""
    return BASE[sensor] + SWING[sensor] * np.sin(2 * np.pi * t / DAY_S + PHASE[sensor])


def make_payloads(n: int, seed: int) -> list[bytes]:
    """``n`` samples (deterministic for a ``seed``) at random sensors and times in a week."""
    rng = np.random.default_rng(seed)
    sensor = rng.integers(0, SENSORS, n)
    target_t = START + rng.integers(0, 7 * DAY_S // STEP_S, n) * STEP_S
    times = target_t[:, None] - STEP_S * np.arange(WINDOW, -1, -1)  # oldest reading .. target
    values = temperature(sensor[:, None], times) + rng.normal(0.0, NOISE, times.shape)
    return [encode(int(s), int(t), v[:-1], v[-1]) for s, t, v in zip(sensor, target_t, values)]


def main(argv: list[str] | None = None) -> int:
    """Append ``--samples`` samples, spread evenly over the partitions, at ``--rate`` per second."""
    ap = argparse.ArgumentParser(prog="python -m kale_example_sensor.producer", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--config", help="the deployment's kale.yaml (default: $KALE_CONFIG, else $KALE_HOME/kale.yaml)")
    ap.add_argument("--samples", type=int, default=20_000, help="samples to write")
    ap.add_argument("--rate", type=float, default=500.0, help="samples per second (0: all at once)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (each second's chunk takes the next)")
    args = ap.parse_args(argv)
    if args.config:
        os.environ["KALE_CONFIG"] = str(Path(args.config).resolve())
    from kale_airflow.config import load_config
    from kale_airflow.stream import open_stream

    deployment = load_config().deployment
    stream = open_stream(deployment.stream_url)
    if not stream.partitions() and hasattr(stream, "create_partitions"):
        stream.create_partitions(deployment.partitions or 16)
    partitions = stream.partitions()
    chunk = int(args.rate) or args.samples
    written, seed, start = 0, args.seed, time.monotonic()
    while written < args.samples:
        payloads = make_payloads(min(chunk, args.samples - written), seed)
        for i, p in enumerate(partitions):
            if payloads[i::len(partitions)]:
                stream.append(p, payloads[i::len(partitions)])
        written, seed = written + len(payloads), seed + 1
        if args.rate:
            time.sleep(max(0.0, start + written / args.rate - time.monotonic()))
    print(f"wrote {written:,} sensor samples to {len(partitions)} partition(s) of {deployment.stream_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
