"""What the demo's summary compares its scaling with (a fixed run sized for the peak by the
capacity Kale plans with), and how it counts freshness it could not read."""

import numpy as np
import pandas as pd
import pytest

from kale_airflow.cli.demo import fixed_workers, freshness_figures, workers_path

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


def test_starting_the_job_is_not_a_rescale_and_holds_are_not_in_the_path():
    """Bug class: the demo counted the job's first start (0 -> n workers) as a rescale."""
    decisions = [{"workers": 0, "target": 3}, {"workers": 3, "target": 3}, {"workers": 3, "target": 2},
                 {"workers": 2, "target": 2}, {"workers": 2, "target": 1}, {"workers": 1, "target": 2}]
    decisions = [d | {"ts": 100.0 + 10 * i} for i, d in enumerate(decisions)]
    assert workers_path(decisions) == ([0, 3, 2, 1, 2], 3)
    assert workers_path([{"workers": 2, "target": 2, "ts": 0.0}]) == ([], 0)


def test_a_decision_after_the_traffic_ended_is_not_in_the_summary():
    """Bug class: the last autoscaler run, still deciding after the producer stopped, saw an
    idle stream and scaled down; the summary counted that rescale, outside the traffic whose
    worker-hours it reports."""
    decisions = [{"workers": 0, "target": 3, "ts": 100.0}, {"workers": 3, "target": 2, "ts": 200.0},
                 {"workers": 2, "target": 1, "ts": 300.0}]
    assert workers_path(decisions, until=250.0) == ([0, 3, 2], 1)
    assert workers_path(decisions, until=300.0) == ([0, 3, 2, 1], 2)


def test_a_sample_without_a_freshness_reading_is_unobserved_not_a_lag_of_zero():
    """Bug class: samples taken while no assignment exists (a generation decided, not yet
    rebalanced) counted as 0 s of lag, which halved this run's violation rate."""
    dt = pd.Series([2.0, 2.0, 2.0, 3.0])
    figures = freshness_figures(dt, pd.Series([10.0, np.nan, np.nan, 70.0]), 60)
    assert figures == {"slo_violation_rate": 0.5, "max_freshness_s": 70.0, "unobserved_s": 4.0}


def test_a_run_without_any_freshness_reading_has_no_violation_rate():
    figures = freshness_figures(pd.Series([2.0, 2.0]), pd.Series([np.nan, np.nan]), 60)
    assert figures == {"slo_violation_rate": None, "max_freshness_s": None, "unobserved_s": 4.0}
