"""Fleet benchmark: the four shared traces as one fleet on a budget of 96 GPUs.

Each trace is one job, scaled as the protocol scales it (its p99 rate = the throughput of
``ref_workers`` = 32 workers; default ``amdahl`` cluster; 1-64 workers), evaluated after
14 days of history. The windows differ in length and calendar (NASA 1995, NYC 2014,
Twitter 2015): the jobs are aligned by tick index from each one's evaluation start and
run for the length they have in common (NASA's 13.6 days). Together the jobs' peak needs
are far above 96 workers; their peaks rarely coincide, but sometimes do.

Compared in one run, equal priorities and then 3:1:1:1 (the 3 on the first job in file
order): fleet Kale (the arbiter), per-job Kale and HPA first come first served under the
same cap, a static split of the budget by peak share, each job alone with 64 workers and
no budget, and the fleet's offline references.

1. **Parameter discipline.** The arbiter's one parameter, ``violation_gpus`` (GPU-seconds
   a second of risked SLO violation costs), is chosen on the first half of the common
   window only (``CANDIDATES``: the candidate meeting the most checks over both priority
   settings, ties by the lowest priority-weighted violation time, then GPU-hours).
2. **Reported** on the whole window with the chosen value: per job and in total, lag, SLO
   violations (rate, seconds, priority-weighted seconds), GPU-hours, the budget's
   utilisation, and the checks (``judge``).
3. **Speed** of one arbitration: 20 jobs with plan-like costs on 256 GPUs.

It takes about five minutes on two busy cores (``--days N`` shortens the common window;
the JSON records it as ``days_option``).

    .venv/bin/python benchmarks/fleet.py [--traces DIR] [--json OUT] [--days N] [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from kale_airflow.core.fleet import JobDemand, allocate, violation_risk
from kale_airflow.core.fleet_sim import FleetJob, FleetSpec, fleet_offline, fleet_table, prepare, run_fleet_policy
from kale_airflow.core.traffic import load_trace
from kale_airflow.reporting.results import write_json

ROOT = Path(__file__).resolve().parent.parent
GPUS = 96
CANDIDATES = (64.0, 256.0, 1024.0)
PRIORITIES = {"equal": (1.0, 1.0, 1.0, 1.0), "3:1:1:1": (3.0, 1.0, 1.0, 1.0)}
BASELINES = ("kale-fcfs", "hpa-fcfs", "static-split")
# What each priority setting runs: the baselines do not depend on the arbiter's parameter.
POLICIES = ("fleet-kale",) + BASELINES + ("kale-alone",)


def check(name: str, value: float, target: float, op: str = "<=", note: str = "") -> dict:
    ok = {"<=": value <= target, "==": value == target}[op]
    out = {"name": name, "value": round(float(value), 4), "target": f"{op} {target:g}", "pass": bool(ok)}
    return out | ({"note": note} if note else {})


def judge(runs: dict, priorities: tuple) -> list[dict]:
    """The targets of one priority setting: fleet Kale's priority-weighted SLO-violation time
    against per-job Kale FCFS and the static split, the budget and the floors, GPU-hours
    against the baseline using the fewest, and with unequal priorities the high-priority
    job's violations against its violations alone with 64 workers."""
    fleet = runs["fleet-kale"]["total"]
    out = []
    for base in ("kale-fcfs", "static-split"):
        other = runs[base]["total"]["weighted_slo_violation_s"]
        ratio = fleet["weighted_slo_violation_s"] / other if other else (0.0 if not fleet["weighted_slo_violation_s"]
                                                                          else float("inf"))
        out.append(check(f"fleet-kale / {base} priority-weighted SLO-violation time", ratio, 0.5))
    for name in ("fleet-kale",) + BASELINES:
        t = runs[name]["total"]
        out.append(check(f"{name}: ticks over the budget", t["budget_exceeded_ticks"], 0, "=="))
        out.append(check(f"{name}: job-ticks below a floor", t["below_floor_ticks"], 0, "=="))
    cheapest = min(BASELINES, key=lambda b: runs[b]["total"]["gpu_hours"])
    out.append(check(f"fleet-kale / {cheapest} GPU-hours (the baseline using the fewest)",
                     fleet["gpu_hours"] / runs[cheapest]["total"]["gpu_hours"], 1.1))
    if len(set(priorities)) > 1:
        top = int(np.argmax(priorities))
        job = list(runs["fleet-kale"]["jobs"])[top]
        alone = runs["kale-alone"]["jobs"][job]["slo_violation_s"]
        out.append(check(f"{job} (priority {priorities[top]:g}) SLO-violation s, fleet-kale - alone with 64 workers",
                         runs["fleet-kale"]["jobs"][job]["slo_violation_s"] - alone, 0.0,
                         note=f"alone: {alone:.0f} s"))
    return out


def spec_for(paths: list[Path], priorities: tuple, days: float | None, violation_gpus: float) -> FleetSpec:
    jobs = tuple(FleetJob(p.stem, str(p), priority=pr) for p, pr in zip(paths, priorities))
    return FleetSpec(GPUS, jobs, days=days, violation_gpus=violation_gpus)


def run_task(paths: list[str], priorities: tuple, days: float | None, violation_gpus: float, policy: str) -> dict:
    """One fleet policy on one window and priority setting (a process-pool task)."""
    spec = spec_for([Path(p) for p in paths], priorities, days, violation_gpus)
    jobs = prepare(spec, {Path(p).stem: load_trace(p) for p in paths})
    run = run_fleet_policy(policy, jobs, spec)
    return {"total": run.total, "jobs": run.jobs}


def offline_task(paths: list[str], priorities: tuple, days: float | None) -> dict:
    spec = spec_for([Path(p) for p in paths], priorities, days, 0.0)
    return fleet_offline(prepare(spec, {Path(p).stem: load_trace(p) for p in paths}), spec)


def common_days(paths: list[Path], days: float | None) -> float:
    """Days the jobs' evaluation windows have in common (after 14 days of history)."""
    spec = spec_for(paths, PRIORITIES["equal"], days, 0.0)
    jobs = prepare(spec, {p.stem: load_trace(p) for p in paths})
    return len(jobs[0].workload.arrivals) * spec.tick_s / 86400


def peak_needs(paths: list[Path], days: float | None) -> dict[str, int]:
    spec = spec_for(paths, PRIORITIES["equal"], days, 0.0)
    jobs = prepare(spec, {p.stem: load_trace(p) for p in paths})
    return {j.spec.name: j.cfg.cluster.workers_for(float(j.workload.arrivals.max()) / j.cfg.tick_s, 64)
            for j in jobs}


def choose(first: dict) -> tuple[float, list[dict]]:
    """The candidate meeting the most checks over the first halves of both priority
    settings, ties by the lowest total weighted violation time, then GPU-hours."""
    rows = []
    for vg, by_prio in first.items():
        checks = [c for prio, runs in by_prio.items() for c in judge(runs, PRIORITIES[prio])]
        rows.append({"violation_gpus": vg, "checks_met": sum(c["pass"] for c in checks), "checks": len(checks),
                     "weighted_slo_violation_s": sum(r["fleet-kale"]["total"]["weighted_slo_violation_s"]
                                                     for r in by_prio.values()),
                     "gpu_hours": sum(r["fleet-kale"]["total"]["gpu_hours"] for r in by_prio.values()),
                     "missed": [f"{p}: {c['name']}" for p, r in by_prio.items() for c in judge(r, PRIORITIES[p])
                                if not c["pass"]]})
    pick = max(rows, key=lambda r: (r["checks_met"], -r["weighted_slo_violation_s"], -r["gpu_hours"]))
    return pick["violation_gpus"], rows


def first_halves(pool, paths: list[str], half: float) -> dict:
    """Every candidate's fleet Kale and the baselines on the first half, both priority settings."""
    base = {(prio, pol): pool.submit(run_task, paths, pr, half, 0.0, pol)
            for prio, pr in PRIORITIES.items() for pol in BASELINES + ("kale-alone",)
            if not (pol in ("static-split", "kale-alone") and prio != "equal")}
    fleet = {(vg, prio): pool.submit(run_task, paths, pr, half, vg, "fleet-kale")
             for vg in CANDIDATES for prio, pr in PRIORITIES.items()}
    out = {}
    for (vg, prio), f in fleet.items():
        runs = {"fleet-kale": f.result()}
        for pol in BASELINES + ("kale-alone",):
            runs[pol] = base.get((prio, pol), base.get(("equal", pol))).result()
        out.setdefault(vg, {})[prio] = _reweight(runs, PRIORITIES[prio])
    return out


def _reweight(runs: dict, priorities: tuple) -> dict:
    """A copy of the runs with every job weighted by this setting's priorities (the static
    split and each job alone run once for both settings)."""
    import copy

    runs = copy.deepcopy(runs)
    for run in runs.values():
        for (name, m), p in zip(run["jobs"].items(), priorities):
            m["priority"], m["weighted_slo_violation_s"] = p, p * m["slo_violation_s"]
        run["total"]["weighted_slo_violation_s"] = sum(m["weighted_slo_violation_s"] for m in run["jobs"].values())
    return runs


def whole(pool, paths: list[str], days: float | None, vg: float) -> dict:
    """Every policy and the offline references on the whole common window, both settings."""
    futs = {(prio, pol): pool.submit(run_task, paths, pr, days, vg, pol)
            for prio, pr in PRIORITIES.items() for pol in POLICIES
            if not (pol in ("static-split", "kale-alone") and prio != "equal")}
    offs = {prio: pool.submit(offline_task, paths, pr, days) for prio, pr in PRIORITIES.items()}
    out = {}
    for prio, pr in PRIORITIES.items():
        runs = {pol: futs.get((prio, pol), futs.get(("equal", pol))).result() for pol in POLICIES}
        out[prio] = {"priorities": list(pr), "policies": _reweight(runs, pr), "offline": offs[prio].result()}
        out[prio]["checks"] = judge(out[prio]["policies"], pr)
    return out


def speed(repeats: int = 300) -> dict:
    """One arbitration of 20 jobs on 256 GPUs, with Kale-like plan costs (GPU-seconds, a
    convex lag price on the workers short, a rescale pause off the running count) and
    risk arrays from :func:`violation_risk`; every job asks for more than its share."""
    rng = np.random.default_rng(0)
    n = np.arange(65, dtype=float)
    cap = 1000.0 * n / (1 + 0.01 * (n - 1))
    batches = []
    for _ in range(repeats):
        ds = []
        for i in range(20):
            want, cur = int(rng.integers(16, 65)), int(rng.integers(4, 16))
            cost = 3600.0 * n + 4e4 * np.maximum(want - n, 0) ** 2 / want + np.where(n != cur, 9e4, 0.0)
            risk = violation_risk(cap, float(cap[want]) * 0.95, float(rng.uniform(0, 200)), cur, 300.0, 90.0, 3600.0)
            ds.append(JobDemand(f"job{i}", want, cur, 1, 64, float(rng.integers(1, 4)), cost=cost, risk_s=risk))
        batches.append(ds)
    load = os.getloadavg()[0]  # other work on the machine slows this down: recorded with the figures
    wall, cpu = [], []
    for ds in batches:
        s, c = time.perf_counter(), time.process_time()
        allocate(ds, 256)
        wall.append((time.perf_counter() - s) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    p50, p99, cpu99 = float(np.percentile(wall, 50)), float(np.percentile(wall, 99)), float(np.percentile(cpu, 99))
    return {"jobs": 20, "gpus": 256, "repeats": repeats, "p50_ms": round(p50, 3), "p99_ms": round(p99, 3),
            "cpu_p99_ms": round(cpu99, 3), "min_ms": round(float(min(wall)), 3),
            "load_average_1m_before": round(load, 2),
            "checks": [check("one allocation of 20 jobs on 256 GPUs, median wall (ms)", p50, 5.0),
                       check("one allocation of 20 jobs on 256 GPUs, p99 CPU time (ms)", cpu99, 5.0,
                             note=f"p99 wall {p99:.2f} ms at load average {load:.1f}")]}


def print_setting(prio: str, doc: dict, gpus: int) -> None:
    print(f"\n== priorities {prio} {doc['priorities']}, budget {gpus} GPUs")
    print(fleet_table({"gpus": gpus, "policies": doc["policies"], "offline": doc["offline"]}))
    for c in doc["checks"]:
        print(f"  [{'PASS' if c['pass'] else 'MISS'}] {c['name']}: {c['value']:.4g} (target {c['target']})"
              + (f"  ({c['note']})" if "note" in c else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "data" / "traces"), help="folder of trace CSVs")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "fleet.json"), help="output JSON")
    ap.add_argument("--days", type=float, default=None, help="limit the common window to this many days")
    ap.add_argument("--jobs", type=int, default=2, help="parallel simulations")
    args = ap.parse_args()
    paths = sorted(Path(args.traces).glob("*.csv"))
    if len(paths) != 4:
        print(f"expected the 4 shared traces in {args.traces}, found {len(paths)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    days = common_days(paths, args.days)
    names = [str(p) for p in paths]
    with ProcessPoolExecutor(args.jobs) as pool:
        first = first_halves(pool, names, days / 2)
        vg, rows = choose(first)
        print(f"== violation_gpus chosen on the first halves ({days / 2:.2f} days): {vg:g}")
        for r in rows:
            print(f"  {r['violation_gpus']:>6g}: checks met {r['checks_met']}/{r['checks']}, weighted violation "
                  f"{r['weighted_slo_violation_s']:.0f} s, GPU-h {r['gpu_hours']:.0f}; missed: "
                  f"{'; '.join(r['missed']) or 'none'}")
        runs = whole(pool, names, args.days, vg)
    for prio, doc in runs.items():
        print_setting(prio, doc, GPUS)
    sp = speed()
    print(f"\n== arbiter speed: 20 jobs on 256 GPUs, median {sp['p50_ms']:.2f} ms, p99 {sp['p99_ms']:.2f} ms wall "
          f"({sp['cpu_p99_ms']:.2f} ms CPU), min {sp['min_ms']:.2f} ms (load average "
          f"{sp['load_average_1m_before']:.1f} before)")
    for c in sp["checks"]:
        print(f"  [{'PASS' if c['pass'] else 'MISS'}] {c['name']}: {c['value']:.4g} (target {c['target']})")
    peaks = peak_needs(paths, args.days)
    report = {"gpus": GPUS, "traces": [p.name for p in paths], "peak_needs": peaks, "sum_of_peak_needs": sum(peaks.values()),
              "days": days, "days_option": args.days, "history_days": 14.0, "ref_workers": 32, "cluster": "amdahl",
              "alignment": "by tick index from each trace's evaluation start; the common length",
              "tuning": {"parameter": "violation_gpus", "candidates": list(CANDIDATES), "chosen": vg,
                         "window": f"first half ({days / 2:.2f} days)", "rows": rows},
              "runs": runs, "speed": sp, "wall_s": round(time.perf_counter() - started, 1)}
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
