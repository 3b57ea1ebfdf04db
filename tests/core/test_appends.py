"""The append clock dates records from end offsets observed over time."""

import pytest

from kale_airflow.core.appends import AppendClock


def clock(*observations) -> AppendClock:
    c = AppendClock()
    for t, ends in observations:
        c.observe(t, ends)
    return c


def test_a_record_is_dated_by_spreading_its_interval_evenly():
    c = clock((10.0, {0: 100, 1: 0}), (20.0, {0: 200, 1: 50}))
    # offsets 100..199 of partition 0 arrived in (10, 20]: record k of them at 10 + (k + .5) / 100 * 10
    assert c.time_of(0, 100) == pytest.approx(10.05)
    assert c.time_of(0, 150) == pytest.approx(15.05)
    assert c.time_of(0, 199) == pytest.approx(19.95)
    assert c.time_of(1, 0) == pytest.approx(10.1)


def test_the_interval_is_the_one_whose_ends_enclose_the_record():
    c = clock((0.0, {0: 0}), (10.0, {0: 10}), (20.0, {0: 10}), (30.0, {0: 20}))
    assert c.time_of(0, 5) == pytest.approx(5.5)
    assert c.time_of(0, 10) == pytest.approx(20.5)  # nothing arrived in (10, 20]


def test_records_outside_the_observations_are_not_dated():
    c = clock((10.0, {0: 100}), (20.0, {0: 200}))
    assert c.time_of(0, 99) is None  # appended before the first observation
    assert c.time_of(0, 200) is None  # not yet seen appended
    assert c.time_of(7, 150) is None  # a partition never observed
    assert clock((10.0, {0: 100})).time_of(0, 50) is None


def test_an_end_moving_back_or_new_partitions_start_the_clock_over():
    c = clock((10.0, {0: 100}), (20.0, {0: 200}), (30.0, {0: 50}))  # the log was emptied
    assert len(c) == 1 and c.time_of(0, 150) is None
    c = clock((10.0, {0: 100}), (20.0, {0: 200}), (30.0, {0: 300, 1: 5}))  # a partition was added
    assert len(c) == 1 and c.time_of(0, 250) is None


def test_an_observation_not_after_the_last_is_ignored():
    c = clock((10.0, {0: 100}), (20.0, {0: 200}), (20.0, {0: 900}), (15.0, {0: 300}))
    assert len(c) == 2 and c.time_of(0, 250) is None


def test_only_the_last_observations_are_kept():
    c = AppendClock(keep=3)
    for i in range(5):
        c.observe(float(i), {0: 10 * i})
    assert len(c) == 3 and c.times == [2.0, 3.0, 4.0]
    assert c.time_of(0, 15) is None and c.time_of(0, 25) == pytest.approx(2.55)


def test_by_default_a_clock_remembers_the_last_thousand_observations():
    c = AppendClock()
    for i in range(1001):
        c.observe(float(i), {0: 10 * i})
    assert len(c) == 1000 and c.times[0] == 1.0


def test_arrivals_in_a_window_interpolate_the_ends_at_its_edges():
    c = clock((0.0, {0: 0, 1: 10}), (10.0, {0: 100, 1: 10}), (20.0, {0: 300, 1: 30}))
    assert c.arrived(0.0, 20.0) == {0: 300, 1: 20}
    assert c.arrived(10.0, 20.0) == {0: 200, 1: 20}
    assert c.arrived(5.0, 15.0) == {0: 150, 1: 10}  # 50 of the first interval, 100 of the second
    assert c.arrived(12.0, 12.0) == {0: 0, 1: 0}


def test_arrivals_outside_the_observations_are_unknown():
    c = clock((10.0, {0: 100}), (20.0, {0: 200}))
    assert c.arrived(9.0, 20.0) is None and c.arrived(10.0, 21.0) is None
    assert AppendClock().arrived(0.0, 1.0) is None
