"""Forecaster benchmark (issue 3): accuracy, training and serving speed, value in the simulator.

For each trace in the traces folder:
- rolling-origin backtest 1 h ahead over the last 7 days (training on at most 28 days
  before them), seasonal baseline and NeuralProphet: MASE against daily seasonal naive,
  sMAPE, p90 coverage, fit time;
- Kale with NeuralProphet vs Kale with the seasonal baseline vs the oracle in the
  simulator over ``--sim-days`` days: the share of the GPU-hours gap to the oracle that
  NeuralProphet closes, at what lag and SLO.
Plus: NeuralProphet retraining time on 14 days of 1-minute data, and loading the
registered champion from a SQLite MLflow registry and predicting (ms).

    .venv/bin/python benchmarks/forecasting.py [--traces DIR] [--sim-days 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kale_airflow.core.backtest import backtest
from kale_airflow.core.forecast import get_forecaster
from kale_airflow.core.simulator import SimConfig, simulate
from kale_airflow.core.traffic import load_trace
from kale_airflow.reporting.results import write_json

ROOT = Path(__file__).resolve().parent.parent


def accuracy(trace) -> dict:
    horizon = max(1, int(round(3600 / trace.step_s)))
    out = {}
    for name in ("seasonal", "neuralprophet"):
        m = backtest(trace.series, get_forecaster(name), horizon, test_days=7, max_train_days=28).metrics
        out[name] = {k: m[k] for k in ("mase", "smape", "coverage", "fit_seconds", "origins")} | {
            "coverage_by_quantile": m["coverage_by_quantile"]}
        print(f"  {name:<14} MASE {m['mase']:.3f}  sMAPE {m['smape']:.1f}%  p90 coverage {m['coverage']:.3f}  "
              f"fit {m['fit_seconds']:.1f}s", flush=True)
    return out


def in_simulator(trace, days: float) -> dict:
    cfg = SimConfig(days=days)
    np_run = simulate(trace, ("kale", "oracle"), cfg, forecaster="neuralprophet")
    seasonal = simulate(trace, ("kale",), cfg).runs["kale"].metrics
    k, o = np_run.runs["kale"].metrics, np_run.runs["oracle"].metrics
    gap = seasonal["gpu_hours"] - o["gpu_hours"]
    closed = (seasonal["gpu_hours"] - k["gpu_hours"]) / gap if gap > 0 else float("nan")
    res = {
        "days": days,
        "kale_neuralprophet": k, "kale_seasonal": seasonal, "oracle": o,
        "np_over_oracle_gpu": k["gpu_hours"] / o["gpu_hours"],
        "seasonal_over_oracle_gpu": seasonal["gpu_hours"] / o["gpu_hours"],
        "gap_closed": closed,
    }
    print(f"  simulator {days:g} days: GPU-h / oracle: NeuralProphet {res['np_over_oracle_gpu']:.3f}, seasonal "
          f"{res['seasonal_over_oracle_gpu']:.3f} (gap closed {closed:.0%}); mean wait {k['mean_wait_s']:.1f}s vs "
          f"{seasonal['mean_wait_s']:.1f}s; SLO {k['slo_violation_rate']:.2%} vs {seasonal['slo_violation_rate']:.2%}",
          flush=True)
    return res


def retrain_speed(traces: Path) -> dict:
    nasa = load_trace(traces / "nasa_http_jul1995_1min.csv")
    s = nasa.series.iloc[: 14 * 1440]
    t0 = time.perf_counter()
    get_forecaster("neuralprophet").fit(s)
    sec = time.perf_counter() - t0
    print(f"  NeuralProphet retrain on 14 days of 1-minute data: {sec:.1f}s (target <= 60)", flush=True)
    return {"rows": len(s), "fit_seconds": sec, "pass": sec <= 60}


def serving_latency(trace) -> dict:
    import mlflow
    import mlflow.pyfunc

    from kale_airflow.forecasting.persist import save_forecaster
    from kale_airflow.registry.mlflow_registry import CHAMPION, FORECASTER_MODEL, mlflow_at, register
    from kale_airflow.registry.pyfunc import ForecasterModel, forecaster_signature

    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        f = get_forecaster("neuralprophet").fit(trace.series.iloc[-14 * 48:])
        save_forecaster(f, Path(tmp) / "fc")
        with mlflow_at(uri, Path(tmp, "art").as_uri()) as client:
            with mlflow.start_run() as run:
                mlflow.pyfunc.log_model(name="model", python_model=ForecasterModel(),
                                        artifacts={"forecaster": str(Path(tmp) / "fc")},
                                        signature=forecaster_signature(["q50", "q80", "q90"], 2))
            v = register(client, FORECASTER_MODEL, run.info.run_id, "model", "bench")
            client.set_registered_model_alias(FORECASTER_MODEL, CHAMPION, v)
            hist = trace.series.iloc[-48:].rename("value").reset_index().rename(columns={"index": "timestamp"})
            loads, preds = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                model = mlflow.pyfunc.load_model(f"models:/{FORECASTER_MODEL}@{CHAMPION}")
                t1 = time.perf_counter()
                model.predict(hist, params={"horizon": 2})
                t2 = time.perf_counter()
                loads.append((t1 - t0) * 1e3)
                preds.append((t2 - t1) * 1e3)
    res = {"load_ms_median": float(np.median(loads)), "predict_ms_median": float(np.median(preds)),
           "load_and_predict_ms_median": float(np.median(np.add(loads, preds)))}
    res["pass"] = res["load_and_predict_ms_median"] <= 200
    print(f"  champion load {res['load_ms_median']:.0f} ms + predict {res['predict_ms_median']:.0f} ms "
          f"(target <= 200 ms together)", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "data" / "traces"))
    ap.add_argument("--sim-days", type=float, default=7.0)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "forecasting.json"))
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    traces = Path(args.traces)
    report = {"traces": {}}
    for path in sorted(traces.glob("*.csv")):
        trace = load_trace(path)
        print(f"== {trace.name}", flush=True)
        acc = accuracy(trace)
        np_acc = acc["neuralprophet"]
        checks = {"mase<=0.8": np_acc["mase"] <= 0.8, "coverage_in_[0.85,0.95]": 0.85 <= np_acc["coverage"] <= 0.95}
        report["traces"][trace.name] = {"accuracy": acc, "checks": checks,
                                        "simulator": in_simulator(trace, args.sim_days)}
        print(f"  checks: {checks}", flush=True)
    report["retrain"] = retrain_speed(traces)
    report["serving"] = serving_latency(load_trace(next(traces.glob("nyc*.csv"))))
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
