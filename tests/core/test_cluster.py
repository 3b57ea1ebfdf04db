"""A simulation of a real deployment takes its truth from the throughput its job measured."""

import numpy as np
import pytest

from kale_airflow.core.cluster import ClusterModel


@pytest.mark.parametrize("per_worker, serial", [(300.0, 0.0), (300.0, 0.05), (1000.0, 0.01)])
def test_a_fitted_cluster_recovers_the_curve_its_measurements_came_from(per_worker, serial):
    truth = ClusterModel(per_worker=per_worker, serial_fraction=serial)
    n = np.repeat([1, 2, 3, 6], 10)
    rates = truth.capacity(n.astype(float)) * (1 + 0.02 * np.random.default_rng(3).standard_normal(n.size))
    fit = ClusterModel.fitted(n, rates)
    assert fit.kind == "amdahl"
    np.testing.assert_allclose(fit.capacity_table(8), truth.capacity_table(8), rtol=0.02)
    assert 0.01 < fit.noise_sd < 0.03  # the measurements' spread around the curve


def test_exact_measurements_fit_without_noise():
    fit = ClusterModel.fitted([1, 2, 3], [320.0, 640.0, 960.0])
    assert fit.per_worker == pytest.approx(320.0) and fit.serial_fraction == pytest.approx(0.0, abs=1e-9)
    assert fit.noise_sd == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("workers, rates", [([2, 2], [500.0, 510.0]), ([1, 2], [300.0, 0.0]), ([1, 2], [300.0])])
def test_measurements_that_cannot_identify_a_curve_are_refused(workers, rates):
    with pytest.raises(ValueError, match="2 or more worker counts"):
        ClusterModel.fitted(workers, rates)
