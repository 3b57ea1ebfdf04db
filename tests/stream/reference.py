"""The backlog as the autoscaler computed it before the batched stream reads
(``committed_many``/``timestamps_at``): the reference the batched one must equal, and the
before side of ``benchmarks/autoscaler.py``."""

from __future__ import annotations


def per_slice_backlog(stream, group, assignment, now):
    """The backlog as the autoscaler computed it with one ``committed`` and one ``read`` per
    slice (before ``committed_many``/``timestamps_at``): the reference the batched one must equal."""
    from kale_airflow.core.slices import slices_for

    ends = stream.end_offsets()
    backlog, oldest = 0.0, now
    for w in assignment:
        for sl in slices_for({"assignment": assignment}, int(w)):
            pos = stream.committed(f"{group}/{sl.group_suffix}", sl.partition)
            pending = ends.get(sl.partition, 0) - pos
            if pending > 0:
                backlog += pending * (sl.hi - sl.lo)
                rec = stream.read(sl.partition, pos, 1)
                if rec:
                    oldest = min(oldest, rec[0].ts)
    return backlog, max(0.0, now - oldest)
