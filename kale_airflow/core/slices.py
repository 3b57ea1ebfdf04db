"""Slices of stream partitions: which offsets of a partition a worker consumes.

A slice ``[lo, hi)`` of partition p takes the offsets o with ``frac(o * phi)`` in the range
(phi the golden ratio's fractional part), so slices of one partition interleave samples
evenly and never overlap. Pure: the rebalancer decides shares, this maps them to offsets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PHI = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class Slice:
    """The part of a partition one worker consumes: ``frac(offset * phi)`` in [lo, hi)."""

    partition: int
    lo: float = 0.0
    hi: float = 1.0

    @property
    def group_suffix(self) -> str:
        """Commits are kept per slice so slices of one partition advance independently."""
        return f"p{self.partition}:{self.lo:.6f}-{self.hi:.6f}"

    def mask(self, offsets: np.ndarray) -> np.ndarray:
        """Which offsets belong to this slice."""
        if self.lo <= 0.0 and self.hi >= 1.0:
            return np.ones(len(offsets), dtype=bool)
        f = np.mod(offsets * PHI, 1.0)
        return (f >= self.lo) & (f < self.hi)


def partition_number(pid) -> int:
    """Stream partition number of an assignment's partition id (``"7"``, ``"p007"`` or 7)."""
    text = str(pid).lstrip("p")
    if not text.isdigit():
        raise ValueError(f"partition id {pid!r} does not name a stream partition (expected 7, '7' or 'p007')")
    return int(text)


def all_slices(assignment: dict) -> list[tuple[int, Slice]]:
    """Every worker's slices of an assignment document (worker -> [[partition, share]]), as
    (worker, slice) in partition order: workers sharing a partition get consecutive ranges,
    ordered by worker id, the last one's reaching 1."""
    raw = assignment.get("assignment", assignment)
    owners: dict[str, list[tuple[int, float]]] = {}
    for w, items in raw.items():
        for p, share in items:
            owners.setdefault(p, []).append((int(w), float(share)))
    out = []
    for p, holders in sorted(owners.items()):
        lo, last = 0.0, max(h[0] for h in holders)
        for w, share in sorted(holders):
            hi = 1.0 if w == last else min(1.0, lo + share)
            out.append((w, Slice(partition_number(p), lo, hi)))
            lo = hi
    return out


def slices_for(assignment: dict, worker: int) -> list[Slice]:
    """This worker's slices of an assignment document (see :func:`all_slices`)."""
    return [sl for w, sl in all_slices(assignment) if w == worker]
