"""The ``kale`` command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from kale_airflow.core.forecast import ForecastError, forecaster_names
from kale_airflow.core.simulator import ALL_POLICIES, SimConfig, SimulationError, simulate
from kale_airflow.core.traffic import BUNDLED_TRACE, TraceError, load_trace

log = logging.getLogger("kale")


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in names if p not in ALL_POLICIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown policy {unknown or text!r}; choose from {','.join(ALL_POLICIES)}")
    return names


def format_table(doc: dict) -> str:
    """The comparison table printed by ``kale simulate`` (ratios against HPA when present)."""
    pols = doc["policies"]
    hpa = pols.get("hpa")
    head = f"{'policy':<10} {'acc. lag (sample*s)':>20} {'mean wait s':>11} {'downtime s':>11} {'SLO viol.':>9} " \
           f"{'GPU-h':>9} {'rescales':>8}"
    if hpa:
        head += f" {'lag/HPA':>8} {'down/HPA':>8} {'GPU/HPA':>8}"
    lines = [head, "-" * len(head)]
    for name, m in pols.items():
        row = (f"{name:<10} {m['accumulated_lag']:>20.4g} {m['mean_wait_s']:>11.2f} {m['downtime_s']:>11.0f} "
               f"{m['slo_violation_rate']:>9.2%} {m['gpu_hours']:>9.0f} {m['rescales']:>8d}")
        if hpa:
            def ratio(key):
                return m[key] / hpa[key] if hpa[key] else float("nan")
            row += f" {ratio('accumulated_lag'):>8.3f} {ratio('downtime_s'):>8.3f} {ratio('gpu_hours'):>8.3f}"
        lines.append(row)
    fluid = doc["limits"]["fluid_gpu_hours"]
    lines.append(f"fluid bound (exactly enough fractional workers, free rescales): {fluid:.0f} GPU-h")
    if "kale" in pols and "oracle" in pols:
        k, o = pols["kale"], pols["oracle"]
        lines.append(f"kale / oracle GPU-h: {k['gpu_hours'] / o['gpu_hours']:.3f}; "
                     f"kale / fluid bound: {k['gpu_hours'] / fluid:.3f}")
    return "\n".join(lines)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run the evaluation protocol and report."""
    trace = load_trace(args.trace, repair=args.repair)
    for note in trace.report.notes:
        log.warning("trace %s: %s", trace.name, note)
    cfg = SimConfig(slo_s=args.slo_seconds, history_days=args.history_days, days=args.days, seed=args.seed,
                    rescale_downtime_s=args.downtime_seconds)
    result = simulate(trace, args.policies, cfg, forecaster=args.forecaster, progress=not args.no_progress)
    doc = result.to_dict()
    print(f"trace {trace.name}: {doc['evaluation']['days']:.1f} days evaluated after {cfg.history_days:g} days of "
          f"history, tick {cfg.tick_s:g}s, SLO {cfg.slo_s:g}s, rescale downtime {cfg.rescale_downtime_s:g}s "
          f"({result.wall_s:.1f}s wall)")
    print(format_table(doc))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        from kale_airflow.plotting import plot_simulation

        print(f"wrote {plot_simulation(result, args.plot)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="kale",
        description="kale-airflow: predictive GPU autoscaling for online training (Kale, SoCC '24).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log decisions and repairs")
    sub = parser.add_subparsers(dest="command", required=True)
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
                     help=f"comma-separated subset of {','.join(ALL_POLICIES)}")
    sim.add_argument("--forecaster", default="seasonal", choices=forecaster_names(), help="Kale's traffic forecaster")
    sim.add_argument("--slo-seconds", type=float, default=300.0, help="freshness SLO: max age of the oldest sample")
    sim.add_argument("--downtime-seconds", type=float, default=90.0, help="training pause per rescale")
    sim.add_argument("--history-days", type=float, default=14.0,
                     help="leading days of the trace used only as forecaster history")
    sim.add_argument("--days", type=float, default=None, help="evaluate only this many days after the history")
    sim.add_argument("--seed", type=int, default=0, help="seed of the cluster's throughput noise")
    sim.add_argument("--repair", action="store_true", help="sort rows and interpolate gaps/NaNs instead of failing")
    sim.add_argument("--json", metavar="OUT", help="write the full results as JSON")
    sim.add_argument("--plot", metavar="OUT.png", help="write traffic/capacity, workers and lag plots")
    sim.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sim.set_defaults(func=cmd_simulate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kale`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except (TraceError, SimulationError, ForecastError, ValueError) as exc:
        print(f"kale: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
