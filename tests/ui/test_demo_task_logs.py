"""The demo's task logs are in the Airflow UI: ``kale demo`` runs its DAGs with ``dag.test()``
in long-lived lanes (tasks in the lane's own process, logs printed only), and the lane writes
each task's output where the UI reads a task log. Runs a small DAG twice in one of the demo's
lanes, then asks Airflow's own API server app for each run's task logs, as the UI's log view
does."""

import json
import subprocess
import sys
import textwrap

import pytest

from kale_airflow.cli.demo import DagLane

DAG = textwrap.dedent('''
    import logging
    import subprocess
    import sys

    from airflow.sdk import dag, task


    @dag(schedule=None)
    def logs_demo():
        @task
        def first():
            logging.getLogger("kale.test").info("first task logged this")
            print("first task printed this")
            return 1

        @task
        def second(value):
            subprocess.run([sys.executable, "-c", "print('a child process of the second task printed this')"])
            logging.getLogger("kale.test").warning("second task got %s", value)

        second(first())


    logs_demo()
''')

QUERY = r"""
import json
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app, get_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
client = TestClient(create_app())
auth = {"Authorization": "Bearer " + get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin",
                                                                                          role="admin")),
        "Accept": "application/json"}
runs = client.get("/api/v2/dags/logs_demo/dagRuns", headers=auth).json()["dag_runs"]
logs = {}
for run in runs:
    for task in ("first", "second"):
        got = client.get(f"/api/v2/dags/logs_demo/dagRuns/{run['dag_run_id']}/taskInstances/{task}/logs/1",
                         headers=auth)
        logs[f"{run['dag_run_id']}/{task}"] = " ".join(line.get("event", "") for line in got.json()["content"])
print("KALE_LOGS" + json.dumps(logs))
"""


@pytest.mark.slow
def test_each_task_log_of_a_demo_run_is_served_by_the_ui(airflow_home, tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "logs_demo.py").write_text(DAG)
    env = airflow_home.env | {"AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    lane = DagLane(env, tmp_path, tmp_path / "lane.log", dags=dags)
    try:
        states = [lane.run("logs_demo", {"n": 1}), lane.run("logs_demo", {"n": 2})]
    finally:
        lane.close()
    printed = (tmp_path / "lane.log").read_text()
    assert states == ["success", "success"], printed[-3000:]
    # What the tasks wrote still reaches the lane's log (the demo keeps it in dag-logs/).
    assert printed.count("first task printed this") == 2 and printed.count("second task got 1") == 2
    out = subprocess.run([sys.executable, "-c", QUERY], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    line = next((l for l in out.stdout.splitlines() if l.startswith("KALE_LOGS")), None)
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    logs = json.loads(line[len("KALE_LOGS"):])
    runs = {key.split("/")[0] for key in logs}
    assert len(runs) == 2  # each run of the lane has its own task logs
    for run in runs:
        first, second = logs[f"{run}/first"], logs[f"{run}/second"]
        assert "first task logged this" in first and "first task printed this" in first
        assert "second task got 1" in second and "a child process of the second task" in second
        assert "second task" not in first and "first task" not in second  # one file per task
