"""What the demo's summary compares its scaling with: a fixed run sized for the peak by the
capacity Kale plans with."""

import pytest

from kale_airflow.cli.demo import fixed_workers

# samples/s of 0..6 ranks on two cores: sublinear, as the demo's job measures itself
CAPACITY = [0.0, 330.0, 610.0, 790.0, 980.0, 1100.0, 1150.0]


@pytest.mark.parametrize("peak, expected", [
    (800.0, 4),    # 3 ranks' 790 fall short of the peak, though 3 x one rank's 330 would not
    (790.0, 3),    # exactly 3 ranks' capacity: no fourth
    (100.0, 1),
    (1150.0, 6),
    (5000.0, 6),   # none covers it: the largest allowed
])
def test_a_fixed_run_has_the_fewest_ranks_whose_capacity_covers_the_peak(peak, expected):
    assert fixed_workers(peak, CAPACITY, 6) == expected


def test_the_fixed_run_stays_within_max_workers_and_without_a_capacity_is_the_largest():
    assert fixed_workers(1100.0, CAPACITY, 4) == 4
    assert fixed_workers(1100.0, None, 6) == 6
