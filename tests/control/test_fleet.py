"""Several jobs on one deployment and one GPU budget, in process: the real autoscaler and
generations manager of each job on real embedded streams and a shared control plane (SQLite
and PostgreSQL), with the champions served directly (MLflow is not this test's subject)."""

import pytest

from kale_airflow.config import Config, Settings, parse_deployment
from kale_airflow.control.autoscaler import Autoscaler
from kale_airflow.control.fleet import DEMAND_KEY, FleetLimits, active_pin, pin, release
from kale_airflow.control.generations import Generations, decision_event
from kale_airflow.core.fleet import JobDemand
from kale_airflow.core.policies import Decision, Observation, Reason
from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream
from tests.control.test_autoscaler import NOW, FakeChampions, arrive


@pytest.fixture
def fleet(tmp_path, db_url):
    """Two jobs, ``ranking`` (priority 3) and ``ads``, each on its own stream of 2,500
    samples/s (1,000 samples/s per worker: each asks for 4 with its margin), sharing a budget of
    6 GPUs."""
    streams = {name: EmbeddedStream(tmp_path / f"{name}.db", partitions=4) for name in ("ranking", "ads")}
    top = parse_deployment({
        "stream_url": "sqlite:///unused.db", "poll_interval_s": 15, "bin_s": 60, "max_workers": 8,
        "fleet": {"gpus": 6},
        "jobs": [{"name": "ranking", "stream_url": f"sqlite:///{tmp_path / 'ranking.db'}", "priority": 3},
                 {"name": "ads", "stream_url": f"sqlite:///{tmp_path / 'ads.db'}"}]})
    configs = {name: Config(Settings(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", database=db_url, job=name), dep)
               for name, dep in top.all_jobs.items()}
    for stream in streams.values():
        arrive(stream, 2500)
    autos = {name: Autoscaler(configs[name], stream=streams[name], registry=FakeChampions()) for name in configs}
    return configs, autos, db_url


def decide_and_apply(config, auto, run_id):
    """One sensor decision of a job and its application (the autoscaler DAG's two tasks)."""
    done, event = decision_event(auto, NOW)
    return event, (Generations(config).apply(event, run_id) if done else None)


def test_two_jobs_get_their_own_generations_and_the_budget_holds_the_one_that_values_it_less(fleet):
    """Bug classes: one job's generation or decision written into the other's rows, a job
    sized as if the budget were its own, a held-back job not told who holds the GPUs, the
    budget exceeded by the two decisions together."""
    configs, autos, db = fleet
    ranking_event, ranking_made = decide_and_apply(configs["ranking"], autos["ranking"], "run-ranking")
    ask = ranking_event["workers"]  # alone, it gets what it asks for
    assert ranking_made and not ranking_made["skip"] and 3 <= ask < 6, ranking_event
    ads_event, ads_made = decide_and_apply(configs["ads"], autos["ads"], "run-ads")
    free = 6 - ask
    assert ads_event["reason"] == Reason.HOLD_BUDGET.value, ads_event
    assert ads_event["workers"] == free, ads_event  # what is free now, towards its share
    assert f"(budget 6 GPUs: ranking {ask})" in ads_event["message"], ads_event["message"]  # who holds the GPUs

    stores = {name: StateStore(db, name) for name in configs}
    assert ranking_made["generation"] == f"g000001-{ask}w" == stores["ranking"].current()["generation"]
    assert ads_made["generation"] == f"g000001-{free}w" == stores["ads"].current()["generation"]  # its own counter
    assert [d["reason"] for d in stores["ads"].decisions()] == ["hold_budget"]
    assert [d["reason"] for d in stores["ranking"].decisions()] != ["hold_budget"]
    assert set(stores["ranking"].values_of_every_job(DEMAND_KEY)) == {"ranking", "ads"}

    # The next decisions share the budget by the arbiter: ranking (priority 3) gives back some
    # of what ads asks for, ads takes it; the two never run more than the budget together.
    for k in range(3):
        for name in ("ranking", "ads"):
            decide_and_apply(configs[name], autos[name], f"run-{name}-{k}")
            assert sum(stores[n].current()["workers"] for n in stores) <= 6
    shares = {n: stores[n].current()["workers"] for n in stores}
    assert sum(shares.values()) == 6 and ask > shares["ranking"] > shares["ads"] > free, shares
    last = stores["ads"].decisions()[-1]
    assert last["reason"] == "hold_budget" and f"ranking {shares['ranking']})" in last["message"], last


def test_a_job_whose_autoscaler_stopped_keeps_what_it_runs_and_no_more(fleet):
    """Bug class: a stale demand (the other job's autoscaler died an hour ago asking for 4)
    still holding GPUs it never started, or its running workers given away."""
    configs, autos, db = fleet
    ads = StateStore(db, "ads")
    ads.set_value(DEMAND_KEY, JobDemand("ads", 6, 1, 1, 8, 1.0).to_dict() | {"ts": NOW - 3600})
    _, event = decision_event(autos["ranking"], NOW)
    ask = event["workers"]
    assert ask <= 5 and event["reason"] != Reason.HOLD_BUDGET.value, event  # 6 - ads' 1 covers it
    ads.set_value(DEMAND_KEY, JobDemand("ads", 6, 4, 1, 8, 1.0).to_dict() | {"ts": NOW - 3600})
    autos["ranking"].state.set_current_generation("none", 0)
    _, event = decision_event(autos["ranking"], NOW)
    assert event["workers"] == 2 and event["reason"] == Reason.HOLD_BUDGET.value, event  # ads' 4 running stay


def test_a_pin_bounds_the_jobs_decisions_until_it_is_released(fleet):
    """Bug classes: a pin ignored, applied to the other job, outliving its release or its time."""
    configs, autos, db = fleet
    store = StateStore(db, "ranking")
    with pytest.raises(ValueError, match="must end in the future"):
        pin(store, 2, NOW - 1, now=NOW)
    pin(store, 2, NOW + 3600, "load test", now=NOW)
    _, event = decision_event(autos["ranking"], NOW)
    assert event["workers"] == 2 and event["reason"] == Reason.OVERRIDE.value, event
    assert "pinned to 2 workers until" in event["message"] and "load test" in event["message"]
    _, other = decision_event(autos["ads"], NOW)
    assert other["reason"] != Reason.OVERRIDE.value
    _, later = decision_event(autos["ranking"], NOW + 7200)  # expired
    assert later["reason"] != Reason.OVERRIDE.value
    assert release(store)["workers"] == 2 and release(store) is None
    assert decision_event(autos["ranking"], NOW)[1]["reason"] != Reason.OVERRIDE.value


def test_a_calendar_window_raises_the_floor_inside_it_only(tmp_path):
    """Bug classes: a window applied outside its hours, or its floor ignored inside them."""
    dep = parse_deployment({"stream_url": "sqlite:///s.db", "max_workers": 8, "schedule_overrides": [
        {"cron": "0 19 * * *", "duration": "4h", "min_workers": 6, "name": "final"}]})
    limits = FleetLimits(dep, StateStore(f"sqlite:///{tmp_path / 'kale.db'}"))
    seven_pm = 1_800_000_000 - 1_800_000_000 % 86400 + 19 * 3600 + 60.0  # 19:01 UTC
    obs = Observation(seven_pm, 2, 100.0, 0.0, 0.0)
    inside = limits.apply(Decision(2, Reason.HOLD), obs, seven_pm)
    assert inside.workers == 6 and inside.reason == Reason.OVERRIDE and "final" in inside.message
    outside = limits.apply(Decision(2, Reason.HOLD), obs, seven_pm + 5 * 3600)
    assert outside.workers == 2 and outside.reason == Reason.HOLD


def test_a_pin_is_shown_while_it_holds_only(tmp_path):
    store = StateStore(tmp_path / "kale.db")
    assert active_pin(store) is None
    rec = pin(store, 3, until_s=NOW + 60, note="launch", now=NOW)
    assert active_pin(store, NOW + 59) == rec and active_pin(store, NOW + 60) is None  # ends at its `until`
    release(store)
    assert active_pin(store, NOW) is None
