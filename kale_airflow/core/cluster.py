"""The simulator's ground truth: how many samples/s n GPU workers really process.

Policies never read it (the clairvoyant reference and the offline optimum do, by
definition); Kale fits its own :class:`~kale_airflow.core.throughput.ThroughputModel`
from what the workers measure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CLUSTER_KINDS = ("amdahl", "saturating", "comm")


@dataclass(frozen=True)
class ClusterModel:
    """True throughput of n workers (samples/s), one of three families (``kind``):

    - ``amdahl`` (default): ``c(n) = per_worker * n / (1 + serial_fraction * (n - 1))``;
      1,000 samples/s per worker and a 1 % serial fraction give 24,427 samples/s at 32
      workers (76 % efficiency) and 39,264 at 64 (61 %). Exactly Kale's model family.
    - ``saturating``: the Amdahl curve under a hard ceiling ``ceiling`` (a shared
      parameter server): ``min(amdahl(n), ceiling)``; 28,000 samples/s is reached at 39
      workers, and more workers add nothing. Outside Kale's family (a kink).
    - ``comm``: Amdahl plus an all-reduce cost growing with n^2 in the time per sample,
      ``1 / c(n) = (1 - s) / (p n) + s / p + comm_quadratic * n^2``; with the default
      coefficient throughput peaks at 48 workers (24,427 samples/s) and falls beyond
      (22,830 at 64). Outside Kale's family (no n^2 feature).

    ``noise_sd`` is the standard deviation of the per-tick multiplicative noise.
    """

    per_worker: float = 1000.0
    serial_fraction: float = 0.01
    noise_sd: float = 0.03
    kind: str = "amdahl"
    ceiling: float = 28_000.0
    comm_quadratic: float = 4.476e-9

    def __post_init__(self) -> None:
        if self.per_worker <= 0:
            raise ValueError(f"per_worker must be > 0, got {self.per_worker}")
        if not 0 <= self.serial_fraction < 1:
            raise ValueError(f"serial_fraction must be in [0, 1), got {self.serial_fraction}")
        if self.noise_sd < 0:
            raise ValueError(f"noise_sd must be >= 0, got {self.noise_sd}")
        if self.kind not in CLUSTER_KINDS:
            raise ValueError(f"unknown cluster kind {self.kind!r}; choose from {', '.join(CLUSTER_KINDS)}")
        if self.ceiling <= 0 or self.comm_quadratic < 0:
            raise ValueError("ceiling must be > 0 and comm_quadratic >= 0")

    @classmethod
    def fitted(cls, workers, rates) -> "ClusterModel":
        """The ``amdahl`` cluster closest to measured throughput (``workers[i]`` workers,
        ``rates[i]`` samples/s): ``1 / c(n) = a / n + b`` by non-negative least squares on
        relative error, so ``per_worker = 1 / (a + b)`` and ``serial_fraction = b / (a + b)``,
        with the measurements' relative spread around it as ``noise_sd``. A real job's
        truth for a simulation of its own deployment (``kale demo``'s prediction)."""
        from scipy.optimize import nnls

        n = np.asarray(workers, dtype=float)
        r = np.asarray(rates, dtype=float)
        if n.size != r.size or np.unique(n).size < 2 or (r <= 0).any() or (n < 1).any():
            raise ValueError("fitting a cluster needs positive throughput measured at 2 or more worker counts")
        x = np.stack([1.0 / n, np.ones_like(n)], axis=1) * r[:, None]  # relative error: rows over 1 / r
        (a, b), _ = nnls(x, np.ones_like(n))
        if a + b <= 0:
            raise ValueError("the measurements fit no positive throughput")
        fit = cls(per_worker=1.0 / (a + b), serial_fraction=b / (a + b), noise_sd=0.0)
        return cls(per_worker=fit.per_worker, serial_fraction=fit.serial_fraction,
                   noise_sd=float(np.std(r / fit.capacity(n) - 1.0)))

    def capacity(self, n):
        """Mean samples/s of n workers (n may be fractional or an array)."""
        p, s = self.per_worker, self.serial_fraction
        amdahl = p * n / (1.0 + s * (n - 1.0))
        if self.kind == "saturating":
            return np.minimum(amdahl, self.ceiling) if isinstance(n, np.ndarray) else min(amdahl, self.ceiling)
        if self.kind == "comm":
            return 1.0 / (1.0 / amdahl + self.comm_quadratic * n * n)
        return amdahl

    def peak_workers(self, max_workers: int) -> int:
        """Fewest whole workers (<= max_workers) reaching the highest mean throughput."""
        table = self.capacity_table(max_workers)
        return int(np.argmax(table[1:] >= table[1:].max() * (1 - 1e-12))) + 1

    def workers_for_fractional(self, rate: np.ndarray | float, max_workers: int = 64) -> np.ndarray:
        """Exact (fractional) workers whose mean capacity equals ``rate``; inf if no count up
        to the curve's peak (within ``max_workers``) reaches it."""
        r = np.asarray(rate, dtype=float)
        if self.kind == "amdahl":
            s, p = self.serial_fraction, self.per_worker
            denom = p - s * r
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(denom > 0, r * (1.0 - s) / denom, np.inf)
        peak = self.peak_workers(max_workers)
        grid = np.linspace(1e-6, peak, int(peak * 200) + 1)
        cap = self.capacity(grid)
        n = np.interp(r, cap, grid)
        return np.where(r <= cap[-1] * (1 + 1e-12), n, np.inf)

    def workers_for(self, rate: float, max_workers: int) -> int:
        """Fewest whole workers whose mean capacity covers ``rate``; the peak count (never a
        count where throughput falls) if none does."""
        table = self.capacity_table(max_workers)
        idx = np.flatnonzero(table[1:] >= rate - 1e-9)
        if idx.size == 0:
            return self.peak_workers(max_workers)
        return int(idx[0]) + 1

    def capacity_table(self, max_workers: int) -> np.ndarray:
        """``table[n]`` = mean capacity of n workers, n = 0..max_workers (lower bound = mean)."""
        n = np.arange(max_workers + 1, dtype=float)
        return np.concatenate([[0.0], self.capacity(n[1:])])


def cluster_preset(kind: str) -> tuple[ClusterModel, tuple[int, ...], float | None]:
    """(true cluster, profiled worker counts, profiling noise sd or None for the cluster's)
    for ``kale simulate --cluster``. The default Amdahl cluster is profiled at 1-64
    workers with the per-tick noise; the misspecified ones only at 1-16 workers with 5 %
    noise, so Kale must extrapolate a curve outside its family."""
    if kind == "amdahl":
        return ClusterModel(), (1, 2, 4, 8, 16, 32, 64), None
    if kind in CLUSTER_KINDS:
        return ClusterModel(kind=kind), (1, 2, 4, 8, 16), 0.05
    raise ValueError(f"unknown cluster {kind!r}; choose from {', '.join(CLUSTER_KINDS)}")
