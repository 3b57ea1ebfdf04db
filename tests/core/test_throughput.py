import numpy as np
import pytest

from kale_airflow.core.cluster import ClusterModel
from kale_airflow.core.throughput import (
    ThroughputModel,
    ThroughputModelError,
    guarded,
    monotone,
    peak_cut,
    plateau_start,
    workers_for_rate,
)


def noisy_obs(model: ClusterModel, counts, per_count=30, sd=0.03, seed=0):
    rng = np.random.default_rng(seed)
    n = np.repeat(np.asarray(counts, dtype=float), per_count)
    return n, model.capacity(n) * (1 + sd * rng.standard_normal(n.size))


def test_fit_recovers_the_true_curve_from_noisy_observations():
    truth = ClusterModel(per_worker=500, serial_fraction=0.02)
    m = ThroughputModel.fit(*noisy_obs(truth, [1, 2, 4, 8, 16, 32]))
    for n in (1, 3, 10, 32, 48):
        assert m.predict(n)[0] == pytest.approx(truth.capacity(n), rel=0.03)


def test_lower_bound_is_below_the_mean_and_widens_when_extrapolating():
    truth = ClusterModel()
    m = ThroughputModel.fit(*noisy_obs(truth, [2, 4, 8], per_count=10))
    rel_gap = 1 - m.capacity_lower([4, 64]) / m.predict([4, 64])
    assert (rel_gap > 0).all()
    assert rel_gap[1] > 3 * rel_gap[0]


def test_inversion_gives_the_fewest_workers_that_cover_the_rate():
    truth = ClusterModel()
    m = ThroughputModel.fit(*noisy_obs(truth, [1, 2, 4, 8, 16, 32, 64]))
    for rate in (500.0, 5_000.0, 20_000.0):
        n = m.workers_for(rate, 64)
        assert m.capacity_lower(n)[0] >= rate
        assert n == 1 or m.capacity_lower(n - 1)[0] < rate
    assert m.workers_for(1e9, 64) == 64


@pytest.mark.parametrize(
    "counts, active_features",
    [([4, 8], 2), ([2, 4, 8], 3), ([1, 2, 4, 8], 4)],
    ids=["two-counts-amdahl", "three-counts-adds-log", "four-counts-all"],
)
def test_feature_set_grows_with_distinct_counts(counts, active_features):
    m = ThroughputModel.fit(*noisy_obs(ClusterModel(), counts, per_count=5))
    assert all(c == 0.0 for c in m.coef[active_features:])
    assert m.worker_counts == tuple(counts)


@pytest.mark.parametrize(
    "workers, rates, message",
    [
        ([8, 8, 8], [7000, 7100, 6900], "only 1 distinct worker count"),
        ([1, 2], [1000, float("nan")], "NaN or infinite"),
        ([1, 2], [1000, 0], "<= 0"),
        ([1, 2.5], [1000, 2000], "whole numbers"),
        ([1, 2, 3], [1000, 2000], "differ in length"),
    ],
    ids=["one-count", "nan", "zero-rate", "fractional-workers", "length-mismatch"],
)
def test_bad_observations_get_clear_errors(workers, rates, message):
    with pytest.raises(ThroughputModelError, match=message):
        ThroughputModel.fit(workers, rates)


def test_saturation_is_detected_when_communication_dominates():
    # Time per sample with a strong all-to-all term: throughput peaks, then falls.
    n = np.repeat(np.arange(1, 17, dtype=float), 3)
    rate = 1.0 / (1e-3 / n + 1e-5 * n)
    m = ThroughputModel.fit(n, rate)
    sat = m.saturation_workers(64)
    assert sat is not None and 8 <= sat <= 10  # analytic peak at sqrt(1e-3 / 1e-5) = 10
    assert ThroughputModel.fit(*noisy_obs(ClusterModel(serial_fraction=0.0), [1, 2, 4, 8])).saturation_workers(64) is None


def test_monotone_table_never_buys_useless_workers():
    table = monotone(np.array([0.0, 10.0, 18.0, 20.0, 19.0, 17.0]))
    assert workers_for_rate(table, 19.5) == 3
    assert workers_for_rate(table, 25.0) == 5  # unreachable: the largest count


def test_round_trip_through_dict():
    m = ThroughputModel.fit(*noisy_obs(ClusterModel(), [1, 4, 16]))
    m2 = ThroughputModel.from_dict(m.to_dict())
    assert m2.predict(12)[0] == pytest.approx(m.predict(12)[0])


def test_cluster_model_inverse_matches_forward():
    c = ClusterModel()
    for n in (1.0, 7.5, 64.0):
        assert float(c.workers_for_fractional(c.capacity(n))) == pytest.approx(n)
    assert c.workers_for(c.capacity(10) + 1, 64) == 11


def test_misspecified_clusters_have_the_documented_shapes():
    sat, comm = ClusterModel(kind="saturating"), ClusterModel(kind="comm")
    assert sat.capacity(64) == sat.capacity(39) == 28_000 and sat.peak_workers(64) == 39
    assert comm.peak_workers(64) == 48 and comm.capacity(64) < comm.capacity(48) * 0.95
    # Inversions never answer a count past the peak, whatever the rate.
    assert comm.workers_for(1e9, 64) == 48 and sat.workers_for(1e9, 64) == 39
    n = comm.workers_for_fractional([comm.capacity(20.0), 1e9], 64)
    assert n[0] == pytest.approx(20.0, abs=0.01) and np.isinf(n[1])
    with pytest.raises(ValueError, match="unknown cluster kind"):
        ClusterModel(kind="magic")


def test_peak_cut_stops_at_the_fitted_peak_and_at_a_measured_fall():
    comm = ClusterModel(kind="comm")
    assert peak_cut(comm.capacity_table(64), min_gain=0.0) == 48
    assert 40 <= peak_cut(comm.capacity_table(64)) <= 48  # the last workers before the peak gain < 2 %
    amdahl = ClusterModel()
    assert peak_cut(amdahl.capacity_table(64)) == 64
    # The fit says "keep rising", but 32 workers measured less than 16: the wall is at 16.
    measured = {8: 7_500.0, 16: 14_000.0, 32: 12_000.0}
    assert peak_cut(amdahl.capacity_table(64), measured) == 16
    # A flat region (gain under 2 % of one worker) is cut too.
    assert peak_cut(ClusterModel(kind="saturating").capacity_table(64)) <= 39


def test_peak_cut_stops_where_measured_counts_stop_paying_for_themselves():
    # The fitted (Amdahl) curve keeps rising to 64, but measurements say the cluster is flat
    # from 39 on (a hard ceiling the smooth fit bends through): the cut is the plateau's start.
    fit = ClusterModel().capacity_table(64)
    sat = ClusterModel(kind="saturating")
    flat = {n: (float(sat.capacity(n)), 50.0) for n in (16, 31, 39, 48, 58)}
    assert peak_cut(fit, flat) == 39
    # Counts that each add well over 2 % of a worker are no plateau.
    rising = {n: (float(fit[n]), 50.0) for n in (16, 32, 48, 64)}
    assert peak_cut(fit, rising) == 64
    # Too few measurements to tell a flat curve from a rising one: no cut.
    uncertain = {n: (mean, 2_000.0) for n, (mean, _) in flat.items()}
    assert peak_cut(fit, uncertain) == 64


def test_plateau_start_compares_the_upper_bound_of_each_gain_with_the_threshold():
    counts, ses = np.array([10, 20, 30]), np.zeros(3)
    # 20 -> 30 gains 99 per worker, under the threshold of 100: 20 is where it flattens
    # (10 -> 30 still gains 149.5 per worker, so 10 is not).
    assert plateau_start(counts, np.array([0.0, 2_000.0, 2_990.0]), ses, 100.0) == 20
    # Exactly the threshold is still worth it.
    assert plateau_start(counts, np.array([0.0, 2_000.0, 3_000.0]), ses, 100.0) is None
    # Two standard errors of the difference count against flatness: 10 -> 20 gains 0, at
    # most 2 * 70.7 = 141.4 over 10 workers, so flat only for a threshold above 14.14.
    same, se = np.array([1_000.0, 1_000.0]), np.array([50.0, 50.0])
    assert plateau_start(counts[:2], same, se, 14.1) is None
    assert plateau_start(counts[:2], same, se, 14.2) == 10
    # A measured fall is flat too (a larger count that did worse).
    assert plateau_start(counts[:2], np.array([1_000.0, 900.0]), np.zeros(2), 1.0) == 10
    # A peak between measured counts: 30 matches 10, but 20 beat 10 by far more than the
    # threshold, so 10 is no plateau; 20 is (30 did worse).
    assert plateau_start(counts, np.array([0.0, 2_000.0, 0.0]), ses, 100.0) == 20
    # "Beat by more" is judged at the lower bound: 10 -> 20 must gain at least 1,000 plus
    # two standard errors of the difference (141.4) to veto 10.
    se3 = np.full(3, 50.0)
    assert plateau_start(counts, np.array([0.0, 1_142.0, 0.0]), se3, 100.0) == 20
    assert plateau_start(counts, np.array([0.0, 1_141.0, 0.0]), se3, 100.0) == 10


def test_guarded_table_never_sizes_into_the_falling_region():
    comm = ClusterModel(kind="comm")
    table = guarded(comm.capacity_table(64))
    assert len(table) == 49
    assert workers_for_rate(table, 1e9) == 48
    assert workers_for_rate(table, comm.capacity(10)) == 10


def test_an_online_model_profiled_on_1_to_16_never_scales_past_a_comm_peak():
    from kale_airflow.core.capacity import OnlineThroughput

    comm = ClusterModel(kind="comm")
    src = OnlineThroughput(*noisy_obs(comm, [1, 2, 4, 8, 16], sd=0.05), max_workers=64)
    # Measurements arrive at larger counts as it scales: throughput falls past 48.
    for k, n in enumerate([24, 32, 40, 48, 56, 64]):
        for i in range(8):
            src.observe(1e5 * k + i, n, float(comm.capacity(n)))
    # Up to the peak, not short of it: 56 matches 40, but 48 beat 40 by far more than 2 %
    # of a worker per extra worker (40 is no plateau).
    assert workers_for_rate(src.table, 1e9) == 48


def test_an_online_model_profiled_on_1_to_16_learns_a_saturating_ceiling():
    from kale_airflow.core.capacity import OnlineThroughput

    sat = ClusterModel(kind="saturating")
    src = OnlineThroughput(*noisy_obs(sat, [1, 2, 4, 8, 16], sd=0.05), max_workers=64)
    assert workers_for_rate(src.table, 1e9) == 64  # the fit alone extrapolates past the ceiling
    rng = np.random.default_rng(1)
    for k, n in enumerate([24, 31, 39, 48, 58]):
        for i in range(60):
            src.observe(1e6 * k + 600 * i, n, float(sat.capacity(n)) * (1 + 0.03 * rng.standard_normal()))
    assert 38 <= workers_for_rate(src.table, 1e9) <= 40  # the true ceiling is reached at 39
