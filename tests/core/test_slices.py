"""Every worker's slices at once are each worker's own."""

import numpy as np
import pytest

from kale_airflow.core.slices import Slice, all_slices, partition_number, slices_for

DOC = {"assignment": {"0": [["p000", 0.5], ["p001", 1.0]], "2": [["p000", 0.3]], "1": [["p000", 0.2], ["p002", 1.0]]}}


def test_all_slices_are_the_workers_slices_in_partition_order():
    got = all_slices(DOC)
    assert got == [(0, Slice(0, 0.0, 0.5)), (1, Slice(0, 0.5, 0.7)), (2, Slice(0, 0.7, 1.0)),
                   (0, Slice(1, 0.0, 1.0)), (1, Slice(2, 0.0, 1.0))]
    for w in (0, 1, 2):
        assert slices_for(DOC, w) == [sl for v, sl in got if v == w]
    assert all_slices(DOC["assignment"]) == got  # the bare mapping as well


def test_the_last_holder_reaches_the_end_and_no_range_passes_it():
    # Shares short of 1: the last holder (the highest worker id) takes the rest; a share past
    # 1 stops at the end.
    doc = {"3": [["p000", 0.3]], "1": [["p000", 0.4], ["p001", 1.5]], "2": [["p001", 0.5]]}
    assert all_slices(doc) == [(1, Slice(0, 0.0, 0.4)), (3, Slice(0, 0.4, 1.0)),
                               (1, Slice(1, 0.0, 1.0)), (2, Slice(1, 1.0, 1.0))]


def test_slices_of_a_partition_split_its_offsets_between_them():
    offsets = np.arange(10_000)
    masks = [sl.mask(offsets) for _, sl in all_slices(DOC) if sl.partition == 0]
    assert (sum(m.astype(int) for m in masks) == 1).all()  # every offset in exactly one slice
    widths = [sl.hi - sl.lo for _, sl in all_slices(DOC) if sl.partition == 0]
    assert [m.mean() for m in masks] == pytest.approx(widths, abs=0.01)  # evenly interleaved
    whole = Slice(0).mask(offsets)
    assert whole.dtype == bool and whole.shape == offsets.shape and whole.all()


def test_partition_ids_name_stream_partitions():
    assert [partition_number(x) for x in (7, "7", "p007")] == [7, 7, 7]
    with pytest.raises(ValueError, match=r"'X7' does not name a stream partition \(expected 7, '7' or 'p007'\)"):
        partition_number("X7")
