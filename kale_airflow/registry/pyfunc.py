"""Thin MLflow pyfunc wrappers: load once in ``load_context``, delegate in ``predict``.

Both are logged as "models from code" (:data:`FORECASTER_CODE`, :data:`THROUGHPUT_CODE`:
nothing is pickled) with a signature and an input example, by :func:`log_forecaster` and
:func:`log_throughput`."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow.pyfunc
import pandas as pd

FORECASTER_CODE = Path(__file__).with_name("forecaster_model.py")
THROUGHPUT_CODE = Path(__file__).with_name("throughput_model.py")
EXAMPLE_ROWS = 288  # a day of the autoscaler's 5-minute traffic bins: enough history for every forecaster


class ForecasterModel(mlflow.pyfunc.PythonModel):
    """Input: a history frame ``timestamp,value``; params: ``horizon`` (steps).
    Output: the forecast frame (``timestamp, mean, q50, q80, q90``)."""

    def load_context(self, context):
        from kale_airflow.forecasting.persist import load_forecaster

        self.forecaster = load_forecaster(context.artifacts["forecaster"])

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        from kale_airflow.core.backtest import forecast_from

        horizon = int((params or {}).get("horizon", 12))
        history = pd.Series(model_input["value"].to_numpy(dtype=float),
                            index=pd.DatetimeIndex(pd.to_datetime(model_input["timestamp"])))
        return forecast_from(self.forecaster, history, horizon).reset_index()


class ThroughputModelPyfunc(mlflow.pyfunc.PythonModel):
    """Input: a frame with ``workers``. Output: ``workers, samples_per_s, lower_bound``."""

    def load_context(self, context):
        from kale_airflow.core.throughput import ThroughputModel

        with open(context.artifacts["throughput"]) as fh:
            self.model = ThroughputModel.from_dict(json.load(fh))

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        n = model_input["workers"].to_numpy(dtype=float)
        return pd.DataFrame({"workers": n.astype(int), "samples_per_s": self.model.predict(n),
                             "lower_bound": self.model.capacity_lower(n)})


def forecaster_signature(quantile_columns: list[str], default_horizon: int = 12):
    """Signature: history frame in, forecast frame out, ``horizon`` (steps) as a param."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("datetime", "timestamp"), ColSpec("double", "value")]),
        outputs=Schema([ColSpec("datetime", "timestamp"), ColSpec("double", "mean")]
                       + [ColSpec("double", c) for c in quantile_columns]),
        params=ParamSchema([ParamSpec("horizon", "long", default_horizon)]),
    )


def throughput_signature():
    """Signature: worker counts in, mean and conservative samples/s out."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("long", "workers")]),
        outputs=Schema([ColSpec("long", "workers"), ColSpec("double", "samples_per_s"),
                        ColSpec("double", "lower_bound")]),
    )


def forecaster_example(history: pd.Series, horizon: int, rows: int = EXAMPLE_ROWS) -> tuple[pd.DataFrame, dict]:
    """The forecaster's input example: the last ``rows`` steps of ``history`` (a series indexed
    by time) as the history frame, and the ``horizon`` param."""
    tail = history.iloc[-rows:]
    frame = pd.DataFrame({"timestamp": pd.DatetimeIndex(tail.index), "value": tail.to_numpy(dtype=float)})
    return frame, {"horizon": int(horizon)}


def throughput_example(worker_counts) -> pd.DataFrame:
    """The throughput model's input example: the worker counts it was fitted on."""
    return pd.DataFrame({"workers": sorted(int(n) for n in worker_counts)}).astype("int64")


def log_forecaster(model_dir: str, quantile_columns: list[str], horizon: int, example: tuple[pd.DataFrame, dict]):
    """Log the forecaster saved in ``model_dir`` to the active run as ``name="model"``; returns
    MLflow's ``ModelInfo`` (its ``model_uri`` is what :func:`~.mlflow_registry.register` takes)."""
    return mlflow.pyfunc.log_model(name="model", python_model=str(FORECASTER_CODE),
                                   artifacts={"forecaster": model_dir},
                                   signature=forecaster_signature(quantile_columns, horizon), input_example=example)


def log_throughput(path: str, example: pd.DataFrame):
    """Log the throughput model saved at ``path`` (JSON) to the active run as ``name="model"``;
    returns MLflow's ``ModelInfo``."""
    return mlflow.pyfunc.log_model(name="model", python_model=str(THROUGHPUT_CODE), artifacts={"throughput": path},
                                   signature=throughput_signature(), input_example=example)
