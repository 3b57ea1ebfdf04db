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
