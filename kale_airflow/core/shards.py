"""Partitions in the simulator: skewed partition rates, per-partition backlog, per-worker capacity.

With ``shards`` enabled, arrivals are spread over ``partitions`` partitions with Zipf(s)
rate shares (seeded), and each of the n workers trains at ``c(n) / n`` on the partitions
(or slices) it is assigned. A worker cannot take over another's samples, so an
overloaded worker builds backlog on its partitions while others idle: the effect
data shuffling removes. Backlog is kept per partition and moves with the partition when
the assignment changes (at a rescale). A slice with share s of partition p consumes the
fraction s of p's samples.

Freshness here is approximated per partition as ``backlog / arrival rate`` (the age of the
oldest sample if the rate was steady); the reported value is the maximum over partitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kale_airflow.core.rebalance import Assignment, assign


def zipf_shares(partitions: int, s: float, seed: int) -> np.ndarray:
    """Rate share of each partition: Zipf(s) over ranks, ranks shuffled (seeded)."""
    w = 1.0 / np.arange(1, partitions + 1) ** s
    rng = np.random.default_rng(seed)
    return rng.permutation(w / w.sum())


def round_robin(partitions: int, n: int) -> np.ndarray:
    """Partition p to worker p mod n (even partition counts, blind to rates)."""
    m = np.zeros((n, partitions))
    m[np.arange(partitions) % n, np.arange(partitions)] = 1.0
    return m


@dataclass
class ShardModel:
    """Per-partition state for one simulation run."""

    shares: np.ndarray          # rate share per partition, sums to 1
    strategy: str = "rebalance"  # or "round_robin"

    def __post_init__(self):
        if self.strategy not in ("rebalance", "round_robin"):
            raise ValueError(f"strategy must be 'rebalance' or 'round_robin', got {self.strategy!r}")
        self.backlog = np.zeros(len(self.shares))
        self._n = None
        self._matrix = None
        self._previous: Assignment | None = None

    def matrix(self, n: int) -> np.ndarray:
        """Shares matrix (workers x partitions) for n workers; recomputed on a change of n."""
        if n != self._n:
            if self.strategy == "round_robin":
                self._matrix = round_robin(len(self.shares), n)
            else:
                rates = {str(p): float(r) for p, r in enumerate(self.shares)}
                self._previous = assign(rates, n, self._previous)
                m = np.zeros((n, len(self.shares)))
                for w, items in self._previous.workers.items():
                    for p, s in items:
                        m[w, int(p)] = s
                self._matrix = m
            self._n = n
        return self._matrix

    def step(self, arrivals: float, capacity: float, n: int, tick_s: float) -> tuple[float, float, float]:
        """One tick: returns (processed, total backlog, freshness estimate in s)."""
        m = self.matrix(n)
        a = arrivals * self.shares
        pending = self.backlog + a
        demand = m @ pending
        per_worker = capacity / n
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(demand > 0, np.minimum(1.0, per_worker / demand), 1.0)
        served = m.T @ frac  # fraction of each partition's pending samples processed
        self.backlog = pending * (1.0 - served)
        self.backlog[self.backlog < 1e-9] = 0.0
        processed = float(pending.sum() - self.backlog.sum())
        rate = a / tick_s
        with np.errstate(divide="ignore", invalid="ignore"):
            age = np.where(self.backlog > 0, self.backlog / np.maximum(rate, 1e-12), 0.0)
        return processed, float(self.backlog.sum()), float(age.max())
