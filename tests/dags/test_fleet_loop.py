"""Two jobs of one deployment file on one GPU budget, through their own DAGs for real
(``dag.test``, in the home's one long-lived process): each job's retrain and refit DAGs
register its own champions in MLflow, each job's autoscaler DAG decides on its own live
stream and starts its own generation, and the budget holds back the job that values the GPUs
less, telling it who holds them. The same arbitration in process, decision by decision, on
SQLite and PostgreSQL: tests/control/test_fleet.py."""

import subprocess
import sys

import pytest
import yaml

from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream
from tests.conftest import seed_simulated_throughput
from tests.dags.test_autoscaler_loop import LOOP_CONFIG, PRODUCER, producing

pytestmark = pytest.mark.slow

JOBS = ("ranking", "ads")


@pytest.fixture
def fleet(airflow_home):
    """``ranking`` (priority 3) and ``ads``, each on its own 4-partition stream fed at 2,500
    samples/s (each asks for 3 or more workers alone), sharing a budget of 5 GPUs."""
    home = airflow_home.kale_home
    home.mkdir(parents=True, exist_ok=True)
    jobs = [{"name": name, "stream_url": f"sqlite:///{home / f'{name}.db'}"} for name in JOBS]
    jobs[0]["priority"] = 3
    (home / "kale.yaml").write_text(yaml.safe_dump(LOOP_CONFIG | {"stream_url": f"sqlite:///{home / 'unused.db'}",
                                                                  "fleet": {"gpus": 5}, "jobs": jobs}))
    procs, rates = [], {}
    try:
        for name in JOBS:
            EmbeddedStream(home / f"{name}.db", partitions=4)
            rates[name] = home / f"{name}-rate.txt"
            rates[name].write_text("2500")
            seed_simulated_throughput(f"sqlite:///{home / 'kale.db'}", job=name)
            for dag_id, conf in ((f"kale_forecaster_retrain__{name}",
                                  {"forecaster": "seasonal", "history_days": 3,
                                   "forecaster_options": {"level_window_s": 10}, "auto_promote": True}),
                                 (f"kale_throughput_refit__{name}", {})):
                run = airflow_home.run(dag_id, conf)
                assert run.state == "success", run.log[-2000:]
            procs.append(subprocess.Popen([sys.executable, "-c", PRODUCER, f"sqlite:///{home / f'{name}.db'}",
                                           str(rates[name])]))
        for rate in rates.values():
            producing(rate)
        yield airflow_home
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_each_job_starts_its_own_generation_and_the_budget_holds_the_lower_priority_one(fleet):
    stores = {name: StateStore(f"sqlite:///{fleet.kale_home / 'kale.db'}", name) for name in JOBS}
    started = {}
    for name in JOBS:  # ranking decides first: alone in the budget, it gets what it asks for
        run = fleet.run(f"kale_autoscaler__{name}", {"poll_interval_s": 1, "max_polls": 30})
        assert run.state == "success" and run.tasks["start_generation"] == "success", run.log[-3000:]
        started[name] = stores[name].current()
    ranking, ads = (stores[name].decisions()[-1] for name in JOBS)
    assert ranking["reason"] != "hold_budget" and 3 <= ranking["target"] < 5, ranking
    assert ads["reason"] == "hold_budget", ads
    assert ads["target"] == 5 - ranking["target"]  # what the budget leaves it
    assert f"(budget 5 GPUs: ranking {ranking['target']})" in ads["message"], ads["message"]
    # Each job's own generation, counter and decision log, in one control-plane database.
    assert started["ranking"]["generation"] == f"g000001-{ranking['target']}w"
    assert started["ads"]["generation"] == f"g000001-{ads['target']}w"
    assert all(d["reason"] != "hold_budget" for d in stores["ranking"].decisions())
