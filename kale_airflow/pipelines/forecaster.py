"""The steps of the forecaster retrain DAG, as plain functions (the DAG file stays thin).

Data moves between steps as files under ``$KALE_HOME/runs/<run>/``; XCom carries only
small dicts (paths, metrics, versions).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from kale_airflow.config import Settings
from kale_airflow.core.backtest import evaluate, selection_of, split
from kale_airflow.core.forecast import ForecastError, get_forecaster, quantile_column
from kale_airflow.core.traffic import BUNDLED_TRACE, TraceError, load_trace
from kale_airflow.metrics.embedded import MetricsError, open_job_metrics
from kale_airflow.pipelines.common import data_hash

log = logging.getLogger(__name__)
MIN_STEPS = 24  # a day of 1-hour steps, two minutes of 5-second bins


def extract_traffic(settings: Settings, run_id: str, history_days: float) -> dict:
    """Read the last ``history_days`` of observed traffic (what the autoscaler recorded from
    the stream) into ``history.csv``. Before anything was observed, the bundled NYC taxi
    trace stands in, and ``source`` says so (it is logged with the MLflow run)."""
    try:
        metrics = open_job_metrics(settings)
        series = metrics.traffic_history(history_days)
        source = "observed"
    except MetricsError as exc:
        log.warning("no observed traffic yet (%s): training on the bundled NYC taxi trace instead", exc)
        seed = load_trace(BUNDLED_TRACE).series
        series = seed[seed.index > seed.index[-1] - pd.Timedelta(days=history_days)]
        source = "bundled seed (no observed traffic yet)"
    path = settings.run_dir(run_id) / "history.csv"
    series.rename("value").to_csv(path, index_label="timestamp")
    log.info("extracted %d rows of %s traffic (%s .. %s) to %s", len(series), source, series.index[0],
             series.index[-1], path)
    return {"path": str(path), "rows": len(series), "start": str(series.index[0]), "end": str(series.index[-1]),
            "source": source}


def validate_traffic(path: str, horizon_minutes: float, test_days: float) -> dict:
    """Strict validation: bad rows, gaps, NaNs, too short or constant history fail the task.

    The history must hold the backtest window twice (train before it, then test on it)
    and at least ``MIN_STEPS`` steps."""
    trace = load_trace(path, min_rows=2)
    days = trace.duration_s / 86400
    if days < 2 * test_days or len(trace.series) < MIN_STEPS:
        raise TraceError(
            f"history covers {days:.3g} days in {len(trace.series)} steps; at least {2 * test_days:.3g} days "
            f"(twice test_days: train, then backtest) and {MIN_STEPS} steps are needed: raise the history_days "
            "param, lower test_days, or wait for more observed traffic"
        )
    if np.ptp(trace.values) == 0:
        raise TraceError("traffic history is constant; a forecaster would learn nothing: check the metrics source")
    if horizon_minutes * 60 < trace.step_s:
        raise TraceError(f"horizon {horizon_minutes:g} min is shorter than the data step {trace.step_s:g} s")
    return {"rows": len(trace.series), "step_s": trace.step_s, "days": days}


def train_and_backtest(settings: Settings, run_id: str, path: str, forecaster: str, horizon_minutes: float,
                       test_days: float, options: dict | None = None, source: str = "observed") -> dict:
    """Train the challenger (``forecaster`` built with ``options``) before the test window;
    backtest it and the champion on that window.

    With ``auto`` the training itself backtests the roster on the last days before the test
    window and keeps the winner; ``selected`` and every candidate's scores there join the
    summary (``candidate.<name>.<score>`` metrics, logged to the run and written into the
    version's description by the review)."""
    from kale_airflow.forecasting.persist import save_forecaster
    from kale_airflow.registry.pyfunc import EXAMPLE_ROWS
    from kale_airflow.reporting.plots import plot_backtest

    trace = load_trace(path, min_rows=2)
    series = trace.series
    horizon = max(1, int(round(horizon_minutes * 60 / trace.step_s)))
    cut, start = split(series, horizon, test_days)
    model = get_forecaster(forecaster, **(options or {}))
    t0 = time.perf_counter()
    model.fit(series.iloc[start:cut])
    fit_seconds = time.perf_counter() - t0
    result = evaluate(series, model, horizon, first_origin=cut, stride=horizon)
    metrics = result.metrics | {"fit_seconds": fit_seconds}
    selection = selection_of(model)
    for cand, scores in selection.get("candidates", {}).items():
        metrics |= {f"candidate.{cand}.{k}": v for k, v in scores.items() if isinstance(v, (int, float))}
    out = settings.run_dir(run_id)
    save_forecaster(model, out / "forecaster")
    plot_backtest(result, out / "backtest.png")
    example = series.iloc[max(start, cut - EXAMPLE_ROWS):cut].rename("value")  # the end of the training window
    example.to_csv(out / "example.csv", index_label="timestamp")
    champion_metrics = _champion_metrics(settings, series, horizon, cut)
    summary = {
        "model_dir": str(out / "forecaster"),
        "example_path": str(out / "example.csv"),
        "plot": str(out / "backtest.png"),
        "metrics": _flat(metrics),
        "champion_metrics": _flat(champion_metrics) if champion_metrics else None,
        "train_start": str(series.index[start]),
        "train_end": str(series.index[cut - 1]),
        "data_hash": data_hash(series.iloc[start:cut]),
        "forecaster": forecaster,
        "selected": selection.get("selected"),
        "options": options or {},
        "traffic_source": source,
        "horizon_steps": horizon,
        "quantile_columns": [quantile_column(q) for q in model.quantiles],
    }
    return summary


def _champion_metrics(settings: Settings, series: pd.Series, horizon: int, cut: int) -> dict | None:
    """The champion's backtest on the challenger's test window (None: no champion yet)."""
    from kale_airflow.registry.mlflow_registry import (
        CHAMPION,
        current_version,
        job_models,
        load_version,
        registry_client,
    )

    model = job_models(settings.job)[0]
    champion_version = current_version(registry_client(settings.mlflow_uri), model, CHAMPION)
    if not champion_version:
        return None
    champ = load_version(model, champion_version, settings.mlflow_uri).unwrap_python_model().forecaster
    try:
        return evaluate(series, champ, horizon, first_origin=cut, stride=horizon).metrics
    except (ForecastError, ValueError) as exc:
        log.warning("champion could not forecast this window (%s); it counts as losing", exc)
        return {"mase": float("inf"), "error": str(exc)}


def register_forecaster(settings: Settings, run_id: str, summary: dict) -> dict:
    """Log the run (params, metrics, plot, window, data hash) and register a new version."""
    import mlflow

    from kale_airflow.registry.mlflow_registry import job_models, mlflow_at, register
    from kale_airflow.registry.pyfunc import forecaster_example, log_forecaster

    model = job_models(settings.job)[0]
    example = None  # a summary from before input examples were logged has none
    if summary.get("example_path"):
        tail = pd.read_csv(summary["example_path"], index_col="timestamp", parse_dates=["timestamp"])["value"]
        example = forecaster_example(tail, summary["horizon_steps"])
    with mlflow_at(settings.mlflow_uri, settings.artifacts.as_uri()) as client:
        with mlflow.start_run(run_name=f"forecaster-{run_id}", tags={"kale.job": settings.job}) as run:
            mlflow.log_params({"forecaster": summary["forecaster"], "horizon_steps": summary["horizon_steps"],
                               "train_start": summary["train_start"], "train_end": summary["train_end"],
                               "data_hash": summary["data_hash"], "airflow_run_id": run_id,
                               "traffic_source": summary.get("traffic_source", "observed")}
                              | ({"selected": summary["selected"]} if summary.get("selected") else {})
                              | {f"option.{k}": v for k, v in summary.get("options", {}).items()})
            mlflow.log_metrics({k: v for k, v in summary["metrics"].items() if isinstance(v, (int, float))})
            mlflow.log_artifact(summary["plot"])
            info = log_forecaster(summary["model_dir"], summary["quantile_columns"], summary["horizon_steps"],
                                  example)
        version = register(client, model, info.model_uri,
                           f"Traffic forecaster of kale-airflow job {settings.job} (samples per step; mean and "
                           "quantiles).")
        if summary.get("selected"):
            client.set_model_version_tag(model, version, "kale.selected", summary["selected"])
    return {"run_id": run.info.run_id, "version": version}


def _flat(metrics: dict) -> dict:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update({f"{k}_{kk}": vv for kk, vv in v.items()})
        elif isinstance(v, (int, float, str)) and not (isinstance(v, float) and not np.isfinite(v)):
            out[k] = v
        elif isinstance(v, float):
            out[k] = 1e300  # MLflow and JSON cannot carry inf; a huge score still loses
    return out
