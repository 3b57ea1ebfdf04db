"""How much of Kale's gain rides on cheap rescales: the engine benchmark's headline rows
(every trace, the default cluster, the whole evaluation window) at a 10 s and at the
protocol's 90 s rescale downtime, side by side in one run.

Each row runs Kale, clairvoyant Kale, static and every baseline variant at that downtime,
and is judged exactly as ``benchmarks/engine.py`` judges its rows (each baseline at its
best variant). Kale keeps the tunables ``engine.json`` records, chosen on first halves at
90 s: nothing is re-tuned for 10 s. Writes ``benchmarks/results/downtime.json``.

    .venv/bin/python benchmarks/downtime.py [--traces DIR] [--json OUT] [--jobs 2] [--days N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import GRID, ROOT, run_one, windows  # noqa: E402 - the engine benchmark's own rows and judge

from kale_airflow.core.traffic import load_trace  # noqa: E402
from kale_airflow.reporting.docs import downtime_table  # noqa: E402
from kale_airflow.reporting.results import write_json  # noqa: E402

DOWNTIMES = (10.0, 90.0)
POLICIES = ("kale", "oracle", "static") + GRID


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "data" / "traces"), help="folder of trace CSVs")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "downtime.json"), help="output JSON")
    ap.add_argument("--engine", default=str(ROOT / "benchmarks" / "results" / "engine.json"),
                    help="engine benchmark results whose Kale tunables are used")
    ap.add_argument("--days", type=float, default=None, help="limit the evaluated days per trace")
    ap.add_argument("--jobs", type=int, default=2, help="parallel simulations")
    args = ap.parse_args()
    kale = json.loads(Path(args.engine).read_text())["kale_config"]
    kale = {k: v for k, v in kale.items() if k not in ("slo_s", "rescale_downtime_s", "interval_s")}
    traces = {p: load_trace(p) for p in sorted(Path(args.traces).glob("*.csv"))}
    if not traces:
        print(f"no trace CSVs in {args.traces}: pass --traces", file=sys.stderr)
        return 2
    started = time.perf_counter()
    # The longest traces first, so the pool's last jobs are short.
    longest = sorted(traces, key=lambda p: -len(traces[p].series) * traces[p].step_s)
    runs = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        futs = {f"{p.stem}|{dt:g}": pool.submit(run_one, str(p), POLICIES,
                                                 replace(windows(traces[p], args.days)["whole"], rescale_downtime_s=dt),
                                                 kale)
                for p in longest for dt in DOWNTIMES}
        for key, fut in futs.items():
            runs[key] = fut.result()
            print(f"  {key}: {sum(c['pass'] for c in runs[key]['checks'])}/{len(runs[key]['checks'])} targets met",
                  flush=True)
    report = {"protocol": "engine.py's rows (default cluster, whole evaluation window) at each rescale downtime",
              "downtimes_s": list(DOWNTIMES), "kale_config": kale, "runs": runs,
              "wall_s": round(time.perf_counter() - started, 1)}
    write_json(args.json, report)
    print(downtime_table(report))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
