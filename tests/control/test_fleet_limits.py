"""One job's side of the fleet (:class:`~kale_airflow.control.fleet.FleetLimits`) in process:
the demand it publishes, the decision the budget leaves it, and which of the others' demands
count. The jobs' loops through their autoscalers: test_fleet.py."""

import pytest

from kale_airflow.config import parse_deployment
from kale_airflow.control.fleet import DEMAND_KEY, FleetLimits, pin
from kale_airflow.core.fleet import JobDemand
from kale_airflow.core.policies import Decision, Observation, Reason
from kale_airflow.store import StateStore

NOW = 1_800_000_000.0


def limits(tmp_path, **fleet) -> FleetLimits:
    top = parse_deployment({
        "stream_url": "sqlite:///unused.db", "max_workers": 8, "fleet": {"gpus": 6, **fleet},
        "jobs": [{"name": "ranking", "priority": 3, "kale": {"horizon_s": 1800}},
                 {"name": "ads", "stream_url": "sqlite:///ads.db"}]})
    return FleetLimits(top.all_jobs["ranking"], StateStore(tmp_path / "kale.db", "ranking"))


def test_a_demand_without_a_plan_is_the_decision_within_the_bounds_at_the_jobs_priority(tmp_path):
    job = limits(tmp_path)
    pin(job.store, 5, until_s=NOW + 60, now=NOW)
    b = job.bounds(NOW)
    asked = job.demand(Decision(12, Reason.SCALE_UP_FORECAST), Observation(NOW, workers=3), b)
    assert asked == JobDemand("ranking", want=5, current=3, min_workers=5, max_workers=5, priority=3.0,
                              horizon_s=1800.0, locked=False)
    idle = job.demand(Decision(2, Reason.HOLD), Observation(NOW, workers=None), job.bounds(NOW + 61))
    assert (idle.want, idle.current, idle.min_workers, idle.max_workers) == (2, 0, 1, 8)


def test_a_job_in_a_rescale_asks_for_what_it_runs_and_is_locked(tmp_path):
    job = limits(tmp_path)
    asked = job.demand(Decision(7, Reason.SCALE_UP_FORECAST), Observation(NOW, workers=3, rescaling=True,
                                                                          arrival_rate=100.0), job.bounds(NOW))
    assert (asked.want, asked.current, asked.locked, asked.cost) == (3, 3, True, None)


def test_a_job_held_back_waits_with_the_budget_in_its_decision(tmp_path):
    job = limits(tmp_path)
    job.store.for_job("ads").set_value(DEMAND_KEY, JobDemand("ads", 2, 2).to_dict() | {"ts": NOW})
    d = job.apply(Decision(5, Reason.SCALE_UP_FORECAST, "the peak", {"plan": [5]}), Observation(NOW, workers=1), NOW)
    # 3 GPUs are free, its scale-up needs 4: it waits at 1 for ads to give one back (priority 3 to 1)
    assert (d.workers, d.reason) == (1, Reason.HOLD_BUDGET)
    assert "being released by ads (budget 6 GPUs: ads 2)" in d.message and d.details["plan"] == [5]
    budget = d.details["budget"]
    assert (budget["workers"], budget["target"], budget["want"], budget["held_back"], budget["jobs"]) == \
        (1, 5, 5, True, 2)
    mine = job.store.get_value(DEMAND_KEY)
    assert (mine["want"], mine["current"], mine["held"], mine["ts"]) == (5, 1, 1, NOW)


def test_a_scale_up_that_fits_is_recorded_with_the_gpus_it_is_about_to_take(tmp_path):
    job = limits(tmp_path)
    job.store.for_job("ads").set_value(DEMAND_KEY, JobDemand("ads", 1, 1).to_dict() | {"ts": NOW})
    d = Decision(5, Reason.SCALE_UP_FORECAST, "the peak")
    assert job.apply(d, Observation(NOW, workers=1), NOW) == d
    assert job.store.get_value(DEMAND_KEY)["held"] == 5  # the others must not count these GPUs as free


def test_a_job_in_a_rescale_keeps_its_count_and_its_reason(tmp_path):
    job = limits(tmp_path)
    d = job.apply(Decision(7, Reason.SCALE_UP_FORECAST, "the peak"), Observation(NOW, workers=3, rescaling=True), NOW)
    assert (d.workers, d.reason, d.message) == (3, Reason.SCALE_UP_FORECAST, "the peak")
    assert d.details["budget"]["held_back"] is False and d.details["budget"]["jobs"] == 1


def test_a_job_alone_in_the_budget_keeps_its_decision_and_reason(tmp_path):
    job = limits(tmp_path)
    d = Decision(4, Reason.SCALE_UP_FORECAST, "the peak")
    assert job.apply(d, Observation(NOW, workers=4), NOW) == d
    assert job.store.get_value(DEMAND_KEY)["held"] == 4
    assert job.apply(d, Observation(NOW, workers=4), NOW + 1, record=False) == d
    assert job.store.get_value(DEMAND_KEY)["ts"] == NOW  # not recorded again


@pytest.mark.parametrize("age_s, counts", [(0, True), (300, True), (301, False)])
def test_another_jobs_demand_counts_until_its_ttl_then_only_what_it_runs(tmp_path, age_s, counts):
    job = limits(tmp_path, demand_ttl_s=300)
    job.store.for_job("ads").set_value(DEMAND_KEY, JobDemand("ads", 6, 2).to_dict() | {"ts": NOW - age_s})
    job.store.set_value(DEMAND_KEY, JobDemand("ranking", 1, 1).to_dict() | {"ts": NOW})  # its own: never an other
    (other,) = job.others(NOW, 300)
    assert other.name == "ads" and other.current == 2 and other.want == (6 if counts else 2)


def test_without_a_fleet_only_the_bounds_apply(tmp_path):
    dep = parse_deployment({"stream_url": "sqlite:///unused.db", "max_workers": 8})
    job = FleetLimits(dep, StateStore(tmp_path / "kale.db"))
    d = job.apply(Decision(12, Reason.SCALE_UP_FORECAST), Observation(NOW, workers=1), NOW)
    assert d.workers == 8 and job.store.get_value(DEMAND_KEY) is None


def test_a_pin_must_end_in_the_future_and_records_when_it_began(tmp_path):
    store = StateStore(tmp_path / "kale.db")
    with pytest.raises(ValueError, match="a pin must end in the future: give --until a later time"):
        pin(store, 3, until_s=NOW, now=NOW)
    assert pin(store, 3, until_s=NOW + 1, now=NOW) == {"workers": 3, "until": NOW + 1, "note": "", "since": NOW}
    with pytest.raises(ValueError, match="a pin needs workers >= 0, got -1"):  # the Pin's own checks
        pin(store, -1, until_s=NOW + 1, now=NOW)


def test_a_pin_is_recorded_as_given_and_read_back_with_its_note(tmp_path):
    from kale_airflow.control.fleet import PIN_KEY, active_pin, pins_of, release
    from kale_airflow.core.fleet import Pin

    store = StateStore(tmp_path / "kale.db")
    assert pin(store, 3, until_s=NOW + 60, note="launch", now=NOW) == {"workers": 3, "until": NOW + 60,
                                                                       "note": "launch", "since": NOW}
    assert pins_of(store) == (Pin(3, NOW + 60, "launch"),)
    store.set_value(PIN_KEY, {"workers": 2, "until": NOW + 60})  # a record without a note
    assert pins_of(store) == (Pin(2, NOW + 60, ""),)
    assert release(store)["workers"] == 2 and store.get_value(PIN_KEY) == {} and pins_of(store) == ()
    with pytest.raises(ValueError, match=r"^a pin must end in the future: give --until a later time \(UTC\) or a "
                                         r"duration like 2h$"):
        pin(store, 3, until_s=NOW, now=NOW)
    import time

    rec = pin(store, 1, until_s=4e9)  # 2096, on the clock's own now
    assert time.time() - 60 < rec["since"] <= time.time() and active_pin(store)["workers"] == 1


class Planning:
    """What FleetLimits reads of a Kale policy: its plan of an observation, its capacity
    table and the configuration it plans with (the measured pause, the horizon)."""

    def __init__(self, plan, table):
        from types import SimpleNamespace

        self._plan, self.capacity = plan, SimpleNamespace(table=table)
        self.config = SimpleNamespace(rescale_downtime_s=60.0, horizon_s=1800.0)

    def plan(self, obs):
        return self._plan


def planning():
    import numpy as np

    from kale_airflow.core.policies.kale import Plan

    table = np.arange(9) * 50.0  # samples/s of 0..8 workers
    cost = np.linspace(9.0, 1.0, 9) * 3600
    plan = Plan(4, cost, np.arange(9) >= 3, np.zeros(9), rate=120.0, peak=200.0, source="forecast")
    return Planning(plan, table), plan, table


@pytest.mark.parametrize("freshness, backlog", [(0.0, 0.0), (40.0, 5000.0)], ids=["fresh", "behind"])
def test_a_planned_demand_prices_the_measured_burst_backlog_and_age(tmp_path, freshness, backlog):
    """The risk is priced at the measured burst (260/s, above the plan's 120/s), with the
    measured backlog and age: a job whose forecast lags a burst is not the one to lose GPUs."""
    import numpy as np

    job = limits(tmp_path)
    policy, plan, table = planning()
    obs = Observation(NOW, workers=3, arrival_rate=260.0, backlog=backlog, freshness_lag_s=freshness)
    asked = job.demand(Decision(4, Reason.SCALE_UP_FORECAST), obs, job.bounds(NOW), policy)
    expect = JobDemand.from_plan("ranking", plan, 4, 3, capacity=table, freshness_s=freshness, slo_s=300.0,
                                 downtime_s=60.0, horizon_s=1800.0, arrival_rate=260.0, backlog=backlog)
    assert (asked.want, asked.current, asked.priority, asked.horizon_s, asked.locked) == (4, 3, 3.0, 1800.0, False)
    np.testing.assert_array_equal(asked.cost, plan.cost)
    np.testing.assert_array_equal(asked.risk_s, expect.risk_s)
    assert asked.risk_s[2] > 0  # 100/s against 260/s after a pause: two workers risk the SLO


@pytest.mark.parametrize("missing", ["plan", "table", "arrival", "rescaling"])
def test_a_demand_is_unpriced_without_a_plan_a_table_or_a_measured_rate_and_in_a_rescale(tmp_path, missing):
    job = limits(tmp_path)
    policy, _, _ = planning()
    if missing == "plan":
        policy._plan, policy.plan = None, None
    if missing == "table":
        policy.capacity.table = None
    obs = Observation(NOW, workers=3, arrival_rate=None if missing == "arrival" else 260.0,
                      rescaling=missing == "rescaling")
    asked = job.demand(Decision(4, Reason.SCALE_UP_FORECAST), obs, job.bounds(NOW), policy)
    assert asked.cost is None and asked.risk_s is None


@pytest.mark.parametrize("violation_gpus, mine", [(64.0, 1), (0.001, 5)])
def test_the_fleet_prices_risked_violation_seconds_at_its_own_rate(tmp_path, violation_gpus, mine):
    """ads risks 1,000 s of SLO violation below 5 workers: at 64 GPU-s a second that beats
    ranking's priority and ads keeps the free GPUs; at a near-zero price ranking takes them."""
    import numpy as np

    job = limits(tmp_path, violation_gpus=violation_gpus)
    risk = np.array([1000.0] * 5 + [0.0] * 4)
    job.store.for_job("ads").set_value(DEMAND_KEY, JobDemand("ads", 5, 1, risk_s=risk).to_dict() | {"ts": NOW})
    d = job.apply(Decision(5, Reason.SCALE_UP_FORECAST), Observation(NOW, workers=1), NOW)
    assert d.workers == mine

