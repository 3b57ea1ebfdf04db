"""The demo's task logs are in the Airflow UI: ``kale demo`` runs its DAGs with ``dag.test()``
(tasks in the runner's own process, logs printed only), and its runner writes each task's
output where the UI reads a task log. Runs the demo's runner on a small DAG, then asks
Airflow's own API server app for each task's log, as the UI's log view does."""

import json
import subprocess
import sys
import textwrap

import pytest

from kale_airflow.cli.demo import RUN_DAG

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
(run,) = client.get("/api/v2/dags/logs_demo/dagRuns", headers=auth).json()["dag_runs"]
logs = {}
for task in ("first", "second"):
    got = client.get(f"/api/v2/dags/logs_demo/dagRuns/{run['dag_run_id']}/taskInstances/{task}/logs/1", headers=auth)
    logs[task] = " ".join(line.get("event", "") for line in got.json()["content"])
print("KALE_LOGS" + json.dumps(logs))
"""


@pytest.mark.slow
def test_each_task_log_of_a_demo_run_is_served_by_the_ui(airflow_home, tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "logs_demo.py").write_text(DAG)
    env = airflow_home.env | {"AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    run = subprocess.run([sys.executable, "-c", RUN_DAG, str(dags), "logs_demo", "{}"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "KALE_STATE success" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    # What the tasks wrote still reaches the runner's output (the demo keeps it in dag-logs/).
    assert "first task printed this" in run.stdout and "second task got 1" in run.stdout
    out = subprocess.run([sys.executable, "-c", QUERY], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    line = next((l for l in out.stdout.splitlines() if l.startswith("KALE_LOGS")), None)
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    logs = json.loads(line[len("KALE_LOGS"):])
    assert "first task logged this" in logs["first"] and "first task printed this" in logs["first"]
    assert "second task got 1" in logs["second"] and "a child process of the second task" in logs["second"]
    assert "second task" not in logs["first"] and "first task" not in logs["second"]  # one file per task
