"""What the demo's summary compares its scaling with: a fixed run sized for the peak."""

import pytest

from kale_airflow.cli.demo import fixed_workers


@pytest.mark.parametrize("peak, per_rank, expected", [
    (1100.0, 320.0, 4),   # 3.4 ranks' worth: 4
    (1280.0, 320.0, 4),   # exactly 4 ranks' worth: no fifth
    (1281.0, 320.0, 5),
    (100.0, 320.0, 1),
    (5000.0, 320.0, 6),   # never above max_workers
])
def test_a_fixed_run_has_the_fewest_ranks_whose_profiled_rate_covers_the_peak(peak, per_rank, expected):
    assert fixed_workers(peak, per_rank, 6) == expected


def test_without_a_profile_the_fixed_run_is_the_largest():
    assert fixed_workers(1100.0, None, 6) == 6
