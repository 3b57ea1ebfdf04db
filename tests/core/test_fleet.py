"""The fleet's arbiter, calendar overrides and pins: table tests and a brute-force check."""

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

from kale_airflow.core.fleet import (
    Allocation,
    JobDemand,
    Override,
    Pin,
    admit,
    allocate,
    arbitrate,
    best_split,
    bounded,
    bounds_at,
    check_floors,
    epoch_of,
    first_come,
    seconds_of,
    violation_risk,
    weighted_costs,
)
from kale_airflow.core.policies import Decision, Limits, Reason

COUNTS = np.arange(65, dtype=float)


def convex(want: int, per_worker_short: float = 10_000.0) -> np.ndarray:
    """A plan-like cost: GPU-seconds of the count plus a convex price on the workers short."""
    return 3600.0 * COUNTS + per_worker_short * np.maximum(want - COUNTS, 0.0) ** 2


def demand(name, want, current=None, cost=None, **kw):
    cost = convex(want) if cost is None else cost
    return JobDemand(name, want, want if current is None else current, cost=cost, **kw)


def utc(text: str) -> float:
    return pd.Timestamp(text, tz="UTC").value / 1e9


# ---------------------------------------------------------------- the split
@pytest.mark.parametrize("seed", range(40))
def test_best_split_is_exact_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    costs = [rng.integers(0, 50, rng.integers(1, 6)).astype(float) for _ in range(rng.integers(1, 5))]
    spare = int(rng.integers(0, 12))
    x = best_split(costs, spare)
    best = min(sum(c[i] for c, i in zip(costs, xs))
               for xs in itertools.product(*[range(len(c)) for c in costs]) if sum(xs) <= spare)
    assert sum(x) <= spare and all(0 <= xi < len(c) for xi, c in zip(x, costs))
    assert sum(c[i] for c, i in zip(costs, x)) == best


@pytest.mark.parametrize("seed", range(25))
def test_arbitrate_minimises_the_weighted_total_against_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    demands = []
    for j in range(int(rng.integers(2, 4))):
        want = int(rng.integers(2, 7))
        cost = 3600.0 * COUNTS[:8] + rng.integers(0, 40_000, 8)  # any shape: not convex
        risk = np.where(COUNTS[:8] < want - 1, rng.integers(0, 600, 8), 0.0)
        demands.append(JobDemand(f"j{j}", want, int(rng.integers(1, want + 1)), min_workers=int(rng.integers(1, 3)),
                                 priority=float(rng.integers(1, 4)), cost=cost, risk_s=risk))
    asks = sum(max(d.min_workers, d.want) for d in demands)
    floors = sum(d.min_workers for d in demands)
    budget = int(rng.integers(floors, max(floors + 1, asks)))  # below the asks (where it can be): the split decides
    targets = arbitrate(demands, budget)

    ranges = [range(d.min_workers, max(d.min_workers, d.want) + 1) for d in demands]
    priced = [weighted_costs(d, r.start, r.stop - 1) for d, r in zip(demands, ranges)]

    def total(counts):
        return sum(w[n - r.start] for w, r, n in zip(priced, ranges, counts))

    best = min(total(c) for c in itertools.product(*ranges) if sum(c) <= budget)
    assert sum(targets) <= budget
    assert all(d.min_workers <= t <= max(d.min_workers, d.want) for d, t in zip(demands, targets))
    assert total(targets) == pytest.approx(best, rel=1e-9)
    assert arbitrate(demands, asks) == [max(d.min_workers, d.want) for d in demands]  # all fit: all get their ask


def test_a_cheap_stay_beats_the_greedy_on_marginal_costs():
    # a runs 4 and staying there pays no rescale pause: its first extra workers save little,
    # the fourth saves much. A greedy on marginal costs feeds b and ends at 110; the DP
    # finds a at 4, b at 2 (40).
    a = JobDemand("a", 4, 4, cost=np.array([math.inf, 100.0, 99.0, 98.0, 0.0]))
    b = JobDemand("b", 5, 5, cost=np.array([math.inf, 60.0, 40.0, 25.0, 15.0, 10.0]))
    assert arbitrate([a, b], 6) == [4, 2]


def test_a_job_is_cut_only_to_give_the_gpus_to_another():
    # a asks to stay at 11 (its persistence window has not passed) although its plan is
    # cheaper at 10; b's 11th worker is worth nothing to it. The budget binds, but cutting a
    # helps nobody: a keeps its 11.
    a = JobDemand("a", 11, 11, cost=convex(11) - np.where(COUNTS == 10, 50_000.0, 0.0))
    b = JobDemand("b", 11, 10, cost=np.where(COUNTS >= 10, 0.0, 1e9))
    assert weighted_costs(a, 1, 11).min() == weighted_costs(a, 1, 11)[-1]
    assert arbitrate([a, b], 21) == [11, 10]


@pytest.mark.parametrize("case, demands, budget, expected", [
    ("fits: everyone gets what it asks",
     [("a", 10, 1, 1.0), ("b", 20, 1, 1.0)], 30, [10, 20]),
    ("tie: the job listed first gets the odd worker",
     [("a", 10, 1, 1.0), ("b", 10, 1, 1.0)], 15, [8, 7]),
    ("a job at its floor stays there",
     [("a", 2, 2, 1.0), ("b", 30, 1, 1.0)], 10, [2, 8]),
    ("priority: the job worth 3x gets twice the workers",
     [("a", 10, 1, 1.0), ("b", 10, 1, 3.0)], 12, [4, 8]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_arbitrate_table(case, demands, budget, expected):
    ds = [demand(n, w, min_workers=lo, priority=p) for n, w, lo, p in demands]
    assert arbitrate(ds, budget) == expected


def test_the_floors_are_never_crossed_and_the_budget_never_exceeded():
    ds = [demand("a", 40, min_workers=8), demand("b", 40, min_workers=8), demand("c", 40, min_workers=8)]
    targets = arbitrate(ds, 30)
    assert sum(targets) == 30 and min(targets) >= 8


def test_a_budget_below_the_floors_names_the_jobs_and_their_floors():
    with pytest.raises(ValueError, match=r"floors need 12 GPUs \(a 8, b 4\) but the budget is 10"):
        check_floors({"a": 8, "b": 4}, 10)
    with pytest.raises(ValueError, match="a 8, b 4"):
        allocate([demand("a", 8, min_workers=8), demand("b", 4, min_workers=4)], 10)


def test_first_come_takes_in_priority_then_listed_order_and_keeps_later_floors():
    ds = [demand("a", 30, min_workers=2), demand("b", 30, min_workers=2), demand("c", 30, min_workers=2, priority=2)]
    assert first_come(ds, 50) == [18, 2, 30]


# ---------------------------------------------------------------- admission and messages
def test_a_scale_down_holds_its_gpus_and_the_scale_up_waits_for_them():
    a = demand("a", 10, current=20)   # going down: holds 20 through its pause
    b = demand("b", 20, current=10)   # going up by 10
    assert admit([a, b], [10, 20], 30) == [10, 10]
    out = allocate([a, b], 30)
    assert out["a"].workers == 10 and not out["a"].held_back
    assert out["b"].workers == 10 and out["b"].target == 20 and out["b"].held_back
    assert out["b"].reason is Reason.HOLD_BUDGET
    assert "waits at 10 for the 10 GPUs its scale-up to 20 needs, being released by a" in out["b"].message
    # Once a's pause is over (it holds 10), b starts.
    assert allocate([demand("a", 10), b], 30)["b"].workers == 20


def staying(want, current):
    """A demand whose plan makes every rescale expensive: it keeps its count."""
    return demand("b" if current == 5 else "a", want, current, cost=convex(want) + np.where(COUNTS != current, 1e6, 0))


def test_a_job_held_back_is_told_who_holds_the_gpus_and_why():
    out = allocate([staying(10, 10), staying(10, 5)], 15)
    b = out["b"]
    assert (b.workers, b.target, b.want, b.held_back) == (5, 5, 10, True)
    assert b.holders == (("a", 10),)
    assert b.message.startswith("b gets 5 of the 10 workers it asks for: the 5 more would save it")
    assert "(budget 15 GPUs: a 10)" in b.message
    assert json.loads(json.dumps(b.to_dict()))["reason"] == "hold_budget"
    fcfs = allocate([staying(10, 10), staying(10, 5)], 15, rule="fcfs")["b"]
    assert "jobs before it in the first-come order took the rest" in fcfs.message


def test_a_job_rescaling_keeps_its_count():
    a = JobDemand("a", 30, 20, cost=convex(30), held=25, locked=True)
    b = demand("b", 30, current=1)
    out = allocate([a, b], 40)
    assert out["a"].workers == 20 and not out["a"].held_back
    assert out["b"].target == 20 and out["b"].workers == 1  # waits: a still holds 25 through its pause


@pytest.mark.parametrize("kwargs, match", [
    ({"priority": 0.0}, "priority must be > 0"),
    ({"min_workers": 5, "max_workers": 4}, "max_workers .4. is below min_workers .5."),
    ({"held": 1}, "held >= current"),
])
def test_bad_demands_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        JobDemand("a", 3, 3, **kwargs)


def test_unknown_rule_and_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="unknown rule"):
        allocate([demand("a", 1)], 4, rule="lottery")
    with pytest.raises(ValueError, match="unique"):
        allocate([demand("a", 1), demand("a", 1)], 4)


# ---------------------------------------------------------------- risk
CAP = np.arange(11) * 100.0  # 100 samples/s per worker


@pytest.mark.parametrize("case, rate, fresh, backlog, count, expected", [
    ("keeping up, no queue", 500.0, 0.0, 0.0, 5, 0.0),
    ("a little short: crosses the SLO late", 500.0, 0.0, 0.0, 4, 3600 - 90 - (300 - 90) / 0.2),
    ("far short: almost the whole horizon", 500.0, 0.0, 0.0, 0, 3600 - 90 - 210),
    ("past the SLO, staying exactly at the rate", 500.0, 400.0, 400 * 500.0, 5, 3600.0),
    ("past the SLO, draining", 500.0, 400.0, 400 * 500.0, 10, 90 + (490 - 300) / 1.0),
    ("a queue from a burst ages even at the rate", 500.0, 200.0, 200 * 800.0, 5, 3600 - (300 - 200) / (1 - 5 / 8)),
    ("past the SLO and short: the whole horizon", 500.0, 400.0, 400 * 500.0, 4, 3600.0),
    ("more than enough: the pause's queue drains under the SLO", 500.0, 0.0, 0.0, 10, 0.0),
    ("at exactly the SLO, staying at the rate", 500.0, 300.0, 300 * 500.0, 5, 0.0),
    ("a queue of unknown age at the rate it arrives", 500.0, 0.0, 1000.0, 5, 0.0),
    ("an age with nothing queued: nothing is late", 500.0, 400.0, 0.0, 5, 0.0),
    # the current 5 workers serve 500/s of 600/s arriving: from an empty queue the oldest
    # sample ages 1/6 s per s and passes the SLO after 1,800 s
    ("short with nothing queued yet: the queue builds from now", 600.0, 0.0, 0.0, 5, 3600 - 300 * 6),
    # after the pause the queue arrived at 900/s: 10 workers drain it (at 500/s spare) in 882 s,
    # before its age (falling 1/9 s per s from 490 s) is back under 300 s
    ("a burst's queue drains before its age falls under the SLO", 500.0, 400.0, 400 * 990.0, 10, 90 + 882.0),
], ids=lambda v: v if isinstance(v, str) else "")
def test_violation_risk_table(case, rate, fresh, backlog, count, expected):
    risk = violation_risk(CAP, rate, fresh, 5, 300.0, 90.0, 3600.0, backlog)
    assert risk[count] == pytest.approx(expected)


def test_violation_risk_defaults_and_short_horizons():
    args = (CAP, 500.0, 0.0, 5, 300.0, 90.0, 3600.0)
    np.testing.assert_array_equal(violation_risk(*args), violation_risk(*args, 0.0))  # no backlog by default
    # 4 workers cross the SLO 1,050 s after the pause: past a 600 s horizon, no risk at all.
    assert violation_risk(CAP, 500.0, 0.0, 5, 300.0, 90.0, 600.0)[4] == 0.0
    # Half a second old, 1,000 queued that arrived at 2,000/s: 10 workers (staying) drain it in
    # 2 s while its age grows 0.5 s per s, above a 1 s SLO for the last second.
    assert violation_risk(CAP, 500.0, 0.5, 10, 1.0, 90.0, 3600.0, 1000.0)[10] == pytest.approx(1.0)


def test_violation_risk_is_the_same_in_any_unit_of_samples():
    # Rates, capacities and backlogs in thousands: every risked second stays as it is.
    for rate, fresh, backlog in [(500.0, 0.0, 0.0), (500.0, 200.0, 200 * 800.0), (500.0, 400.0, 400 * 990.0),
                                 (50.0, 30.0, 700.0),
                                 (500.0, 400.0, 200.0)]:  # a queue of 0.2 thousand at the count staying
        full = violation_risk(CAP, rate, fresh, 5, 300.0, 90.0, 3600.0, backlog)
        small = violation_risk(CAP * 1e-3, rate * 1e-3, fresh, 5, 300.0, 90.0, 3600.0, backlog * 1e-3)
        np.testing.assert_allclose(small, full, rtol=1e-9, atol=1e-9)


def test_a_demand_from_a_plan_prices_the_plans_counts_at_the_higher_rate():
    from kale_airflow.core.capacity import KnownCapacity
    from kale_airflow.core.policies import KaleConfig, KalePolicy, Observation
    from kale_airflow.core.sources import OracleForecastSource

    table = 100.0 * COUNTS
    policy = KalePolicy(Limits(1, 64), OracleForecastSource(0.0, 15.0, np.full(2000, 0.0)), KnownCapacity(table),
                        KaleConfig(horizon_s=5400.0, slo_s=10.0))
    plan = policy.plan(Observation(0.0, 3, 0.0, 0.0, 0.0, None, None))
    assert plan.rate == 0.0
    kw = dict(capacity=table, freshness_s=4.0, slo_s=10.0, downtime_s=60.0, horizon_s=1800.0)
    d = JobDemand.from_plan("ads", plan, 2, 3, priority=3.0, **kw)
    assert d.cost is plan.cost and d.slo_ok is plan.slo_ok and (d.want, d.current, d.priority) == (2, 3, 3.0)
    assert d.horizon_s == 1800.0
    np.testing.assert_array_equal(d.risk_s, violation_risk(table[: len(plan.cost)], 0.0, 4.0, 3, 10.0, 60.0, 1800.0))
    # What is measured now counts when it is above the plan's rate, and so does the backlog.
    burst = JobDemand.from_plan("ads", plan, 2, 3, arrival_rate=450.0, backlog=900.0, **kw)
    np.testing.assert_array_equal(burst.risk_s,
                                  violation_risk(table[: len(plan.cost)], 450.0, 4.0, 3, 10.0, 60.0, 1800.0, 900.0))
    assert (burst.risk_s != d.risk_s).any()


def test_weighted_costs_of_a_job_without_a_plan_are_its_missing_worker_hours():
    d = JobDemand("a", 5, 2, priority=2.0)
    np.testing.assert_array_equal(weighted_costs(d, 2, 5), 2.0 * np.array([3, 2, 1, 0]) * 3600.0)


def test_counts_a_plan_rules_out_rank_after_every_allowed_one_more_workers_first():
    # Costs of millions of GPU-seconds, and of a fraction of one: a ruled-out count is always dearer.
    for scale in (1e7, 0.25):
        cost = np.array([math.inf, 3.0, math.inf, 2.0, math.inf, math.inf, 1.0]) * scale
        w = weighted_costs(JobDemand("a", 6, 3, cost=cost), 1, 6)
        allowed, ruled_out = w[[0, 2, 5]], w[[1, 3, 4]]
        np.testing.assert_allclose(allowed, [3.0 * scale, 2.0 * scale, 1.0 * scale])
        assert np.isfinite(w).all() and ruled_out.min() > allowed.max()
        assert ruled_out[0] > ruled_out[1] > ruled_out[2]  # of counts 2, 4, 5: more workers first
    # Nothing allowed: still ordered, more workers first.
    w = weighted_costs(JobDemand("a", 3, 1, cost=np.full(4, math.inf)), 1, 3)
    assert np.isfinite(w).all() and w[0] > w[1] > w[2]


def test_risk_past_the_known_counts_is_the_whole_horizon():
    # Risk or SLO tables that stop at count 3: count 4 (the ask) risks the whole 60 s horizon.
    cost = np.array([0.0, 400.0, 300.0, 200.0, 100.0])
    d = JobDemand("a", 4, 1, cost=cost, risk_s=np.array([0.0, 0.0, 5.0, 0.0]), horizon_s=60.0)
    np.testing.assert_array_equal(weighted_costs(d, 1, 4, violation_gpus=1.0), [400.0, 305.0, 200.0, 160.0])
    ok = JobDemand("a", 4, 1, cost=cost, slo_ok=np.array([False, True, False, True]), horizon_s=60.0)
    np.testing.assert_array_equal(weighted_costs(ok, 1, 4, violation_gpus=1.0), [400.0, 360.0, 200.0, 160.0])
    free = JobDemand("a", 4, 1, cost=cost)
    np.testing.assert_array_equal(weighted_costs(free, 1, 4), [400.0, 300.0, 200.0, 100.0])
    # A cost table that stops short: the counts past it are ruled out, the ask among them, and
    # no count is priced below the ask.
    short = weighted_costs(JobDemand("a", 4, 1, cost=cost[:3]), 1, 4)
    assert np.isfinite(short).all() and short.min() > 400.0 and short[2] > short[3]


def test_arbitrate_leaves_a_gpu_idle_rather_than_pay_a_rescale_that_costs_more():
    # a runs 2 (staying is cheap), b runs its ask of 2: the fifth GPU would cost a a rescale
    # pause for nothing, so it stays free.
    a = JobDemand("a", 4, 2, cost=np.array([math.inf, 100.0, 60.0, 80.0, 60.0]))
    b = JobDemand("b", 2, 2, cost=np.array([math.inf, 50.0, 40.0]))
    assert arbitrate([a, b], 5) == [2, 2]


def test_arbitrate_prices_risk_at_the_violation_price_it_is_given():
    # b's risk decides only when violation seconds are priced: free of charge, a's plan wins.
    a = JobDemand("a", 3, 1, cost=np.array([math.inf, 3e4, 2e4, 1e4]))
    b = JobDemand("b", 3, 1, cost=np.array([math.inf, 2e4, 1.9e4, 1.8e4]), risk_s=np.array([0.0, 900.0, 0.0, 0.0]))
    assert arbitrate([a, b], 4, violation_gpus=0.0) == [3, 1]
    assert arbitrate([a, b], 4, violation_gpus=64.0) == [2, 2]


def test_an_allocation_reads_back_as_its_fields():
    held = Allocation(2, 3, 4, True, Reason.HOLD_BUDGET, "b gets 2 of 4", (("a", 6), ("c", 1)))
    assert held.to_dict() == {"workers": 2, "target": 3, "want": 4, "held_back": True, "reason": "hold_budget",
                              "message": "b gets 2 of 4", "holders": [["a", 6], ["c", 1]]}
    assert Allocation(4, 4, 4, False, None, "").to_dict()["reason"] is None


def test_a_demands_json_has_no_infinities_and_old_documents_read_with_defaults():
    d = JobDemand("ads", 3, 2, cost=np.array([math.inf, 1.0]), risk_s=np.array([math.inf, 0.0]))
    json.dumps(d.to_dict(), allow_nan=False)  # strict JSON: infinities stored as null
    doc = {"name": "ads", "want": 3, "current": 2, "min_workers": 1, "max_workers": 8, "priority": 1.0}
    old = JobDemand.from_dict(doc)
    assert old.horizon_s == 3600.0 and old.locked is False
    back = JobDemand.from_dict(json.loads(json.dumps(d.to_dict())))
    assert back.cost.dtype == float and back.risk_s.dtype == float


def test_durations_are_numbers_or_text():
    assert seconds_of(90) == 90.0 and seconds_of(2.5) == 2.5 and seconds_of("90min") == 5400.0


def test_dates_are_epoch_seconds_in_utc():
    assert epoch_of(90) == 90.0 and epoch_of(2.5) == 2.5
    # 2026-12-24 00:00 UTC, written naive, in UTC and an hour east of it.
    assert epoch_of("2026-12-24") == epoch_of("2026-12-24T00:00Z") == epoch_of("2026-12-24T01:00+01:00") == 1798070400.0


def test_an_override_describes_itself():
    assert WEEKDAYS.describe() == "office hours: cron '0 8 * * 1-5' for 10 h (min 8)"
    assert XMAS.describe() == "2026-12-24 00:00 to 2026-12-27 00:00 (max 4)"
    both = Override(min_workers=2, max_workers=6, start_s=utc("2026-12-24"), end_s=utc("2026-12-25"))
    assert both.describe() == "2026-12-24 00:00 to 2026-12-25 00:00 (min 2, max 6)"


def test_risk_is_priced_by_priority_and_the_violation_price():
    d = JobDemand("a", 4, 4, priority=2.0, cost=np.zeros(5), risk_s=np.array([9.0, 5.0, 1.0, 0.0, 0.0]))
    np.testing.assert_allclose(weighted_costs(d, 1, 4, violation_gpus=10.0), [100.0, 20.0, 0.0, 0.0])
    only_ok = JobDemand("a", 4, 4, cost=np.zeros(5), slo_ok=np.array([0, 0, 1, 1, 1], dtype=bool), horizon_s=60.0)
    np.testing.assert_allclose(weighted_costs(only_ok, 1, 4, violation_gpus=1.0), [60.0, 0.0, 0.0, 0.0])


# ---------------------------------------------------------------- overrides and pins
WEEKDAYS = Override(min_workers=8, cron="0 8 * * 1-5", duration_s=10 * 3600, name="office hours")
XMAS = Override(max_workers=4, start_s=utc("2026-12-24"), end_s=utc("2026-12-27"))
LIMITS = Limits(1, 32)


@pytest.mark.parametrize("case, now, overrides, pins, expected", [
    ("no window", "2026-12-01 03:00", [WEEKDAYS], [], (1, 32, None)),
    ("weekday window open", "2026-12-01 09:00", [WEEKDAYS], [], (8, 32, Reason.OVERRIDE)),
    ("opens exactly at the cron time", "2026-12-01 08:00", [WEEKDAYS], [], (8, 32, Reason.OVERRIDE)),
    ("closed after its duration", "2026-12-01 18:00", [WEEKDAYS], [], (1, 32, None)),
    ("closed on Saturday", "2026-12-05 09:00", [WEEKDAYS], [], (1, 32, None)),
    ("dated cap", "2026-12-25 12:00", [XMAS], [], (1, 4, Reason.OVERRIDE)),
    ("dated window ends before its end", "2026-12-27 00:00", [XMAS], [], (1, 32, None)),
    ("a floor over a cap wins", "2026-12-24 09:00", [WEEKDAYS, XMAS], [], (8, 8, Reason.OVERRIDE)),
    ("clipped to the limits", "2026-12-01 09:00", [Override(min_workers=99, cron="0 8 * * *", duration_s=3600 * 4)],
     [], (32, 32, Reason.OVERRIDE)),
    ("a pin sets both", "2026-12-01 09:00", [WEEKDAYS], [Pin(3, utc("2026-12-01 12:00"))], (3, 3, Reason.OVERRIDE)),
    ("an expired pin is gone", "2026-12-01 13:00", [], [Pin(3, utc("2026-12-01 12:00"))], (1, 32, None)),
    ("the last live pin wins", "2026-12-01 09:00", [],
     [Pin(3, utc("2026-12-02")), Pin(5, utc("2026-12-01 10:00"))], (5, 5, Reason.OVERRIDE)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bounds_table(case, now, overrides, pins, expected):
    b = bounds_at(LIMITS, utc(now), overrides, pins)
    assert (b.min_workers, b.max_workers, b.reason) == expected


def test_bounds_say_until_when_they_hold():
    assert bounds_at(LIMITS, utc("2026-12-01 09:00"), [WEEKDAYS]).until_s == utc("2026-12-01 18:00")
    assert bounds_at(LIMITS, utc("2026-12-01 19:00"), [WEEKDAYS]).until_s == utc("2026-12-02 08:00")
    assert bounds_at(LIMITS, utc("2026-12-20"), [XMAS]).until_s == utc("2026-12-24")
    assert bounds_at(LIMITS, utc("2026-12-28"), [XMAS]).until_s == math.inf


def test_a_decision_moved_by_a_window_carries_the_override_reason():
    b = bounds_at(LIMITS, utc("2026-12-01 09:00"), [WEEKDAYS])
    d = bounded(Decision(3, Reason.SCALE_DOWN_FORECAST, "3 workers carry it"), b)
    assert d.workers == 8 and d.reason is Reason.OVERRIDE
    assert d.message == ("schedule override office hours: cron '0 8 * * 1-5' for 10 h (min 8): 8 workers instead of 3 "
                         "(3 workers carry it)")
    inside = Decision(12, Reason.HOLD, "fine")
    assert bounded(inside, b) is inside
    pinned = bounds_at(LIMITS, utc("2026-12-01 09:00"), pins=[Pin(6, utc("2026-12-01 12:00"), "incident 42")])
    assert pinned.message == "pinned to 6 workers until 2026-12-01 12:00 (incident 42)"


def test_overrides_and_pins_from_config_mappings():
    o = Override.from_dict({"cron": "0 8 * * 1-5", "duration": "10h", "min_workers": 8})
    assert o.duration_s == 36000 and o.window(utc("2026-12-01 09:00"))[0]
    d = Override.from_dict({"start": "2026-12-24", "end": "2026-12-27T00:00:00+01:00", "max_workers": 4})
    assert d.start_s == utc("2026-12-24") and d.end_s == utc("2026-12-26 23:00")
    assert Pin.from_dict({"workers": 6, "until": "2026-12-01T12:00"}).until_s == utc("2026-12-01 12:00")


@pytest.mark.parametrize("doc, match", [
    ({"cron": "0 8 * * 1-5", "duration": "10h"}, "give min_workers, max_workers or both"),
    ({"cron": "not a cron", "duration": "1h", "min_workers": 2}, "needs five valid fields"),
    ({"cron": "0 8 * * *", "min_workers": 2}, "positive duration"),
    ({"start": "2026-12-24", "min_workers": 2}, "end must come after start"),
    ({"min_workers": 2}, "either cron .with duration. or start and end"),
    ({"cron": "0 8 * * *", "duration": "1h", "min_workers": 4, "max_workers": 2}, "below min_workers"),
    ({"cron": "0 8 * * *", "duration": "1h", "min": 4}, "unknown key"),
])
def test_bad_overrides_are_refused(doc, match):
    with pytest.raises(ValueError, match=match):
        Override.from_dict(doc)


def test_a_demand_survives_the_control_plane_and_an_idle_one_keeps_what_it_runs():
    """Bug classes: a demand read back from the control plane with a cost, risk, bound,
    priority or count changed (infinite costs lost in JSON), a stale job's demand still
    asking for GPUs it does not run."""
    cost = np.array([math.inf, 9.0, 4.0, 5.5])
    d = JobDemand("ads", 3, 2, 1, 3, 2.5, cost=cost, risk_s=np.array([math.inf, 60.0, 0.0, 0.0]),
                  slo_ok=np.array([False, True, True, True]), horizon_s=1800.0, held=4, locked=True)
    back = JobDemand.from_dict(json.loads(json.dumps(d.to_dict())))
    assert (back.name, back.want, back.current, back.min_workers, back.max_workers, back.priority, back.horizon_s,
            back.held, back.locked) == ("ads", 3, 2, 1, 3, 2.5, 1800.0, 4, True)
    assert back.cost.tolist() == cost.tolist() and back.risk_s.tolist() == [math.inf, 60.0, 0.0, 0.0]
    assert back.slo_ok.tolist() == [False, True, True, True]
    plain = JobDemand.from_dict(json.loads(json.dumps(JobDemand("feed", 5, 1).to_dict())))
    assert plain.cost is None and plain.risk_s is None and plain.slo_ok is None and plain.held is None
    idle = JobDemand("ads", 6, 2, 3, 8, 2.0, cost=cost, held=4).idle()
    assert (idle.want, idle.current, idle.min_workers, idle.max_workers, idle.held, idle.locked) == (2, 2, 2, 3, 4, True)
    assert idle.cost is None and idle.priority == 2.0
    out = allocate([idle, JobDemand("ranking", 10, 0, 1, 10)], 10)
    assert out["ads"].workers == 2 and out["ranking"].workers == 6  # ads keeps its 2 (it holds 4 now)


# ---------------------------------------------------------------- what mutation showed untested
def test_a_job_that_gets_what_it_asks_is_not_held_back():
    out = allocate([demand("a", 10), demand("b", 5)], 30)
    assert out["a"] == Allocation(10, 10, 10, False, None, "")


def test_the_holders_are_listed_by_gpus_then_name_and_only_those_releasing_are_named():
    # z goes down from 6 (releasing), c stays at 1, d runs nothing, b waits to go up.
    z, b = demand("z", 3, current=6), demand("b", 8, current=2)
    c, d = demand("c", 1, current=1), JobDemand("d", 0, 0, 0, 4)
    out = allocate([z, b, c, d], 12)
    assert out["b"].message == ("b waits at 2 for the 6 GPUs its scale-up to 8 needs, being released by z "
                                "(budget 12 GPUs: z 6, c 1)")
    assert out["b"].holders == (("z", 6), ("c", 1))


def test_a_job_admitted_up_holds_its_new_count():
    a, b = demand("a", 6, current=2), staying(10, 5)
    out = allocate([a, b], 11)
    assert out["a"].workers == 6 and ("a", 6) in out["b"].holders


def test_scale_ups_share_what_is_free_in_order_and_floors_take_what_is_left():
    ups = [demand("a", 7, current=2), demand("b", 7, current=2)]
    assert admit(ups, [7, 7], 12) == [7, 2]  # 8 free: a's 5 fit, b's 5 wait for the 3 left
    floors = [demand("a", 3, current=1, min_workers=3), demand("b", 3, current=1, min_workers=3)]
    assert admit(floors, [5, 5], 5) == [4, 1]  # a's 4 more do not fit: it takes the 3 free towards its floor
    assert admit(floors[:1], [3], 2) == [2]  # one GPU free: towards the floor at once


def test_the_arbiters_reason_states_the_saving_in_gpu_hours():
    a = demand("a", 10, cost=(10 - COUNTS[:11]) * 288_000.0)  # 80 GPU-h per worker short
    b = demand("b", 10, current=5, cost=(10 - COUNTS[:11]) * 28_800.0)  # 8 GPU-h per worker short
    msg = allocate([a, b], 15)["b"].message
    assert msg == ("b gets 5 of the 10 workers it asks for: the 5 more would save it 40.00 GPU-h (priority 1 x its "
                   "plan's cost and risked SLO time), less than they save where they are (budget 15 GPUs: a 10)")


def test_pins_and_windows_state_their_bounds_exactly():
    t = utc("2026-12-24 09:00")
    assert bounds_at(LIMITS, t).message == "" and bounds_at(LIMITS, t).until_s == math.inf
    assert bounds_at(LIMITS, t, pins=[Pin(3, t)]).until_s == math.inf  # a pin ending now is over
    plain = bounds_at(LIMITS, t, pins=[Pin(0, t + 60)])
    assert (plain.min_workers, plain.message) == (1, "pinned to 1 workers until 2026-12-24 09:01")
    six = Override(max_workers=6, start_s=utc("2026-12-24"), end_s=utc("2026-12-25"), name="six")
    both = bounds_at(LIMITS, t, [XMAS, six])
    assert both.max_workers == 4
    assert both.message == ("schedule override 2026-12-24 00:00 to 2026-12-27 00:00 (max 4); "
                            "six: 2026-12-24 00:00 to 2026-12-25 00:00 (max 6)")
    before = bounds_at(LIMITS, utc("2026-12-20"), [XMAS])
    assert (before.max_workers, before.reason) == (32, None)
    # Half a second before the 08:00 window: closed, opening at 08:00.
    early = bounds_at(LIMITS, utc("2026-12-01 08:00") - 0.5, [WEEKDAYS])
    assert (early.min_workers, early.until_s) == (1, utc("2026-12-01 08:00"))


def test_a_decision_moved_inside_the_bounds_keeps_its_details():
    b = bounds_at(LIMITS, utc("2026-12-01 09:00"), [WEEKDAYS])
    assert bounded(Decision(3, Reason.HOLD, "x", {"plan": [1, 2]}), b).details == {"plan": [1, 2]}


@pytest.mark.parametrize("kwargs, message", [
    ({"cron": "0 8 * * *", "duration_s": 60.0, "name": "peak"}, "schedule override peak: give min_workers, "
                                                                "max_workers or both"),
    ({"cron": "0 8 * * *", "duration_s": 0.0, "min_workers": 2}, "schedule override 0 8 * * *: cron '0 8 * * *' "
     "needs five valid fields and a positive duration, e.g. cron: '0 8 * * 1-5' with duration: 10h"),
    ({"start_s": 10.0, "end_s": 10.0, "min_workers": 2}, "schedule override: end must come after start"),
])
def test_an_override_refused_says_which_and_why(kwargs, message):
    with pytest.raises(ValueError) as e:
        Override(**kwargs)
    assert str(e.value) == message


def test_the_tightest_overrides_and_pins_are_allowed():
    assert Override(min_workers=4, max_workers=4, cron="0 8 * * *", duration_s=1.0).duration_s == 1.0
    assert Pin(0, 60.0).workers == 0
    with pytest.raises(ValueError) as e:
        Pin(-1, 60.0)
    assert str(e.value) == "a pin needs workers >= 0, got -1"


def test_names_and_notes_come_from_config_and_default_to_empty():
    named = Override.from_dict({"cron": "0 8 * * *", "duration": "1h", "min_workers": 2, "name": "peak"})
    assert named.name == "peak"
    assert Override.from_dict({"cron": "0 8 * * *", "duration": "1h", "min_workers": 2}).name == ""
    assert Pin.from_dict({"workers": 2, "until": 60, "note": "incident 7"}).note == "incident 7"
    assert Pin.from_dict({"workers": 2, "until": 60}).note == ""


def test_a_scale_up_waiting_names_every_job_releasing_gpus():
    # a and c go down (each holds its old count through the pause); b waits for what they release.
    a, b, c = demand("a", 2, current=5), demand("b", 9, current=3), demand("c", 1, current=4)
    out = allocate([a, b, c], 12)
    assert out["b"].message == ("b waits at 3 for the 6 GPUs its scale-up to 9 needs, being released by a, c "
                                "(budget 12 GPUs: a 5, c 4)")


def test_holders_with_as_many_gpus_are_listed_by_name():
    # m and c hold 4 each (listed m first); b is held back at 2 of the 6 it asks for.
    m, c = (JobDemand(name, 4, 4, cost=staying(4, 4).cost) for name in ("m", "c"))
    out = allocate([m, c, JobDemand("b", 6, 2, cost=staying(6, 2).cost)], 10)
    assert out["b"].holders == (("c", 4), ("m", 4))
    assert out["b"].message.endswith("(budget 10 GPUs: c 4, m 4)")


def test_a_job_held_back_alone_is_told_nobody_else_holds_gpus():
    out = allocate([demand("a", 8, current=3)], 3)
    assert out["a"].held_back and out["a"].message.endswith("(budget 3 GPUs: nobody)")


def test_the_saving_is_the_cost_difference_whatever_the_cost_at_the_ask():
    # As above, with 5 GPU-h added to every count of b: the saving of 5 more stays 40 GPU-h.
    a = demand("a", 10, cost=(10 - COUNTS[:11]) * 288_000.0)
    b = demand("b", 10, current=5, cost=(10 - COUNTS[:11]) * 28_800.0 + 18_000.0)
    assert "the 5 more would save it 40.00 GPU-h" in allocate([a, b], 15)["b"].message


def test_an_unknown_rule_lists_the_rules():
    with pytest.raises(ValueError, match=r"unknown rule 'lottery'; choose from arbiter, fcfs$"):
        allocate([demand("a", 1)], 4, rule="lottery")


def test_a_budget_of_zero_is_enough_for_floors_of_zero():
    check_floors({"a": 0, "b": 0}, 0)
    assert allocate([JobDemand("a", 2, 0, min_workers=0)], 0)["a"].workers == 0


@pytest.mark.parametrize("current, want", [(-1, 2), (2, -1)])
def test_a_negative_count_is_refused_alone(current, want):
    with pytest.raises(ValueError, match="counts must be >= 0"):
        JobDemand("a", want, current)


def test_a_scale_up_within_the_gpus_it_holds_takes_nothing_from_the_free_ones():
    # a runs 2 but still holds 3 (a pause) and goes to 3: no new GPU. b's 2 more take the 2 free.
    a, b = JobDemand("a", 3, 2, held=3), JobDemand("b", 3, 1)
    assert admit([a, b], [3, 3], 6) == [3, 3]


def test_a_job_below_its_floor_takes_what_is_free_and_leaves_what_it_holds():
    # a holds 3 GPUs but runs none (a pause), floor 4, target 5: it starts 1 at once, within what
    # it holds, and takes none of the free GPU, which b's scale-up by one then gets.
    a = JobDemand("a", 5, 0, min_workers=4, held=3)
    b = JobDemand("b", 2, 1, min_workers=0)
    assert admit([a, b], [5, 2], 5) == [1, 2]
    # c runs 1 below its floor 3 and takes both free GPUs towards its target of 4; d's move
    # within its own GPUs still fits in the none left.
    c, d = JobDemand("c", 4, 1, min_workers=3), JobDemand("d", 2, 1, min_workers=0, held=2)
    assert admit([c, d], [4, 2], 5) == [3, 2]
