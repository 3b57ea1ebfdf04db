"""The retrain DAG's extract and validate steps in process, on what the store holds: a bad
history fails validation with a message naming the problem (the DAG run that fails on one
is tests/dags/test_model_dags.py)."""

import numpy as np
import pandas as pd
import pytest

from kale_airflow.config import Settings
from kale_airflow.core.traffic import TraceError
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.pipelines.forecaster import extract_traffic, validate_traffic

WAVE = 100 + 50 * np.sin(np.arange(480) / 7.6)
BAD = [
    (np.where(np.arange(480) == 300, np.nan, WAVE), "value is missing (NaN)"),
    (np.full(480, 250.0), "traffic history is constant"),
    (WAVE[:60], "(twice test_days: train, then backtest)"),
]


def extracted(tmp_path, values) -> dict:
    db = tmp_path / "kale.db"
    idx = pd.date_range("2024-01-01", periods=len(values), freq="30min")
    EmbeddedMetrics(db).write_traffic(pd.Series(values, index=idx))
    return extract_traffic(Settings(tmp_path, "sqlite:///unused", database=f"sqlite:///{db}"), "run", 10)


@pytest.mark.parametrize("values, message", BAD, ids=["nan", "constant", "too-short"])
def test_a_bad_history_in_the_store_fails_validation_naming_the_problem(tmp_path, values, message):
    out = extracted(tmp_path, values)
    assert out["source"] == "observed" and out["rows"] == len(values)
    with pytest.raises(TraceError) as err:
        validate_traffic(out["path"], 60, 3)
    assert message in str(err.value)


def test_a_good_history_passes_validation(tmp_path):
    out = extracted(tmp_path, WAVE)
    assert validate_traffic(out["path"], 60, 3) == {"rows": 480, "step_s": 1800.0, "days": 10.0}  # 480 half-hour steps


def test_a_horizon_shorter_than_the_data_step_fails(tmp_path):
    with pytest.raises(TraceError, match="horizon 10 min is shorter than the data step 1800 s"):
        validate_traffic(extracted(tmp_path, WAVE)["path"], 10, 3)
