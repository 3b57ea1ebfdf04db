"""Forecaster benchmark (issues 3 and 14): accuracy, training and serving speed, value in the simulator.

For each trace in the traces folder:
- rolling-origin backtest 1 h ahead over the last 7 days (training on at most 28 days
  before them) of every roster member (seasonal baseline, MSTL, NeuralProphet) and of
  ``auto`` (the roster chosen on the last days before the test window): MASE against
  daily seasonal naive, sMAPE, p90 coverage, fit time, and ``auto``'s ``selected``;
  coverage both of the forecaster's own quantiles (``coverage``) and with adaptive
  calibration on (``adaptive.coverage``: the quantiles corrected online from the bins
  before each origin, :mod:`kale_airflow.core.calibration`), over the window and its last
  day; the mean is not adjusted, so MASE is the same with it;
- checks: auto MASE <= 0.8 and within 5 % of the best single member, auto p90 coverage
  in [0.85, 0.95] (its own, and with adaptive calibration), adaptive MASE no worse than
  without it, NeuralProphet MASE <= 1.0;
- Kale with ``auto`` vs Kale with the seasonal baseline vs the oracle in the simulator
  over ``--sim-days`` days (``--sim-days 0`` skips it).
Plus: ``auto`` retraining time (roster included) on 14 days of 1-minute data, and loading
the registered ``auto`` champion from a SQLite MLflow registry and predicting (ms).

    .venv/bin/python benchmarks/forecasting.py [--traces DIR] [--sim-days 7] [--json OUT] [--table] [--sim-only]
        [--only auto,seasonal]
"""

from __future__ import annotations

import argparse
import json
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


MEMBERS = ("seasonal", "mstl", "neuralprophet")


def accuracy(trace, names: tuple[str, ...] = (*MEMBERS, "auto")) -> dict:
    horizon = max(1, int(round(3600 / trace.step_s)))
    out = {}
    for name in names:
        f = get_forecaster(name)
        m = backtest(trace.series, f, horizon, test_days=7, max_train_days=28, adaptive=True).metrics
        out[name] = own_and_adaptive(m)
        extra = ""
        if name == "auto":
            out[name] |= {"selected": m["selected"], "candidates": m["candidates"]}
            extra = f"  selected {m['selected']} (" + ", ".join(
                f"{c} {v['mase']:.3f}" for c, v in m["candidates"].items()) + " held out)"
        a = out[name]["adaptive"]
        print(f"  {name:<14} MASE {m['mase']:.3f}  sMAPE {m['smape']:.1f}%  p90 coverage {out[name]['coverage']:.3f}"
              f", adaptive {a['coverage']:.3f} (last day {a['coverage_last_day']['q90']:.3f})  "
              f"fit {m['fit_seconds']:.1f}s{extra}", flush=True)
    return out


def own_and_adaptive(m: dict) -> dict:
    """A backtest's metrics as the report keeps them: the forecaster's own quantiles at the top
    (as before adaptive calibration existed) and the online-calibrated ones under ``adaptive``.
    The mean is not adjusted, so ``adaptive.mase`` equals ``mase``."""
    own = {k: m[k] for k in ("mase", "smape", "fit_seconds", "origins")} | {
        "coverage": m["coverage_unadjusted"], "coverage_by_quantile": m["coverage_by_quantile_unadjusted"],
        "coverage_last_day": m["coverage_last_day_unadjusted"], "pinball": m["pinball_unadjusted"]}
    adaptive = {"rate_per_hour": m["adaptive_rate"], "mase": m["mase"], "coverage": m["coverage"],
                "coverage_by_quantile": m["coverage_by_quantile"], "coverage_last_day": m["coverage_last_day"],
                "pinball": m["pinball"]}
    return own | {"adaptive": adaptive}


def checks_for(acc: dict) -> dict:
    auto, best = acc["auto"], min(acc[m]["mase"] for m in MEMBERS)
    checks = {
        "auto_mase<=0.8": auto["mase"] <= 0.8,
        "auto_within_5%_of_best_member": auto["mase"] <= 1.05 * best,
        "auto_coverage_in_[0.85,0.95]": 0.85 <= auto["coverage"] <= 0.95,
        "neuralprophet_mase<=1.0": acc["neuralprophet"]["mase"] <= 1.0,
    }
    if "adaptive" in auto:
        checks |= {"auto_adaptive_coverage_in_[0.85,0.95]": 0.85 <= auto["adaptive"]["coverage"] <= 0.95,
                   "auto_adaptive_mase<=auto_mase": auto["adaptive"]["mase"] <= auto["mase"]}
    return checks


def in_simulator(trace, days: float) -> dict:
    cfg = SimConfig(days=days)
    auto_run = simulate(trace, ("kale", "oracle"), cfg, forecaster="auto")
    seasonal = simulate(trace, ("kale",), cfg).runs["kale"].metrics
    k, o = auto_run.runs["kale"].metrics, auto_run.runs["oracle"].metrics
    res = {
        "days": days,
        "kale_auto": k, "kale_seasonal": seasonal, "oracle": o,
        "auto_over_oracle_gpu": k["gpu_hours"] / o["gpu_hours"],
        "seasonal_over_oracle_gpu": seasonal["gpu_hours"] / o["gpu_hours"],
    }
    res["checks"] = {"auto_gpu<=seasonal_gpu": k["gpu_hours"] <= seasonal["gpu_hours"],
                     "auto_gpu<=1.15x_oracle": res["auto_over_oracle_gpu"] <= 1.15}
    print(f"  simulator {days:g} days: GPU-h / oracle: auto {res['auto_over_oracle_gpu']:.3f}, seasonal "
          f"{res['seasonal_over_oracle_gpu']:.3f}; mean wait {k['mean_wait_s']:.1f}s vs "
          f"{seasonal['mean_wait_s']:.1f}s; SLO {k['slo_violation_rate']:.2%} vs {seasonal['slo_violation_rate']:.2%}",
          flush=True)
    return res


def retrain_speed(traces: Path) -> dict:
    nasa = load_trace(traces / "nasa_http_jul1995_1min.csv")
    s = nasa.series.iloc[: 14 * 1440]
    t0 = time.perf_counter()
    f = get_forecaster("auto").fit(s)
    sec = time.perf_counter() - t0
    print(f"  auto retrain (roster included) on 14 days of 1-minute data: {sec:.1f}s (target <= 120), "
          f"selected {f.selected}", flush=True)
    return {"rows": len(s), "fit_seconds": sec, "selected": f.selected,
            "fit_seconds_by_member": f.fit_seconds_by_member, "pass": sec <= 120}


def serving_latency(trace) -> dict:
    import mlflow
    import mlflow.pyfunc

    from kale_airflow.forecasting.persist import save_forecaster
    from kale_airflow.registry.mlflow_registry import CHAMPION, FORECASTER_MODEL, mlflow_at, register
    from kale_airflow.registry.pyfunc import ForecasterModel, forecaster_signature

    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        f = get_forecaster("auto").fit(trace.series.iloc[-14 * 48:])
        save_forecaster(f, Path(tmp) / "fc")
        with mlflow_at(uri, Path(tmp, "art").as_uri()) as client:
            with mlflow.start_run():
                info = mlflow.pyfunc.log_model(name="model", python_model=ForecasterModel(),
                                               artifacts={"forecaster": str(Path(tmp) / "fc")},
                                               signature=forecaster_signature(["q50", "q80", "q90"], 2))
            v = register(client, FORECASTER_MODEL, info.model_uri, "bench")
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
    res = {"selected": f.selected, "load_ms_median": float(np.median(loads)),
           "predict_ms_median": float(np.median(preds)),
           "load_and_predict_ms_median": float(np.median(np.add(loads, preds)))}
    res["pass"] = res["load_and_predict_ms_median"] <= 200
    print(f"  champion load {res['load_ms_median']:.0f} ms + predict {res['predict_ms_median']:.0f} ms "
          f"(target <= 200 ms together)", flush=True)
    return res


NAMES = {"nasa_http_jul1995_1min": "NASA 1 min", "nyc_taxi_30min": "NYC 30 min",
         "twitter_volume_AMZN_5min": "Twitter AMZN 5 min", "twitter_volume_FB_5min": "Twitter FB 5 min"}


def readme_table(report: dict) -> str:
    """The README's forecasting table, from the report (so the two cannot drift)."""
    rows = ["| trace | seasonal MASE / p90 cov. | MSTL MASE / p90 cov. | NeuralProphet MASE / p90 cov. / fit "
            "| auto MASE / p90 cov. / selected | Kale GPU-h / oracle, auto vs seasonal |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, d in report["traces"].items():
        a, sim = d["accuracy"], d.get("simulator")
        gpu = (f"{sim['auto_over_oracle_gpu']:.3f} vs {sim['seasonal_over_oracle_gpu']:.3f} ({sim['days']:g} days)"
               if sim else "not run")
        rows.append(f"| {NAMES.get(name, name)} | {a['seasonal']['mase']:.3f} / {a['seasonal']['coverage']:.3f} "
                    f"| {a['mstl']['mase']:.3f} / {a['mstl']['coverage']:.3f} "
                    f"| {a['neuralprophet']['mase']:.3f} / {a['neuralprophet']['coverage']:.3f} / "
                    f"{a['neuralprophet']['fit_seconds']:.1f} s "
                    f"| {a['auto']['mase']:.3f} / {a['auto']['coverage']:.3f} / {a['auto']['selected']} | {gpu} |")
    return "\n".join(rows)


def adaptive_table(report: dict) -> str:
    """``auto``'s p90 coverage 1 h ahead with adaptive calibration on and off, and MASE."""
    header = ("| trace | auto p90 cov., adaptive (last day) | auto p90 cov., own (last day) "
              "| auto MASE, adaptive / own |")
    rows = [header, "| --- | --- | --- | --- |"]
    for name, d in report["traces"].items():
        a = d["accuracy"]["auto"]
        if "adaptive" not in a:
            continue
        ad = a["adaptive"]
        rows.append(f"| {NAMES.get(name, name)} | {ad['coverage']:.3f} ({ad['coverage_last_day']['q90']:.3f}) "
                    f"| {a['coverage']:.3f} ({a['coverage_last_day']['q90']:.3f}) "
                    f"| {ad['mase']:.3f} / {a['mase']:.3f} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "data" / "traces"))
    ap.add_argument("--sim-days", type=float, default=7.0)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "forecasting.json"))
    ap.add_argument("--table", action="store_true", help="print the README table from --json and exit")
    ap.add_argument("--sim-only", action="store_true",
                    help="re-run only the simulator part (it depends on the policy, accuracy does not) into the "
                    "existing --json")
    ap.add_argument("--only", type=_names,
                    help="re-run the accuracy of only these forecasters (comma-separated, e.g. auto) into the existing "
                    "--json, keeping every other result there; retraining and serving are not re-run")
    args = ap.parse_args()
    if args.table:
        report = json.loads(Path(args.json).read_text())
        print(readme_table(report))
        print(adaptive_table(report))
        return 0
    logging.disable(logging.WARNING)
    traces = Path(args.traces)
    loaded = [load_trace(path) for path in sorted(traces.glob("*.csv"))]
    if args.sim_only:
        report = json.loads(Path(args.json).read_text())
        simulator_part(report, loaded, args)
        return 0
    report = json.loads(Path(args.json).read_text()) if args.only else {"traces": {}}
    for trace in loaded:  # accuracy first: the must-show numbers survive an interrupted run
        print(f"== {trace.name}", flush=True)
        entry = report["traces"].setdefault(trace.name, {"accuracy": {}})
        entry["accuracy"] |= accuracy(trace, args.only or (*MEMBERS, "auto"))
        entry["checks"] = checks_for(entry["accuracy"])
        print(f"  checks: {entry['checks']}", flush=True)
        write_json(args.json, report)
    if not args.only:
        report["retrain"] = retrain_speed(traces)
        report["serving"] = serving_latency(load_trace(next(traces.glob("nyc*.csv"))))
        write_json(args.json, report)
    simulator_part(report, loaded, args)
    print(adaptive_table(report))
    return 0


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in (*MEMBERS, "auto")]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown forecaster(s) {unknown or text!r}; choose from "
                                         f"{','.join((*MEMBERS, 'auto'))}")
    return names


def simulator_part(report: dict, loaded: list, args) -> None:
    """Kale with ``auto`` vs Kale with the seasonal baseline in the simulator, per trace."""
    if args.sim_days > 0:
        for trace in loaded:
            print(f"== {trace.name} in the simulator", flush=True)
            report["traces"][trace.name]["simulator"] = in_simulator(trace, args.sim_days)
            write_json(args.json, report)
    print(readme_table(report))


if __name__ == "__main__":
    sys.exit(main())
