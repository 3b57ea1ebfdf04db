"""When records were appended, from end offsets observed over time.

An observer that reads a stream's end offsets at times t0 < t1 < ... knows that a record
whose offset lies in ``[end_i-1, end_i)`` of its partition was appended between t_i-1 and
t_i. :class:`AppendClock` keeps those observations and dates a record by spreading that
interval's records evenly over it: exact at a steady rate, off by at most one interval
between observations otherwise; the records appended in a window are counted the same way.
The autoscaler observes the end offsets at every poke anyway, so on a remote stream neither
the age of the oldest unprocessed record nor the arrival rate needs another request.
Pure: the caller reads the stream and passes the times.
"""

from __future__ import annotations

import bisect


class AppendClock:
    """End offsets per partition at the times they were observed (the last ``keep``)."""

    def __init__(self, keep: int = 1000):
        self.keep = keep
        self.times: list[float] = []
        self.ends: dict[int, list[int]] = {}  # partition -> its end offset at each of self.times

    def __len__(self) -> int:
        return len(self.times)

    def observe(self, t: float, ends: dict[int, int]) -> None:
        """Add the end offsets read at time ``t``. A time not after the last one is ignored; a
        changed set of partitions or an end that moved back (a log emptied or recreated) starts
        the clock over, as the offsets observed before no longer name the same records."""
        if self.times and t <= self.times[-1]:
            return
        if self.times and (set(ends) != set(self.ends) or any(ends[p] < col[-1] for p, col in self.ends.items())):
            self.times, self.ends = [], {}
        self.times.append(t)
        for p, end in ends.items():
            self.ends.setdefault(p, []).append(int(end))
        if len(self.times) > self.keep:
            del self.times[0]
            for col in self.ends.values():
                del col[0]

    def time_of(self, partition: int, offset: int) -> float | None:
        """The estimated append time of the record at ``offset``; None when the observations
        do not enclose it (appended before the first one, or not yet seen appended)."""
        col = self.ends.get(partition)
        if col is None:
            return None
        i = bisect.bisect_right(col, offset)  # the first observation whose end is past the record
        if i == 0 or i == len(col):
            return None
        e0, e1, t0, t1 = col[i - 1], col[i], self.times[i - 1], self.times[i]
        return t0 + (offset - e0 + 0.5) / (e1 - e0) * (t1 - t0)

    def arrived(self, since: float, until: float) -> dict[int, int] | None:
        """Records appended per partition in [since, until], the end offsets interpolated
        between the observations around each time; None unless the observations span the window."""
        if not self.times or since < self.times[0] or until > self.times[-1] or since > until:
            return None
        return {p: round(self._end_at(col, until) - self._end_at(col, since)) for p, col in self.ends.items()}

    def _end_at(self, col: list[int], t: float) -> float:
        i = bisect.bisect_left(self.times, t)  # the first observation at or after t
        if self.times[i] == t:
            return float(col[i])
        t0, t1 = self.times[i - 1], self.times[i]
        return col[i - 1] + (t - t0) / (t1 - t0) * (col[i] - col[i - 1])
