"""Replay a traffic trace into a stream, time-compressed, spread over skewed partitions.

    python -m kale_airflow.runtime.producer [--stream URL] [--steps 48] [--no-sleep] ...

fills a stream with synthetic click-through samples, one trace step's count at a time: the
embedded default's traffic for trying Kale out, and the backlog ``kale profile`` trains on
when a new embedded deployment has no traffic yet. Never point it at a production topic.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kale_airflow.core.shards import zipf_shares
from kale_airflow.core.traffic import Trace
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.stream.base import Stream


def ctr_payloads(n: int, seed: int) -> list[bytes]:
    """``n`` synthetic click-through samples, packed (the reference model's payloads)."""
    return pack(generate(n, seed))


def load_payloads(spec: str | None) -> Callable[[int, int], list[bytes]]:
    """The payload function ``module:attr`` names (a deployment's ``producer``: ``(n, seed)`` ->
    ``n`` payloads); None: :func:`ctr_payloads`."""
    if not spec:
        return ctr_payloads
    module_name, _, attr = spec.partition(":")
    try:
        found = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"producer {spec!r} cannot be loaded ({exc}); install its package here") from None
    if not callable(found):
        raise ValueError(f"producer {spec!r} is not a function (n, seed) -> list of payloads")
    return found


@dataclass
class Producer:
    """Each trace step becomes ``value * scale`` samples, written over ``step / compression``
    wall seconds, split over partitions by Zipf(``skew``) shares (seeded); ``payloads(n, seed)``
    makes them (default the synthetic click-through samples)."""

    stream: Stream
    trace: Trace
    compression: float = 60.0
    scale: float = 1.0
    skew: float = 0.8
    seed: int = 0
    start_step: int = 0
    payloads: Callable[[int, int], list[bytes]] = ctr_payloads

    def __post_init__(self):
        if self.compression <= 0 or self.scale <= 0:
            raise ValueError("compression and scale must be > 0")
        parts = self.stream.partitions()
        if not parts:
            raise ValueError("the stream has no partitions; create them first")
        self.partitions = parts
        self.shares = zipf_shares(len(parts), self.skew, self.seed)
        self._carry = np.zeros(len(parts))
        self._step = self.start_step
        self._chunk = 0

    def emit(self, count: float, now: float | None = None) -> int:
        """Write ``count`` samples spread over the partitions by their shares; returns how many."""
        want = count * self.shares + self._carry
        counts = np.floor(want).astype(int)
        self._carry = want - counts  # fractional samples carry over, so totals are exact
        written = 0
        for p, c in zip(self.partitions, counts):
            if c:
                self._chunk += 1
                self.stream.append(p, self.payloads(int(c), hash((self.seed, p, self._chunk)) & 0xFFFFFFFF), ts=now)
                written += int(c)
        return written

    def produce_step(self, now: float | None = None, slices: int = 1) -> int:
        """Write one trace step's samples (in ``slices`` equal parts); returns how many."""
        if self._step >= len(self.trace.series):
            return 0
        written = self.emit(self.trace.values[self._step] * self.scale / slices, now)
        self._slice = getattr(self, "_slice", 0) + 1
        if self._slice >= slices:
            self._slice = 0
            self._step += 1
        return written

    @property
    def step_wall_s(self) -> float:
        """Wall seconds per trace step."""
        return self.trace.step_s / self.compression

    def run(self, steps: int, sleep: bool = True, slices: int = 10, stop=None, progress=None) -> int:
        """Produce ``steps`` trace steps, each in ``slices`` parts paced in wall time (unless
        ``sleep`` is False) so arrivals are smooth within a step; ``stop`` (an Event) ends early."""
        total = 0
        start = time.monotonic()
        for i in range(steps * slices):
            if stop is not None and stop.is_set():
                break
            total += self.produce_step(slices=slices)
            if progress is not None and (i + 1) % slices == 0:
                progress.update(1)
            if sleep:
                delay = start + (i + 1) * self.step_wall_s / slices - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        return total


def build_arg_parser() -> argparse.ArgumentParser:
    """Arguments of ``python -m kale_airflow.runtime.producer``."""
    ap = argparse.ArgumentParser(
        prog="python -m kale_airflow.runtime.producer",
        description="Replay a traffic trace into a stream: each trace step's count becomes that many synthetic "
                    "click-through samples, spread over the partitions by Zipf shares. For the embedded default "
                    "(trying Kale out, giving `kale profile` a backlog); never point it at a production topic.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--stream", help="stream URL (default: the deployment's stream_url, "
                    "sqlite:///$KALE_HOME/stream.db unless kale.yaml names another)")
    ap.add_argument("--partitions", type=int, default=16,
                    help="partitions to create in an embedded stream that has none")
    ap.add_argument("--trace", help="trace CSV 'timestamp,value' (default: the bundled NYC taxi trace, 30-min steps)")
    ap.add_argument("--start-step", type=int, default=0, help="first trace step to replay")
    ap.add_argument("--steps", type=int, default=48,
                    help="trace steps to replay (48 steps of the bundled trace: one day, about 750,000 samples)")
    ap.add_argument("--compression", type=float, default=60.0, help="trace seconds per wall second")
    ap.add_argument("--scale", type=float, default=1.0, help="samples per trace count")
    ap.add_argument("--skew", type=float, default=0.8, help="Zipf exponent of the partitions' shares")
    ap.add_argument("--no-sleep", action="store_true", help="write as fast as possible instead of pacing in time")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point: replay the trace, print how many samples were written."""
    from kale_airflow.core.traffic import BUNDLED_TRACE, load_trace
    from kale_airflow.stream import open_stream

    args = build_arg_parser().parse_args(argv)
    url = args.stream
    if url is None:
        from kale_airflow.config import load_config

        url = load_config().deployment.stream_url
    stream = open_stream(url)
    if not stream.partitions() and hasattr(stream, "create_partitions"):
        stream.create_partitions(args.partitions)
    producer = Producer(stream, load_trace(args.trace or BUNDLED_TRACE), compression=args.compression,
                        scale=args.scale, skew=args.skew, start_step=args.start_step)
    written = producer.run(args.steps, sleep=not args.no_sleep)
    print(f"wrote {written:,} samples ({args.steps} trace step(s)) to {len(producer.partitions)} partition(s) of {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
