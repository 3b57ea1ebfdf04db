"""Throughput models: samples/s as a function of the number of GPU workers.

:class:`ThroughputModel` is what Kale *fits* from observed (workers, samples/s)
pairs (the simulator's true cluster is :mod:`kale_airflow.core.cluster`). Following
Ernest (Venkataraman et al., NSDI '16) it models the time per sample as a non-negative
combination of features of n, fitted by non-negative least squares on relative error::

    1 / c(n) = t0 + t1 / n + t2 * log(n) + t3 * n

``t1 / n`` is the parallel part, ``t0`` the serial part, ``log n`` tree-style
communication and ``n`` all-to-all communication. Non-negativity keeps every term
physical, so the fitted curve has diminishing returns by construction.

With few distinct worker counts the features are used in that order (documented
fallback): 2 distinct counts fit ``[1/n, 1]`` (Amdahl), 3 add ``log n``, 4 or more
use all four. A single distinct count cannot identify scaling and is an error.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from kale_airflow.core.errors import KaleError

FEATURE_NAMES = ("inv_n", "serial", "log_n", "linear_n")
# Relative residual std assumed when the fit has no degrees of freedom left.
FALLBACK_REL_STD = 0.10


class ThroughputModelError(KaleError, ValueError):
    """Observations cannot identify a throughput curve; the message says what is missing."""


def _features(n: np.ndarray, k: int) -> np.ndarray:
    n = np.asarray(n, dtype=float)
    cols = [1.0 / n, np.ones_like(n), np.log(n), n]
    return np.stack(cols[:k], axis=-1)


@dataclass(frozen=True)
class ThroughputModel:
    """A fitted resource -> throughput model with an uncertainty margin.

    ``capacity_lower(n)`` is the one-sided confidence bound (``z`` standard errors) on
    the mean throughput of n workers; it widens away from the observed worker counts,
    so extrapolating to unseen sizes is done cautiously.
    """

    coef: tuple[float, ...]
    cov: tuple[tuple[float, ...], ...]
    rel_std: float
    n_obs: int
    worker_counts: tuple[int, ...]
    z: float = 1.645

    @classmethod
    def fit(cls, workers, rates, *, z: float = 1.645) -> "ThroughputModel":
        """Fit from observations: ``workers[i]`` workers measured ``rates[i]`` samples/s."""
        n = np.asarray(workers, dtype=float).ravel()
        r = np.asarray(rates, dtype=float).ravel()
        if n.shape != r.shape:
            raise ThroughputModelError(f"workers and rates differ in length ({n.size} vs {r.size})")
        ok = np.isfinite(n) & np.isfinite(r)
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise ThroughputModelError(f"observation {bad} is NaN or infinite; drop it before fitting")
        if (n < 1).any() or (n != np.round(n)).any():
            raise ThroughputModelError("worker counts must be whole numbers >= 1")
        if (r <= 0).any():
            bad = int(np.flatnonzero(r <= 0)[0])
            raise ThroughputModelError(
                f"observation {bad} has throughput {r[bad]} <= 0; a running worker set must report > 0 samples/s"
            )
        counts = tuple(sorted(int(v) for v in np.unique(n)))
        if len(counts) < 2:
            raise ThroughputModelError(
                f"observations cover only {len(counts)} distinct worker count(s) {list(counts)}; "
                "at least 2 are needed to identify scaling (profile another worker count)"
            )
        k = min(len(FEATURE_NAMES), len(counts))
        y = 1.0 / r  # seconds per sample
        x = _features(n, k)
        # Weight rows by 1/y so residuals are relative errors (noise is multiplicative).
        xw, yw = x / y[:, None], np.ones_like(y)
        from scipy.optimize import nnls  # here: scipy.optimize costs every DAG parse half a second

        coef, _ = nnls(xw, yw)
        resid = xw @ coef - yw
        dof = n.size - int(np.count_nonzero(coef))
        rel_std = float(np.sqrt(resid @ resid / dof)) if dof > 0 else FALLBACK_REL_STD
        active = coef > 0
        cov = np.zeros((k, k))
        if active.any():
            xa = xw[:, active]
            cov_a = np.linalg.pinv(xa.T @ xa) * rel_std**2
            cov[np.ix_(active, active)] = cov_a
        coef_full = tuple(float(c) for c in coef) + (0.0,) * (len(FEATURE_NAMES) - k)
        cov_full = np.zeros((len(FEATURE_NAMES),) * 2)
        cov_full[:k, :k] = cov
        return cls(
            coef=coef_full,
            cov=tuple(tuple(float(v) for v in row) for row in cov_full),
            rel_std=rel_std,
            n_obs=int(n.size),
            worker_counts=counts,
            z=z,
        )

    def _time_per_sample(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = _features(n, len(FEATURE_NAMES))
        mean = x @ np.asarray(self.coef)
        var = np.einsum("...i,ij,...j->...", x, np.asarray(self.cov), x)
        return mean, np.sqrt(np.maximum(var, 0.0))

    def predict(self, n) -> np.ndarray:
        """Mean samples/s for worker count(s) n."""
        mean, _ = self._time_per_sample(np.atleast_1d(n))
        return 1.0 / mean

    def capacity_lower(self, n) -> np.ndarray:
        """Conservative samples/s: time per sample raised by ``z`` standard errors of its mean."""
        mean, se = self._time_per_sample(np.atleast_1d(n))
        return 1.0 / (mean + self.z * se)

    def capacity_table(self, max_workers: int) -> np.ndarray:
        """``table[n]`` = conservative capacity of n workers, n = 0..max_workers."""
        return np.concatenate([[0.0], self.capacity_lower(np.arange(1, max_workers + 1))])

    def workers_for(self, rate: float, max_workers: int) -> int:
        """Fewest workers whose conservative capacity covers ``rate``; ``max_workers`` if none does."""
        return workers_for_rate(monotone(self.capacity_table(max_workers)), rate)

    def saturation_workers(self, max_workers: int, min_gain: float = 0.05) -> int | None:
        """First n where adding a worker gains less than ``min_gain`` of one worker's
        throughput, or where throughput peaks; None if scaling stays useful up to max."""
        c = self.predict(np.arange(1, max_workers + 2))
        gain = np.diff(c) / c[0]
        below = np.flatnonzero(gain < min_gain)
        return int(below[0]) + 1 if below.size else None

    def to_dict(self) -> dict:
        """JSON-friendly parameters (for MLflow and state stores)."""
        return {
            "features": list(FEATURE_NAMES),
            "coef": list(self.coef),
            "cov": [list(r) for r in self.cov],
            "rel_std": self.rel_std,
            "n_obs": self.n_obs,
            "worker_counts": list(self.worker_counts),
            "z": self.z,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ThroughputModel":
        """Inverse of :meth:`to_dict`."""
        return cls(
            coef=tuple(d["coef"]),
            cov=tuple(tuple(r) for r in d["cov"]),
            rel_std=float(d["rel_std"]),
            n_obs=int(d["n_obs"]),
            worker_counts=tuple(d["worker_counts"]),
            z=float(d.get("z", 1.645)),
        )


def workers_for_rate(capacity_table, rate: float) -> int:
    """Fewest n >= 1 with ``capacity_table[n] >= rate``; the last index if none does.

    ``capacity_table`` (a list or array, index = workers) must be non-decreasing from
    index 1 on; a saturating curve is made monotone first (see ``monotone``).
    """
    idx = bisect_left(capacity_table, rate, 1)
    return min(idx, len(capacity_table) - 1)


def peak_cut(mean_table, observed: dict | None = None, min_gain: float = 0.02) -> int:
    """The largest worker count worth running: the peak of the mean curve ``mean_table``
    (index = workers), or earlier the first count whose marginal gain falls below
    ``min_gain`` of the one-worker throughput (extra workers there buy nothing); with
    ``observed`` (per worker count, the mean measured samples/s or ``(mean, standard
    error)``) also what was measured, whatever the fit says: the smallest measured count
    that a larger one beat by less than ``min_gain`` per extra worker with 95 % confidence
    (:func:`plateau_start`). That covers a curve that is flat (a hard ceiling, which a
    smooth fit bends through) and one that falls (a larger count that did worse)."""
    t = np.asarray(mean_table, dtype=float)
    if t.size <= 2:
        return 1
    body = t[1:]
    cut = int(np.argmax(body)) + 1
    gain = np.diff(body) / max(body[0], 1e-12)
    flat = np.flatnonzero(gain < min_gain)
    if flat.size:
        cut = min(cut, int(flat[0]) + 1)
    if observed:
        counts = sorted(c for c in observed if 1 <= c < t.size)
        if counts:
            stats = [observed[c] if isinstance(observed[c], tuple) else (observed[c], 0.0) for c in counts]
            means = np.asarray([m for m, _ in stats])
            ses = np.asarray([e for _, e in stats])
            cut = min(cut, plateau_start(np.asarray(counts), means, ses, min_gain * body[0]) or cut)
    return cut


def plateau_start(counts: np.ndarray, means: np.ndarray, ses: np.ndarray, per_worker: float) -> int | None:
    """The smallest measured count ``counts[i]`` that some larger measured count beat by
    less than ``per_worker`` samples/s per extra worker at the upper 95 % bound of the
    difference (two standard errors), while no larger measured count beat it by more at the
    lower bound; None when there is none. The second condition matters on a curve that
    peaks between measured counts: the far side of the peak can match a count below it,
    while the counts in between clearly pay for themselves."""
    diff = means[None, :] - means[:, None]  # [i, j]: mean of counts[j] minus that of counts[i]
    spread = 2 * np.sqrt(ses[:, None] ** 2 + ses[None, :] ** 2)
    extra = counts[None, :] - counts[:, None]
    larger = extra > 0
    flat = larger & (diff + spread < per_worker * extra)
    pays = larger & (diff - spread >= per_worker * extra)
    rows = np.flatnonzero(flat.any(axis=1) & ~pays.any(axis=1))
    return int(counts[rows[0]]) if rows.size else None


def guarded(capacity_table, cut: int | None = None) -> list[float]:
    """``capacity_table`` up to worker count ``cut`` (default: its own peak), made monotone:
    ``workers_for_rate`` on it answers at most ``cut``, so a policy never scales into the
    region where throughput stops rising or falls."""
    t = np.asarray(capacity_table, dtype=float)
    if cut is None:
        cut = peak_cut(t, min_gain=0.0)
    return monotone(t[: max(1, cut) + 1])


def monotone(capacity_table: np.ndarray) -> list[float]:
    """Running maximum as a list: more workers never count as less capacity (past
    saturation, extra workers are not worth it, which ``workers_for_rate`` then avoids)."""
    return np.maximum.accumulate(capacity_table).tolist()
