"""The steps of the retrain/refit DAGs, as plain functions (the DAG files stay thin).

Data moves between steps as files under ``$KALE_HOME/runs/<run>/``; XCom carries only
small dicts (paths, metrics, versions).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kale_airflow.config import Settings
from kale_airflow.core.backtest import evaluate, split
from kale_airflow.core.forecast import ForecastError, get_forecaster, quantile_column
from kale_airflow.core.throughput import ThroughputModel
from kale_airflow.core.traffic import TraceError, load_trace
from kale_airflow.metrics.embedded import open_metrics

log = logging.getLogger(__name__)
MIN_HISTORY_DAYS = 2.0


def run_dir(settings: Settings, run_id: str) -> Path:
    """Per-run working folder."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)
    path = settings.home / "runs" / safe
    path.mkdir(parents=True, exist_ok=True)
    return path


# ----------------------------------------------------------------- forecaster
def extract_traffic(settings: Settings, run_id: str, history_days: float) -> dict:
    """Read the traffic history from the metrics source into ``history.csv``."""
    series = open_metrics(settings.metrics_source, settings.metrics_db).traffic_history(history_days)
    path = run_dir(settings, run_id) / "history.csv"
    series.rename("value").to_csv(path, index_label="timestamp")
    log.info("extracted %d rows (%s .. %s) to %s", len(series), series.index[0], series.index[-1], path)
    return {"path": str(path), "rows": len(series), "start": str(series.index[0]), "end": str(series.index[-1])}


def validate_traffic(path: str, horizon_minutes: float) -> dict:
    """Strict validation: bad rows, gaps, NaNs, too short or constant history fail the task."""
    trace = load_trace(path, min_rows=2)
    days = trace.duration_s / 86400
    if days < MIN_HISTORY_DAYS:
        raise TraceError(
            f"history covers {days:.2f} days; at least {MIN_HISTORY_DAYS:g} days are needed "
            "(one to train on, one to backtest): raise the history_days param or wait for more data"
        )
    if np.ptp(trace.values) == 0:
        raise TraceError("traffic history is constant; a forecaster would learn nothing: check the metrics source")
    if horizon_minutes * 60 < trace.step_s:
        raise TraceError(f"horizon {horizon_minutes:g} min is shorter than the data step {trace.step_s:g} s")
    return {"rows": len(trace.series), "step_s": trace.step_s, "days": days}


def train_and_backtest(settings: Settings, run_id: str, path: str, forecaster: str, horizon_minutes: float,
                       test_days: float, options: dict | None = None) -> dict:
    """Train the challenger (``forecaster`` built with ``options``) before the test window;
    backtest it and the champion on that window."""
    from kale_airflow.forecasting.persist import save_forecaster
    from kale_airflow.plotting import plot_backtest
    from kale_airflow.registry.mlflow_registry import FORECASTER_MODEL, current_version, load_champion, mlflow_at

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
    out = run_dir(settings, run_id)
    save_forecaster(model, out / "forecaster")
    plot_backtest(result, out / "backtest.png")
    champion_metrics = None
    with mlflow_at(settings.mlflow_uri, settings.artifacts.as_uri()) as client:
        if current_version(client, FORECASTER_MODEL, "champion"):
            champ = load_champion(FORECASTER_MODEL, settings.mlflow_uri).unwrap_python_model().forecaster
            try:
                champion_metrics = evaluate(series, champ, horizon, first_origin=cut, stride=horizon).metrics
            except (ForecastError, ValueError) as exc:
                log.warning("champion could not forecast this window (%s); it counts as losing", exc)
                champion_metrics = {"mase": float("inf"), "error": str(exc)}
    summary = {
        "model_dir": str(out / "forecaster"),
        "plot": str(out / "backtest.png"),
        "metrics": _flat(metrics),
        "champion_metrics": _flat(champion_metrics) if champion_metrics else None,
        "train_start": str(series.index[start]),
        "train_end": str(series.index[cut - 1]),
        "data_hash": _hash(series.iloc[start:cut]),
        "forecaster": forecaster,
        "options": options or {},
        "horizon_steps": horizon,
        "quantile_columns": [quantile_column(q) for q in model.quantiles],
    }
    return summary


def register_forecaster(settings: Settings, run_id: str, summary: dict) -> dict:
    """Log the run (params, metrics, plot, window, data hash) and register a new version."""
    import mlflow

    from kale_airflow.registry.mlflow_registry import FORECASTER_MODEL, mlflow_at, register
    from kale_airflow.registry.pyfunc import ForecasterModel, forecaster_signature

    with mlflow_at(settings.mlflow_uri, settings.artifacts.as_uri()) as client:
        with mlflow.start_run(run_name=f"forecaster-{run_id}") as run:
            mlflow.log_params({"forecaster": summary["forecaster"], "horizon_steps": summary["horizon_steps"],
                               "train_start": summary["train_start"], "train_end": summary["train_end"],
                               "data_hash": summary["data_hash"], "airflow_run_id": run_id}
                              | {f"option.{k}": v for k, v in summary.get("options", {}).items()})
            mlflow.log_metrics({k: v for k, v in summary["metrics"].items() if isinstance(v, (int, float))})
            mlflow.log_artifact(summary["plot"])
            mlflow.pyfunc.log_model(name="model", python_model=ForecasterModel(),
                                    artifacts={"forecaster": summary["model_dir"]},
                                    signature=forecaster_signature(summary["quantile_columns"],
                                                                   summary["horizon_steps"]))
        version = register(client, FORECASTER_MODEL, run.info.run_id, "model",
                           "Traffic forecaster for kale-airflow (samples per step; mean and quantiles).")
    return {"run_id": run.info.run_id, "version": version}


def promote_or_hold(settings: Settings, name: str, version: str, challenger: dict, champion: dict | None,
                    metric: str, auto_promote: bool) -> dict:
    """Compare on the recorded metric (lower is better) and move aliases or tag for review."""
    from kale_airflow.registry.mlflow_registry import mlflow_at, review

    comparison = {f"challenger {k}": v for k, v in challenger.items() if isinstance(v, (int, float))}
    if champion:
        comparison |= {f"champion {k}": v for k, v in champion.items() if isinstance(v, (int, float))}
    with mlflow_at(settings.mlflow_uri) as client:
        r = review(client, name, version, challenger[metric], champion.get(metric) if champion else None, metric,
                   auto_promote, comparison)
    return r.to_dict()


# ------------------------------------------------------------------ throughput
def refit_throughput(settings: Settings, run_id: str, holdout_fraction: float = 0.2) -> dict:
    """Fit on older observations, score on the newest; the champion is scored on the same ones."""
    from kale_airflow.registry.mlflow_registry import THROUGHPUT_MODEL, current_version, load_champion, mlflow_at

    obs = open_metrics(settings.metrics_source, settings.metrics_db).throughput_observations()
    if len(obs) < 4:
        raise ValueError(f"only {len(obs)} throughput observations; workers must record at least 4 to fit")
    obs = obs.sort_values("ts", kind="stable")
    cut = max(2, int(len(obs) * (1 - holdout_fraction)))
    rng = np.random.default_rng(0)
    if obs["ts"].nunique() == 1:  # seeded profiling rows share one timestamp: hold out at random
        obs = obs.iloc[rng.permutation(len(obs))]
    train, test = obs.iloc[:cut], obs.iloc[cut:]
    model = ThroughputModel.fit(train["workers"], train["rate"])
    metrics = {"rel_rmse": _rel_rmse(model, test), "rel_std": model.rel_std, "n_obs": model.n_obs,
               "distinct_counts": len(model.worker_counts),
               "saturation_workers": model.saturation_workers(max(model.worker_counts) * 2) or -1}
    out = run_dir(settings, run_id) / "throughput.json"
    out.write_text(json.dumps(model.to_dict(), indent=2))
    champion = None
    with mlflow_at(settings.mlflow_uri, settings.artifacts.as_uri()) as client:
        if current_version(client, THROUGHPUT_MODEL, "champion"):
            champ = load_champion(THROUGHPUT_MODEL, settings.mlflow_uri).unwrap_python_model().model
            champion = {"rel_rmse": _rel_rmse(champ, test)}
    return {"path": str(out), "metrics": metrics, "champion_metrics": champion, "data_hash": _hash(obs)}


def register_throughput(settings: Settings, run_id: str, summary: dict) -> dict:
    """Log and register the throughput model."""
    import mlflow

    from kale_airflow.registry.mlflow_registry import THROUGHPUT_MODEL, mlflow_at, register
    from kale_airflow.registry.pyfunc import ThroughputModelPyfunc, throughput_signature

    with mlflow_at(settings.mlflow_uri, settings.artifacts.as_uri()) as client:
        with mlflow.start_run(run_name=f"throughput-{run_id}") as run:
            mlflow.log_params({"data_hash": summary["data_hash"], "airflow_run_id": run_id})
            mlflow.log_metrics(summary["metrics"])
            mlflow.log_artifact(summary["path"])
            mlflow.pyfunc.log_model(name="model", python_model=ThroughputModelPyfunc(),
                                    artifacts={"throughput": summary["path"]}, signature=throughput_signature())
        version = register(client, THROUGHPUT_MODEL, run.info.run_id, "model",
                           "Resource-to-throughput model for kale-airflow (samples/s by GPU workers).")
    return {"run_id": run.info.run_id, "version": version}


def _rel_rmse(model: ThroughputModel, obs: pd.DataFrame) -> float:
    pred = model.predict(obs["workers"].to_numpy(dtype=float))
    return float(np.sqrt(np.mean(((pred - obs["rate"].to_numpy()) / obs["rate"].to_numpy()) ** 2)))


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


def _hash(frame) -> str:
    from kale_airflow.registry.mlflow_registry import data_hash

    return data_hash(frame)

