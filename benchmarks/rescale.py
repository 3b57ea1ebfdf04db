"""Rescale pauses: warm ranks against today's full restart, on this machine, and the
exactly-once audit of warm rescales with crashes.

    .venv/bin/python benchmarks/rescale.py [--json OUT] [--reps 5] [--restart-reps N] [--modes emulated,real]

A local deployment (SQLite control plane, embedded stream fed continuously) is rescaled the
way the DAGs rescale it (apply, rebalance, ``start_local``) through 1 -> 2 -> 4 -> 2 -> 3 ->
6 -> 3 -> 1 ranks, ``--reps`` times, once with warm ranks (``worker_warm_wait_s`` 120: the
pool keeps the processes, the model travels in memory) and once with every generation a new
job (``worker_warm_wait_s`` 0: the old ranks checkpoint and exit, new processes import torch,
meet and restore the checkpoint), each in two step modes (the warm path with the default
``worker_standby`` spares): the demo's emulated GPU step
(``--step-time 0.4`` per 128 samples) and real CPU steps (512 samples). For every change it
reads rank 0's own record of the new generation's first step:

- ``pause_s``: from the decision naming the generation to the end of the first step at the
  new world size;
- ``gap_s``: from the end of the last step of the old generation to that first step.

Then ten warm rescales (1-3 ranks, CTR model, audit on) with a ``kill -9`` of a random rank
of the old generation during three of them, and the audit of every sample: trained at least
once, never more than twice, a second training only within ``checkpoint_every`` steps before
a crash. Writes ``benchmarks/results/rescale.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kale_airflow.config.deployment import DeploymentConfig  # noqa: E402
from kale_airflow.reporting.results import write_json  # noqa: E402
from tests.runtime.warm_harness import Deployment, Producer, audit_rows, exactly_once_audit  # noqa: E402

SEQUENCE = [1, 2, 4, 2, 3, 6, 3, 1]
CHANGES = ["1->2", "2->4", "4->2", "3->6", "6->3"]  # reported; 2->3 and 3->1 only close the cycle
MODES = {"emulated": {"batch": 128, "step_time_s": 0.4, "rate": 900.0},   # the demo's GPU step
         "real": {"batch": 512, "step_time_s": 0.0, "rate": 3000.0}}
TARGETS = {"warm_pause_p50_s": 5.0, "warm_gap_p50_s": 2.0}
HOLD_S = 1.0  # training between two rescales


def run_path(tmp: Path, mode: str, warm: bool, reps: int) -> list[dict]:
    """Every change of ``reps`` cycles through SEQUENCE; one record each."""
    m = MODES[mode]
    d = Deployment(tmp / f"{mode}-{'warm' if warm else 'restart'}", partitions=6, max_workers=6, batch=m["batch"],
                   step_time_s=m["step_time_s"], warm_wait_s=120.0 if warm else 0.0, checkpoint_every=50,
                   audit=False, step_log=False)
    out = []
    with d.environment():
        producer = Producer(d.stream, 6, m["rate"])
        producer.start()
        try:
            d.first_step(d.scale(SEQUENCE[0])["generation"])
            for rep in range(reps):
                for old, new in zip(SEQUENCE, SEQUENCE[1:]):
                    rec = d.first_step(d.scale(new)["generation"])
                    row = {"mode": mode, "path": "warm" if warm else "restart", "rep": rep, "change": f"{old}->{new}",
                           "kind": rec["kind"], "pause_s": rec["pause_s"], "gap_s": rec["gap_s"]}
                    out.append(row)
                    print(f"  {mode:8} {row['path']:7} rep {rep} {row['change']:5} {row['kind']:7} "
                          f"pause {row['pause_s']:6.2f} s  gap {row['gap_s']:6.2f} s", flush=True)
                    time.sleep(HOLD_S)
        finally:
            producer.stop()
            d.finish(timeout=180)
    return out


def summarize(rows: list[dict]) -> dict:
    """p50/p90/max of both pauses per mode, path and change (and over the reported changes)."""
    out: dict = {}
    for mode in sorted({r["mode"] for r in rows}):
        for path in ("warm", "restart"):
            mine = [r for r in rows if r["mode"] == mode and r["path"] == path]
            groups = {c: [r for r in mine if r["change"] == c] for c in CHANGES}
            groups["all reported"] = [r for r in mine if r["change"] in CHANGES]
            out.setdefault(mode, {})[path] = {c: _stats(g) for c, g in groups.items() if g}
    return out


def _stats(rows: list[dict]) -> dict:
    res = {"n": len(rows), "kinds": sorted({r["kind"] for r in rows})}
    for key in ("pause_s", "gap_s"):
        v = np.array([r[key] for r in rows], dtype=float)
        res[key] = {"p50": float(np.median(v)), "p90": float(np.percentile(v, 90)), "max": float(v.max())}
    return res


def audit_run(tmp: Path, seed: int = 11) -> dict:
    """Ten warm rescales with kill -9 of a random old rank during three; the audit of every sample."""
    sizes, killed, every = [1, 2, 1, 2, 3, 2, 1, 2, 3, 2, 1], {2, 5, 8}, 10
    d = Deployment(tmp / "audit", partitions=3, max_workers=3, batch=64, step_time_s=0.05, checkpoint_every=every)
    rng = random.Random(seed)
    kinds = []
    with d.environment():
        producer = Producer(d.stream, 3, 400)
        producer.start()
        try:
            for k, n in enumerate(sizes):
                kill = (lambda s=rng.randrange(sizes[k - 1]): d.kill(s)) if k in killed else None
                kinds.append(d.first_step(d.scale(n, during=kill)["generation"])["kind"])
                time.sleep(HOLD_S)
        finally:
            producer.stop()
        ends = d.drain()
        d.finish()
    res = exactly_once_audit(audit_rows(d.audit), 3, ends, every)
    return {**res, "rescales": len(sizes) - 1, "killed_during": sorted(killed), "kinds": kinds[1:],
            "checkpoint_every": every}


def report(summary: dict, audit: dict | None) -> None:
    for mode, paths in summary.items():
        print(f"\n{mode} steps: pause from the decision / from the last old step to the first new step (s)")
        print(f"  {'change':13} {'warm p50':>9} {'warm p90':>9} {'gap p50':>8} | {'restart p50':>11} "
              f"{'restart p90':>11} {'gap p50':>8}")
        for change in [*CHANGES, "all reported"]:
            w, r = paths.get("warm", {}).get(change), paths.get("restart", {}).get(change)
            if not w and not r:
                continue
            cells = [f"{x['pause_s']['p50']:9.2f} {x['pause_s']['p90']:9.2f} {x['gap_s']['p50']:8.2f}" if x
                     else " " * 28 for x in (w, r)]
            print(f"  {change:13} {cells[0]} | {cells[1]}")
    if audit:
        print(f"\nexactly once over {audit['rescales']} warm rescales, kill -9 during {audit['killed_during']}: "
              f"{audit['samples']} samples, never trained {audit['never']}, more than twice "
              f"{audit['more_than_twice']}, trained twice {audit['duplicates']} (all within "
              f"{audit['checkpoint_every']} steps before a crash: {audit['duplicates_outside'] == 0}; at most "
              f"{audit['max_steps_before_crash']} steps); kinds {audit['kinds']}: {'OK' if audit['ok'] else 'FAILED'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "rescale.json"))
    ap.add_argument("--reps", type=int, default=5, help="cycles through the sequence on the warm path")
    ap.add_argument("--restart-reps", type=int, default=None,
                    help="cycles on the restart path (default --reps; each of its changes takes 30-60 s here)")
    ap.add_argument("--modes", default="emulated,real")
    ap.add_argument("--no-audit", action="store_true")
    args = ap.parse_args()
    load_before, t0 = os.getloadavg()[0], time.time()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for mode in args.modes.split(","):
            for warm in (True, False):
                rows += run_path(tmp, mode, warm, args.reps if warm or args.restart_reps is None else args.restart_reps)
        audit = None if args.no_audit else audit_run(tmp)
    summary = summarize(rows)
    warm_all = [r for r in rows if r["path"] == "warm" and r["change"] in CHANGES]
    met = {"warm_pause_p50_s": float(np.median([r["pause_s"] for r in warm_all])),
           "warm_gap_p50_s": float(np.median([r["gap_s"] for r in warm_all]))}
    report(summary, audit)
    print(f"\ntargets: warm p50 pause {met['warm_pause_p50_s']:.2f} s (<= {TARGETS['warm_pause_p50_s']:g}), "
          f"warm p50 gap {met['warm_gap_p50_s']:.2f} s (<= {TARGETS['warm_gap_p50_s']:g})")
    write_json(args.json, {
        "machine": {"cpus": os.cpu_count(), "load_average_before": load_before,
                    "load_average_after": os.getloadavg()[0], "wall_s": time.time() - t0},
        "settings": {"sequence": SEQUENCE, "reported_changes": CHANGES, "reps": args.reps,
                     "restart_reps": args.reps if args.restart_reps is None else args.restart_reps, "modes": MODES,
                     "hold_s": HOLD_S, "warm_wait_s": 120.0,
                     "worker_standby": DeploymentConfig.model_fields["worker_standby"].default},
        "targets": TARGETS, "measured": met,
        "targets_met": all(met[k] <= TARGETS[k] for k in TARGETS),
        "summary": summary, "rescales": rows, "audit": audit})
    return 0


if __name__ == "__main__":
    sys.exit(main())
