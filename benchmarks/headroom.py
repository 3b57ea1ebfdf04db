"""How much of Kale's gap to the offline optimum a better forecast could close.

Clairvoyant Kale runs Kale's planner on the true future. Here it also runs on the true
future blurred to 10-minute, 15-minute and hourly means (``oracle@10min``, ...): what a
forecaster that was exact at that resolution, and blind within it, would let Kale do.
Where Kale's own GPU-hours already match the blurred oracle's, a better forecast at that
resolution cannot help; only knowing the finer bins can.

Rows: the chosen traces (Twitter FB by default, the trace whose GPU-hours target Kale
misses) on every cluster, whole window and second half, with the Kale tunables
``engine.json`` records. Writes ``benchmarks/results/headroom.json``.

    .venv/bin/python benchmarks/headroom.py [--traces DIR] [--names FB] [--json OUT] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import CLUSTERS, KALE_CANDIDATES, ROOT, on_cluster, run_one, windows  # noqa: E402

from kale_airflow.core.traffic import load_trace  # noqa: E402
from kale_airflow.reporting.results import write_json  # noqa: E402

POLICIES = ("kale", "oracle", "oracle@10min", "oracle@15min", "oracle@1h")
WINDOWS = ("whole", "second_half")


def row(doc: dict) -> dict:
    """GPU-hours over the offline optimum, lag and SLO violations of each policy."""
    off = doc["limits"]["offline_optimal_gpu_hours"]
    return {name: {"gpu_over_offline": round(p["gpu_hours"] / off, 4), "accumulated_lag": p["accumulated_lag"],
                   "slo_violation_rate": p["slo_violation_rate"], "rescales": p["rescales"]}
            for name, p in doc["policies"].items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "data" / "traces"), help="folder of trace CSVs")
    ap.add_argument("--names", default="FB", help="comma-separated parts of the trace file names to run")
    ap.add_argument("--engine", default=str(ROOT / "benchmarks" / "results" / "engine.json"),
                    help="engine.json whose chosen Kale tunables to use")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "headroom.json"), help="output JSON")
    ap.add_argument("--jobs", type=int, default=2, help="parallel simulations")
    args = ap.parse_args(argv)
    chosen = json.loads(Path(args.engine).read_text())["tuning"]["chosen"]
    kale = KALE_CANDIDATES[chosen]
    paths = [p for p in sorted(Path(args.traces).glob("*.csv")) if any(n in p.stem for n in args.names.split(","))]
    if not paths:
        ap.error(f"no trace in {args.traces} matches --names {args.names}")
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futs = {f"{p.stem}|{kind}|{win}": pool.submit(run_one, str(p), POLICIES, on_cluster(cfg, kind), kale)
                for p in paths for win, cfg in windows(load_trace(p), None).items() if win in WINDOWS
                for kind in CLUSTERS}
        rows = {key: row(f.result()) for key, f in futs.items()}
    print(f"GPU-hours over the offline optimum (Kale tunables {chosen}):")
    print(f"{'row':45s} " + " ".join(f"{p:>13s}" for p in POLICIES))
    for key, r in rows.items():
        print(f"{key:45s} " + " ".join(f"{r[p]['gpu_over_offline']:13.3f}" for p in POLICIES))
    write_json(args.json, {"kale_config": kale, "chosen": chosen, "policies": list(POLICIES), "rows": rows,
                           "wall_s": round(time.perf_counter() - started, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
