"""The fleet simulator: one clock, one budget, the single-job protocol per job."""

import json

import numpy as np
import pandas as pd
import pytest

from kale_airflow.core.fleet_sim import (
    FleetJob,
    FleetSpec,
    fleet_offline,
    fleet_table,
    prepare,
    simulate_fleet,
    static_split,
)
from kale_airflow.core.simulator import SimulationError, offline_optimum, simulate
from kale_airflow.core.traffic import load_trace
from tests.conftest import daily_series

DAYS = 0.25  # the first six hours after the history: the daily peaks of both jobs coincide


def traces():
    return {name: load_trace(daily_series(days=15, step_s=300, noise=0.1, seed=seed) * 10, name=name)
            for name, seed in (("ads", 1), ("feed", 2))}


def spec(gpus=40, **job_kw):
    jobs = (FleetJob("ads", "ads.csv", priority=2.0, **job_kw), FleetJob("feed", "feed.csv", min_workers=2))
    return FleetSpec(gpus, jobs, days=DAYS)


@pytest.fixture(scope="module")
def result():
    return simulate_fleet(spec(), traces(), ("fleet-kale", "kale-fcfs", "static-split", "kale-alone"))


@pytest.mark.parametrize("case, peaks, floors, budget, expected", [
    ("all peaks fit", [10, 20], [1, 1], 40, [10, 20]),
    ("by peak share", [30, 10], [1, 1], 20, [15, 5]),
    ("largest remainder", [10, 10, 10], [1, 1, 1], 20, [7, 7, 6]),
    ("a floor first", [40, 2], [1, 5], 20, [15, 5]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_static_split_table(case, peaks, floors, budget, expected):
    assert static_split(peaks, floors, budget) == expected


def test_the_fleet_run_keeps_the_budget_and_the_floors(result):
    for name in ("fleet-kale", "kale-fcfs", "static-split"):
        total = result.runs[name].total
        assert total["budget_exceeded_ticks"] == 0 and total["below_floor_ticks"] == 0, name
        assert total["max_gpus_in_use"] <= 40
        assert 0 < total["budget_utilisation"] <= 1
    alone = result.runs["kale-alone"].total
    assert alone["max_gpus_in_use"] > 40 and alone["budget_exceeded_ticks"] is None  # the budget binds
    assert result.runs["fleet-kale"].total["held_back_ticks"] > 0
    reasons = result.runs["fleet-kale"].jobs["ads"]["reasons"] | result.runs["fleet-kale"].jobs["feed"]["reasons"]
    assert "hold_budget" in reasons


def test_priority_weights_the_violation_time(result):
    for run in result.runs.values():
        ads = run.jobs["ads"]
        assert ads["weighted_slo_violation_s"] == pytest.approx(2.0 * ads["slo_violation_s"])
        assert run.total["weighted_slo_violation_s"] == pytest.approx(
            sum(m["weighted_slo_violation_s"] for m in run.jobs.values()))


def test_the_result_is_a_json_document_and_a_table(result):
    doc = json.loads(json.dumps(result.to_dict(), default=float))
    assert set(doc["policies"]) == {"fleet-kale", "kale-fcfs", "static-split", "kale-alone"}
    assert doc["evaluation"]["ticks"] == DAYS * 86400 / 15
    assert {"lower_bound_weighted_slo_violation_s", "gpu_hours", "fits_budget"} <= set(doc["offline"])
    table = fleet_table(doc)
    assert "fleet-kale" in table and "exceeded 0 ticks" in table and "offline references" in table


def test_a_job_alone_is_the_single_job_protocol(result):
    job = spec().jobs[0]
    cfg = spec().job_config(job)
    single = simulate(traces()["ads"], ("kale",), cfg, offline=False).runs["kale"].metrics
    alone = result.runs["kale-alone"].jobs["ads"]
    for key in ("accumulated_lag", "gpu_hours", "rescales", "slo_violation_rate"):
        assert alone[key] == pytest.approx(single[key]), key


def test_windows_and_pins_reach_the_run():
    start = pd.Timestamp("2024-01-15")  # the evaluation start after 14 days of history
    overrides = ({"start": str(start), "end": str(start + pd.Timedelta(hours=1)), "min_workers": 12},)
    job = FleetJob.from_dict({"name": "ads", "trace": "ads.csv", "schedule_overrides": list(overrides),
                              "pins": [{"workers": 3, "until": str(start + pd.Timedelta(hours=3))},
                                       {"workers": 5, "until": str(start + pd.Timedelta(minutes=30))}]})
    s = FleetSpec(40, (job, FleetJob("feed", "feed.csv")), days=DAYS)
    run = simulate_fleet(s, traces(), ("kale-fcfs",), offline=False).runs["kale-fcfs"]
    ads = run.jobs["ads"]
    assert ads["override_ticks"] == 3 * 3600 / 15 and ads["below_floor_ticks"] == 0
    assert ads["reasons"]["override"] >= 2  # pinned to 5, then to 3 when the first pin expires
    assert ads["min_workers_seen"] == 3


def test_the_offline_references_fit_and_without_contention_equal_each_jobs_optimum():
    s = spec(gpus=400)
    jobs = prepare(s, traces())
    off = fleet_offline(jobs, s)
    for j in jobs:
        alone = offline_optimum(j.workload.arrivals, j.cfg, j.initial)
        assert off["jobs"][j.spec.name]["gpu_hours"] == pytest.approx(alone["gpu_hours"])
    assert off["weighted_slo_violation_s"] == 0 and off["fits_budget"]
    tight = fleet_offline(prepare(spec(gpus=40), traces()), spec(gpus=40))
    assert tight["fits_budget"] and tight["max_gpus_in_use"] <= 40
    assert tight["lower_bound_weighted_slo_violation_s"] <= tight["weighted_slo_violation_s"]


@pytest.mark.parametrize("doc, match", [
    ({"jobs": [{"name": "a", "trace": "a.csv"}]}, "needs 'gpus'"),
    ({"gpus": 4, "jobs": [{"name": "a"}]}, "needs a name and a trace"),
    ({"gpus": 4, "jobs": [{"name": "a", "trace": "a.csv", "prio": 2}]}, "unknown key"),
    ({"gpus": 4, "budget": 3, "jobs": [{"name": "a", "trace": "a.csv"}]}, "unknown key"),
    ({"gpus": 4, "jobs": [{"name": "a", "trace": "a.csv", "cluster": "tpu"}]}, "unknown cluster"),
    ({"gpus": 4, "jobs": [{"name": "a", "trace": "a.csv"}, {"name": "a", "trace": "b.csv"}]}, "unique names"),
    ({"gpus": 5, "jobs": [{"name": "a", "trace": "a.csv", "min_workers": 4},
                          {"name": "b", "trace": "b.csv", "min_workers": 2}]}, r"floors need 6 GPUs \(a 4, b 2\)"),
])
def test_bad_fleet_files_are_refused(doc, match):
    with pytest.raises(ValueError, match=match):
        FleetSpec.from_dict(doc)


def test_unknown_policies_and_missing_traces_are_refused():
    with pytest.raises(SimulationError, match="unknown fleet policy"):
        simulate_fleet(spec(), traces(), ("fleet-hpa",))
    with pytest.raises(SimulationError, match="no trace given"):
        simulate_fleet(spec(), {"ads": traces()["ads"]})


def test_initial_counts_fit_the_budget():
    jobs = prepare(spec(gpus=3), traces())
    assert sum(j.initial for j in jobs) <= 3 and all(j.initial >= j.spec.min_workers for j in jobs)
    assert np.isclose(jobs[0].noise.mean(), 1.0, atol=0.01)


def test_windows_that_raise_the_floors_past_the_budget_stop_the_run_with_the_tick():
    window = {"start": "2024-01-15", "end": "2024-01-16", "min_workers": 9}
    ads = FleetJob.from_dict({"name": "ads", "trace": "ads.csv", "schedule_overrides": [window]})
    s = FleetSpec(10, (ads, FleetJob("feed", "feed.csv", min_workers=2)), days=DAYS)
    with pytest.raises(SimulationError, match=r"tick 0: the fleet's floors need 11 GPUs \(ads 9, feed 2\)"):
        simulate_fleet(s, traces(), ("fleet-kale",), offline=False)
