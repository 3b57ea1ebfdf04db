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
    """Keeps (workers, samples/s) observations and refits a :class:`ThroughputModel`.

    ``table`` is the capacity Kale plans with (index = workers): the measured mean where a
    count was measured (``MIN_OBSERVED`` times or more), the model's conservative bound
    elsewhere, cut where the fitted or measured curve stops rising (:func:`peak_cut`), made
    monotone. ``model`` (e.g. the registry's champion, fitted on these observations) is the
    first fit instead of fitting at start; later refits use the observations. With one
    measured count only, the table assumes linear scaling from it and ``assumption`` says
    so (every decision repeats it); with none, ``table`` is None and ``error`` says what to do.
    """

    def __init__(self, workers, rates, *, max_workers: int, refit_every_s: float = 6 * 3600.0, per_count: int = 240,
                 model: ThroughputModel | None = None):
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
        self.assumption = ""
        self._refit(0.0, model)

    def _refit(self, now_s: float, model: ThroughputModel | None = None) -> None:
        self._fitted_at = now_s
        if len(self._obs) < 2 and model is None:
            self._linear()
            return
        n = [k for k, v in self._obs.items() for _ in v]
        r = [x for v in self._obs.values() for x in v]
        try:
            self.model = model or ThroughputModel.fit(n, r)
        except ThroughputModelError as exc:
            self.error = str(exc)  # keep the previous model, if any
            return
        self.assumption = ""
        # Size on the conservative bound, but never past the count where the fitted mean
        # curve (or what was measured) stops rising: a throughput peak is a wall.
        mean = np.concatenate([[0.0], self.model.predict(np.arange(1, self.max_workers + 1))])
        observed = {k: (float(np.mean(v)), float(np.std(v) / math.sqrt(len(v))))
                    for k, v in self._obs.items() if len(v) >= MIN_OBSERVED}
        self.cut = peak_cut(mean, observed)
        table = self.model.capacity_table(self.max_workers)
        for k, (m, _) in observed.items():  # what was measured, where it was measured
            if k <= self.max_workers:
                table[k] = m
        self.table = guarded(table, self.cut)

    def _linear(self) -> None:
        """Fewer than two measured counts: no curve can be identified."""
        if not self._obs:
            self.table, self.error = None, "no throughput measured yet: run `kale profile` or start a worker"
            return
        (k, seen), = self._obs.items()
        mean = float(np.mean(seen))
        self.table = [mean / k * i for i in range(self.max_workers + 1)]
        self.cut = self.max_workers
        self.assumption = (f"only {k} worker(s) measured ({mean:.0f} samples/s): assuming linear scaling until "
                           "another count is measured (`kale profile`)")

    def observe(self, now_s: float, workers: int, rate: float | None) -> None:
        """Record one measurement; refit at most every ``refit_every_s`` or on a new count."""
        if rate is None or rate <= 0 or workers < 1:
            return
        seen = self._obs.get(workers)
        new_count = seen is None
        if new_count:
            seen = self._obs[workers] = deque(maxlen=self._per_count)
        seen.append(rate)
        # Refit on a new count, once it has enough measurements to count as observed (the
        # peak guard compares measured means), and every refit_every_s.
        if new_count or len(seen) == MIN_OBSERVED or now_s - self._fitted_at >= self.refit_every_s:
            self._refit(now_s)


class KnownCapacity:  # pragma: no mutate block
    """A fixed capacity table (the oracle's true cluster model)."""

    error = ""
    assumption = ""

    def __init__(self, table: np.ndarray):
        self.table = guarded(table)

    def observe(self, now_s: float, workers: int, rate: float | None) -> None:
        """Nothing to learn."""
