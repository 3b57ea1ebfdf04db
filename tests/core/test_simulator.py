"""The simulator implements DESIGN.md's protocol; no policy sees the future."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kale_airflow.core.policies import Decision, Reason, StaticPolicy
from kale_airflow.core.simulator import (
    ALL_POLICIES,
    SimConfig,
    SimulationError,
    Workload,
    build_policy,
    build_workload,
    fluid_gpu_hours,
    run_policy,
    simulate,
)
from kale_airflow.core.throughput import ClusterModel
from kale_airflow.core.traffic import load_trace
from tests.conftest import daily_series

CFG = SimConfig(history_days=14, days=2, cluster=ClusterModel(noise_sd=0.0))


@pytest.fixture(scope="module")
def trace():
    return load_trace(daily_series(days=16, step_s=300, noise=0.1, seed=1) * 10)


def workload(arrivals, tick=15.0):
    return Workload(0.0, np.asarray(arrivals, dtype=float), pd.Series(dtype=float), 1.0, tick)


class Script:
    """Replays a fixed list of worker counts (one per decision): a test input."""

    name, interval_s = "script", 15.0

    def __init__(self, counts):
        self.counts = list(counts)
        self.seen = []

    def decide(self, obs):
        self.seen.append(obs)
        return Decision(self.counts[min(len(self.seen) - 1, len(self.counts) - 1)], Reason.HOLD)


def test_scaling_puts_p99_at_ref_workers(trace):
    w = build_workload(trace, CFG)
    p99 = np.percentile(trace.rates, 99) * w.scale
    assert p99 == pytest.approx(CFG.cluster.capacity(32))
    assert len(w.arrivals) == 2 * 86400 / 15
    # Each 5-minute value is spread evenly over its 20 ticks.
    np.testing.assert_allclose(w.arrivals[:20], w.arrivals[0])


def test_enough_static_capacity_means_no_lag():
    run = run_policy(StaticPolicy(10), workload([1000.0] * 100), CFG, np.ones(100), 10)
    m = run.metrics
    assert m["accumulated_lag"] == 0 and m["slo_violation_rate"] == 0 and m["rescales"] == 0
    assert m["gpu_hours"] == pytest.approx(10 * 100 * 15 / 3600)


def test_a_rescale_pauses_training_and_holds_max_gpus():
    cfg = replace(CFG, rescale_downtime_s=90)
    arrivals = [15_000.0] * 40  # 1,000 samples/s
    run = run_policy(Script([4, 8]), workload(arrivals), cfg, np.ones(40), 4)
    m = run.metrics
    assert m["rescales"] == 1 and m["downtime_s"] == 90
    assert list(run.workers[:8]) == [4, 8, 8, 8, 8, 8, 8, 8]  # change at tick 1: 6 ticks of 8 held
    # Backlog builds for 90 s, then drains; samples are conserved.
    assert run.backlog[6] == pytest.approx(15_000 * 6)
    processed = sum(arrivals) - run.backlog[-1]
    assert processed <= sum(arrivals) and run.backlog[-1] == pytest.approx(0)


def test_fifo_freshness_lag_matches_brute_force():
    rng = np.random.default_rng(4)
    arrivals = rng.uniform(0, 30_000, 200)
    cfg = replace(CFG, cluster=ClusterModel(per_worker=1000, serial_fraction=0.0, noise_sd=0.0))
    run = run_policy(StaticPolicy(1), workload(arrivals), cfg, np.ones(200), 1)
    # Brute force: a queue of (arrival time, count) chunks, 1,000 samples/s service.
    queue, fresh = [], []
    for k, a in enumerate(arrivals):
        pieces = 100
        queue += [(k * 15 + (i + 0.0) * 15 / pieces, a / pieces) for i in range(pieces)]
        budget = 15_000.0
        while queue and budget > 1e-9:
            t, c = queue[0]
            take = min(c, budget)
            budget -= take
            queue[0] = (t, c - take)
            if queue[0][1] <= 1e-9:
                queue.pop(0)
        fresh.append((k + 1) * 15 - queue[0][0] if queue else 0.0)
    np.testing.assert_allclose(run.freshness, fresh, atol=15 / 100 + 1e-6)
    assert run.metrics["accumulated_lag"] == pytest.approx(run.backlog.sum() * 15)


def test_policies_see_metrics_of_the_past_tick_only():
    arrivals = [1500.0, 3000.0, 4500.0, 6000.0]
    script = Script([10])
    run_policy(script, workload(arrivals), CFG, np.ones(4), 10)
    rates = [o.arrival_rate for o in script.seen]
    assert rates == [None, 100.0, 200.0, 300.0]


def runs_with_changed_future(trace, name):
    """(run on the trace, run with arrivals tripled from the middle on, index of the change)."""
    w1 = build_workload(trace, CFG)
    k = len(w1.arrivals) // 2
    w2 = build_workload(trace, CFG)
    w2.arrivals = w1.arrivals.copy()
    w2.arrivals[k:] *= 3.0
    noise = np.ones(len(w1.arrivals))
    r1 = run_policy(build_policy(name, CFG, w1), w1, CFG, noise, 8)
    r2 = run_policy(build_policy(name, CFG, w2), w2, CFG, noise, 8)
    cut = w1.start_s + k * CFG.tick_s
    before = [[e for e in r.rescale_events if e["t"] < cut] for r in (r1, r2)]
    return r1, r2, k, before


@pytest.mark.parametrize("name", ["kale", "hpa", "keda", "autopilot"])
def test_no_policy_sees_the_future(trace, name):
    """Changing arrivals after tick K changes no decision before K, for every online policy.

    Static (sized for the window's peak) and the oracle (reads the true future) are
    references, not online policies."""
    r1, r2, k, before = runs_with_changed_future(trace, name)
    assert before[0] == before[1]
    np.testing.assert_array_equal(r1.workers[:k], r2.workers[:k])
    assert r1.rescale_events != r2.rescale_events, f"{name} ignored the change"


def test_the_oracle_does_see_the_future(trace):
    *_, before = runs_with_changed_future(trace, "oracle")
    assert before[0] != before[1]


def test_fluid_bound_is_a_lower_bound(trace):
    result = simulate(trace, ALL_POLICIES, CFG)
    for name, run in result.runs.items():
        assert run.metrics["gpu_hours"] >= result.fluid_gpu_hours, name
    doc = result.to_dict()
    assert set(doc["policies"]) == set(ALL_POLICIES)
    for m in doc["policies"].values():
        assert {"accumulated_lag", "mean_wait_s", "downtime_s", "slo_violation_rate", "gpu_hours", "rescales"} <= set(m)
    assert doc["limits"]["fluid_gpu_hours"] == pytest.approx(fluid_gpu_hours(result.workload.arrivals, CFG))


def test_kale_beats_hpa_on_a_daily_pattern(trace):
    r = simulate(trace, ("kale", "hpa"), CFG).to_dict()["policies"]
    assert r["kale"]["gpu_hours"] < r["hpa"]["gpu_hours"]
    assert r["kale"]["rescales"] < r["hpa"]["rescales"]
    assert r["kale"]["slo_violation_rate"] <= r["hpa"]["slo_violation_rate"]


def test_step_that_is_not_a_multiple_of_the_tick_is_refused():
    t = load_trace(daily_series(days=16, step_s=20))
    with pytest.raises(SimulationError, match="not a whole multiple of the tick"):
        build_workload(t, replace(CFG, tick_s=15))


def test_too_short_for_history_is_refused(trace):
    with pytest.raises(SimulationError, match="lower history_days"):
        build_workload(trace, replace(CFG, history_days=16))


def test_unknown_policy_is_refused(trace):
    with pytest.raises(SimulationError, match="unknown policy 'vpa'"):
        simulate(trace, ("vpa",), CFG)
