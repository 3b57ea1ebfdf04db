"""The throughput refit fits measured observations only: without them it fails naming the
problem and the fix (``kale profile``), never falling back to simulated data, and the
simulated rows earlier versions seeded (timestamp 0) never reach the fit."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kale_airflow.config import Settings
from kale_airflow.core.simulator import SimConfig, profile_observations
from kale_airflow.metrics.embedded import SIMULATED_TS, EmbeddedMetrics
from kale_airflow.pipelines.throughput import NoThroughputObservations, measured_observations, refit_throughput


def settings_at(tmp_path) -> Settings:
    return Settings(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", database=f"sqlite:///{tmp_path / 'kale.db'}")


def test_the_refit_without_observations_names_the_problem_and_kale_profile(tmp_path):
    s = settings_at(tmp_path)
    with pytest.raises(NoThroughputObservations) as err:
        refit_throughput(s, "run")
    msg = str(err.value)
    assert msg.startswith(f"no throughput observations in the control plane (sqlite:///{tmp_path}/kale.db)")
    assert "never on simulated data" in msg and "`kale profile`" in msg and "kale_throughput_refit" in msg
    assert EmbeddedMetrics(s.database_url).throughput_observations().empty  # and it wrote none


def test_the_rows_an_earlier_version_seeded_are_ignored_and_said_so(tmp_path):
    s = settings_at(tmp_path)
    m = EmbeddedMetrics(s.database_url)
    n, r = profile_observations(SimConfig())
    m.write_throughput(np.full(len(n), SIMULATED_TS), n, r)  # what every empty store got before
    now = time.time()
    m.write_throughput([now, now + 5], [1, 1], [900.0, 910.0])  # what one real job recorded
    with pytest.raises(NoThroughputObservations, match=rf"^only 2 throughput observation\(s\) at 1 worker count\(s\) "
                                                       rf"\[1\] .*\({len(n)} simulated row\(s\) at timestamp 0"):
        refit_throughput(s, "run")
    m.write_throughput([now + 10, now + 15], [2, 2], [1700.0, 1720.0])
    obs = measured_observations(s)
    assert obs["ts"].min() >= now and obs["workers"].tolist() == [1, 1, 2, 2]  # the fit sees real rows only


def test_a_refit_without_observations_is_not_retried():
    from kale_airflow.operators.failures import KaleFailure, fail_fast

    with pytest.raises(KaleFailure, match="not retried"):
        with fail_fast():
            raise NoThroughputObservations("no throughput observations")
