"""Thin MLflow pyfunc wrappers: load once in ``load_context``, delegate in ``predict``."""

from __future__ import annotations

import json

import mlflow.pyfunc
import pandas as pd


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
