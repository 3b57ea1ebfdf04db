"""Rebalancer benchmark (issue 4): speed, balance, movement, and its value in the simulator.

    .venv/bin/python benchmarks/rebalance.py [--json OUT] [--sim-days 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from kale_airflow.core.rebalance import RebalanceOptions, assign
from kale_airflow.core.simulator import SimConfig, simulate
from kale_airflow.core.traffic import BUNDLED_TRACE, load_trace
from kale_airflow.reporting.results import write_json

ROOT = Path(__file__).resolve().parent.parent


def lpt_max(rates: dict, n: int) -> float:
    import heapq

    heap = [(0.0, w) for w in range(n)]
    for r in sorted(rates.values(), reverse=True):
        load, w = heapq.heappop(heap)
        heapq.heappush(heap, (load + r, w))
    return max(load for load, _ in heap)


def zipf_rates(count: int, s: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, count + 1) ** s
    return {f"p{i:05d}": float(x) for i, x in enumerate(rng.permutation(w / w.sum() * 1e6))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "rebalance.json"))
    ap.add_argument("--sim-days", type=float, default=7.0)
    args = ap.parse_args()
    report: dict = {}

    rates = zipf_rates(10_000, 1.0, 0)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        a = assign(rates, 512)
        times.append((time.perf_counter() - t0) * 1e3)
    report["speed"] = {"partitions": 10_000, "workers": 512, "ms_median": float(np.median(times)),
                       "pass": float(np.median(times)) <= 200}
    print(f"10,000 partitions over 512 workers: {np.median(times):.1f} ms (target <= 200)")
    report["split_imbalance"] = {"value": a.imbalance, "pass": a.imbalance <= 1.01}
    print(f"imbalance with slicing: {a.imbalance:.6f} (target <= 1.01)")

    rows = []
    for count, n, s in [(10_000, 512, 1.0), (1_000, 64, 0.8), (256, 48, 1.2), (64, 40, 0.6)]:
        r = zipf_rates(count, s, 1)
        whole = assign(r, n, options=RebalanceOptions(split=False))
        lpt = lpt_max(r, n) / (sum(r.values()) / n)
        rows.append({"partitions": count, "workers": n, "zipf": s, "imbalance": whole.imbalance, "lpt": lpt,
                     "lower_bound": whole.imbalance_lower_bound(False), "pass": whole.imbalance <= lpt + 1e-9})
        print(f"no slicing, {count} partitions / {n} workers, Zipf {s}: imbalance {whole.imbalance:.4f} vs LPT "
              f"{lpt:.4f} (lower bound {whole.imbalance_lower_bound(False):.4f})")
    report["no_split"] = rows

    moves = []
    for n in (16, 64, 511):
        prev = assign(rates, n)
        for delta in (-1, 1):
            nxt = assign(rates, n + delta, previous=prev)
            ratio = nxt.moved_rate / nxt.moved_lower_bound
            moves.append({"from": n, "to": n + delta, "moved_fraction": nxt.moved_fraction,
                          "minimum_fraction": nxt.moved_lower_bound / nxt.total_rate, "ratio": ratio,
                          "pass": ratio <= 1.5})
            print(f"{n} -> {n + delta} workers: moved {nxt.moved_fraction:.4%} (minimum "
                  f"{nxt.moved_lower_bound / nxt.total_rate:.4%}, ratio {ratio:.3f}, target <= 1.5)")
    report["moves"] = moves

    trace = load_trace(BUNDLED_TRACE)
    sims = []
    for skew in (0.2, 0.4, 0.8):
        row = {"zipf": skew}
        for strategy in ("rebalance", "round_robin"):
            cfg = SimConfig(days=args.sim_days, shard_skew=skew, shard_assignment=strategy)
            m = simulate(trace, ("kale",), cfg).runs["kale"].metrics
            row[strategy] = {k: m[k] for k in ("accumulated_lag", "mean_wait_s", "slo_violation_rate", "gpu_hours",
                                               "rescales")}
        sims.append(row)
        rb, rr = row["rebalance"], row["round_robin"]
        print(f"simulator, {args.sim_days:g} days, 128 partitions Zipf {skew}: Kale + rebalancer wait "
              f"{rb['mean_wait_s']:.1f}s, SLO {rb['slo_violation_rate']:.2%}, {rb['gpu_hours']:.0f} GPU-h | "
              f"round-robin wait {rr['mean_wait_s']:.1f}s, SLO {rr['slo_violation_rate']:.2%}, "
              f"{rr['gpu_hours']:.0f} GPU-h")
    report["simulator"] = sims
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
