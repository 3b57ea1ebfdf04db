"""The Kale planner policy: one table test per binding term, then the holds that are not
economics, persistence, first start, state and the one factory.

The forecast comes from a real source fed the scripted future (``OracleForecastSource``)
and the capacity from a fixed table (``KnownCapacity``): inputs, not our decision logic.
"""

import math

import numpy as np
import pytest

from kale_airflow.core.capacity import KnownCapacity, OnlineThroughput
from kale_airflow.core.cluster import ClusterModel
from kale_airflow.core.forecast import get_forecaster
from kale_airflow.core.policies import KaleConfig, KalePolicy, Limits, Observation, Reason, build_kale
from kale_airflow.core.policies.kale import FALLBACK_MARGIN, planned_downtime
from kale_airflow.core.sources import OnlineForecastSource, OracleForecastSource
from tests.conftest import daily_series

PER = 1000.0                    # samples/s per worker: a linear cluster keeps the arithmetic readable
TABLE = PER * np.arange(65.0)   # 0..64 workers
BIN, TICK = 300.0, 15.0
CFG = KaleConfig(horizon_s=5400.0, wait_cost=1.0, persist_s=60.0, slo_s=300.0, rescale_downtime_s=90.0)
LIMITS = Limits(1, 64)


def kale(bins, config=CFG, limits=LIMITS, table=TABLE):
    """Kale whose forecast is ``bins`` (samples/s per 5-minute bin from t = 0)."""
    rates = np.repeat(np.asarray(bins, dtype=float), int(BIN / TICK))
    return KalePolicy(limits, OracleForecastSource(0.0, TICK, rates, bin_s=BIN), KnownCapacity(table), config)


def obs(t, workers, rate=None, backlog=0.0, fresh=0.0, **kw):
    return Observation(t, workers, rate, backlog, fresh, None, None, **kw)


def run(policy, workers, rate, ticks=6, t0=0.0, **kw):
    """Decide for up to ``ticks`` ticks at a fixed count; the first decision that changes it,
    else the last one."""
    d = None
    for k in range(ticks):
        d = policy.decide(obs(t0 + k * TICK, workers, rate, **kw))
        if d.workers != workers:
            break
    return d


# Each row: forecast bins, running count, what is measured now, the reason, and the range
# the target must lie in.
BINDING = {
    "the forecast: 20 cannot keep up with 30,000/s in 10 minutes": (
        [20000] * 2 + [30000] * 30, 20, {"rate": 20000}, Reason.SCALE_UP_FORECAST, (30, 32)),
    "a lasting fall: 30 -> fewer": ([15000] * 40, 30, {"rate": 15000}, Reason.SCALE_DOWN_FORECAST, (18, 24)),
    "a dip now does not pay for two restarts": (
        [10000] * 2 + [25000] * 30, 25, {"rate": 10000}, Reason.HOLD_NOT_WORTH_DOWNTIME, (25, 25)),
    "the count fits": ([25000] * 40, 25, {"rate": 25000}, Reason.HOLD, (25, 25)),
    "a backlog drains sooner at more workers": (
        [20000] * 40, 22, {"rate": 20000, "backlog": 4e6, "fresh": 150.0}, Reason.SCALE_UP_BACKLOG, (23, 64)),
    "the SLO: the oldest sample is 200 s old and 20 fall behind": (
        [25000] * 40, 20, {"rate": 25000, "backlog": 2e6, "fresh": 200.0}, Reason.SCALE_UP_SLO_RISK, (26, 64)),
}


@pytest.mark.parametrize("bins,workers,now,reason,target", BINDING.values(), ids=BINDING.keys())
def test_the_reason_names_the_binding_term(bins, workers, now, reason, target):
    d = run(kale(bins), workers, **now)
    assert d.reason == reason, d.message
    assert target[0] <= d.workers <= target[1]
    assert d.details["plan_workers"] == d.workers and d.details["plan_gpu_h"] > 0


@pytest.mark.parametrize("table,expected", [
    (TABLE, 64),                                  # every worker more drains sooner: the most
    (np.minimum(TABLE, 40000.0), 40),             # a plateau from 40: the cheapest of the soonest
], ids=["linear", "plateau"])
def test_once_the_slo_is_broken_the_plan_recovers_soonest_instead_of_holding(table, expected):
    # The oldest sample is already 400 s old (SLO 300 s) and 25,000/s arrive at 20 workers:
    # no count brings it back within the step, and staying never drains the queue.
    d = run(kale([20000] * 40, table=table), 20, 25000, backlog=6e6, fresh=400.0)
    assert d.reason == Reason.SCALE_UP_SLO_RISK, d.message
    assert d.workers == expected


def test_a_backlog_without_a_measured_age_is_planned_as_just_arrived():
    # 1e8 queued at 25 workers (25,000/s), the age unmeasured: the step (600 s from a bin's
    # start) cannot work the backlog off, and its oldest sample is as old as the step.
    policy = kale([20000] * 40)
    plan = policy.plan(obs(0.0, 25, 20000, backlog=1e8, fresh=None))
    assert plan.freshness_s[25] == pytest.approx(600.0)


def test_moving_is_refused_when_its_pause_would_break_the_slo():
    # 250 s old already: a 90 s pause takes the oldest sample past 300 s; 22 workers drain it.
    d = kale([20000] * 40).decide(obs(0, 22, 20000, backlog=1e6, fresh=250.0))
    assert d.workers == 22


def test_a_change_waits_for_the_persistence_window_then_applies():
    p = kale([20000] * 2 + [30000] * 30)
    reasons = [p.decide(obs(k * TICK, 20, 20000)).reason for k in range(5)]
    assert reasons[:4] == [Reason.HOLD_STABILIZING] * 4 and reasons[4] == Reason.SCALE_UP_FORECAST


def test_a_change_of_direction_restarts_the_persistence_window():
    p = kale([20000] * 2 + [30000] * 30)
    for k in range(3):
        p.decide(obs(k * TICK, 20, 20000))
    p.decide(obs(3 * TICK, 50, 20000))        # another count now runs and wants to go down
    assert p.decide(obs(4 * TICK, 20, 20000)).reason == Reason.HOLD_STABILIZING


def test_the_slo_moves_at_once():
    d = kale([25000] * 40).decide(obs(0, 20, 25000, backlog=2e6, fresh=200.0))
    assert d.reason == Reason.SCALE_UP_SLO_RISK and d.workers > 25


def test_missing_metrics_never_scale_down():
    d = run(kale([15000] * 40), 30, None)
    assert d.workers == 30 and d.reason == Reason.HOLD_MISSING_METRICS


def test_missing_metrics_still_allow_a_scale_up():
    d = run(kale([20000] * 2 + [30000] * 30), 20, None)
    assert d.workers >= 30


def test_pending_workers_block_a_scale_up_but_not_a_scale_down():
    d = run(kale([20000] * 2 + [30000] * 30), 20, 20000, ready_workers=18)
    assert d.workers == 20 and d.reason == Reason.HOLD_PENDING
    d = run(kale([15000] * 40), 30, 15000, ready_workers=28)
    assert d.workers < 30


def test_nothing_changes_while_a_rescale_is_in_progress():
    d = kale([60000] * 40).decide(obs(0, 20, 60000, rescaling=True))
    assert d.workers == 20 and d.reason == Reason.HOLD_RESCALING


def test_the_limits_clamp_the_plan():
    d = run(kale([50000] * 40, limits=Limits(1, 64, partitions=40)), 30, 50000)
    assert d.workers == 40


class Unavailable(OracleForecastSource):
    """A source whose forecast failed (a real source's answer in that case)."""

    def path(self, now_s, bins):
        return None, "forecaster failed: boom"

    def recent_max(self, now_s, window_s):
        return 25000.0


def test_an_unavailable_forecast_falls_back_to_the_recent_peak_plus_a_margin():
    p = KalePolicy(LIMITS, Unavailable(0.0, TICK, np.ones(10)), KnownCapacity(TABLE), CFG)
    d = run(p, 20, 20000)
    assert d.details["source"] == "fallback (forecaster failed: boom)"
    assert d.details["planned_rate"] == pytest.approx(25000 * (1 + FALLBACK_MARGIN))
    assert d.workers >= 30  # 30,000/s needs 30 workers of 1,000


def test_one_measured_count_plans_on_linear_scaling_and_says_so():
    capacity = OnlineThroughput([2] * 5, [1800.0] * 5, max_workers=64)
    p = KalePolicy(LIMITS, OracleForecastSource(0.0, TICK, np.full(800, 20000.0)), capacity, CFG)
    d = run(p, 20, 20000)
    assert "assuming linear scaling" in d.message
    assert capacity.table[5] == pytest.approx(4500.0)  # 900/s per worker measured
    assert capacity.table[d.workers] >= 20000 > capacity.table[22]


def test_nothing_measured_holds_and_says_what_to_do():
    capacity = OnlineThroughput([], [], max_workers=64)
    d = KalePolicy(LIMITS, OracleForecastSource(0.0, TICK, np.full(80, 4000.0)), capacity, CFG).decide(
        obs(0, 2, 4000))
    assert d.workers == 2 and d.reason == Reason.HOLD_MISSING_METRICS and "kale profile" in d.message


@pytest.mark.parametrize("rate,lo,expected", [(20000.0, 1, (21, 25)), (100.0, 1, (1, 1)), (100.0, 3, (3, 3)),
                                              (1e9, 1, (64, 64))])
def test_first_start_starts_at_the_plans_count_within_the_limits(rate, lo, expected):
    d = kale([rate] * 40, limits=Limits(lo, 64)).first_start(obs(0, 0, rate))
    assert expected[0] <= d.workers <= expected[1] and d.reason == Reason.SCALE_UP_FORECAST


def test_first_start_plans_from_nothing_running_and_carries_the_plans_figures():
    """A start pays the pause at every count: the plan is made from 0 workers and no backlog,
    whatever the observation says about the workers that are gone."""
    policy = kale([20000.0] * 40)
    d = policy.first_start(obs(0, 0, 20000.0, backlog=5e6, fresh=250.0))
    fresh = kale([20000.0] * 40).plan(obs(0, 0, 20000.0))
    assert d.workers == fresh.target and d.details == fresh.details(0)
    assert d.details["stay_gpu_h"] is None or d.details["stay_gpu_h"] > d.details["plan_gpu_h"]
    assert d.message == f"no training generation is running; starting {d.workers} worker(s)"


def test_first_start_plans_for_what_arrives_now_when_it_is_above_the_forecast():
    forecast_only = kale([1000.0] * 40).first_start(obs(0, 0, 1000.0)).workers
    d = kale([1000.0] * 40).first_start(obs(0, 0, 20000.0))
    # The first step (the bin in progress and the next, 300 s each) plans for their mean rate.
    assert d.workers >= (20000.0 + 1000.0) / 2 / PER > forecast_only


def test_first_start_pays_the_start_pause_at_every_count():
    """One worker carries 900/s, but not the backlog of its own 90 s start as well: its
    spare 100/s would drain it for 13 minutes, so the plan starts two."""
    assert kale([900.0] * 40).first_start(obs(0, 0, 900.0)).workers == 2


def test_first_start_without_a_measured_throughput_starts_the_floor_and_says_why():
    capacity = OnlineThroughput([], [], max_workers=64)
    policy = KalePolicy(Limits(3, 64), OracleForecastSource(0.0, TICK, np.full(80, 4000.0)), capacity, CFG)
    d = policy.first_start(obs(0, 0, 4000.0))
    assert (d.workers, d.reason, d.details) == (3, Reason.SCALE_UP_FORECAST, {})
    assert d.message == "no training generation is running and no throughput is measured yet; starting 3"


def test_a_plans_figures_are_its_costs_in_gpu_hours_and_its_rates():
    from kale_airflow.core.policies.kale import Plan

    cost = np.array([np.inf, 7200.0, 5400.0, 9000.0])
    plan = Plan(target=2, cost=cost, slo_ok=np.ones(4, bool), freshness_s=np.zeros(4), rate=1234.56789,
                peak=2345.67891, source="forecast")
    assert plan.details(1) == {"plan_workers": 2, "plan_gpu_h": 1.5, "stay_gpu_h": 2.0, "planned_rate": 1234.568,
                               "forecast_peak": 2345.679, "source": "forecast"}
    assert plan.details(0)["stay_gpu_h"] is None  # staying at 0 is not allowed (inf)
    assert plan.details(4)["stay_gpu_h"] is None  # a count beyond the plan's table
    assert plan.details(3)["stay_gpu_h"] == 2.5
    rounded = Plan(1, np.array([0.0, 1.23456 * 3600]), np.ones(2, bool), np.zeros(2), 0.0, 0.0, "x").details(1)
    assert rounded["plan_gpu_h"] == rounded["stay_gpu_h"] == 1.2346  # rounded to 4 places


def test_state_round_trips_the_forecast_sources_bins():
    """A policy rebuilt between pokes forecasts from the bins its predecessor saw, and a
    state saved without them (an older release) leaves the new policy's own."""
    history = daily_series(days=8, step_s=300) * 0 + 6000.0
    now = history.index[-1].value / 1e9 + 300

    def built(with_history):
        return build_kale(LIMITS, get_forecaster("seasonal"), ([1, 8], [1000.0, 8000.0]), CFG,
                          history=history if with_history else None)

    p = built(True)
    for k in range(40):
        p.decide(obs(now + k * TICK, 6, 6000.0 + 100.0 * k))
    q = built(False)
    q.load_state_dict(p.state_dict())
    assert q.forecast.state_dict() == p.forecast.state_dict()
    assert q.plan(obs(now + 40 * TICK, 6, 9000.0)).target == p.plan(obs(now + 40 * TICK, 6, 9000.0)).target
    r = built(True)
    own = r.forecast.state_dict()
    r.load_state_dict({"want": None})
    assert r.forecast.state_dict() == own


def test_state_round_trips_the_persistence_window():
    bins = [20000] * 2 + [30000] * 30
    p = kale(bins)
    for k in range(3):
        p.decide(obs(k * TICK, 20, 20000))
    q = kale(bins)
    q.load_state_dict(p.state_dict())
    assert q.decide(obs(4 * TICK, 20, 20000)).reason == Reason.SCALE_UP_FORECAST
    q.load_state_dict({})
    assert q.decide(obs(5 * TICK, 20, 20000)).reason == Reason.HOLD_STABILIZING


@pytest.mark.parametrize("fields, message", [
    ({"horizon_s": 100.0}, "horizon_s .* two restarts"),
    ({"wait_cost": -1.0}, "wait_cost .* must be >= 0.1: lag priced at almost nothing"),
    ({"wait_cost": 0.0}, "wait_cost .* Set 0.25 or more"),
    ({"wait_cost": 0.099}, "wait_cost"),
    ({"persist_s": -1.0}, "persist_s must be >= 0"),
    ({"forecast_quantile": 1.0}, "forecast_quantile"),
    ({"forecast_quantile": 0.0}, "forecast_quantile"),
    ({"slo_s": 0.0}, "slo_s and interval_s"),
    ({"interval_s": 0.0}, "slo_s and interval_s"),
])
def test_config_validation_names_the_setting(fields, message):
    with pytest.raises(ValueError, match=message):
        KaleConfig(**fields)


@pytest.mark.parametrize("fields", [{"slo_s": 0.5}, {"interval_s": 0.5}, {"wait_cost": 0.1}, {"persist_s": 0.0},
                                    {"persist_s": 0.5}, {"horizon_s": 180.0}, {"horizon_s": 250.0}],
                         ids=["slo-below-1s", "interval-below-1s", "wait-cost-at-its-floor", "no-persistence",
                              "persist-below-1s", "horizon-exactly-two-restarts", "horizon-under-three-restarts"])
def test_config_accepts_the_edges_of_its_ranges(fields):
    KaleConfig(**{"rescale_downtime_s": 90.0, **fields})


def test_kale_config_has_at_most_six_tunables():
    inputs = {"slo_s", "rescale_downtime_s", "interval_s"}
    assert len(set(KaleConfig.__dataclass_fields__) - inputs) <= 6


def test_the_plan_prices_the_measured_pause():
    # A 40-minute dip to a third: worth a restart there and back at a 90 s pause, not at a 10-minute one.
    bins = [10000] * 8 + [30000] * 30
    fast = run(kale(bins), 30, 10000)
    slow = run(kale(bins, KaleConfig(rescale_downtime_s=600.0, horizon_s=5400.0)), 30, 10000)
    assert fast.workers < 30 and slow.workers == 30


def test_planned_downtime_is_the_configured_one_until_measured():
    assert planned_downtime(90.0, [], 3600.0) == 90.0


def test_slower_measured_restarts_raise_the_planned_downtime_to_their_median():
    assert planned_downtime(8.0, [40.0, 35.0, 300.0], 3600.0) == 40.0  # one outlier does not dominate


def test_faster_measured_restarts_never_lower_it_below_the_configured_floor():
    assert planned_downtime(90.0, [20.0, 30.0], 3600.0) == 90.0


def test_the_planned_downtime_never_exceeds_its_cap():
    assert planned_downtime(8.0, [120.0], 60.0) == 60.0


def test_build_kale_plans_on_the_fitted_capacity_of_what_was_measured():
    cluster = ClusterModel(noise_sd=0.0)
    n = np.repeat([1, 2, 4, 8, 16, 32, 64], 10)
    history = daily_series(days=8, step_s=300) * 0 + 6000.0
    p = build_kale(LIMITS, get_forecaster("seasonal"), (n, cluster.capacity(n)), CFG, history=history)
    now = history.index[-1].value / 1e9 + 300
    d = p.first_start(obs(now, 0, 6000.0))
    truth = kale([6000.0] * 40, table=cluster.capacity_table(64)).first_start(obs(0, 0, 6000.0))
    assert truth.workers <= d.workers <= truth.workers + 1  # the fit is conservative by a worker at most


# ---------------------------------------------------------------- what every decision says
def test_the_holds_carry_the_plans_figures_and_say_why():
    p = kale([20000] * 2 + [30000] * 30)
    stabilizing = p.decide(obs(0, 20, 20000))
    plan = kale([20000] * 2 + [30000] * 30).plan(obs(0, 20, 20000))
    assert stabilizing.details == plan.details(20)
    assert stabilizing.message.endswith("; waiting until the plan holds 60 s")
    pending = kale([20000] * 2 + [30000] * 30).decide(obs(0, 20, 20000, ready_workers=18))
    assert pending.details == plan.details(20)
    assert pending.message == "2 of 20 workers are Pending for lack of capacity; holding at 20 instead of asking for 30"
    missing = kale([15000] * 40).decide(obs(0, 30, None))
    assert missing.details == kale([15000] * 40).plan(obs(0, 30, None)).details(30)
    assert missing.message == "arrival rate or backlog missing: never scale down on missing data"
    held = kale([25000] * 40).decide(obs(0, 25, 25000))
    assert held.message == "25 workers are the cheapest plan for oracle (peak 25000/s)"
    rescaling = kale([60000] * 40).decide(obs(0, 20, 60000, rescaling=True))
    assert rescaling.message == "rescale in progress; waiting for workers to restore"


def test_a_scale_up_goes_when_every_running_worker_is_ready():
    d = run(kale([20000] * 2 + [30000] * 30), 20, 20000, ready_workers=20)
    assert d.workers > 20 and d.reason == Reason.SCALE_UP_FORECAST


def test_the_persistence_window_is_not_cut_short():
    p = kale([20000] * 2 + [30000] * 30)
    p.decide(obs(0.0, 20, 20000))
    assert p.decide(obs(59.5, 20, 20000)).reason == Reason.HOLD_STABILIZING
    assert p.decide(obs(60.0, 20, 20000)).reason == Reason.SCALE_UP_FORECAST


def test_a_change_after_a_hold_waits_its_own_window():
    p = kale([25000] * 40)
    assert p.decide(obs(0, 25, 25000)).reason == Reason.HOLD
    assert p.decide(obs(TICK, 50, 25000)).reason == Reason.HOLD_STABILIZING


def test_a_policy_keeps_its_name_and_decision_interval():
    p = KalePolicy(LIMITS, OracleForecastSource(0.0, TICK, np.ones(10)), KnownCapacity(TABLE),
                   KaleConfig(interval_s=30.0), name="kale-clairvoyant")
    assert (p.name, p.interval_s) == ("kale-clairvoyant", 30.0)


def test_a_second_change_after_an_applied_one_waits_its_own_window():
    p = kale([20000] * 2 + [30000] * 30, KaleConfig(horizon_s=5400.0, persist_s=30.0, rescale_downtime_s=90.0))
    d = run(p, 20, 20000)
    assert d.workers > 20
    assert p.decide(obs(100 * TICK, 50, 20000)).reason == Reason.HOLD_STABILIZING  # too many now: a new window


def test_the_messages_figures_are_the_plans_costs_in_gpu_hours():
    d = run(kale([15000] * 40), 30, 15000)
    plan = kale([15000] * 40).plan(obs(0, 30, 15000))
    saved = (plan.cost[30] - plan.cost[d.workers]) / 3600
    assert d.reason == Reason.SCALE_DOWN_FORECAST and f"saves {saved:.2f} GPU-h over staying" in d.message
    hold = kale([10000] * 2 + [25000] * 30).decide(obs(0, 25, 10000))
    plan = kale([10000] * 2 + [25000] * 30).plan(obs(0, 25, 10000))
    smaller = [n for n in range(1, 25) if TABLE[n] >= plan.rate]
    alt = min(smaller, key=lambda n: plan.cost[n])
    assert hold.reason == Reason.HOLD_NOT_WORTH_DOWNTIME
    assert hold.message == (f"{alt} workers would keep up now, but the rescale and its way back cost "
                            f"{(plan.cost[alt] - plan.cost[25]) / 3600:.2f} GPU-h more than staying at 25")


def test_the_policy_learns_from_what_it_observes_and_not_while_rescaling():
    capacity = OnlineThroughput([2] * 5, [1800.0] * 5, max_workers=64)
    p = KalePolicy(LIMITS, OracleForecastSource(0.0, TICK, np.full(800, 20000.0)), capacity, CFG)
    p.decide(Observation(0, 10, 20000, 0.0, 0.0, None, 9000.0, True))
    assert 10 not in capacity._obs
    p.decide(Observation(TICK, 10, 20000, 0.0, 0.0, None, 9000.0))
    assert list(capacity._obs[10]) == [9000.0]
    # Measured again at the same count: kept, and refitted on its clock.
    p.decide(Observation(2 * TICK, 10, 20000, 0.0, 0.0, None, 9500.0))
    assert list(capacity._obs[10]) == [9000.0, 9500.0]
    built = build_kale(LIMITS, get_forecaster("seasonal"), ([1, 8], [1000.0, 8000.0]), CFG)
    for k in range(4):
        built.decide(obs(k * TICK, 6, 7000.0))
    assert built.forecast.recent_max(4 * TICK, 3600.0) == pytest.approx(7000.0)


# ---------------------------------------------------------------- how a plan is assembled
def by_hand(policy, o):
    """The documented assembly of a plan: the first step runs from now to the end of the next
    bin at the mean of now's rate (the forecast's or the measured one, whichever is higher)
    and the next bin's, from what is measured; the steps after it are the horizon's bins."""
    from kale_airflow.core.planning import Prices, Start, first_step, values_to_go

    cfg, now = policy.config, o.now_s
    bins = max(3, math.ceil(cfg.horizon_s / BIN) + 1)
    rates, _ = policy.forecast.path(now, bins)
    b = now // BIN
    left = (b + 1) * BIN - now
    first_rate = (max(rates[0], o.arrival_rate or 0.0) * left + rates[1] * BIN) / (left + BIN)
    prices = Prices(cfg.rescale_downtime_s, cfg.wait_cost / max(1.0, np.mean(rates)), policy.limits.min_workers,
                    cfg.slo_s)
    table = np.asarray(policy.capacity.table[:65], dtype=float)
    tail = rates[2:]
    start = Start(o.workers, o.backlog or 0.0, o.freshness_lag_s or 0.0, first_rate)
    return first_rate, first_step(table, start, (b + 2) * BIN - now, tail[0], BIN * len(tail),
                                  values_to_go(table, tail, BIN, prices), prices, cfg.slo_s)


@pytest.mark.parametrize("config", [CFG, KaleConfig(horizon_s=180.0, wait_cost=1.0, slo_s=300.0),
                                    KaleConfig(horizon_s=5400.0, wait_cost=0.1, slo_s=300.0)],
                         ids=["90-min horizon", "horizon under a bin", "lag at its floor: the SLO binds later steps"])
@pytest.mark.parametrize("measured", [{"rate": 22000.0, "backlog": 1e6, "fresh": 40.0},
                                      {"rate": 29000.0, "backlog": 3e6, "fresh": None}],
                         ids=["forecast above arrivals", "arrivals above forecast, freshness unknown"])
def test_a_plan_is_the_documented_first_step_over_the_horizons_bins(config, measured):
    p = kale([20000, 24000, 28000, 26000] + [30000] * 40, config)
    o = obs(400.0, 20, measured["rate"], backlog=measured["backlog"], fresh=measured["fresh"])
    plan = p.plan(o)
    rate, fs = by_hand(p, o)
    assert plan.rate == pytest.approx(rate)
    np.testing.assert_allclose(plan.cost, fs.cost, rtol=1e-12)
    np.testing.assert_allclose(plan.freshness_s, fs.freshness_s, rtol=1e-12)
    assert (plan.slo_ok == fs.slo_ok).all()


def test_a_refitted_capacity_replans_within_the_bin():
    """Plans and their later steps are reused while nothing they depend on changes; a refit
    of the capacity table (a new count measured) is such a change."""
    def policy():
        capacity = OnlineThroughput([2] * 5, [1800.0] * 5, max_workers=64)
        return KalePolicy(LIMITS, OracleForecastSource(0.0, TICK, np.full(800, 20000.0)), capacity, CFG)

    p = policy()
    p.decide(obs(0, 20, 20000))
    learnt = p.decide(Observation(TICK, 20, 20000, 0.0, 0.0, None, 30000.0))
    fresh = policy()
    fresh.capacity.observe(TICK, 20, 30000.0)
    assert learnt.details == fresh.plan(obs(TICK, 20, 20000)).details(20)


def test_the_fallback_plans_for_the_peak_of_the_last_half_horizon():
    """Before its forecast is available (fewer than 4 bins), a real source's recent peak is
    taken over half the horizon (45 min: the last two 20-minute bins and the one in progress)."""

    source = OnlineForecastSource(get_forecaster("seasonal"), bin_s=1200.0, quantile=0.5)
    for b, rate in enumerate([30000.0, 20000.0, 10000.0]):
        source.observe((b + 1) * 1200.0, rate)
    p = KalePolicy(LIMITS, source, KnownCapacity(TABLE), CFG)
    d = p.decide(obs(3 * 1200.0 + 600.0, 30, 5000.0))
    assert d.details["source"] == "fallback (only 3 bins of history)"
    assert d.details["planned_rate"] == pytest.approx(20000.0 * (1 + FALLBACK_MARGIN))


def test_a_fallback_with_nothing_observed_plans_for_nothing():
    class Nothing(Unavailable):
        def recent_max(self, now_s, window_s):
            return None

    d = KalePolicy(LIMITS, Nothing(0.0, TICK, np.ones(10)), KnownCapacity(TABLE), CFG).decide(obs(0, 3, None))
    assert d.details["planned_rate"] == 0.0


def test_a_plan_made_with_a_backlog_is_not_reused_once_it_is_gone_nor_the_other_way_round():
    def fresh_plan(o):
        return kale([20000] * 40).plan(o).details(22)

    p = kale([20000] * 40)
    quiet, queued = obs(0, 22, 20000), obs(TICK, 22, 20000, backlog=4e6)
    assert p.decide(quiet).details == fresh_plan(quiet)
    assert p.decide(queued).details == fresh_plan(queued) != fresh_plan(quiet)
    assert p.decide(obs(2 * TICK, 22, 20000)).details == fresh_plan(obs(2 * TICK, 22, 20000))


def test_a_large_saving_is_stated_in_gpu_hours_to_the_hundredth():
    # 400 workers for 1,500/s: over the first step alone the move saves more than 36 GPU-h, so
    # dividing by anything but 3,600 s per hour shows in the second decimal.
    big = dict(limits=Limits(1, 400), table=PER * np.arange(401.0))
    d = run(kale([1500] * 40, **big), 400, 1500)
    plan = kale([1500] * 40, **big).plan(obs(0, 400, 1500))
    saved = (plan.cost[400] - plan.cost[d.workers]) / 3600
    assert saved > 36
    assert d.reason == Reason.SCALE_DOWN_FORECAST and f"saves {saved:.2f} GPU-h over staying" in d.message


def test_a_backlog_scale_up_names_the_backlog_when_the_count_exactly_keeps_up():
    # 20 workers carry exactly the 20,000/s arriving, so only the backlog asks for more; a
    # 1-hour SLO is far from binding.
    cfg = KaleConfig(horizon_s=5400.0, wait_cost=1.0, persist_s=60.0, slo_s=3600.0, rescale_downtime_s=90.0)
    p = kale([20000] * 40, cfg)
    plan = p.plan(obs(0, 20, 20000, backlog=4e6, fresh=100.0))
    assert plan.rate == TABLE[20] and plan.target > 20 and plan.slo_ok[20]
    d = run(p, 20, 20000, backlog=4e6, fresh=100.0)
    assert d.reason == Reason.SCALE_UP_BACKLOG, d.message


def test_a_smaller_count_that_exactly_keeps_up_at_the_floor_makes_the_hold_a_matter_of_downtime():
    # A 10-minute dip to 24,000/s: 24 workers (the floor) carry it exactly, but two restarts
    # cost more than one worker for ten minutes.
    p = kale([24000] * 2 + [25000] * 30, limits=Limits(24, 64))
    d = p.decide(obs(0, 25, 24000))
    assert d.reason == Reason.HOLD_NOT_WORTH_DOWNTIME, d.message
    assert d.message.startswith("24 workers would keep up now")


def test_a_count_above_the_limit_is_planned_as_the_limit():
    # 40 running after the limit came down to 32: the plan covers 0..32 and the figures of
    # the running count are those of the limit.
    limits = Limits(1, 32)
    p = kale([15000] * 40, limits=limits)
    plan = kale([15000] * 40, limits=limits).plan(obs(0, 40, 15000))
    assert len(plan.cost) == 33
    d = run(p, 40, 15000)
    assert d.reason == Reason.SCALE_DOWN_FORECAST and d.workers <= 32
    assert d.details == plan.details(32)
    assert f"saves {(plan.cost[32] - plan.cost[d.workers]) / 3600:.2f} GPU-h" in d.message


def test_a_first_start_feeds_what_arrives_to_the_forecast():
    built = build_kale(LIMITS, get_forecaster("seasonal"), ([1, 8], [1000.0, 8000.0]), CFG)
    built.first_start(obs(TICK, 0, 7000.0))
    assert built.forecast.recent_max(TICK, 3600.0) == pytest.approx(7000.0)


def test_arrivals_uneven_within_a_bin_are_planned_with_more_workers_than_steady_ones_of_the_same_means():
    """Two futures with the same 5-minute means, one steady, one with a minute at 1.8x in
    every bin: the plan on the same path keeps up with the mean on the first and buys the
    capacity the busy minute's lag is worth on the second."""
    minute = np.r_[np.full(4, 36000.0), np.full(16, 16000.0)]  # mean 20,000 samples/s
    steady = KalePolicy(LIMITS, OracleForecastSource(0.0, TICK, np.full(20 * 40, 20000.0), bin_s=BIN),
                        KnownCapacity(TABLE), CFG)
    uneven = KalePolicy(LIMITS, OracleForecastSource(0.0, TICK, np.tile(minute, 40), bin_s=BIN),
                        KnownCapacity(TABLE), CFG)
    now = obs(0.0, 20, 20000.0)
    assert list(steady.forecast.path(0.0, 5)[0]) == pytest.approx(list(uneven.forecast.path(0.0, 5)[0]))
    assert steady.plan(now).target == 20
    assert 20 < uneven.plan(now).target <= 36
