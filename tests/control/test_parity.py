"""One Kale: the policy the autoscaler builds decides exactly as the policy the simulator builds.

The simulator's Kale (``build_policy("kale", ...)``) and the autoscaler's (``Autoscaler``
with champions from a real MLflow registry and a control plane on disk holding the same
recorded traffic and throughput observations) are fed one scripted observation sequence
(a day of 15 s ticks with a burst, the count following each decision, the workers'
measured throughput); every decision must be the same: count, reason and sentence.
"""

import json

import numpy as np
import pandas as pd
import pytest

from kale_airflow.config import Config, Deployment, Settings
from kale_airflow.control.autoscaler import Autoscaler, MlflowChampions
from kale_airflow.core.cluster import ClusterModel
from kale_airflow.core.forecast import get_forecaster
from kale_airflow.core.policies import Observation
from kale_airflow.core.simulator import SimConfig, Workload, build_policy, profile_observations
from kale_airflow.core.throughput import ThroughputModel
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.stream.embedded import EmbeddedStream
from tests.conftest import daily_series

BIN = 300.0
SIM = SimConfig(max_workers=16, partitions=16, ref_workers=8, cluster=ClusterModel(), profile_workers=(1, 2, 4, 8, 16))


def history() -> pd.Series:
    """Ten days of 5-minute rates (samples/s) with a daily cycle; whole numbers, so the store's
    counts per bin divide back to exactly the same rates."""
    return (daily_series(days=10, step_s=BIN, noise=0.05, seed=4) * 80).round()  # 2,000-11,000/s


def register_champions(uri: str, tmp_path, n, r) -> None:
    import mlflow

    from kale_airflow.forecasting.persist import save_forecaster
    from kale_airflow.registry import mlflow_registry as reg
    from kale_airflow.registry.pyfunc import ForecasterModel, ThroughputModelPyfunc

    save_forecaster(get_forecaster("seasonal").fit(history()), tmp_path / "forecaster")
    (tmp_path / "throughput.json").write_text(json.dumps(ThroughputModel.fit(n, r).to_dict()))
    for name, model, artifacts in ((reg.FORECASTER_MODEL, ForecasterModel(), {"forecaster": str(tmp_path / "forecaster")}),
                                   (reg.THROUGHPUT_MODEL, ThroughputModelPyfunc(),
                                    {"throughput": str(tmp_path / "throughput.json")})):
        with reg.mlflow_at(uri, (tmp_path / "artifacts").as_uri()) as client:
            with mlflow.start_run():
                info = mlflow.pyfunc.log_model(name="model", python_model=model, artifacts=artifacts,
                                               pip_requirements=["pandas"])
            version = reg.register(client, name, info.model_uri, "parity")
            client.set_registered_model_alias(name, reg.CHAMPION, version)


def autoscaler_kale(tmp_path, hist: pd.Series, n, r):
    """Kale as ``Autoscaler`` builds it, from a registry and a control plane on disk."""
    db = f"sqlite:///{tmp_path / 'kale.db'}"
    metrics = EmbeddedMetrics(db)
    metrics.write_traffic(hist * BIN)  # what the autoscaler records: samples per bin
    metrics.write_throughput(np.arange(len(n), dtype=float) + 1.0, n, r)  # in measurement order
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    register_champions(uri, tmp_path, n, r)
    EmbeddedStream(tmp_path / "stream.db", partitions=4)
    dep = Deployment(stream_url=f"sqlite:///{tmp_path / 'stream.db'}", bin_s=BIN, min_workers=SIM.min_workers,
                     max_workers=SIM.max_workers, partitions=SIM.partitions, slo_s=SIM.slo_s,
                     rescale_downtime_s=SIM.rescale_downtime_s, poll_interval_s=SIM.tick_s)
    auto = Autoscaler(Config(Settings(tmp_path, uri, database=db), dep), registry=MlflowChampions(uri))
    auto._champions()
    return auto.policy


def script(start: float, hist: pd.Series):
    """A day of ticks: yesterday's traffic again, with a two-hour burst at twice the rate."""
    day = hist.iloc[-288:].to_numpy()
    rates = np.repeat(day, int(BIN / SIM.tick_s))
    rates[2400:2880] *= 2.0
    return start + SIM.tick_s * np.arange(len(rates)), rates


@pytest.mark.slow
def test_the_autoscaler_builds_the_kale_the_simulator_measures(tmp_path):
    hist = history()
    start = hist.index[-1].value / 1e9 + BIN
    n, r = profile_observations(SIM)
    sim = build_policy("kale", SIM, Workload(start, np.zeros(1), hist, 1.0, SIM.tick_s))
    prod = autoscaler_kale(tmp_path, hist, n, r)
    assert np.array_equal(sim.capacity.table, prod.capacity.table)
    times, rates = script(start, hist)
    noise = np.random.default_rng(7).normal(1.0, 0.03, len(rates))
    workers = backlog = 0.0
    changes = 0
    for t, rate, eps in zip(times, rates, noise):
        cap = SIM.cluster.capacity(max(workers, 1)) * eps
        obs = Observation(float(t), int(workers), float(rate), backlog, 60.0 if backlog else 0.0, None,
                          float(cap) if workers else None, False)
        a = sim.first_start(obs) if not workers else sim.decide(obs)
        b = prod.first_start(obs) if not workers else prod.decide(obs)
        assert (a.workers, a.reason, a.message) == (b.workers, b.reason, b.message), t
        changes += a.workers != workers
        backlog = max(0.0, backlog + (rate - cap) * SIM.tick_s) if workers else 0.0
        workers = a.workers
    assert changes >= 3  # the scenario exercises rescales, not only holds
