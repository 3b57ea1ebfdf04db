"""Where Kale's view of the cluster's capacity comes from: a throughput model refitted
from what the workers measure (deployed and simulated Kale alike), or a fixed table (the
clairvoyant reference's true cluster)."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from kale_airflow.core.throughput import ThroughputModel, ThroughputModelError, guarded, peak_cut


MIN_OBSERVED = 4  # measurements before a worker count's mean counts for the peak guard


class OnlineThroughput:  # pragma: no mutate block
    """Keeps (workers, samples/s) observations and refits a :class:`ThroughputModel`."""

    def __init__(self, workers, rates, *, max_workers: int, refit_every_s: float = 6 * 3600.0, per_count: int = 240):
        self.max_workers = max_workers
        self.refit_every_s = refit_every_s
        self._obs: dict[int, deque] = {}
        for n, r in zip(workers, rates):
            self._obs.setdefault(int(n), deque(maxlen=per_count)).append(float(r))
        self._per_count = per_count
        self._fitted_at = float("-inf")
        self.model: ThroughputModel | None = None
        self.table: list[float] | None = None
        self.cut: int | None = None
        self.error = ""
        self._refit(0.0)

    def _refit(self, now_s: float) -> None:
        n = [k for k, v in self._obs.items() for _ in v]
        r = [x for v in self._obs.values() for x in v]
        try:
            self.model = ThroughputModel.fit(n, r)
        except ThroughputModelError as exc:
            self.error = str(exc)  # keep the previous model, if any
        else:
            # Size on the conservative bound, but never past the count where the fitted mean
            # curve (or what was measured) stops rising: a throughput peak is a wall.
            mean = np.concatenate([[0.0], self.model.predict(np.arange(1, self.max_workers + 1))])
            observed = {k: (float(np.mean(v)), float(np.std(v) / math.sqrt(len(v))))
                        for k, v in self._obs.items() if len(v) >= MIN_OBSERVED}
            self.cut = peak_cut(mean, observed)
            self.table = guarded(self.model.capacity_table(self.max_workers), self.cut)
        self._fitted_at = now_s

    def observe(self, now_s: float, workers: int, rate: float | None) -> None:
        """Record one measurement; refit at most every ``refit_every_s`` or on a new count."""
        if rate is None or rate <= 0 or workers < 1:
            return
        new_count = workers not in self._obs
        seen = self._obs.setdefault(workers, deque(maxlen=self._per_count))
        seen.append(rate)
        # Refit on a new count, once it has enough measurements to count as observed (the
        # peak guard compares measured means), and every refit_every_s.
        if new_count or len(seen) == MIN_OBSERVED or now_s - self._fitted_at >= self.refit_every_s:
            self._refit(now_s)


class KnownCapacity:  # pragma: no mutate block
    """A fixed capacity table (the oracle's true cluster model)."""

    def __init__(self, table: np.ndarray):
        self.table = guarded(table)

    def observe(self, now_s: float, workers: int, rate: float | None) -> None:
        """Nothing to learn."""
