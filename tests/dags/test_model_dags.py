"""Both DAGs end to end with dag.test() against a SQLite MLflow store."""

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from kale_airflow.config import Config, Deployment, Settings
from kale_airflow.control.autoscaler import Autoscaler
from kale_airflow.core.traffic import BUNDLED_TRACE, load_trace
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.registry.mlflow_registry import FORECASTER_MODEL, THROUGHPUT_MODEL
from tests.conftest import seed_simulated_throughput

pytestmark = pytest.mark.slow


def alias_version(uri, name, alias):
    try:
        return str(MlflowClient(uri, uri).get_model_version_by_alias(name, alias).version)
    except Exception:  # noqa: BLE001
        return None


def test_forecaster_retrain_registers_promotes_then_holds_for_review(airflow_home):
    run = airflow_home.run("kale_forecaster_retrain", {"forecaster": "seasonal", "history_days": 7,
                                                       "forecaster_options": {"level_window_s": 7200},
                                                       "auto_promote": True})
    assert run.state == "success", run.log[-3000:]
    uri = airflow_home.mlflow_uri
    assert alias_version(uri, FORECASTER_MODEL, "champion") == "1"
    client = MlflowClient(uri, uri)
    v1 = client.get_model_version(FORECASTER_MODEL, "1")
    assert v1.tags["kale.review"] == "promoted"
    run_data = client.get_run(v1.run_id).data
    assert {"train_start", "train_end", "data_hash"} <= set(run_data.params)
    assert run_data.params["option.level_window_s"] == "7200"
    assert run_data.params["traffic_source"] == "bundled seed (no observed traffic yet)"
    assert "mase" in run_data.metrics and "coverage" in run_data.metrics
    assert "backtest.png" in {a.path for a in client.list_artifacts(v1.run_id)}

    # An `auto` challenger (the roster, NeuralProphet included) without auto-promotion waits
    # for review; champion unchanged.
    run = airflow_home.run("kale_forecaster_retrain", {
        "forecaster": "auto", "history_days": 7, "auto_promote": False,
        "forecaster_options": {"member_options": {"neuralprophet": {"epochs": 5}}}})
    assert run.state == "success", run.log[-3000:]
    assert alias_version(uri, FORECASTER_MODEL, "challenger") == "2"
    assert alias_version(uri, FORECASTER_MODEL, "champion") == "1"
    v2 = client.get_model_version(FORECASTER_MODEL, "2")
    assert v2.tags["kale.review"] == "pending"
    assert "champion v1" in v2.description and "challenger mase" in v2.description
    # Every candidate's held-out scores reach the run and the description; the choice is recorded.
    run2 = client.get_run(v2.run_id).data
    roster = ("seasonal", "mstl", "neuralprophet", "ensemble_median", "ensemble_weighted")
    assert {f"candidate.{c}.mase" for c in roster} <= set(run2.metrics)
    assert run2.params["selected"] in roster and v2.tags["kale.selected"] == run2.params["selected"]
    assert all(f"challenger candidate.{c}.mase" in v2.description for c in roster)

    # The registered model loads through pyfunc and forecasts after the history it is given.
    import mlflow.pyfunc

    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/{FORECASTER_MODEL}@challenger")
    hist = load_trace(BUNDLED_TRACE).series.iloc[-144:]  # nothing observed yet: it trained on the bundled trace
    out = model.predict(hist.rename("value").reset_index().rename(columns={"index": "timestamp"}),
                        params={"horizon": 2})
    assert list(out.columns) == ["timestamp", "mean", "q50", "q80", "q90"]
    assert pd.Timestamp(out["timestamp"].iloc[0]) == hist.index[-1] + pd.Timedelta(minutes=30)
    champion = mlflow.pyfunc.load_model(f"models:/{FORECASTER_MODEL}@champion").unwrap_python_model()
    assert champion.forecaster.level_window_s == 7200  # the options travel with the registered model


def test_unknown_forecaster_option_fails_training_naming_the_accepted_ones(airflow_home):
    run = airflow_home.run("kale_forecaster_retrain", {"forecaster": "seasonal", "history_days": 7,
                                                       "forecaster_options": {"level_window": 60}})
    assert run.state == "failed" and run.tasks["train_backtest"] == "failed"
    assert "bad options {'level_window': 60} for forecaster 'seasonal'" in run.log
    assert "level_window_s" in run.log  # among the accepted options
    assert alias_version(airflow_home.mlflow_uri, FORECASTER_MODEL, "challenger") is None


def asset_events(home) -> list:
    """(asset URI, extra) of every asset event in the run's Airflow metadata database."""
    import json
    import sqlite3

    with sqlite3.connect(home.path / "airflow.db") as db:
        rows = db.execute("SELECT a.uri, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id").fetchall()
    return [(u, json.loads(x) if isinstance(x, str) else x) for u, x in rows]


def test_throughput_refit_registers_and_promotes(airflow_home):
    airflow_home.kale_home.mkdir(parents=True, exist_ok=True)
    seed_simulated_throughput(f"sqlite:///{airflow_home.kale_home / 'kale.db'}")  # the simulator's profiled cluster
    run = airflow_home.run("kale_throughput_refit")
    assert run.state == "success", run.log[-3000:]
    uri = airflow_home.mlflow_uri
    assert alias_version(uri, THROUGHPUT_MODEL, "champion") == "1"
    # The promotion is an asset event (what Airflow's asset views and asset-scheduled DAGs see)
    # and a row the autoscaler checks at each poke.
    from kale_airflow.control.promotions import PROMOTION_KEY
    from kale_airflow.store import StateStore

    assert run.tasks["announce_champion"] == "success"
    [(asset, extra)] = asset_events(airflow_home)
    assert asset == "kale://models/throughput" and (extra["model"], extra["version"]) == (THROUGHPUT_MODEL, "1")
    assert StateStore(f"sqlite:///{airflow_home.kale_home / 'kale.db'}").get_value(PROMOTION_KEY) == extra
    held = airflow_home.run("kale_throughput_refit", {"auto_promote": False})
    assert held.state == "success" and held.tasks["announce_champion"] == "skipped", held.log[-3000:]
    assert len(asset_events(airflow_home)) == 1  # a challenger held for review announces nothing
    import mlflow.pyfunc

    mlflow.set_tracking_uri(uri)
    pred = mlflow.pyfunc.load_model(f"models:/{THROUGHPUT_MODEL}@champion").predict(pd.DataFrame({"workers": [1, 32]}))
    assert pred["samples_per_s"].iloc[1] == pytest.approx(24_427, rel=0.03)  # the profiled cluster
    assert (pred["lower_bound"] <= pred["samples_per_s"]).all()


def _store(home, values):
    idx = pd.date_range("2024-01-01", periods=len(values), freq="30min")
    EmbeddedMetrics(home.kale_home / "kale.db").write_traffic(pd.Series(values, index=idx))


def test_bad_history_fails_validation_and_changes_no_alias(airflow_home):
    """A failed validation fails the run before anything is registered. Each bad history's
    message: tests/pipelines/test_forecaster_steps.py."""
    _store(airflow_home, np.full(480, 250.0))
    run = airflow_home.run("kale_forecaster_retrain", {"forecaster": "seasonal", "history_days": 10,
                                                       "auto_promote": True})
    assert run.state == "failed"
    assert run.tasks["validate"] == "failed" and run.tasks["register"] != "success"
    assert "traffic history is constant" in run.log
    assert alias_version(airflow_home.mlflow_uri, FORECASTER_MODEL, "challenger") is None


def test_unreachable_mlflow_fails_with_a_clear_message(airflow_home):
    # An unreachable MLflow is retried (2 retries, 5 min apart and more): run the last try.
    run = airflow_home.run("kale_forecaster_retrain", {"forecaster": "seasonal", "history_days": 7},
                           extra_env={"KALE_MLFLOW_URI": "http://127.0.0.1:9"}, retries=0)
    assert run.state == "failed"
    assert run.tasks["train_backtest"] == "failed"
    assert "MLflow at http://127.0.0.1:9 is unreachable" in run.log
    assert "No model or alias was changed" in run.log


def test_retrain_trains_on_the_traffic_the_autoscaler_recorded(airflow_home):
    """Traffic produced into the stream and recorded bin by bin by the autoscaler's pokes is
    what the next retrain trains on (its MLflow run says so and names the range). The
    backtest's reference (daily seasonal naive) needs a day of history, so the producer
    writes 28 hours of 10-minute bins with past timestamps instead of waiting for them."""
    import time

    from kale_airflow.stream.embedded import EmbeddedStream

    home, bin_s, bins = airflow_home.kale_home, 600.0, 170
    home.mkdir(parents=True, exist_ok=True)
    stream = EmbeddedStream(home / "stream.db", partitions=2)
    start = (int(time.time() // bin_s) - bins - 2) * bin_s
    for k in range(bins):  # a daily-looking rate: rises and falls every 12 bins
        stream.append(k % 2, [b"x"] * (50 + 30 * (k % 12)), ts=start + k * bin_s + 1.0)
    env = Settings(home, airflow_home.mlflow_uri, database=f"sqlite:///{home / 'kale.db'}")
    dep = Deployment(stream_url=f"sqlite:///{home / 'stream.db'}", bin_s=bin_s)
    auto = Autoscaler(Config(env, dep), registry=object(), pods=list)
    for k in range(bins):  # one poke per bin: each records the bins that ended since the last
        auto.record_traffic(start + (k + 1) * bin_s)
    recorded = EmbeddedMetrics(env.database_url).traffic_history(3)
    # The first poke backfilled 11 empty bins before the traffic began: observed zeros, not gaps.
    first = start - 11 * bin_s
    assert recorded.index[0] == pd.Timestamp(first, unit="s") and len(recorded) == bins + 11
    assert (recorded.iloc[:11] == 0).all() and recorded.iloc[11] == 50 and recorded.iloc[22] == 50 + 30 * 11

    run = airflow_home.run("kale_forecaster_retrain", {
        "forecaster": "seasonal", "history_days": 3, "test_days": 0.1, "horizon_minutes": 60,
        "forecaster_options": {"level_window_s": 3600}, "auto_promote": True})
    assert run.state == "success", run.log[-3000:]
    client = MlflowClient(airflow_home.mlflow_uri, airflow_home.mlflow_uri)
    params = client.get_run(client.get_model_version(FORECASTER_MODEL, "1").run_id).data.params
    assert params["traffic_source"] == "observed"
    assert pd.Timestamp(params["train_start"]) == pd.Timestamp(first, unit="s")
    assert pd.Timestamp(params["train_end"]) < pd.Timestamp(start + bins * bin_s, unit="s")
