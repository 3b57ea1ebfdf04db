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


DEMO_YAML = {"stream_url": "sqlite:///unused", "min_workers": 1, "max_workers": 6, "partitions": 16,
             "poll_interval_s": 2, "bin_s": 30, "slo_s": 60, "rescale_downtime_s": 2,
             "kale": {"horizon_s": 120, "persist_s": 4, "wait_cost": 1.0}}


def demo_window(steps: int = 24) -> pd.Series:
    from kale_airflow.core.traffic import BUNDLED_TRACE, load_trace

    series = load_trace(BUNDLED_TRACE).series
    start = series.index.get_loc(pd.Timestamp("2014-07-21 21:00"))
    return series.iloc[start:start + steps]


def ranks_measured(per_rank: float = 310.0) -> pd.DataFrame:
    n = np.repeat([1, 2, 3], 6)
    return pd.DataFrame({"workers": n, "rate": per_rank * n * (1 + 0.01 * np.sin(np.arange(n.size)))})


def test_the_prediction_simulates_the_demos_own_deployment():
    """Not the protocol's default cluster of 64 workers at a 5-minute SLO: the demo's limits,
    SLO, poll interval, bin and Kale settings, its ranks' throughput, its measured pause and
    its pin, on its traffic at its compression and peak."""
    from kale_airflow.cli.demo import HANDOVER_S, demo_simulation
    from kale_airflow.config import parse_deployment

    dep = parse_deployment(DEMO_YAML)
    window = demo_window()
    trace, cfg, kale = demo_simulation(window, 1_700_000_000.0, 20.0, 800.0, dep, ranks_measured(), [0.4, 6.0, 7.0], 3)
    assert (cfg.min_workers, cfg.max_workers, cfg.partitions, cfg.slo_s, cfg.tick_s, cfg.bin_s) == (1, 6, 16, 60, 2, 30)
    assert (cfg.initial_workers, cfg.pinned_s, cfg.peak_rate, cfg.history_days) == (3, HANDOVER_S, 800.0, 0.0)
    assert cfg.rescale_downtime_s == kale.rescale_downtime_s == 6.0  # the median measured pause, above the floor
    assert (kale.horizon_s, kale.persist_s, kale.wait_cost, kale.interval_s) == (120, 4, 1.0, 2)
    assert cfg.cluster.per_worker == pytest.approx(310.0, rel=0.02)
    assert trace.step_s == 20.0 and len(trace.series) == len(window)
    assert trace.series.index[0] == pd.Timestamp(1_700_000_000, unit="s")  # bins fall where the demo's fell
    np.testing.assert_allclose(trace.values, window.to_numpy())


def test_the_simulated_demo_pins_then_scales_within_the_demos_limits():
    from kale_airflow.cli.demo import BIN_S, HANDOVER_S, demo_simulation
    from kale_airflow.config import parse_deployment
    from kale_airflow.core.simulator import simulate

    trace, cfg, kale = demo_simulation(demo_window(), 1_700_000_000.0, 20.0, 800.0, parse_deployment(DEMO_YAML),
                                       ranks_measured(), [], 3)
    run = simulate(trace, ("kale",), cfg, forecaster_kwargs={"level_window_s": BIN_S}, kale_config=kale,
                   offline=False).runs["kale"]
    assert (run.workers[: int(HANDOVER_S / cfg.tick_s)] == 3).all()
    assert run.rescale_events and run.rescale_events[0]["t"] >= 1_700_000_000.0 + HANDOVER_S
    assert 1 <= run.workers.min() and run.workers.max() <= 6
    assert run.metrics["slo_violation_rate"] == 0.0
