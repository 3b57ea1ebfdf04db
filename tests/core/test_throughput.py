import numpy as np
import pytest

from kale_airflow.core.cluster import ClusterModel
from kale_airflow.core.throughput import (
    FALLBACK_REL_STD,
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
        ([8, 8, 8], [7000, 7100, 6900], r"^observations cover only 1 distinct worker count\(s\) \[8\]; at least 2 are "
                                        r"needed to identify scaling \(profile another worker count\)$"),
        ([1, 2], [1000, float("nan")], "^observation 1 is NaN or infinite; drop it before fitting$"),
        ([1, 2, 3], [1, 0, 2000], "^observation 1 has throughput 0.0 <= 0;"),
        ([1, 2.5], [1000, 2000], "^worker counts must be whole numbers >= 1$"),
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
    m = ThroughputModel.fit(*noisy_obs(ClusterModel(), [1, 4, 16]), z=2.0)
    d = m.to_dict()
    assert ThroughputModel.from_dict(d) == m
    assert d["features"] == ["inv_n", "serial", "log_n", "linear_n"]  # what each coefficient is, in MLflow
    # A model stored before the bound's z was recorded reads as the one-sided 95 % bound.
    assert ThroughputModel.from_dict({k: v for k, v in d.items() if k != "z"}).z == 1.645


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


def known(coef, max_count=64) -> ThroughputModel:
    """A model with the given time-per-sample coefficients and no uncertainty."""
    return ThroughputModel(coef=tuple(coef), cov=((0.0,) * 4,) * 4, rel_std=0.0, n_obs=0,
                           worker_counts=(1, max_count))


def test_coefficients_are_the_documented_time_per_sample_terms():
    n = np.array([1.0, 4.0, 10.0])
    m = known((2e-3, 1e-4, 3e-5, 1e-6))
    assert m.predict(n) == pytest.approx(1 / (2e-3 / n + 1e-4 + 3e-5 * np.log(n) + 1e-6 * n))
    # Any shape of worker counts, element by element.
    grid = np.array([[1.0, 4.0], [10.0, 2.0]])
    assert m.predict(grid) == pytest.approx(1 / (2e-3 / grid + 1e-4 + 3e-5 * np.log(grid) + 1e-6 * grid))
    table = m.capacity_table(3)
    assert table[0] == 0.0 and table[1:] == pytest.approx(m.predict([1, 2, 3]))


def per_count_residuals(rates):
    """Relative residuals at one worker count when the fit can match each count: the time
    per sample p that minimises sum((p * r - 1)^2) is sum(r) / sum(r^2)."""
    r = np.asarray(rates, dtype=float)
    return r * r.sum() / (r * r).sum() - 1


@pytest.mark.parametrize(
    "per_count, dof",
    [({1: [900, 1100], 2: [1700, 2100]}, 2), ({1: [900, 1100], 2: [1800]}, 1)],
    ids=["two-left", "one-left"],
)
def test_rel_std_is_the_relative_residual_std_net_of_the_fitted_terms(per_count, dof):
    # Two counts, two terms (1/n and the serial part), both positive here: each count is
    # matched at its least-squares time per sample, and dof = observations - 2.
    workers = [n for n, rates in per_count.items() for _ in rates]
    rates = [r for rs in per_count.values() for r in rs]
    m = ThroughputModel.fit(workers, rates)
    assert all(c > 0 for c in m.coef[:2])
    resid = np.concatenate([per_count_residuals(rs) for rs in per_count.values()])
    assert m.rel_std == pytest.approx(np.sqrt(resid @ resid / dof))


def test_an_exact_fit_assumes_the_fallback_relative_std():
    m = ThroughputModel.fit([1, 2], [1000, 1800])
    assert m.rel_std == FALLBACK_REL_STD


def test_the_bound_widens_in_proportion_to_the_noise_and_z():
    # Two counts of an Amdahl curve: both terms stay in the fit whatever the noise.
    base = ClusterModel()
    n = np.repeat([2.0, 8.0], 5)
    wobble = np.tile([1.0, -1.0, 0.5, -0.5, 0.0], 2)

    def gap(sd, z=1.645):
        m = ThroughputModel.fit(n, base.capacity(n) * (1 + sd * wobble), z=z)
        assert all(c > 0 for c in m.coef[:2])
        return 1 / m.capacity_lower(16)[0] - 1 / m.predict(16)[0]  # z standard errors of the time per sample

    assert gap(0.02) / gap(0.01) == pytest.approx(2.0, rel=0.03)
    assert gap(0.01, z=3.29) / gap(0.01) == pytest.approx(2.0, rel=1e-9)
    assert ThroughputModel.fit(n, base.capacity(n)).z == 1.645  # one-sided 95 % by default


def test_terms_the_fit_leaves_at_zero_carry_no_uncertainty():
    # An Amdahl curve measured at four counts: no communication terms.
    m = ThroughputModel.fit(*noisy_obs(ClusterModel(), [1, 2, 4, 8], per_count=5))
    cov = np.asarray(m.cov)
    zero = np.asarray(m.coef) == 0
    assert zero.any() and not zero.all()
    assert (cov[zero] == 0).all() and (cov[:, zero] == 0).all()
    assert (np.diag(cov)[~zero] > 0).all()


def test_fractional_samples_per_second_are_valid_throughput():
    m = ThroughputModel.fit([1, 2], [0.5, 0.9])
    assert m.predict([1, 2]) == pytest.approx([0.5, 0.9])


def test_saturation_is_the_first_count_whose_next_worker_gains_too_little():
    m = known((1e-3, 0.0, 0.0, 1e-5))

    def c(k):  # the documented curve, written out
        return 1 / (1e-3 / k + 1e-5 * k)

    first = next(k for k in range(1, 100) if c(k + 1) - c(k) < 0.05 * c(1))
    assert m.saturation_workers(64) == first
    # Judged on one more worker than the limit, and not past it.
    assert m.saturation_workers(first) == first
    assert m.saturation_workers(first - 1) is None
    # A gain of exactly min_gain is still worth having.
    g = (c(2) - c(1)) / c(1)
    assert m.saturation_workers(64, min_gain=g) == 2
    assert m.saturation_workers(64, min_gain=np.nextafter(g, 1)) == 1


def test_workers_for_rate_never_answers_zero_workers():
    assert workers_for_rate([0.0, 10.0, 20.0], 0.0) == 1
    assert workers_for_rate([0.0, 10.0, 20.0], -5.0) == 1


@pytest.mark.parametrize("table", [[], [0.0], [0.0, 5.0]], ids=["empty", "no-workers", "one-worker"])
def test_peak_cut_of_a_table_of_at_most_one_worker_is_one(table):
    assert peak_cut(table) == 1


@pytest.mark.parametrize(
    "table, cut",
    [
        ([0.0, 5.0, 10.0], 2),  # rises to two
        ([0.0, 10.0, 5.0], 1),  # falls after one worker
        ([0.0, 100.0, 101.5, 200.0], 1),  # the second worker gains 1.5 % of one worker
        ([0.0, 100.0, 102.0, 300.0], 3),  # exactly 2 % still pays
        ([0.0, 100.0, 200.0, 203.5], 3),  # the third gains 3.5 % of one worker (1.75 % of two)
        ([0.0, 0.5, 0.515, 1.0], 3),  # relative to one worker, whatever the units
    ],
    ids=["rises", "falls", "flat", "at-threshold", "relative-to-one-worker", "small-units"],
)
def test_peak_cut_of_the_fitted_curve(table, cut):
    assert peak_cut(table) == cut


def test_peak_cut_reads_the_measured_counts_inside_the_table_only():
    fit = ClusterModel().capacity_table(64)  # rises to 64
    # One worker measured as fast as two: flat from the first worker.
    assert peak_cut(fit, {1: 500.0, 2: 500.0}) == 1
    # A count past the table's largest is not measured evidence for it.
    assert peak_cut(fit, {32: 9_000.0, 65: 9_000.0}) == 64


def test_peak_cut_judges_measured_gains_against_min_gain_of_one_fitted_worker():
    fit = np.arange(0.0, 65.0) * 100.0  # one worker: 100/s, min_gain 2 per extra worker
    assert peak_cut(fit, {10: 1_000.0, 20: 1_030.0}) == 64  # 3 per extra worker pays
    assert peak_cut(fit, {10: 1_000.0, 20: 1_015.0}) == 10
    fit[2] = 200.0  # a fitted second worker of 200/s changes nothing: one worker is the unit
    assert peak_cut(fit, {10: 1_000.0, 20: 1_030.0}) == 64


def test_peak_cut_takes_a_plain_mean_as_exact():
    fit = np.arange(0.0, 65.0) * 100.0
    # 20 beats 10 by 19.5 over 10 extra workers, under 2 each: flat, with no error to doubt it.
    assert peak_cut(fit, {10: 1_000.0, 20: 1_019.5}) == 10
    assert peak_cut(fit, {10: (1_000.0, 1.0), 20: (1_019.5, 1.0)}) == 64


def test_plateau_start_counts_adjacent_counts_and_judges_the_thresholds_exactly():
    # One extra worker is a larger count too.
    assert plateau_start(np.array([10, 11]), np.array([1_000.0, 1_000.0]), np.zeros(2), 1.0) == 10
    # At the upper bound: 900 + 2 * 50 = 1,000 over 10 workers is exactly 100 each, not under it.
    assert plateau_start(np.array([10, 20]), np.array([0.0, 900.0]), np.array([0.0, 50.0]), 100.0) is None
    # At the lower bound: 20 beat 10 by exactly 100 per worker, which pays, so 10 is no plateau.
    counts = np.array([10, 20, 30])
    assert plateau_start(counts, np.array([0.0, 1_000.0, 0.0]), np.zeros(3), 100.0) == 20


def test_plateau_start_skips_a_count_too_uncertain_to_judge():
    # 10 is measured too loosely to be flat or paid for; 20 -> 30 is clearly flat.
    counts, means = np.array([10, 20, 30]), np.array([0.0, 1_000.0, 1_010.0])
    assert plateau_start(counts, means, np.array([5_000.0, 0.0, 0.0]), 100.0) == 20


def test_guarded_keeps_the_cut_count_and_no_more():
    table = ClusterModel().capacity_table(8)
    assert len(guarded(table, cut=1)) == 2
    assert len(guarded(table, cut=0)) == 2  # never below one worker
    assert len(guarded(table, cut=5)) == 6
