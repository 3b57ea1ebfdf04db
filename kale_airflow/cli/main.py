"""The ``kale`` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from kale_airflow import __version__
from kale_airflow.cli.db import add_db
from kale_airflow.cli.ops import add_ops
from kale_airflow.cli.profile import add_profile
from kale_airflow.cli.promote import add_promote
from kale_airflow.core.errors import KaleError
from kale_airflow.core.forecast import forecaster_names
from kale_airflow.core.simulator import ALL_POLICIES, CANDIDATES, VARIANTS, SimConfig, simulate
from kale_airflow.core.traffic import BUNDLED_TRACE, load_trace
from kale_airflow.reporting.results import write_json
from kale_airflow.reporting.tables import format_table

log = logging.getLogger("kale")


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in names if p not in ALL_POLICIES and p not in VARIANTS and p not in CANDIDATES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown policy {unknown or text!r}; choose from {','.join(ALL_POLICIES)}, "
                                         f"a named candidate ({','.join(CANDIDATES)}) or a baseline variant "
                                         f"({','.join(VARIANTS)})")
    return names


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run the evaluation protocol and report."""
    if args.fleet:
        return _simulate_fleet(args)
    trace = load_trace(args.trace, repair=args.repair)
    for note in trace.report.notes:
        log.warning("trace %s: %s", trace.name, note)
    from kale_airflow.core.cluster import cluster_preset

    cluster, profile_workers, profile_noise = cluster_preset(args.cluster)
    cfg = SimConfig(slo_s=args.slo_seconds, history_days=args.history_days, days=args.days, seed=args.seed,
                    rescale_downtime_s=args.downtime_seconds, shard_skew=args.shard_skew,
                    shard_partitions=args.shard_partitions, shard_assignment=args.shard_assignment,
                    cluster=cluster, profile_workers=profile_workers, profile_noise_sd=profile_noise,
                    hpa_window_s=args.hpa_window_s, keda_lag_threshold_s=args.keda_lag_threshold_s,
                    autopilot_margin=args.autopilot_margin, autopilot_percentile=args.autopilot_percentile)
    result = simulate(trace, args.policies, cfg, forecaster=args.forecaster, progress=not args.no_progress,
                      jobs=args.jobs)
    doc = result.to_dict()
    print(f"trace {trace.name}: {doc['evaluation']['days']:.1f} days evaluated after {cfg.history_days:g} days of "
          f"history, tick {cfg.tick_s:g}s, SLO {cfg.slo_s:g}s, rescale downtime {cfg.rescale_downtime_s:g}s, "
          f"{args.cluster} cluster ({result.wall_s:.1f}s wall)")
    print(format_table(doc))
    write_json(args.json, doc)
    if args.plot:
        from kale_airflow.reporting.plots import plot_simulation

        print(f"wrote {plot_simulation(result, args.plot)}")
    return 0


def _simulate_fleet(args: argparse.Namespace) -> int:
    """``kale simulate --fleet FLEET.yaml``: the fleet's jobs on one GPU budget, every fleet
    policy side by side (trace paths are relative to the fleet file; ``--days`` overrides
    the file's ``days``)."""
    from dataclasses import replace

    import yaml

    from kale_airflow.core.fleet_sim import FLEET_POLICIES, FleetSpec, fleet_table, simulate_fleet

    path = Path(args.fleet)
    if not path.is_file():
        raise ValueError(f"fleet file {path} does not exist")
    spec = FleetSpec.from_dict(yaml.safe_load(path.read_text()))
    if args.days is not None:
        spec = replace(spec, days=args.days)
    traces = {j.name: load_trace(path.parent / j.trace, repair=args.repair, name=j.name) for j in spec.jobs}
    policies = tuple(p.strip() for p in (args.fleet_policies or ",".join(FLEET_POLICIES)).split(",") if p.strip())
    result = simulate_fleet(spec, traces, policies, jobs=args.jobs, progress=not args.no_progress)
    doc = result.to_dict()
    print(f"fleet {path.name}: {len(spec.jobs)} jobs on {spec.gpus} GPUs, {doc['evaluation']['days']:.1f} days "
          f"aligned by tick from each job's evaluation start, tick {spec.tick_s:g}s ({result.wall_s:.1f}s wall)")
    print(fleet_table(doc))
    write_json(args.json, doc)
    return 0


def _duration(text: str) -> float:
    import pandas as pd

    try:
        seconds = pd.Timedelta(text).total_seconds()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write e.g. 1h, 90min, 3600s") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("the horizon must be positive")
    return seconds


def cmd_backtest(args: argparse.Namespace) -> int:
    """Rolling-origin backtest of one forecaster on one trace."""
    from kale_airflow.core.backtest import backtest
    from kale_airflow.core.forecast import get_forecaster

    trace = load_trace(args.trace, repair=args.repair)
    horizon = max(1, int(round(args.horizon / trace.step_s)))
    forecaster = get_forecaster(args.forecaster)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(unit="origin", desc=f"{trace.name} {args.forecaster}")
    result = backtest(trace.series, forecaster, horizon, test_days=args.test_days, max_train_days=args.max_train_days,
                      adaptive=args.adaptive, adaptive_rate=args.adaptive_rate, progress=bar)
    if bar is not None:
        bar.close()
    m = result.metrics | {"trace": trace.name}
    print(f"{trace.name}: {args.forecaster}, {horizon} step(s) = {horizon * trace.step_s / 3600:g} h ahead, "
          f"{m['origins']} origins over the last {args.test_days:g} days")
    print(f"  MASE vs daily seasonal naive {m['mase']:.3f}   sMAPE {m['smape']:.1f} %   fit {m['fit_seconds']:.1f} s")
    if m.get("selected"):
        scores = ", ".join(f"{c} {v['mase']:.3f}" for c, v in m["candidates"].items())
        print(f"  selected {m['selected']} by held-out MASE before the test window: {scores}")
    if m["adaptive"]:
        print(f"  quantiles calibrated online (adaptive, {m['adaptive_rate']:g} log units/h); the forecaster's own "
              "in brackets")
    for col, cov in m["coverage_by_quantile"].items():
        line = (f"  {col}: coverage {cov:.3f} (last day {m['coverage_last_day'][col]:.3f}), "
                f"pinball loss {m['pinball'][col]:.4g}")
        if m["adaptive"]:
            line += (f"   [{m['coverage_by_quantile_unadjusted'][col]:.3f} (last day "
                     f"{m['coverage_last_day_unadjusted'][col]:.3f}), {m['pinball_unadjusted'][col]:.4g}]")
        print(line)
    write_json(args.json, m)
    if args.plot:
        from kale_airflow.reporting.plots import plot_backtest

        print(f"wrote {plot_backtest(result, args.plot)}")
    return 0


def _read_json(path: str, what: str):
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        dup = {k for k in keys if keys.count(k) > 1}
        if dup:
            raise ValueError(f"{what} {path}: key(s) {sorted(dup)} appear more than once")
        return dict(pairs)

    try:
        return json.loads(Path(path).read_text(), object_pairs_hook=no_duplicates)
    except FileNotFoundError:
        raise ValueError(f"{what} {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path} is not valid JSON: {exc}") from None


def cmd_rebalance(args: argparse.Namespace) -> int:
    """Assign partitions to workers and report balance and movement."""
    from kale_airflow.core.rebalance import RebalanceOptions, assign

    rates = _read_json(args.rates, "rates file")
    if not isinstance(rates, dict):
        raise ValueError(f"rates file {args.rates} must map partition id -> rate, e.g. {{\"p0\": 120.5}}")
    previous = _read_json(args.previous, "previous assignment") if args.previous else None
    result = assign(rates, args.workers, previous, RebalanceOptions(split=not args.no_split))
    doc = result.to_dict(split=not args.no_split)
    lb = doc["imbalance_lower_bound"]
    print(f"{len(rates)} partitions over {args.workers} workers ({'slicing allowed' if not args.no_split else 'whole'}"
          f"): imbalance {doc['imbalance']:.4f} (lower bound {lb:.4f})")
    if previous is not None:
        print(f"moved {doc['moved_fraction']:.2%} of the rate (lower bound {doc['moved_fraction_lower_bound']:.2%})")
    for note in doc["notes"]:
        print(f"note: {note}")
    write_json(args.json, doc)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole loop on the embedded default."""
    from kale_airflow.cli.demo import run_demo

    return run_demo(args.out, args.minutes, args.config)


def cmd_ui(args: argparse.Namespace) -> int:
    """Airflow's UI on this environment's Airflow home, read-only."""
    from kale_airflow.cli.demo import serve_ui

    return serve_ui(args.port)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="kale",
        description="kale-airflow: predictive GPU autoscaling for online training (Kale, SoCC '24).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log decisions and repairs")
    parser.add_argument("--version", action="version", version=f"kale-airflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_simulate, _add_forecast, _add_rebalance, _add_demo, add_ops, add_profile, add_db, add_promote):
        add(sub)
    return parser


def _add_simulate(sub) -> None:
    sim = sub.add_parser(
        "simulate",
        help="replay a traffic trace through scaling policies and compare them",
        description=(
            "Replay a traffic trace (CSV 'timestamp,value', counts per step) through scaling policies under the "
            "evaluation protocol: the trace is scaled so its p99 rate equals 32 workers' throughput, every rescale "
            "pauses training, and each policy sees only the past. Prints accumulated lag, mean wait, downtime, SLO "
            "violation rate, GPU-hours and rescales per policy, with ratios against HPA."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sim.add_argument("--trace", default=str(BUNDLED_TRACE), help="trace CSV (default: the bundled NYC taxi trace)")
    sim.add_argument("--policies", type=_policies, default=ALL_POLICIES,
                     help=f"comma-separated subset of {','.join(ALL_POLICIES)} ('oracle' is clairvoyant Kale: "
                          f"Kale's logic fed the true future and curve), plus any baseline variant of "
                          f"{','.join(VARIANTS).replace('%', '%%')}")
    sim.add_argument("--forecaster", default="seasonal", choices=forecaster_names(), help="Kale's traffic forecaster")
    sim.add_argument("--slo-seconds", type=float, default=300.0, help="freshness SLO: max age of the oldest sample")
    sim.add_argument("--downtime-seconds", type=float, default=90.0, help="training pause per rescale")
    sim.add_argument("--history-days", type=float, default=14.0,
                     help="leading days of the trace used only as forecaster history")
    sim.add_argument("--days", type=float, default=None, help="evaluate only this many days after the history")
    sim.add_argument("--seed", type=int, default=0, help="seed of the cluster's throughput noise")
    sim.add_argument("--repair", action="store_true", help="sort rows and interpolate gaps/NaNs instead of failing")
    sim.add_argument("--cluster", choices=["amdahl", "saturating", "comm"], default="amdahl",
                     help="true cluster curve: amdahl (Kale's own model family, profiled at 1-64 workers), "
                          "saturating (hard ceiling of 28,000 samples/s from a shared parameter server) or comm "
                          "(all-reduce cost growing with n^2: throughput peaks at 48 workers, then falls); the "
                          "last two are profiled only at 1-16 workers with 5%% noise")
    sim.add_argument("--hpa-window-s", type=float, default=15.0,
                     help="HPA: utilization averaged over this window (15 = the last tick; 60-120 is typical "
                          "through Prometheus)")
    sim.add_argument("--keda-lag-threshold-s", type=float, default=60.0,
                     help="KEDA: lagThreshold as the samples one worker drains in this many seconds")
    sim.add_argument("--autopilot-margin", type=float, default=0.10, help="Autopilot: safety margin on the percentile")
    sim.add_argument("--autopilot-percentile", type=float, default=0.95,
                     help="Autopilot: weighted percentile of busy workers over the 1 h window")
    sim.add_argument("--shard-skew", type=float, default=None,
                     help="spread traffic over partitions with Zipf(S) rates (per-worker capacity, per-partition "
                          "backlog); off by default")
    sim.add_argument("--shard-partitions", type=int, default=128, help="number of partitions with --shard-skew")
    sim.add_argument("--shard-assignment", choices=["rebalance", "round_robin"], default="rebalance",
                     help="how partitions reach workers with --shard-skew")
    sim.add_argument("--fleet", metavar="FLEET.yaml",
                     help="replay several jobs at once on one GPU budget instead of one trace: a YAML file with "
                          "'gpus' and 'jobs' (name, trace, priority, min_workers, max_workers, slo_s, cluster, "
                          "schedule_overrides, pins); compares the fleet arbiter with per-job Kale and HPA first come "
                          "first served, a static split and the offline references (docs/simulation.md)")
    sim.add_argument("--fleet-policies", metavar="LIST",
                     help="with --fleet: a comma-separated subset of fleet-kale,kale-fcfs,hpa-fcfs,static-split,"
                          "kale-alone (default: all)")
    sim.add_argument("--json", metavar="OUT", help="write the full results as JSON")
    sim.add_argument("--plot", metavar="OUT.png",
                     help="write one panel per policy (capacity vs traffic, workers, freshness lag), a zoomed "
                          "busiest day and a bar chart of the ratios against HPA and clairvoyant Kale")
    sim.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                     help="replay the policies in this many processes (same results; 1 = in this process)")
    sim.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sim.set_defaults(func=cmd_simulate)


def _add_forecast(sub) -> None:
    from kale_airflow.core.calibration import DEFAULT_RATE

    fc = sub.add_parser("forecast", help="forecaster tools").add_subparsers(dest="forecast_command", required=True)
    bt = fc.add_parser(
        "backtest",
        help="rolling-origin backtest of a forecaster on a trace",
        description=(
            "Train the forecaster on the trace before its last --test-days, then forecast --horizon ahead from "
            "rolling origins through those days, each from data before the origin only. Reports MASE against the "
            "daily seasonal-naive forecast (< 1 beats it), sMAPE, pinball loss and coverage per quantile, over the "
            "window and its last day. With --adaptive (default) the quantiles are calibrated online from the bins "
            "before each origin, and the forecaster's own are reported beside them."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    bt.add_argument("--trace", default=str(BUNDLED_TRACE), help="trace CSV 'timestamp,value'")
    bt.add_argument("--forecaster", default="seasonal", choices=forecaster_names(),
                    help="forecaster to test; auto chooses from the roster on the days before the test window")
    bt.add_argument("--horizon", type=_duration, default=3600.0, help="how far ahead, e.g. 1h, 30min")
    bt.add_argument("--test-days", type=float, default=7.0, help="most recent days used as rolling origins")
    bt.add_argument("--max-train-days", type=float, default=28.0, help="train on at most this many days")
    bt.add_argument("--repair", action="store_true", help="sort rows and interpolate gaps/NaNs instead of failing")
    bt.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=True,
                    help="calibrate the quantiles online from the coverage realised before each origin (adaptive "
                         "conformal); the forecaster's own quantiles are reported beside them")
    bt.add_argument("--adaptive-rate", type=float, default=DEFAULT_RATE,
                    help="learning rate of the online calibration, log units per hour")
    bt.add_argument("--json", metavar="OUT",
                    help="write metrics (mase, smape, coverage, coverage_last_day, fit_seconds, selected with "
                         "auto, ...) as JSON")
    bt.add_argument("--plot", metavar="OUT.png", help="plot actual vs forecast with the quantile band")
    bt.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    bt.set_defaults(func=cmd_backtest)


def _add_rebalance(sub) -> None:
    rb = sub.add_parser(
        "rebalance",
        help="assign stream partitions to workers evenly, moving as little as possible",
        description=(
            "Assign partitions with uneven sample rates to N workers. With slicing (default) every worker gets the "
            "same load and only the excess above the fair share moves; hot partitions are split into slices "
            "[partition, share]. With --no-split partitions stay whole (no worse than longest-processing-time "
            "greedy). --previous keeps workers' partitions where possible, also across a change of N."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    rb.add_argument("--rates", required=True, help='JSON object partition id -> samples/s, e.g. {"p0": 120.5}')
    rb.add_argument("--workers", type=int, required=True, help="number of workers")
    rb.add_argument("--previous", help="previous assignment JSON (the output of an earlier run)")
    rb.add_argument("--no-split", action="store_true", help="never slice a partition")
    rb.add_argument("--json", metavar="OUT", help="write assignment, imbalance, moved_fraction as JSON")
    rb.set_defaults(func=cmd_rebalance)


def _add_demo(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="run the whole loop on this machine (Airflow, MLflow, stream, local workers, autoscaler)",
        description="Run the embedded default end to end: retrain and register the models, profile the reference "
                    "worker, replay the bundled trace time-compressed into the embedded stream, and let the "
                    "kale_autoscaler DAG scale local training workers. Ends with a summary, a plot, and how to "
                    "open the Airflow and MLflow UIs on what it produced.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument("--out", default="out/demo", help="folder for Airflow, MLflow, stream and results")
    demo.add_argument("--minutes", type=float, default=8.0, help="how long traffic is replayed")
    demo.add_argument("--config", metavar="KALE_YAML", help="train this kale.yaml's trainer on its producer's payloads "
                      "(the rest of the demo's deployment is its own; default: the reference CTR model)")
    demo.set_defaults(func=cmd_demo)

    ui = sub.add_parser(
        "ui", help="serve the Airflow UI on a demo's state, read-only (the command `kale demo` prints)",
        description="Start Airflow's DAG processor and API server on $AIRFLOW_HOME (the environment `kale demo` "
                    "prints sets it to the demo's), and no scheduler or triggerer: the DAGs, their runs and task "
                    "logs, the Kale page and its decisions are shown as the demo left them, and no deferred "
                    "sensor resumes to decide again. Ctrl-C stops both.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ui.add_argument("--port", type=int, default=8080, help="the API server's port")
    ui.set_defaults(func=cmd_ui)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kale`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except (KaleError, ValueError) as exc:  # bad input: a clear message, exit 2
        print(f"kale: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
