"""Both models are logged as MLflow 3 expects, against a real SQLite MLflow store: ``name=``,
models from code (nothing pickled), a signature and an input example, registered from the
logged model's ``models:/m-...`` URI. MLflow warns about none of it (bug classes: a missing
input example, a pickled ``python_model``, registering ``runs:/RUN/model``, each of which
MLflow 3.17 warns about), and a registered version loads and answers its own example."""

from __future__ import annotations

import json
import logging
import warnings

import pandas as pd
import pytest

from kale_airflow.config import Settings
from kale_airflow.core.throughput import ThroughputModel
from kale_airflow.registry import mlflow_registry as reg
from kale_airflow.registry.pyfunc import EXAMPLE_ROWS
from tests.conftest import daily_series

# Not ours: MLflow 3.17's own SQL store uses a loader strategy SQLAlchemy 2.1 deprecates.
THIRD_PARTY = ("The ``noload`` loader strategy is deprecated",)


class Collect(logging.Handler):
    """MLflow's loggers do not propagate to the root logger (so caplog misses them): collect here."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """The retrain's train and register steps and the refit's register step, on one store; with
    every warning and every MLflow log record at WARNING or above they produced."""
    from kale_airflow.pipelines.forecaster import register_forecaster, train_and_backtest
    from kale_airflow.pipelines.throughput import register_throughput

    home = tmp_path_factory.mktemp("kale")
    settings = Settings(home, f"sqlite:///{home / 'mlflow.db'}", database=f"sqlite:///{home / 'kale.db'}")
    daily_series(days=4, step_s=1800).rename("value").to_csv(home / "history.csv", index_label="timestamp")
    (home / "throughput.json").write_text(json.dumps(ThroughputModel.fit([1, 2, 4, 8], [10.0, 19.0, 37.0, 70.0])
                                                     .to_dict()))
    # Opening the store first: it loads Airflow's SDK, whose logging setup replaces
    # warnings.showwarning, which inside catch_warnings would take the warnings away from it.
    with reg.mlflow_at(settings.mlflow_uri, (home / "mlartifacts").as_uri()):
        pass
    handler, loggers = Collect(), [logging.getLogger("mlflow")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary = train_and_backtest(settings, "run-1", str(home / "history.csv"), "seasonal", 60, 1)
            forecaster = register_forecaster(settings, "run-1", summary)
            throughput = register_throughput(settings, "run-1", {
                "path": str(home / "throughput.json"), "metrics": {"rel_rmse": 0.05}, "data_hash": "abc"})
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    return settings, summary, forecaster, throughput, caught, handler.records


def test_logging_and_registering_raise_no_mlflow_warning(registered):
    *_, caught, records = registered
    ours = [f"{w.category.__name__}: {w.message}" for w in caught if not any(t in str(w.message) for t in THIRD_PARTY)]
    assert ours == []
    assert [f"{r.name}: {r.getMessage()[:200]}" for r in records] == []


@pytest.mark.parametrize("model", [reg.FORECASTER_MODEL, reg.THROUGHPUT_MODEL])
def test_a_version_is_registered_from_the_logged_model_with_an_input_example(registered, model):
    import mlflow.models

    settings, _, forecaster, throughput, *_ = registered
    version = (forecaster if model == reg.FORECASTER_MODEL else throughput)["version"]
    client = reg.registry_client(settings.mlflow_uri)
    mv = client.get_model_version(model, version)
    assert mv.source.startswith("models:/m-"), mv.source  # the logged model, not runs:/RUN/model
    assert reg.current_version(client, model, reg.CHALLENGER) == version
    with reg.mlflow_at(settings.mlflow_uri):
        info = mlflow.models.get_model_info(mv.source)
    assert info.saved_input_example_info is not None and info.signature is not None
    assert "python_model.pkl" not in json.dumps(info.flavors)  # models from code: nothing pickled


def test_a_registered_version_loads_from_code_and_answers_its_input_example(registered):
    settings, summary, forecaster, throughput, *_ = registered
    pyfunc = reg.load_version(reg.FORECASTER_MODEL, forecaster["version"], settings.mlflow_uri)
    example = pd.read_csv(summary["example_path"], parse_dates=["timestamp"])
    assert 0 < len(example) <= EXAMPLE_ROWS
    assert example["timestamp"].iloc[-1] == pd.Timestamp(summary["train_end"])  # the end of the training window
    out = pyfunc.predict(example, params={"horizon": 2})
    assert list(out.columns) == ["timestamp", "mean", *summary["quantile_columns"]] and len(out) == 2
    model = reg.load_version(reg.THROUGHPUT_MODEL, throughput["version"], settings.mlflow_uri)
    rates = model.predict(pd.DataFrame({"workers": [1, 8]}))
    assert list(rates.columns) == ["workers", "samples_per_s", "lower_bound"] and rates["samples_per_s"].iloc[1] > 60
