"""Mutation testing of the modules where a bug loses data or money (``make mutation``).

Runs mutmut (configured in pyproject.toml ``[tool.mutmut]``: the Kale policy's stages, the
rebalancer and the offset handover, the worker's commit/checkpoint/restore path, the
registry's comparison and promotion, the Kale page's auth) with the fast tests that cover
them, within a time budget, then prints per module the mutants killed and surviving and
writes ``benchmarks/results/mutation.json``:
``{"score": S, "modules": {"<path>": {"killed": K, "survived": V, "not_run": N, "score": S}},
"survivors": {"<path>": [mutant names]}}``. List a survivor's diff with ``mutmut show NAME``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KILLED = {1, 3, -24, 34, 36}  # test failure, error, timeout (SIGXCPU), segfault-like: the tests noticed


def tally(mutants: Path) -> tuple[dict, dict]:
    """Per module counts and survivor names from mutmut's ``*.meta`` files."""
    modules, survivors = {}, {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        module = str(meta.relative_to(mutants))[: -len(".meta")]
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        killed = sum(1 for c in codes.values() if c in KILLED)
        survived = sorted(k for k, c in codes.items() if c == 0)
        not_run = sum(1 for c in codes.values() if c is None)
        ran = killed + len(survived)
        modules[module] = {"killed": killed, "survived": len(survived), "not_run": not_run,
                           "score": round(killed / ran, 4) if ran else None}
        survivors[module] = survived
    return modules, survivors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=18 * 60, help="stop mutmut after this many seconds")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "mutation.json"))
    ap.add_argument("--report-only", action="store_true", help="tally the last run without running mutmut")
    args = ap.parse_args()
    t0 = time.monotonic()
    if not args.report_only:
        log = ROOT / "mutants-run.log"
        with log.open("w") as fh:
            try:
                subprocess.run([sys.executable, "-m", "mutmut", "run"], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                               timeout=args.budget_s, check=False)
            except subprocess.TimeoutExpired:
                print(f"mutmut stopped at the {args.budget_s:.0f} s budget; mutants not run are reported as such")
    modules, survivors = tally(ROOT / "mutants")
    killed = sum(m["killed"] for m in modules.values())
    ran = killed + sum(m["survived"] for m in modules.values())
    doc = {"score": round(killed / ran, 4) if ran else None, "wall_s": round(time.monotonic() - t0, 1),
           "modules": modules, "survivors": survivors}
    print(f"{'module':<45} {'killed':>7} {'survived':>9} {'not run':>8} {'score':>6}")
    for name, m in modules.items():
        score = f"{m['score']:.2f}" if m["score"] is not None else "-"
        print(f"{name:<45} {m['killed']:>7} {m['survived']:>9} {m['not_run']:>8} {score:>6}")
    print(f"mutation score {doc['score']} over {ran} mutants run ({doc['wall_s']:.0f} s)")
    from kale_airflow.reporting.results import write_json

    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
