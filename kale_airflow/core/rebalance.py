"""Data shuffling: assign stream partitions (with uneven rates) to workers.

``assign(rates, n_workers, previous=None, options)`` returns an :class:`Assignment`:
worker -> list of (partition, share), where shares of one partition add up to 1. A
share below 1 is a *slice*: the worker consumes that fraction of the partition's samples
(sample interleaving by offset, see the runtime).

With splitting (the default) the result is perfectly balanced and moves the least rate
possible: every worker keeps what it had up to the fair share ``total / n``, only the
excess of overloaded workers (and the partitions of removed workers, and new partitions)
moves, and it is water-filled into the spare room of the others, splitting at most one
piece per fill. Whole partitions are preferred over slices when they fit.

Without splitting the problem is makespan scheduling (NP-hard): we take the better of
longest-processing-time greedy (LPT, relabelled to keep as much of ``previous`` in place
as possible) and a sticky local search from ``previous``; neither is ever worse than LPT.

Lower bounds reported next to the results: imbalance >= max(1, largest partition /
mean load) without splitting, 1 with it; moved rate >= the excess over the fair share
of the workers that stay plus everything on workers that go (plus new partitions).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from kale_airflow.core.errors import KaleError

EPS = 1e-12


class RebalanceError(KaleError, ValueError):
    """Bad input to the rebalancer; the message names the partition or the field."""


@dataclass(frozen=True)
class RebalanceOptions:
    """``split``: allow slicing partitions; ``min_slice``: smallest share worth creating."""

    split: bool = True
    min_slice: float = 1e-3


@dataclass
class Assignment:
    """Worker -> [(partition, share)], with quality figures."""

    workers: dict[int, list[tuple[str, float]]]
    rates: dict[str, float]
    moved_rate: float = 0.0
    moved_lower_bound: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def n_workers(self) -> int:
        """Number of workers."""
        return len(self.workers)

    def loads(self) -> np.ndarray:
        """Samples/s per worker."""
        return np.array([sum(self.rates[p] * s for p, s in self.workers[w]) for w in sorted(self.workers)])

    @property
    def total_rate(self) -> float:
        """Sum of all partition rates."""
        return float(sum(self.rates.values()))

    @property
    def imbalance(self) -> float:
        """Most loaded worker over the mean load (1.0 is perfect)."""
        loads = self.loads()
        mean = loads.mean() if len(loads) else 0.0
        return float(loads.max() / mean) if mean > 0 else 1.0

    def imbalance_lower_bound(self, split: bool) -> float:
        """No assignment can do better than this."""
        total = self.total_rate
        if split or total <= 0:
            return 1.0
        return max(1.0, max(self.rates.values()) * self.n_workers / total)

    @property
    def moved_fraction(self) -> float:
        """Moved rate over total rate."""
        total = self.total_rate
        return self.moved_rate / total if total > 0 else 0.0

    def to_dict(self, split: bool = True) -> dict:
        """The JSON document of ``kale rebalance``."""
        return {
            "assignment": {str(w): [[p, round(s, 9)] for p, s in self.workers[w]] for w in sorted(self.workers)},
            "imbalance": self.imbalance,
            "imbalance_lower_bound": self.imbalance_lower_bound(split),
            "moved_fraction": self.moved_fraction,
            "moved_fraction_lower_bound": self.moved_lower_bound / self.total_rate if self.total_rate > 0 else 0.0,
            "loads": self.loads().tolist(),
            "notes": self.notes,
        }

    @staticmethod
    def from_dict(doc: Mapping, rates: Mapping[str, float]) -> "Assignment":
        """Rebuild from ``to_dict()['assignment']`` (or the whole document)."""
        raw = doc.get("assignment", doc)
        workers = {int(w): [(str(p), float(s)) for p, s in items] for w, items in raw.items()}
        return Assignment(workers, dict(rates))


def _check_rates(rates) -> dict[str, float]:
    items = list(rates.items()) if isinstance(rates, Mapping) else list(rates)
    out: dict[str, float] = {}
    for pid, rate in items:
        pid = str(pid)
        if pid in out:
            raise RebalanceError(f"partition {pid!r} appears twice; ids must be unique")
        try:
            r = float(rate)
        except (TypeError, ValueError):
            raise RebalanceError(f"partition {pid!r}: rate {rate!r} is not a number") from None
        if not math.isfinite(r):
            raise RebalanceError(f"partition {pid!r}: rate is {r}; drop it or give it a finite rate")
        if r < 0:
            raise RebalanceError(f"partition {pid!r}: rate {r} is negative; rates are samples/s >= 0")
        out[pid] = r
    if not out:
        raise RebalanceError("no partitions to assign")
    return dict(sorted(out.items()))  # a canonical order makes results independent of input order


def _carry_over(previous: Assignment | None, rates: dict[str, float], n: int):
    """Previous shares of surviving partitions on surviving workers, plus what must move."""
    kept: list[dict[str, float]] = [dict() for _ in range(n)]
    pool: dict[str, float] = {}  # partition -> share that needs a (new) home
    removed_rate = 0.0
    placed = {p: 0.0 for p in rates}
    if previous is not None:
        for w, items in previous.workers.items():
            for p, s in items:
                if p not in rates:
                    continue
                if w < n:
                    kept[w][p] = kept[w].get(p, 0.0) + s
                    placed[p] += s
                else:
                    removed_rate += rates[p] * s
    for p, s in placed.items():
        if s < 1 - 1e-9:
            pool[p] = pool.get(p, 0.0) + (1.0 - s)
        elif s > 1 + 1e-9:
            raise RebalanceError(f"previous assignment gives partition {p!r} {s:.3f} shares; it must total 1")
    return kept, pool, removed_rate


def _assign_split(rates, n, previous, opts: RebalanceOptions) -> Assignment:
    total = sum(rates.values())
    fair = total / n
    tol = EPS * total  # relative: rates may be tiny or huge
    kept, pool, removed_rate = _carry_over(previous, rates, n)
    must_move = removed_rate  # new partitions are placed, not moved
    # Shed the excess above the fair share, whole partitions first (largest that fits), then one slice.
    moved = removed_rate
    for w in range(n):
        load = sum(rates[p] * s for p, s in kept[w].items())
        excess = load - fair
        if excess <= tol:
            continue
        must_move += excess
        for p, s in sorted(kept[w].items(), key=lambda kv: -rates[kv[0]] * kv[1]):
            r = rates[p] * s
            if r <= excess + EPS and r > 0:
                excess -= r
                moved += r
                pool[p] = pool.get(p, 0.0) + s
                del kept[w][p]
            if excess <= tol:
                break
        if excess > tol:
            # Slice the smallest piece that covers the rest.
            p = min((p for p in kept[w] if rates[p] * kept[w][p] >= excess), key=lambda q: rates[q] * kept[w][q])
            share = excess / rates[p]
            kept[w][p] -= share
            pool[p] = pool.get(p, 0.0) + share
            moved += excess
    # Water-fill the pool into spare room: largest pieces first, into the emptiest worker.
    loads = [sum(rates[p] * s for p, s in kept[w].items()) for w in range(n)]
    heap = [(loads[w], w) for w in range(n)]
    heapq.heapify(heap)
    zero = sorted(p for p, s in pool.items() if rates[p] == 0)
    pieces = sorted(((rates[p] * s, p, s) for p, s in pool.items() if rates[p] > 0), reverse=True)
    for _, p, share in pieces:
        rate = rates[p]
        while share > 0:
            load, w = heapq.heappop(heap)
            room = (fair - load) / rate  # in shares of this partition
            # The whole rest when it fits, or when the room is too thin to be worth a slice
            # (then every worker is full to within a sliver, so the overshoot is a sliver).
            take = share if room >= share * (1 - 1e-9) or room < opts.min_slice else room
            kept[w][p] = kept[w].get(p, 0.0) + take
            heapq.heappush(heap, (load + take * rate, w))
            share -= take
    for p in zero:  # zero-rate partitions still need an owner: the worker with the fewest partitions
        w = min(range(n), key=lambda k: (len(kept[k]), k))
        kept[w][p] = 1.0
    workers = {w: sorted(((p, s) for p, s in kept[w].items() if s > 1e-12), key=lambda x: x[0]) for w in range(n)}
    notes = []
    if n > len(rates):
        notes.append(f"{n} workers for {len(rates)} partitions: partitions are sliced so every worker gets work")
    return Assignment(workers, rates, moved_rate=moved if previous is not None else 0.0,
                      moved_lower_bound=must_move if previous is not None else 0.0, notes=notes)


def _lpt(rates, n) -> list[list[str]]:  # pragma: no mutate block
    heap = [(0.0, w) for w in range(n)]
    bins: list[list[str]] = [[] for _ in range(n)]
    for p in sorted(rates, key=lambda q: (-rates[q], q)):
        load, w = heapq.heappop(heap)
        bins[w].append(p)
        heapq.heappush(heap, (load + rates[p], w))
    return bins


def _relabel(bins: list[list[str]], previous: Assignment | None, rates) -> list[list[str]]:  # pragma: no mutate block
    """Permute LPT bins onto workers to keep as much previous rate in place as possible."""
    if previous is None:
        return bins
    from scipy.optimize import linear_sum_assignment

    n = len(bins)
    owner: dict[str, dict[int, float]] = {}
    for w, items in previous.workers.items():
        for p, s in items:
            owner.setdefault(p, {})[w] = s
    overlap = np.zeros((n, n))
    for b, parts in enumerate(bins):
        for p in parts:
            for w, s in owner.get(p, {}).items():
                if w < n:
                    overlap[b, w] += rates[p] * s
    rows, cols = linear_sum_assignment(-overlap)
    out: list[list[str]] = [[] for _ in range(n)]
    for b, w in zip(rows, cols):
        out[w] = bins[b]
    return out


def _sticky_local_search(rates, n, previous: Assignment, max_moves: int = 100_000) -> list[list[str]]:  # pragma: no mutate block
    """Start from previous owners (largest share wins), place the rest by LPT, then move
    single partitions from the most to the least loaded worker while that lowers the max."""
    best_owner: dict[str, tuple[float, int]] = {}
    for w, items in previous.workers.items():
        for p, s in items:
            if p in rates and w < n and s > best_owner.get(p, (0.0, -1))[0]:
                best_owner[p] = (s, w)
    bins: list[list[str]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for p, (_, w) in best_owner.items():
        bins[w].append(p)
        loads[w] += rates[p]
    heap = [(loads[w], w) for w in range(n)]
    heapq.heapify(heap)
    for p in sorted((q for q in rates if q not in best_owner), key=lambda q: (-rates[q], q)):
        load, w = heapq.heappop(heap)
        bins[w].append(p)
        loads[w] = load + rates[p]
        heapq.heappush(heap, (loads[w], w))
    for _ in range(max_moves):
        hi = max(range(n), key=loads.__getitem__)
        lo = min(range(n), key=loads.__getitem__)
        gap = loads[hi] - loads[lo]
        # The largest partition on hi that still lowers the max when moved to lo.
        cand = [p for p in bins[hi] if 0 < rates[p] < gap]
        if not cand:
            break
        p = max(cand, key=lambda q: rates[q])
        bins[hi].remove(p)
        bins[lo].append(p)
        loads[hi] -= rates[p]
        loads[lo] += rates[p]
    return bins


def _moved(bins: list[list[str]], previous: Assignment | None, rates) -> float:
    if previous is None:
        return 0.0
    now = {p: w for w, parts in enumerate(bins) for p in parts}
    moved = 0.0
    for w, items in previous.workers.items():
        for p, s in items:
            if p in rates and now.get(p) != w:
                moved += rates[p] * s
    return moved


def _assign_whole(rates, n, previous, opts) -> Assignment:
    candidates = [_relabel(_lpt(rates, n), previous, rates)]
    if previous is not None:
        candidates.append(_sticky_local_search(rates, n, previous))

    def score(bins):
        return (max(sum(rates[p] for p in b) for b in bins), _moved(bins, previous, rates))

    best = min(candidates, key=score)
    must_move = 0.0
    if previous is not None:
        kept, _, removed = _carry_over(previous, rates, n)
        fair = sum(rates.values()) / n
        must_move = removed + sum(max(0.0, sum(rates[p] * s for p, s in k.items()) - fair) for k in kept)
    workers = {w: [(p, 1.0) for p in sorted(best[w])] for w in range(n)}
    notes = [f"{n - len(rates)} worker(s) idle: fewer partitions than workers and splitting is off"] \
        if n > len(rates) else []
    return Assignment(workers, rates, moved_rate=_moved(best, previous, rates), moved_lower_bound=must_move,
                      notes=notes)


def assign(partition_rates: Mapping[str, float] | Iterable[tuple[str, float]], n_workers: int,
           previous: Assignment | Mapping | None = None, options: RebalanceOptions | None = None) -> Assignment:
    """Assign partitions to ``n_workers`` workers (see the module docstring)."""
    opts = options or RebalanceOptions()
    rates = _check_rates(partition_rates)
    if not isinstance(n_workers, (int, np.integer)) or n_workers < 1:
        raise RebalanceError(f"n_workers must be a whole number >= 1, got {n_workers!r}")
    if previous is not None and not isinstance(previous, Assignment):
        previous = Assignment.from_dict(previous, rates)
    if opts.split:
        return _assign_split(rates, int(n_workers), previous, opts)
    return _assign_whole(rates, int(n_workers), previous, opts)
