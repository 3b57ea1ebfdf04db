"""The steps of the throughput refit DAG: fit the resource-to-throughput model on recorded
(workers, samples/s) observations, score it and the champion on the newest, register it.

Only what the training job measured is fitted: with too few observations the refit fails
and says how to record some (``kale profile``); it never falls back to simulated data.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from kale_airflow.config import Settings
from kale_airflow.core.errors import KaleError
from kale_airflow.core.throughput import ThroughputModel
from kale_airflow.metrics.embedded import SIMULATED_TS, open_metrics
from kale_airflow.pipelines.common import data_hash
from kale_airflow.store.database import masked

MIN_OBSERVATIONS = 4  # with the 2 distinct worker counts the model needs to identify scaling


class NoThroughputObservations(KaleError, ValueError):
    """Too few measured (workers, samples/s) observations to fit; the message says how to record some."""


def measured_observations(settings: Settings) -> pd.DataFrame:
    """The throughput observations the training job recorded, without the simulated rows (at
    :data:`SIMULATED_TS`) that earlier versions seeded; raises
    :class:`NoThroughputObservations` when they cannot identify scaling."""
    obs = open_metrics(settings.metrics_source, settings.database_url, settings.job).throughput_observations()
    simulated = int((obs["ts"] == SIMULATED_TS).sum())
    obs = obs[obs["ts"] != SIMULATED_TS].reset_index(drop=True)
    counts = sorted(int(n) for n in obs["workers"].unique())
    if len(obs) >= MIN_OBSERVATIONS and len(counts) >= 2:
        return obs
    where = (f"the control plane ({masked(settings.database_url)})" if settings.metrics_source == "embedded"
             else f"the {settings.metrics_source} metrics source")
    found = (f"no throughput observations in {where}" if obs.empty else
             f"only {len(obs)} throughput observation(s) at {len(counts)} worker count(s) {counts} in {where}")
    ignored = (f" ({simulated} simulated row(s) at timestamp 0, seeded by an earlier version, are ignored)"
               if simulated else "")
    raise NoThroughputObservations(
        f"{found}{ignored}: the throughput model is fitted only on the training job's own measurements, at "
        f"least {MIN_OBSERVATIONS} of them at 2 or more worker counts, never on simulated data. Record some with "
        "`kale profile` (it runs the job at --workers 1,2,4 and records the samples/s it measures), or let "
        "training workers run at two sizes; then run kale_throughput_refit again.")


def refit_throughput(settings: Settings, run_id: str, holdout_fraction: float = 0.2) -> dict:
    """Fit on older observations, score on the newest; the champion is scored on the same ones."""
    obs = measured_observations(settings).sort_values("ts", kind="stable")  # before MLflow loads: fail fast
    from kale_airflow.registry.mlflow_registry import (
        CHAMPION,
        current_version,
        job_models,
        load_version,
        registry_client,
    )

    name = job_models(settings.job)[1]
    cut = max(2, int(len(obs) * (1 - holdout_fraction)))
    rng = np.random.default_rng(0)
    if obs["ts"].nunique() == 1:  # rows written at one instant (a bulk import) have no order: hold out at random
        obs = obs.iloc[rng.permutation(len(obs))]
    train, test = obs.iloc[:cut], obs.iloc[cut:]
    model = ThroughputModel.fit(train["workers"], train["rate"])
    metrics = {"rel_rmse": _rel_rmse(model, test), "rel_std": model.rel_std, "n_obs": model.n_obs,
               "distinct_counts": len(model.worker_counts),
               "saturation_workers": model.saturation_workers(max(model.worker_counts) * 2) or -1}
    out = settings.run_dir(run_id) / "throughput.json"
    out.write_text(json.dumps(model.to_dict(), indent=2))
    champion = None
    champion_version = current_version(registry_client(settings.mlflow_uri), name, CHAMPION)
    if champion_version:
        champ = load_version(name, champion_version, settings.mlflow_uri).unwrap_python_model().model
        champion = {"rel_rmse": _rel_rmse(champ, test)}
    return {"path": str(out), "metrics": metrics, "champion_metrics": champion, "data_hash": data_hash(obs)}


def register_throughput(settings: Settings, run_id: str, summary: dict) -> dict:
    """Log and register the throughput model."""
    import mlflow

    from kale_airflow.registry.mlflow_registry import job_models, mlflow_at, register
    from kale_airflow.registry.pyfunc import log_throughput, throughput_example

    name = job_models(settings.job)[1]
    with open(summary["path"]) as fh:
        example = throughput_example(ThroughputModel.from_dict(json.load(fh)).worker_counts)
    with mlflow_at(settings.mlflow_uri, settings.artifacts.as_uri()) as client:
        with mlflow.start_run(run_name=f"throughput-{run_id}", tags={"kale.job": settings.job}) as run:
            mlflow.log_params({"data_hash": summary["data_hash"], "airflow_run_id": run_id})
            mlflow.log_metrics(summary["metrics"])
            mlflow.log_artifact(summary["path"])
            info = log_throughput(summary["path"], example)
        version = register(client, name, info.model_uri,
                           f"Resource-to-throughput model of kale-airflow job {settings.job} (samples/s by GPU "
                           "workers).")
    return {"run_id": run.info.run_id, "version": version}


def _rel_rmse(model: ThroughputModel, obs: pd.DataFrame) -> float:
    pred = model.predict(obs["workers"].to_numpy(dtype=float))
    return float(np.sqrt(np.mean(((pred - obs["rate"].to_numpy()) / obs["rate"].to_numpy()) ** 2)))
